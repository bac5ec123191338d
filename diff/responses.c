/* Generated responses compared as tokens: CroVA's generation metrics with
 * the case-level bootstrap of every other metric. A case takes part when
 * both runs generated their own response after the same prompt. */
#include "diff_int.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static int cmp_int(const void *a, const void *b) {
    const int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

typedef enum { R_EQUAL, R_FIRST_DIVERGENCE, R_AGREEMENT } response_metric;

typedef struct rctx {
    const mf_diff_acc *a;
    response_metric m;
} rctx;

/* The metric over the cases idx[0..n) (all cases when idx is NULL); NaN where no case has responses. */
static double over(const mf_diff_acc *a, response_metric m, const int *idx, size_t n) {
    int64_t num = 0, den = 0;
    int *firsts = m == R_FIRST_DIVERGENCE ? mf_xmalloc((n + 1) * sizeof *firsts) : NULL;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        const mf_case *c = &a->cases[idx ? (size_t)idx[i] : i];
        if (!c->responses) continue;
        const int shorter = c->response_ref < c->response_tgt ? c->response_ref : c->response_tgt;
        switch (m) {
        case R_EQUAL: num += c->response_equal, den++; break;
        case R_AGREEMENT: num += c->response_agree, den += shorter; break;
        case R_FIRST_DIVERGENCE: firsts[k++] = c->first_divergence; break;
        }
    }
    double v = NAN;
    if (m == R_FIRST_DIVERGENCE) {
        if (k) {   /* the median, the mean of the middle two for an even count (numpy's) */
            qsort(firsts, k, sizeof *firsts, cmp_int);
            v = k % 2 ? firsts[k / 2] : 0.5 * (firsts[k / 2 - 1] + firsts[k / 2]);
        }
        free(firsts);
    } else if (den > 0) {
        v = 100.0 * (double)num / (double)den;
    }
    return v;
}

static double f_response(const void *p, const int *idx, size_t n) {
    const rctx *c = p;
    return over(c->a, c->m, idx, n);
}

json_t *diff_responses_json(const mf_diff_acc *a, const int *plan, int B) {
    size_t cases = 0;
    int64_t ref_tokens = 0, tgt_tokens = 0, compared = 0, excluded = 0;
    for (size_t i = 0; i < a->n_cases; i++) {
        const mf_case *c = &a->cases[i];
        if (!c->responses) continue;
        cases++;
        ref_tokens += c->response_ref;
        tgt_tokens += c->response_tgt;
        compared += c->first_divergence;
        excluded += c->response_ref - c->first_divergence;
    }
    if (!cases) return NULL;
    json_t *o = json_object();
    json_object_set_new(o, "sequences", json_integer((json_int_t)cases));
    static const struct {
        const char *name;
        response_metric m;
    } ms[] = {{"response_equal_pct", R_EQUAL},
              {"first_divergence_median", R_FIRST_DIVERGENCE},
              {"generated_token_agreement_pct", R_AGREEMENT}};
    for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++) {
        rctx ctx = {a, ms[i].m};
        double ci[2];
        diff_ci(f_response, &ctx, plan, a->n_cases, B, ci);
        json_object_set_new(o, ms[i].name, diff_value_ci(over(a, ms[i].m, NULL, a->n_cases), ci));
    }
    json_object_set_new(o, "generated_tokens", json_pack("{s:I,s:I}", "reference", (json_int_t)ref_tokens, "target",
                                                         (json_int_t)tgt_tokens));
    /* routing and logits are compared up to each response's first divergence: from there the inputs differ */
    json_object_set_new(o, "generated_positions_compared", json_integer((json_int_t)compared));
    json_object_set_new(o, "generated_positions_not_compared", json_integer((json_int_t)excluded));
    json_t *seqs = json_array();
    for (size_t i = 0; i < a->n_cases; i++) {
        const mf_case *c = &a->cases[i];
        if (!c->responses) continue;
        json_array_append_new(seqs, json_pack("{s:s,s:i,s:i,s:i,s:i,s:b}", "id", c->id, "prompt_length", c->prompt_len,
                                              "response_reference", c->response_ref, "response_target", c->response_tgt,
                                              "first_divergence", c->first_divergence, "equal", c->response_equal));
    }
    json_object_set_new(o, "per_sequence", seqs);
    return o;
}

