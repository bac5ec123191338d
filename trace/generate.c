/* Greedy generation on the CPU: a prompt run through a session, then one
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

/* The growing result: every array laid out for cap positions ([n_moe, cap, ...]), compacted to T at the end. */
typedef struct grown {
    mf_seq_result r;
    int cap;
} grown;

static void grown_init(grown *g, const mf_seq_result *first, int cap) {
    memset(g, 0, sizeof *g);
    g->cap = cap;
    mf_seq_result *r = &g->r;
    r->T = 0;
    r->n_moe = first->n_moe, r->k = first->k, r->E = first->E, r->V = first->V, r->H = first->H;
    const size_t L = (size_t)first->n_moe, C = (size_t)cap;
    r->topk_ids = mf_xmalloc(L * C * (size_t)r->k * sizeof *r->topk_ids + 1);
    r->topk_w = mf_xmalloc(L * C * (size_t)r->k * sizeof *r->topk_w + 1);
    r->router = mf_xmalloc(L * C * (size_t)r->E * sizeof *r->router + 1);
    if (first->shared_gate) r->shared_gate = mf_xmalloc(L * C * sizeof *r->shared_gate + 1);
    if (first->select) r->select = mf_xmalloc(L * C * (size_t)r->E * sizeof *r->select + 1);
    if (first->router_in) r->router_in = mf_xmalloc(L * C * (size_t)r->H * sizeof *r->router_in + 1);
    r->logits = mf_xmalloc(C * (size_t)r->V * sizeof *r->logits);
}

/* Per MoE layer, n positions of width w from src (laid out for n positions) to dst (for cap) at position at. */
#define APPEND_ROWS(dst, src, w)                                                                                  \
    for (size_t l = 0; l < L; l++)                                                                                \
        memcpy((dst) + (l * C + at) * (w), (src) + l * n * (w), n * (w) * sizeof *(dst))

static void grown_append(grown *g, const mf_seq_result *s) {
    mf_seq_result *r = &g->r;
    const size_t L = (size_t)r->n_moe, C = (size_t)g->cap, at = (size_t)r->T, n = (size_t)s->T;
    APPEND_ROWS(r->topk_ids, s->topk_ids, (size_t)r->k);
    APPEND_ROWS(r->topk_w, s->topk_w, (size_t)r->k);
    APPEND_ROWS(r->router, s->router, (size_t)r->E);
    if (r->shared_gate) APPEND_ROWS(r->shared_gate, s->shared_gate, (size_t)1);
    if (r->select) APPEND_ROWS(r->select, s->select, (size_t)r->E);
    if (r->router_in) APPEND_ROWS(r->router_in, s->router_in, (size_t)r->H);
    memcpy(r->logits + at * (size_t)r->V, s->logits, n * (size_t)r->V * sizeof *r->logits);
    r->T += s->T;
}

/* From [n_moe, cap, w] to [n_moe, T, w], in place (each layer's block moves down, never over one not yet moved). */
#define COMPACT(a, w)                                                                                             \
    for (size_t l = 1; l < L; l++) memmove((a) + l * T * (w), (a) + l * C * (w), T * (w) * sizeof *(a))

static void grown_finish(grown *g, mf_seq_result *out) {
    mf_seq_result *r = &g->r;
    const size_t L = (size_t)r->n_moe, C = (size_t)g->cap, T = (size_t)r->T;
    if (T < C) {
        COMPACT(r->topk_ids, (size_t)r->k);
        COMPACT(r->topk_w, (size_t)r->k);
        COMPACT(r->router, (size_t)r->E);
        if (r->shared_gate) COMPACT(r->shared_gate, (size_t)1);
        if (r->select) COMPACT(r->select, (size_t)r->E);
        if (r->router_in) COMPACT(r->router_in, (size_t)r->H);
    }
    *out = *r;
    memset(r, 0, sizeof *r);
}

int mf_generate_cpu(const mf_model *m, const mf_run_opts *o, const mf_generation *gen, const mf_prompt *p,
                    int32_t *tokens, int *generated, mf_seq_result *out, mf_error *err) {
    memset(out, 0, sizeof *out);
    *generated = 0;
    const int cap = p->T + gen->max_new_tokens;
    memcpy(tokens, p->tokens, (size_t)p->T * sizeof *tokens);
    mf_cpu_session *s;
    int rc = mf_cpu_session_open(&s, m, o, cap, err);
    if (rc) return rc;
    grown g;
    mf_seq_result step;
    if ((rc = mf_cpu_session_forward(s, tokens, p->T, &step, err))) goto done;
    grown_init(&g, &step, cap);
    grown_append(&g, &step);
    mf_seq_result_free(&step);
    const mf_dtype head = o->prec.part[MF_PART_HEAD];
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
        if ((rc = mf_cpu_session_forward(s, &next, 1, &step, err))) {
            mf_fail_wrap(err, "generated position %d", at);
            break;
        }
        grown_append(&g, &step);
        mf_seq_result_free(&step);
        if (mf_generation_stops(gen, next)) break;
    }
    if (!rc) grown_finish(&g, out);
    mf_seq_result_free(&g.r);
done:
    mf_cpu_session_close(s);
    return rc;
}
