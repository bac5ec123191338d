/* Greedy generation on the CPU or a GPU: a prompt run through a session, then one
 * token at a time against its key-value cache, each step's results kept as
 * the decode path computed them. Hugging Face generate(do_sample=False) is
 * the model followed: argmax of the last position's logits (the first of
 * equal values, as torch.argmax), stopping after max_new_tokens or at a
 * token of generation_config.json's eos_token_id, which is kept. */
#include "mf_trace.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* eos_token_id as Hugging Face writes it: an integer, a list of them, or null. */
static int read_eos(json_t *v, const char *path, int vocab, mf_generation *g, mf_error *err) {
    if (!v || json_is_null(v)) return MF_OK;
    json_t *one[1] = {v};
    size_t n = 1;
    json_t **items = one;
    if (json_is_array(v)) {
        n = json_array_size(v);
        if (n > MF_MAX_STOP_TOKENS)
            return mf_fail(err, MF_EFORMAT, "%s: eos_token_id lists %zu tokens, more than %d", path, n, MF_MAX_STOP_TOKENS);
        items = NULL;
    }
    for (size_t i = 0; i < n; i++) {
        json_t *x = items ? items[i] : json_array_get(v, i);
        if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) >= vocab)
            return mf_fail(err, MF_EFORMAT, "%s: eos_token_id must be token ids in [0, %d)", path, vocab);
        g->eos[g->n_eos++] = (int32_t)json_integer_value(x);
    }
    return MF_OK;
}

int mf_generation_load(mf_generation *g, const char *model_dir, int vocab, int max_new_tokens, mf_error *err) {
    memset(g, 0, sizeof *g);
    g->max_new_tokens = max_new_tokens;
    snprintf(g->eos_source, sizeof g->eos_source, "none");
    /* Hugging Face reads generation_config.json, and builds one from config.json where there is none */
    static const char *files[] = {"generation_config.json", "config.json"};
    for (size_t f = 0; f < 2; f++) {
        char path[4200];
        if (!mf_path_join(path, sizeof path, model_dir, files[f])) return mf_fail(err, MF_EINVAL, "%s: path too long", model_dir);
        if (!mf_path_exists(path)) continue;
        char *text;
        size_t len;
        int rc = mf_read_file(path, &text, &len, err);
        if (rc) return rc;
        json_error_t jerr;
        json_t *root = json_loadb(text, len, 0, &jerr);
        free(text);
        if (!root || !json_is_object(root)) {
            json_decref(root);
            return mf_fail(err, MF_EFORMAT, "%s: not a JSON object (%s, line %d)", path, root ? "top level" : jerr.text,
                           jerr.line);
        }
        rc = read_eos(json_object_get(root, "eos_token_id"), path, vocab, g, err);
        json_decref(root);
        if (rc) return rc;
        snprintf(g->eos_source, sizeof g->eos_source, "%s", files[f]);
        return MF_OK;
    }
    return MF_OK;
}

bool mf_generation_stops(const mf_generation *g, int32_t token) {
    for (int i = 0; i < g->n_eos; i++)
        if (g->eos[i] == token) return true;
    return false;
}

int mf_greedy_token(const double *logits, int V, mf_dtype head, int32_t *token) {
    /* the logits as the model hands them over (rounded to the head's dtype: in bf16 equal values are common,
     * and the lower id wins) */
    int best = -1;
    double bv = 0;
    for (int i = 0; i < V; i++) {
        const double v = mf_round_to(head, logits[i]);
        if (isnan(v)) return MF_EINVAL;
        if (best < 0 || v > bv) {
            best = i;
            bv = v;
        }
    }
    *token = best;
    return MF_OK;
}

/* The growing result: laid out for cap positions ([n_moe, cap, ...]), len of them filled, compacted at the end. */
typedef struct grown {
    mf_seq_result r;
    int len;
} grown;

/* From [n_moe, cap, w] to [n_moe, len, w], in place (each layer's block moves down, never over one not yet moved). */
#define COMPACT(a, w)                                                                                             \
    for (size_t l = 1; l < L; l++) memmove((a) + l * T * (w), (a) + l * C * (w), T * (w) * sizeof *(a))

static void grown_finish(grown *g, mf_seq_result *out) {
    mf_seq_result *r = &g->r;
    const size_t L = (size_t)r->n_moe, C = (size_t)r->T, T = (size_t)g->len;
    if (T < C) {
        COMPACT(r->topk_ids, (size_t)r->k);
        COMPACT(r->topk_w, (size_t)r->k);
        COMPACT(r->router, (size_t)r->E);
        if (r->shared_gate) COMPACT(r->shared_gate, (size_t)1);
        if (r->select) COMPACT(r->select, (size_t)r->E);
        if (r->router_in) COMPACT(r->router_in, (size_t)r->H);
    }
    r->T = g->len;
    *out = *r;
    memset(r, 0, sizeof *r);
}

/* A sequence's key-value-cache session on the CPU or a GPU (whose cache was made when it was opened). */
typedef struct session {
    mf_cpu_session *cpu;
    mf_gpu *gpu;
} session;

static int session_step(session *s, const int32_t *tokens, int n, mf_seq_result *r, mf_error *err) {
    return s->gpu ? mf_gpu_session_forward(s->gpu, tokens, n, MF_GPU_ALL, r, err)
                  : mf_cpu_session_forward(s->cpu, tokens, n, r, err);
}

int mf_generate(const mf_model *m, const mf_run_opts *o, mf_gpu *gpu, const mf_generation *gen, const mf_prompt *p,
                int32_t *tokens, int *generated, double *decode_s, mf_seq_result *out, mf_error *err) {
    memset(out, 0, sizeof *out);
    *generated = 0;
    *decode_s = 0;
    const int cap = p->T + gen->max_new_tokens;
    memcpy(tokens, p->tokens, (size_t)p->T * sizeof *tokens);
    session s = {NULL, gpu};
    int rc = gpu ? mf_gpu_session_rewind(gpu, 0, err) : mf_cpu_session_open(&s.cpu, m, o, cap, err);
    if (rc) return rc;
    grown g;
    mf_seq_result step;
    if ((rc = session_step(&s, tokens, p->T, &step, err))) goto done;
    mf_seq_result_alloc(&g.r, &m->cfg, cap, &step);
    mf_seq_result_place(&g.r, &step, 0);
    g.len = step.T;
    mf_seq_result_free(&step);
    const mf_dtype head = o->prec.part[MF_PART_HEAD];
    const double t_decode = mf_now();
    for (int i = 0; i < gen->max_new_tokens; i++) {
        const int at = p->T + i;   /* the position the new token takes */
        int32_t next;
        if (mf_greedy_token(g.r.logits + (size_t)(at - 1) * g.r.V, g.r.V, head, &next)) {
            rc = mf_fail(err, MF_EINVAL, "position %d: the logits hold NaN, so no token follows", at - 1);
            break;
        }
        tokens[at] = next;
        ++*generated;
        /* the token is run too, so that every position the run records has its routing and logits */
        if ((rc = session_step(&s, &next, 1, &step, err))) {
            mf_fail_wrap(err, "generated position %d", at);
            break;
        }
        mf_seq_result_place(&g.r, &step, g.len);
        g.len += step.T;
        mf_seq_result_free(&step);
        if (mf_generation_stops(gen, next)) break;
    }
    *decode_s = mf_now() - t_decode;
    if (!rc) grown_finish(&g, out);
    mf_seq_result_free(&g.r);
done:
    mf_cpu_session_close(s.cpu);
    return rc;
}