void diff_responses_summary(FILE *out, const mf_diff_acc *a) {
    size_t cases = 0;
    for (size_t i = 0; i < a->n_cases; i++) cases += a->cases[i].responses;
    if (!cases) return;
    fprintf(out, "  generated responses (%zu sequences)\n", cases);
    static const char *const names[] = {"response_equal_pct", "first_divergence_median", "generated_token_agreement_pct"};
    for (int m = 0; m < 3; m++) {
        const double v = over(a, (response_metric)m, NULL, a->n_cases);
        if (isfinite(v)) fprintf(out, "  %-40s %.6g\n", names[m], v);
        else fprintf(out, "  %-40s null (no response to compare)\n", names[m]);
    }
}

/* ids[0..n) as text through the tokenizer's decoder, as a JSON string: bytes that are not UTF-8 (a character
 * cut where a response parts) become U+FFFD, so that the string is always one jansson takes. */
static json_t *text_json(const mf_tokenizer *tk, const int32_t *ids, size_t n) {
    char *text = NULL;
    size_t len = 0;
    if (mf_tokenizer_decode_text(tk, ids, n, false, &text, &len, NULL)) return json_null();
    char *clean = mf_xmalloc(len * 3 + 1);
    size_t k = 0;
    for (size_t i = 0; i < len;) {
        const int l = mf_utf8_char((const unsigned char *)text + i, len - i);
        if (l > 0 && !(l == 1 && text[i] == 0)) {
            memcpy(clean + k, text + i, (size_t)l);
            k += (size_t)l;
            i += (size_t)l;
        } else {
            memcpy(clean + k, "\xef\xbf\xbd", 3);
            k += 3;
            i++;
        }
    }
    json_t *s = json_stringn(clean, k);
    free(clean);
    free(text);
    return s ? s : json_null();
}

static int seq_index(const mf_run *r, const char *id) {
    for (size_t i = 0; i < r->n_seqs; i++)
        if (!strcmp(r->seqs[i].id, id)) return (int)i;
    return -1;
}

/* The tokens of sequence id of run r (borrowed from its shard) and their count; NULL when it has none. */
static const int32_t *seq_tokens(mf_run *r, const char *id, int *n) {
    const int i = seq_index(r, id);
    const mf_st_tensor *t;
    if (i < 0 || mf_run_tensor(r, (size_t)i, "tokens", &t, NULL) || !t) return NULL;
    *n = r->seqs[i].length;
    return (const int32_t *)(const void *)t->data;
}

void diff_texts_add(json_t *target, mf_run *ref, mf_run *tgt, const mf_tokenizer *tk) {
    size_t i;
    json_t *e;
    /* each response: the prompt, what both runs generated alike, and where each went after they parted */
    json_array_foreach(json_object_get(json_object_get(target, "responses"), "per_sequence"), i, e) {
        const char *id = json_string_value(json_object_get(e, "id"));
        int nr = 0, nt = 0;
        const int32_t *a = seq_tokens(ref, id, &nr), *b = seq_tokens(tgt, id, &nt);
        if (!a || !b) continue;
        const int P = (int)json_integer_value(json_object_get(e, "prompt_length"));
        const int d = (int)json_integer_value(json_object_get(e, "first_divergence"));
        if (P < 0 || d < 0 || P + d > nr || P + d > nt) continue;
        json_object_set_new(e, "prompt_text", text_json(tk, a, (size_t)P));
        json_object_set_new(e, "common_text", text_json(tk, a + P, (size_t)d));
        json_object_set_new(e, "reference_rest", text_json(tk, a + P + d, (size_t)(nr - P - d)));
        json_object_set_new(e, "target_rest", text_json(tk, b + P + d, (size_t)(nt - P - d)));
    }
    /* each changed item: its prompt and its choices */
    json_array_foreach(json_object_get(json_object_get(target, "answers"), "changed"), i, e) {
        const char *id = json_string_value(json_object_get(e, "id"));
        const int si = seq_index(ref, id);
        int n = 0;
        const int32_t *a = seq_tokens(ref, id, &n);
        if (si < 0 || !a || !ref->seqs[si].choices) continue;
        const int P = n - ref->seqs[si].generated;
        json_object_set_new(e, "prompt_text", text_json(tk, a, (size_t)P));
        json_t *cs = json_array();
        for (int k = 0; k < ref->seqs[si].choices->n; k++)
            json_array_append_new(cs, text_json(tk, ref->seqs[si].choices->v[k].tokens, (size_t)ref->seqs[si].choices->v[k].n));
        json_object_set_new(e, "choices_text", cs);
    }
}
