/* Routing replay (trace --replay RUN): the experts another run of the same
 * model dispatched, read from its run directory and handed to the forward
 * pass position by position (runtime's mf_replay), with the checks that make
 * the replay mean something: the same model, the same token sequences (or,
 * when generating, the same prompts), routing recorded at every MoE layer,
 * a complete run. The manifest's "replay" object says what was replayed and
 * names the source by the digest of its manifest, which is how a diff finds
 * a target's replayed twin. */
#include "mf_trace.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

struct mf_replay_source {
    mf_run *run;
    char *dir;
    int n_moe, k;
    bool *layers;        /* [n_moe] replayed */
    bool all_layers;
    bool weights;        /* the source's weights, not this router's */
    size_t *seq_of;      /* [prompts] the source's sequence of each prompt */
    char *manifest_json; /* the run manifest's "replay" object */
    /* the current sequence's routing, as mf_replay hands it to the forward pass */
    int32_t *tokens;
    uint16_t *ids;
    double *w;
};

/* "N" or "N-M", comma-separated, model layer indices; a single index must be a MoE layer, a range takes the MoE
 * layers inside it (and must hold one). cfg NULL: the syntax alone. */
int mf_replay_layers_parse(const char *spec, const mf_config *cfg, bool *layers, mf_error *err) {
    if (!spec || !*spec) return mf_fail(err, MF_EINVAL, "--replay-layers takes model layer indices, e.g. 0,2 or 0-3");
    const int n_layers = cfg ? cfg->n_layers : MF_MAX_LAYERS;
    bool seen[MF_MAX_LAYERS] = {0};
    const char *p = spec;
    while (true) {
        char *end;
        long a = strtol(p, &end, 10), b;
        if (end == p || *p == '-' || *p == '+' || *p == ' ')
            return mf_fail(err, MF_EINVAL, "--replay-layers \"%s\": \"%s\" is not a layer index (N or N-M, comma-separated)",
                           spec, p);
        b = a;
        const bool range = *end == '-';
        if (range) {
            const char *q = end + 1;
            b = strtol(q, &end, 10);
            if (end == q || *q == '-' || *q == '+' || *q == ' ' || b < a)
                return mf_fail(err, MF_EINVAL, "--replay-layers \"%s\": a range is N-M with N <= M", spec);
        }
        if (*end != ',' && *end != 0)
            return mf_fail(err, MF_EINVAL, "--replay-layers \"%s\": \"%s\" is not a layer index (N or N-M, comma-separated)",
                           spec, end);
        if (a < 0 || b >= n_layers)
            return mf_fail(err, MF_EINVAL, "--replay-layers \"%s\": layer %ld is not a layer of the model (0 to %d)", spec,
                           a < 0 ? a : b, n_layers - 1);
        int found = 0;
        for (long l = a; l <= b; l++) {
            if (cfg && !cfg->layer_is_moe[l]) {
                if (!range)
                    return mf_fail(err, MF_EINVAL, "--replay-layers \"%s\": layer %ld is a dense layer (no router to replay)",
                                   spec, l);
                continue;
            }
            if (seen[l]) return mf_fail(err, MF_EINVAL, "--replay-layers \"%s\": layer %ld is named twice", spec, l);
            seen[l] = true;
            found++;
        }
        if (!found) return mf_fail(err, MF_EINVAL, "--replay-layers \"%s\": %ld-%ld holds no MoE layer", spec, a, b);
        if (!*end) break;
        p = end + 1;
    }
    if (cfg && layers)
        for (int l = 0, mi = 0; l < cfg->n_layers; l++)
            if (cfg->layer_is_moe[l]) layers[mi++] = seen[l];
    return MF_OK;
}

void mf_replay_close(mf_replay_source *s) {
    if (!s) return;
    mf_run_close(s->run);
    free(s->dir);
    free(s->layers);
    free(s->seq_of);
    free(s->manifest_json);
    free(s->tokens);
    free(s->ids);
    free(s->w);
    free(s);
}

static const char *manifest_str(json_t *man, const char *obj, const char *key) {
    json_t *o = obj ? json_object_get(man, obj) : man;
    const char *v = json_string_value(json_object_get(o, key));
    return v ? v : "";
}

/* The source holds the prompts' token sequences: each prompt is a sequence of it, with the same tokens (when
 * generating, the same prompt: the source's tokens before those it generated). */
