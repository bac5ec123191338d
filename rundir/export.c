/* Export a run as JSON lines or CSV (docs/run-format.md, "Export"). Numbers are printed with
 * enough digits to round-trip: 17 significant digits for F64, 9 otherwise.
 * JSON has no NaN or infinities: JSON lines write a value that is not a
 * number as null (CSV as NaN, Infinity, -Infinity, which CSV readers take).
 * Ids are written as CSV fields, quoted when they hold a comma or a quote.
 * The run was validated when it was opened (mf_run_open): every tensor used
 * here is there with the shape the manifest declares. */
#include "mf_rundir.h"

#include <errno.h>
#include <math.h>
#include <string.h>

static void put_num(FILE *out, double v, mf_dtype t, bool json) {
    if (!isfinite(v) && json) fputs("null", out);
    else if (isnan(v)) fputs("NaN", out);
    else if (isinf(v)) fputs(v > 0 ? "Infinity" : "-Infinity", out);
    else fprintf(out, t == MF_F64 ? "%.17g" : "%.9g", v);
}

static void put_row(FILE *out, const mf_st_tensor *t, size_t off, int n, char sep, bool json) {
    for (int i = 0; i < n; i++) {
        if (i) fputc(sep, out);
        put_num(out, mf_load_as_f64(t->data, t->dtype, off + (size_t)i), t->dtype, json);
    }
}

/* A CSV field (RFC 4180): quoted, with quotes doubled, when it holds a separator or a quote. */
static void put_csv_field(FILE *out, const char *s) {
    if (!strpbrk(s, ",\"\r\n")) {
        fputs(s, out);
        return;
    }
    fputc('"', out);
    for (; *s; s++) {
        if (*s == '"') fputc('"', out);
        fputc(*s, out);
    }
    fputc('"', out);
}

typedef struct seq_tensors {
    const mf_st_tensor *tokens, *ids, *w, *router, *shared, *logits, *topk_logits, *topk_tokens, *lse;
} seq_tensors;

static int get_all(mf_run *r, size_t s, seq_tensors *st, mf_error *err) {
    memset(st, 0, sizeof *st);
    int rc;
    if ((rc = mf_run_tensor(r, s, "tokens", &st->tokens, err)) || (rc = mf_run_tensor(r, s, "topk_ids", &st->ids, err)) ||
        (rc = mf_run_tensor(r, s, "topk_w", &st->w, err)) || (rc = mf_run_tensor(r, s, "router", &st->router, err)) ||
        (rc = mf_run_tensor(r, s, "shared_gate", &st->shared, err)) ||
        (rc = mf_run_tensor(r, s, "logits", &st->logits, err)) ||
        (rc = mf_run_tensor(r, s, "topk_logits", &st->topk_logits, err)) ||
        (rc = mf_run_tensor(r, s, "topk_tokens", &st->topk_tokens, err)) ||
        (rc = mf_run_tensor(r, s, "logsumexp", &st->lse, err)))
        return rc;
    /* mf_run_open refused a run without these; this guards a caller that built an mf_run by other means */
    const int T = r->seqs[s].length;
    if (!st->tokens || mf_st_numel(st->tokens) != T || (r->n_moe && (!st->ids || (!st->w && !(r->lacks & MF_LACKS_GATES)) || (!st->router && !(r->lacks & MF_LACKS_ROUTER)))) ||
        (st->topk_logits && (!st->topk_tokens || !st->lse)))
        return mf_fail(err, MF_EFORMAT, "%s: sequence %s: tensors missing", r->dir, r->seqs[s].id);
    return MF_OK;
}

static int32_t token_at(const seq_tensors *st, int p) {
    int32_t v;
    memcpy(&v, st->tokens->data + 4 * (size_t)p, 4);
    return v;
}

static uint16_t id_at(const seq_tensors *st, size_t i) {
    uint16_t v;
    memcpy(&v, st->ids->data + 2 * i, 2);
    return v;
}

