/* Importing others' captures as runs. CroVA (crova-project/crova) stores, per
 * case, logits/<case>.safetensors with logits [m, V], response [m] and, for
 * MoE models, router_logits [L, m, E]; it never records the experts that ran,
 * so they are derived here from the scores, canonically, and the manifest says
 * they were derived.
 *
 * A capture is someone else's file: every case is checked before anything is
 * written (its id, that is its file name, as prompt files take ids; its
 * tensors' dtypes and shapes against the model's config; every response token
 * in the vocabulary), and the run is built under a temporary name and renamed
 * into place when it is whole, so a failed import leaves nothing behind. */
#include "mf_rundir.h"
#include "rundir_int.h"
#include "mf_router.h"

#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int list_cases(const char *dir, char ***names, size_t *n, mf_error *err) {
    DIR *d = opendir(dir);
    if (!d) return mf_fail(err, MF_EIO, "%s: no CroVA capture here (expected a logits/ directory)", dir);
    size_t cap = 16;
    *names = mf_xmalloc(cap * sizeof **names);
    *n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t L = strlen(e->d_name);
        if (L <= 12 || strcmp(e->d_name + L - 12, ".safetensors")) continue;
        char id[4096];
        snprintf(id, sizeof id, "%.*s", (int)(L - 12), e->d_name);
        if (!mf_seq_id_valid(id)) {
            char shown[300];
            snprintf(shown, sizeof shown, "%.200s", e->d_name);
            closedir(d);
            return mf_fail(err, MF_EINVAL,
                           "%s: case %s: its name is not a sequence id (1 to %d bytes of UTF-8 without '\\' or control "
                           "characters)", dir, shown, MF_MAX_SEQ_ID);
        }
        if (*n == cap) *names = mf_xrealloc(*names, (cap *= 2) * sizeof **names);
        (*names)[(*n)++] = mf_xstrdup(e->d_name);
    }
    closedir(d);
    qsort(*names, *n, sizeof **names, cmp_str);
    if (!*n) return mf_fail(err, MF_EINVAL, "%s: no .safetensors cases", dir);
    return MF_OK;
}

int rundir_import_dest(const char *out_dir, char *tmp, size_t cap, mf_error *err) {
    char man[4300];
    if (strlen(out_dir) > 4000) return mf_fail(err, MF_EINVAL, "%s: path too long", out_dir);
    snprintf(man, sizeof man, "%s/manifest.json", out_dir);
    if (mf_path_exists(man)) return mf_fail(err, MF_EINVAL, "%s: a run is already there (import into another -o)", out_dir);
    if (mf_path_exists(out_dir) && !mf_is_dir(out_dir)) return mf_fail(err, MF_EINVAL, "%s: exists and is not a directory", out_dir);
    if (mf_is_dir(out_dir) && rmdir(out_dir) != 0)   /* an empty directory is taken over; anything else is not */
        return mf_fail(err, MF_EINVAL, "%s: exists and is not an empty directory", out_dir);
    mf_run_remove_stale(out_dir);
    snprintf(tmp, cap, "%s.tmp.%ld", out_dir, (long)getpid());
    return MF_OK;
}

void rundir_derive_experts(const mf_config *cfg, const double *router, size_t rows, uint16_t *ids, double *w) {
    const int E = cfg->n_experts, K = cfg->top_k;
    double *probs = mf_xmalloc(sizeof(double) * (size_t)E);
    const mf_route_spec spec = {.kind = MF_ROUTE_KIND_SOFTMAX_TOPK, .n_experts = E, .top_k = K,
                                .norm_topk = cfg->norm_topk_prob, .opmath = MF_F32, .weight_out = MF_F32};
    for (size_t s = 0; s < rows; s++) {
        /* experts: canonical top-k of the raw logits (CroVA's rule); weights from the fp32 softmax */
        mf_topk(router + s * (size_t)E, E, K, ids + s * (size_t)K);
        uint16_t rid[MF_MAX_TOP_K];
        double rw[MF_MAX_TOP_K];
        mf_route_out ro = {.ids = rid, .weights = rw};
        mf_route(&spec, router + s * (size_t)E, probs, &ro);
        for (int k = 0; k < K; k++) {
            double wk = 0;
            for (int q = 0; q < K; q++)
                if (rid[q] == ids[s * (size_t)K + (size_t)k]) wk = rw[q];
            w[s * (size_t)K + (size_t)k] = wk;
        }
    }
    free(probs);
}