static int check_sequences(mf_replay_source *s, const mf_prompts *prompts, bool generate, mf_error *err) {
    mf_run *r = s->run;
    for (size_t i = 0; i < prompts->n; i++) {
        const mf_prompt *p = &prompts->seq[i];
        size_t j = 0;
        while (j < r->n_seqs && strcmp(r->seqs[j].id, p->id)) j++;
        if (j == r->n_seqs)
            return mf_fail(err, MF_EMISMATCH, "--replay %s: sequence %s of the input is not in the run", s->dir, p->id);
        s->seq_of[i] = j;
        const mf_st_tensor *t;
        int rc = mf_run_tensor(r, j, "tokens", &t, err);
        if (rc) return rc;
        const int len = r->seqs[j].length, prompt = len - r->seqs[j].generated;
        const int want = generate ? prompt : len;
        for (int q = 0; q < want && q < p->T; q++) {
            int32_t v;
            memcpy(&v, t->data + 4 * (size_t)q, 4);
            if (v != p->tokens[q])
                return mf_fail(err, MF_EMISMATCH, "--replay %s: sequence %s, position %d: token %d in the run, %d in the input",
                               s->dir, p->id, q, v, p->tokens[q]);
        }
        if (generate && prompt != p->T)
            return mf_fail(err, MF_EMISMATCH, "--replay %s: sequence %s: a %d-token prompt in the run, %d in the input", s->dir,
                           p->id, prompt, p->T);
        if (!generate && len != p->T)
            return mf_fail(err, MF_EMISMATCH, "--replay %s: sequence %s: %d tokens in the run, %d in the input%s", s->dir,
                           p->id, len, p->T,
                           r->seqs[j].generated ? " (the run generated some of its tokens: give --generate to continue the "
                                                  "prompts as it did, or --input with the run to trace its tokens)"
                                                : "");
        /* the routing, at every MoE layer and position */
        const mf_st_tensor *ids, *w;
        if ((rc = mf_run_tensor(r, j, "topk_ids", &ids, err)) || (rc = mf_run_tensor(r, j, "topk_w", &w, err))) return rc;
        if (!ids || (s->weights && !w))
            return mf_fail(err, MF_EFORMAT, "--replay %s: sequence %s has no %s: the run records no routing to replay", s->dir,
                           p->id, ids ? "topk_w" : "topk_ids");
        /* a router chooses k different experts: a slot naming one twice is no router's choice */
        const int K = s->k;
        for (size_t slot = 0; slot < (size_t)s->n_moe * (size_t)len; slot++) {
            uint16_t e[64];
            memcpy(e, ids->data + 2 * slot * (size_t)K, 2 * (size_t)K);
            for (int a = 0; a < K; a++)
                for (int b = a + 1; b < K; b++)
                    if (e[a] == e[b])
                        return mf_fail(err, MF_EFORMAT, "--replay %s: sequence %s, layer %d, position %zu: expert %u is dispatched twice",
                                       s->dir, p->id, r->moe_layers[slot / (size_t)len], slot % (size_t)len, e[a]);
        }
    }
    return MF_OK;
}