static void export_jsonl(mf_run *r, size_t s, const seq_tensors *st, FILE *out) {
    const int T = r->seqs[s].length, K = r->top_k, E = r->n_experts, V = r->vocab;
    for (int p = 0; p < T; p++) {
        fputs("{\"seq\": ", out);
        /* ids were validated on input: no quotes, backslashes or control characters need escaping except '"' */
        fputc('"', out);
        for (const char *c = r->seqs[s].id; *c; c++) {
            if (*c == '"') fputc('\\', out);
            fputc(*c, out);
        }
        fprintf(out, "\", \"pos\": %d, \"token\": %d", p, token_at(st, p));
        if (p >= T - r->seqs[s].generated) fputs(", \"generated\": true", out);
        if (st->logits) {
            fputs(", \"logits\": [", out);
            put_row(out, st->logits, (size_t)p * V, V, ',', true);
            fputc(']', out);
        } else if (st->topk_logits) {
            int k = (int)st->topk_logits->shape[1];
            fputs(", \"topk_logits\": [", out);
            put_row(out, st->topk_logits, (size_t)p * k, k, ',', true);
            fputs("], \"topk_tokens\": [", out);
            for (int i = 0; i < k; i++) {
                int32_t v;
                memcpy(&v, st->topk_tokens->data + 4 * ((size_t)p * k + i), 4);
                fprintf(out, i ? ",%d" : "%d", v);
            }
            fputs("], \"logsumexp\": ", out);
            put_num(out, mf_load_as_f64(st->lse->data, st->lse->dtype, (size_t)p), st->lse->dtype, true);
        }
        if (r->n_moe) {
            fputs(", \"layers\": [", out);
            for (int m = 0; m < r->n_moe; m++) {
                size_t slot = ((size_t)m * T + p);
                fprintf(out, "%s{\"layer\": %d, \"experts\": [", m ? ", " : "", r->moe_layers[m]);
                for (int i = 0; i < K; i++) fprintf(out, i ? ",%u" : "%u", id_at(st, slot * K + i));
                fputc(']', out);
                /* an imported capture without weights or scores: the keys are left out */
                if (st->w) {
                    fputs(", \"weights\": [", out);
                    put_row(out, st->w, slot * K, K, ',', true);
                    fputc(']', out);
                }
                if (st->router) {
                    fputs(", \"router_logits\": [", out);
                    put_row(out, st->router, slot * E, E, ',', true);
                    fputc(']', out);
                }
                if (st->shared) {
                    fputs(", \"shared_gate\": ", out);
                    put_num(out, mf_load_as_f64(st->shared->data, st->shared->dtype, slot), st->shared->dtype, true);
                }
                fputc('}', out);
            }
            fputc(']', out);
        }
        fputs("}\n", out);
    }
}

/* CSV: one row per (sequence, position, MoE layer); lists joined with ';'.
 * Dense models give one row per position with an empty layer. Logits are not
 * in the CSV (use JSON lines for them). */
static void export_csv(mf_run *r, size_t s, const seq_tensors *st, FILE *out) {
    const int T = r->seqs[s].length, K = r->top_k, E = r->n_experts;
    /* a run that generated has one more column: whether the position's token was generated */
    const bool gen_col = r->max_new_tokens > 0;
    for (int p = 0; p < T; p++) {
        const char *gen = !gen_col ? "" : p >= T - r->seqs[s].generated ? ",true" : ",false";
        if (!r->n_moe) {
            put_csv_field(out, r->seqs[s].id);
            fprintf(out, ",%d,%d,,,,,%s\n", p, token_at(st, p), gen);
            continue;
        }
        for (int m = 0; m < r->n_moe; m++) {
            size_t slot = (size_t)m * T + p;
            put_csv_field(out, r->seqs[s].id);
            fprintf(out, ",%d,%d,%d,", p, token_at(st, p), r->moe_layers[m]);
            for (int i = 0; i < K; i++) fprintf(out, i ? ";%u" : "%u", id_at(st, slot * K + i));
            fputc(',', out);
            if (st->w) put_row(out, st->w, slot * K, K, ';', false);   /* empty where an import lacks them */
            fputc(',', out);
            if (st->router) put_row(out, st->router, slot * E, E, ';', false);
            fputc(',', out);
            if (st->shared) put_num(out, mf_load_as_f64(st->shared->data, st->shared->dtype, slot), st->shared->dtype, false);
            fputs(gen, out);
            fputc('\n', out);
        }
    }
}

int mf_run_export(mf_run *r, mf_export_format fmt, FILE *out, mf_error *err) {
    if (fmt == MF_EXPORT_CSV)
        fputs(r->max_new_tokens > 0 ? "seq,pos,token,layer,experts,weights,router_logits,shared_gate,generated\n"
                                    : "seq,pos,token,layer,experts,weights,router_logits,shared_gate\n", out);
    for (size_t s = 0; s < r->n_seqs; s++) {
        seq_tensors st;
        int rc = get_all(r, s, &st, err);
        if (rc) return rc;
        if (fmt == MF_EXPORT_JSONL) export_jsonl(r, s, &st, out);
        else export_csv(r, s, &st, out);
    }
    if (ferror(out)) return mf_fail(err, MF_EIO, "exporting %s: writing failed: %s", r->dir, strerror(errno ? errno : EIO));
    return MF_OK;
}