int mf_import_crova(const char *src_dir, const char *model_dir, const char *out_dir, mf_error *err) {
    char path[8300], logits_dir[4096];
    mf_config cfg;
    if (!mf_path_join(path, sizeof path, model_dir, "config.json")) return mf_fail(err, MF_EINVAL, "path too long");
    int rc = mf_config_load(&cfg, path, err);
    if (rc) return rc;
    if (cfg.arch == MF_ARCH_GPT_OSS)
        return mf_fail(err, MF_EUNSUPPORTED, "%s: importing captures of gpt_oss is not supported yet: its experts and "
                       "weights follow its own router (top-k of the biased logits, softmax over the k)", model_dir);
    if (cfg.route_rule != MF_ROUTE_SOFTMAX_TOPK && cfg.route_rule != MF_ROUTE_SOFTMAX_TOPK_RENORM)
        return mf_fail(err, MF_EUNSUPPORTED, "%s: importing captures of %s is not supported: its experts cannot be "
                       "derived from router logits alone (the router ranks biased sigmoid scores within groups)",
                       model_dir, cfg.model_type);
    char wdigest[33] = "unknown";
    mf_checkpoint *ck = NULL;
    if (mf_checkpoint_open(&ck, model_dir, NULL) == MF_OK) {   /* weights are optional: the config names the model */
        memcpy(wdigest, ck->weights_digest, sizeof wdigest);
        mf_checkpoint_close(ck);
    }
    snprintf(logits_dir, sizeof logits_dir, "%s/logits", src_dir);
    char **names = NULL;
    size_t n = 0;
    if ((rc = list_cases(logits_dir, &names, &n, err))) {
        for (size_t i = 0; i < n; i++) free(names[i]);
        free(names);
        return rc;
    }
    mf_st_file **files = mf_xcalloc(n, sizeof *files);
    mf_prompts prompts = {mf_xcalloc(n, sizeof(mf_prompt)), n, ""};
    mf_digest_state *ds = mf_digest_new();
    mf_dtype logit_dtype = MF_DTYPE_INVALID, router_dtype = MF_DTYPE_INVALID;
    const int L = cfg.n_moe_layers, E = cfg.n_experts, K = cfg.top_k, V = cfg.vocab;
    for (size_t i = 0; i < n && !rc; i++) {
        snprintf(path, sizeof path, "%s/%s", logits_dir, names[i]);
        if ((rc = mf_st_open(&files[i], path, err))) break;
        const mf_st_tensor *lg = mf_st_find(files[i], "logits"), *rs = mf_st_find(files[i], "response"),
                           *rl = mf_st_find(files[i], "router_logits");
        if (!lg || !rs || lg->ndim != 2 || rs->ndim != 1 || lg->shape[0] != rs->shape[0] || !mf_dtype_is_float(lg->dtype)) {
            rc = mf_fail(err, MF_EFORMAT, "%s: needs logits [m, V] and response [m]", path);
            break;
        }
        if (lg->shape[1] != V) {
            rc = mf_fail(err, MF_EFORMAT, "%s: logits have %lld columns, the model's vocabulary is %d", path,
                         (long long)lg->shape[1], V);
            break;
        }
        if (L > 0 && (!rl || rl->ndim != 3 || rl->shape[0] != L || rl->shape[1] != lg->shape[0] || rl->shape[2] != E)) {
            rc = mf_fail(err, MF_EFORMAT, "%s: needs router_logits [%d, %lld, %d] for this model", path, L,
                         (long long)lg->shape[0], E);
            break;
        }
        if (rs->dtype != MF_I64 && rs->dtype != MF_I32) {
            rc = mf_fail(err, MF_EFORMAT, "%s: response must be I64 or I32", path);
            break;
        }
        if (L > 0 && !mf_dtype_is_float(rl->dtype)) {
            rc = mf_fail(err, MF_EFORMAT, "%s: router_logits must be a float tensor, not %s", path, mf_dtype_name(rl->dtype));
            break;
        }
        if (rs->shape[0] < 1 || rs->shape[0] > MF_MAX_SEQ_TOKENS) {
            rc = mf_fail(err, MF_EFORMAT, "%s: the response has %lld tokens (a case needs 1 to %d)", path,
                         (long long)rs->shape[0], MF_MAX_SEQ_TOKENS);
            break;
        }
        logit_dtype = lg->dtype;
        if (rl) router_dtype = rl->dtype;
        mf_prompt *p = &prompts.seq[i];
        names[i][strlen(names[i]) - 12] = 0;   /* case id: the file name */
        p->id = mf_xstrdup(names[i]);
        p->T = (int)rs->shape[0];
        p->tokens = mf_xmalloc(sizeof(int32_t) * (size_t)(p->T ? p->T : 1));
        for (int t = 0; t < p->T; t++) {
            int64_t v = 0;
            if (rs->dtype == MF_I64) memcpy(&v, rs->data + 8 * (size_t)t, 8);
            else {
                int32_t w;
                memcpy(&w, rs->data + 4 * (size_t)t, 4);
                v = w;
            }
            if (v < 0 || v >= V) {
                rc = mf_fail(err, MF_EFORMAT, "%s: response position %d holds token %lld, outside the vocabulary [0, %d)", path, t,
                             (long long)v, V);
                break;
            }
            p->tokens[t] = (int32_t)v;
        }
        if (rc) break;
        mf_digest_update(ds, p->id, strlen(p->id) + 1);
        mf_digest_update(ds, p->tokens, sizeof(int32_t) * (size_t)p->T);
    }
    mf_digest_final(ds, prompts.digest);
    mf_run_writer *w = NULL;
    /* the run is built at <out>.tmp.<pid> and renamed to out when it is whole */
    char tmp[4200] = "";
    if (!rc) rc = rundir_import_dest(out_dir, tmp, sizeof tmp, err);
    if (!rc) {
        /* the precision the capture was made in, as far as the stored dtypes tell */
        mf_precision prec;
        mf_precision_parse(&prec, logit_dtype == MF_BF16 ? "bf16" : logit_dtype == MF_F16 ? "fp16" : "fp32", NULL);
        prec.part[MF_PART_HEAD] = logit_dtype;
        if (router_dtype != MF_DTYPE_INVALID) prec.part[MF_PART_ROUTER] = router_dtype;
        char from[4200];
        snprintf(from, sizeof from, "crova %s", src_dir);
        mf_run_info info = {.model_dir = model_dir, .prec = &prec, .device = "imported", .numerics = "unknown",
                            .record = MF_RECORD_LOGITS, .input_path = src_dir, .prompts = &prompts, .cfg = &cfg,
                            .weights_digest = wdigest, .imported_from = from};
        rc = mf_run_create(&w, tmp, &info, false, err);
        for (size_t i = 0; i < n && !rc; i++) {
            const mf_st_tensor *lg = mf_st_find(files[i], "logits"), *rl = mf_st_find(files[i], "router_logits");
            const int T = prompts.seq[i].T;
            mf_seq_result r = {.T = T, .n_moe = L, .k = K, .E = E, .V = V, .H = cfg.hidden};
            r.logits = mf_xmalloc(sizeof(double) * (size_t)T * V + 1);
            for (size_t j = 0; j < (size_t)T * V; j++) r.logits[j] = mf_load_as_f64(lg->data, lg->dtype, j);
            if (L > 0) {
                r.router = mf_xmalloc(sizeof(double) * (size_t)L * T * E);
                r.topk_ids = mf_xmalloc(sizeof(uint16_t) * (size_t)L * T * K);
                r.topk_w = mf_xmalloc(sizeof(double) * (size_t)L * T * K);
                for (size_t j = 0; j < (size_t)L * T * E; j++) r.router[j] = mf_load_as_f64(rl->data, rl->dtype, j);
                rundir_derive_experts(&cfg, r.router, (size_t)L * T, r.topk_ids, r.topk_w);
            }
            rc = mf_run_writer_add(w, &prompts.seq[i], &r, err);
            mf_seq_result_free(&r);
        }
        if (!rc) rc = mf_run_writer_close(w, err);
        if (!rc && rename(tmp, out_dir) != 0) rc = mf_fail(err, MF_EIO, "%s: cannot rename the import into place: %s", out_dir, strerror(errno));
    }
    mf_run_writer_free(w);
    if (rc && tmp[0]) mf_run_remove_dir(tmp);
    for (size_t i = 0; i < n; i++) {
        mf_st_close(files[i]);
        free(names[i]);
    }
    free(files);
    free(names);
    mf_prompts_free(&prompts);
    return rc;
}