int mf_replay_open(mf_replay_source **out, const char *run_dir, const mf_config *cfg, const mf_prompts *prompts,
                   bool generate, const char *layers, bool weights, mf_error *err) {
    *out = NULL;
    if (!cfg->n_moe_layers)
        return mf_fail(err, MF_EINVAL, "--replay: %s is a dense model: it has no routing to replay", cfg->model_type);
    mf_replay_source *s = mf_xcalloc(1, sizeof *s);
    s->dir = mf_xstrdup(run_dir);
    s->n_moe = cfg->n_moe_layers;
    s->k = cfg->top_k;
    s->weights = weights;
    s->layers = mf_xcalloc((size_t)s->n_moe, sizeof *s->layers);
    s->seq_of = mf_xcalloc(prompts->n + 1, sizeof *s->seq_of);
    json_t *man = NULL;
    int rc;
    if (layers) {
        if ((rc = mf_replay_layers_parse(layers, cfg, s->layers, err))) goto fail;
    } else {
        for (int i = 0; i < s->n_moe; i++) s->layers[i] = true;
    }
    s->all_layers = true;
    for (int i = 0; i < s->n_moe; i++) s->all_layers &= s->layers[i];
    if ((rc = mf_run_open(&s->run, run_dir, err))) {
        mf_fail_wrap(err, "--replay");
        goto fail;
    }
    mf_run *r = s->run;
    man = json_loads(r->manifest_text, 0, NULL);
    /* the same model: its identity (the weights digest is checked once they are loaded), then its shape */
    static const char *keys[] = {"architecture", "config_digest"};
    const char *have[] = {cfg->model_type, cfg->digest};
    for (int i = 0; i < 2; i++)
        if (strcmp(manifest_str(man, "model", keys[i]), have[i])) {
            rc = mf_fail(err, MF_EMISMATCH, "--replay %s: a run of another model (%s %s, this model's %s)", run_dir, keys[i],
                         manifest_str(man, "model", keys[i]), have[i]);
            goto fail;
        }
    if (r->n_moe != cfg->n_moe_layers || r->n_experts != cfg->n_experts || r->top_k != cfg->top_k || r->vocab != cfg->vocab) {
        rc = mf_fail(err, MF_EMISMATCH, "--replay %s: the run's model has another shape (%d MoE layers, %d experts, top-%d)",
                     run_dir, r->n_moe, r->n_experts, r->top_k);
        goto fail;
    }
    if (!r->complete) {
        rc = mf_fail(err, MF_EINVAL, "--replay %s: the run is not complete (%zu sequences so far): finish it with --resume "
                     "first, so that the routing replayed is final", run_dir, r->n_seqs);
        goto fail;
    }
    if (strcmp(r->record, "routing") && strcmp(r->record, "topk") && strcmp(r->record, "logits") && strcmp(r->record, "full")) {
        rc = mf_fail(err, MF_EFORMAT, "--replay %s: the run records no routing (record %s)", run_dir, r->record);
        goto fail;
    }
    if ((rc = check_sequences(s, prompts, generate, err))) goto fail;
    /* what the manifest says of the replay: the source, by its directory and the digest of its manifest */
    char digest[33];
    mf_digest_buffer(r->manifest_text, strlen(r->manifest_text), digest);
    json_t *o = json_object(), *ls = json_array();
    json_object_set_new(o, "source", json_string(run_dir));
    json_object_set_new(o, "source_manifest_digest", json_string(digest));
    json_object_set_new(o, "source_numerics", json_string(manifest_str(man, NULL, "numerics")));
    json_object_set_new(o, "source_precision", json_string(r->precision));
    json_object_set_new(o, "source_device", json_string(manifest_str(man, "device", "kind")));
    for (int i = 0; i < s->n_moe; i++)
        if (s->layers[i]) json_array_append_new(ls, json_integer(r->moe_layers[i]));
    json_object_set_new(o, "layers", ls);
    json_object_set_new(o, "all_layers", json_boolean(s->all_layers));
    json_object_set_new(o, "weights", json_string(weights ? "source" : "router"));
    s->manifest_json = json_dumps(o, JSON_PRESERVE_ORDER | JSON_COMPACT);
    json_decref(o);
    json_decref(man);
    *out = s;
    return MF_OK;
fail:
    json_decref(man);
    mf_replay_close(s);
    return rc;
}

int mf_replay_check_weights(const mf_replay_source *s, const char *weights_digest, mf_error *err) {
    json_t *man = json_loads(s->run->manifest_text, 0, NULL);
    const char *d = manifest_str(man, "model", "weights_digest");
    int rc = MF_OK;
    if (strcmp(d, weights_digest))
        rc = mf_fail(err, MF_EMISMATCH, "--replay %s: a run of another model (weights_digest %s, this model's %s)", s->dir, d,
                     weights_digest);
    json_decref(man);
    return rc;
}

const char *mf_replay_manifest(const mf_replay_source *s) { return s->manifest_json; }

int mf_replay_sequence(mf_replay_source *s, size_t prompt, mf_replay *out, mf_error *err) {
    mf_run *r = s->run;
    const size_t j = s->seq_of[prompt];
    const mf_st_tensor *tok, *ids, *w;
    int rc;
    if ((rc = mf_run_tensor(r, j, "tokens", &tok, err)) || (rc = mf_run_tensor(r, j, "topk_ids", &ids, err)) ||
        (rc = mf_run_tensor(r, j, "topk_w", &w, err)))
        return rc;
    const size_t len = (size_t)r->seqs[j].length, slots = (size_t)s->n_moe * len * (size_t)s->k;
    /* copies: the shard's bytes need not be aligned for these types */
    s->tokens = mf_xrealloc(s->tokens, len * sizeof *s->tokens);
    memcpy(s->tokens, tok->data, len * sizeof *s->tokens);
    s->ids = mf_xrealloc(s->ids, slots * sizeof *s->ids + 1);
    memcpy(s->ids, ids->data, slots * sizeof *s->ids);
    if (s->weights) {
        s->w = mf_xrealloc(s->w, slots * sizeof *s->w + 1);
        for (size_t i = 0; i < slots; i++) s->w[i] = mf_load_as_f64(w->data, w->dtype, i);
    }
    *out = (mf_replay){.len = (int)len, .tokens = s->tokens, .ids = s->ids, .weights = s->weights ? s->w : NULL,
                       .layers = s->layers};
    return MF_OK;
}
