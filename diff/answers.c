/* Multiple-choice answers compared: whether the target picks the choice the
 * reference picks (answer_agreement_pct), each run's accuracy against the
 * items' answers (accuracy_pct), and the items whose prediction changed, with
 * the case-level bootstrap of every other metric. A case takes part when both
 * runs scored the same choices for it. */
#include "diff_int.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int diff_answers_case(mf_case *c, const mf_run_choices *r, const mf_run_choices *t, const char *ref_name,
                      const char *tgt_name, mf_error *err) {
    if (!r && !t) return MF_OK;
    /* one run scored the item and the other did not: a target traced from another input */
    if (!r || !t)
        return mf_fail(err, MF_EMISMATCH, "sequence %s: choices are scored in %s, not in %s", c->id, r ? ref_name : tgt_name,
                       r ? tgt_name : ref_name);
    bool same = r->n == t->n && r->answer == t->answer;
    for (int k = 0; same && k < r->n; k++)
        same = r->v[k].n == t->v[k].n && !memcmp(r->v[k].tokens, t->v[k].tokens, (size_t)r->v[k].n * sizeof(int32_t));
    if (!same)
        return mf_fail(err, MF_EMISMATCH, "sequence %s: its choices (or answer) differ between %s and %s", c->id, ref_name,
                       tgt_name);
    c->answers = true;
    c->answer = r->answer;
    c->pred_ref = r->predicted;
    c->pred_tgt = t->predicted;
    c->n_choices = r->n;
    /* how far the reference's pick led: its score less the best other (NaN when a score is) */
    double best_other = -INFINITY;
    for (int k = 0; k < r->n; k++)
        if (k != r->predicted && r->v[k].logprob > best_other) best_other = r->v[k].logprob;
    c->answer_margin_ref = r->predicted >= 0 ? r->v[r->predicted].logprob - best_other : NAN;
    c->logprob_ref = r->predicted >= 0 ? r->v[r->predicted].logprob : NAN;
    c->logprob_tgt = r->predicted >= 0 ? t->v[r->predicted].logprob : NAN;
    return MF_OK;
}

typedef enum { A_AGREEMENT, A_ACCURACY_REF, A_ACCURACY_TGT } answer_metric;

typedef struct actx {
    const mf_diff_acc *a;
    answer_metric m;
} actx;

/* The metric over the cases idx[0..n) (all when idx is NULL): a percentage of the items that take part (both
 * predictions made for agreement; an answer given and the run's prediction made for accuracy); NaN where none. */
static double over(const mf_diff_acc *a, answer_metric m, const int *idx, size_t n) {
    int64_t num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        const mf_case *c = &a->cases[idx ? (size_t)idx[i] : i];
        if (!c->answers) continue;
        switch (m) {
        case A_AGREEMENT:
            if (c->pred_ref >= 0 && c->pred_tgt >= 0) num += c->pred_ref == c->pred_tgt, den++;
            break;
        case A_ACCURACY_REF:
            if (c->answer >= 0 && c->pred_ref >= 0) num += c->pred_ref == c->answer, den++;
            break;
        case A_ACCURACY_TGT:
            if (c->answer >= 0 && c->pred_tgt >= 0) num += c->pred_tgt == c->answer, den++;
            break;
        }
    }
    return den ? 100.0 * (double)num / (double)den : NAN;
}

static double f_answer(const void *p, const int *idx, size_t n) {
    const actx *c = p;
    return over(c->a, c->m, idx, n);
}

static json_t *pred_json(int p) { return p >= 0 ? json_integer(p) : json_null(); }

json_t *diff_answers_json(const mf_diff_acc *a, const int *plan, int B) {
    size_t items = 0, with_answer = 0, unscored_ref = 0, unscored_tgt = 0;
    for (size_t i = 0; i < a->n_cases; i++) {
        const mf_case *c = &a->cases[i];
        if (!c->answers) continue;
        items++;
        with_answer += c->answer >= 0;
        unscored_ref += c->pred_ref < 0;
        unscored_tgt += c->pred_tgt < 0;
    }
    if (!items) return NULL;
    json_t *o = json_object();
    json_object_set_new(o, "items", json_integer((json_int_t)items));
    json_object_set_new(o, "items_with_answer", json_integer((json_int_t)with_answer));
    /* a NaN score leaves no prediction: such an item is left out of the numbers that need it, and counted here */
    json_object_set_new(o, "unscored", json_pack("{s:I,s:I}", "reference", (json_int_t)unscored_ref, "target",
                                                 (json_int_t)unscored_tgt));
    static const struct {
        const char *key;
        answer_metric m;
    } ms[] = {{"answer_agreement_pct", A_AGREEMENT}, {"reference", A_ACCURACY_REF}, {"target", A_ACCURACY_TGT}};
    json_t *acc = json_object();
    for (size_t i = 0; i < 3; i++) {
        actx ctx = {a, ms[i].m};
        double ci[2];
        diff_ci(f_answer, &ctx, plan, a->n_cases, B, ci);
        json_t *v = diff_value_ci(over(a, ms[i].m, NULL, a->n_cases), ci);
        if (ms[i].m == A_AGREEMENT) json_object_set_new(o, ms[i].key, v);
        else json_object_set_new(acc, ms[i].key, v);
    }
    json_object_set_new(o, "accuracy_pct", acc);
    /* the items whose pick changed, the reference's closest calls first */
    json_t *changed = json_array();
    for (size_t i = 0; i < a->n_cases; i++) {
        const mf_case *c = &a->cases[i];
        if (!c->answers || c->pred_ref == c->pred_tgt) continue;
        json_t *e = json_pack("{s:s,s:o,s:o,s:o}", "id", c->id, "answer", pred_json(c->answer), "reference",
                              pred_json(c->pred_ref), "target", pred_json(c->pred_tgt));
        json_object_set_new(e, "reference_margin", isfinite(c->answer_margin_ref) ? json_real(c->answer_margin_ref) : json_null());
        json_array_append_new(changed, e);
    }
    json_object_set_new(o, "changed", changed);
    return o;
}

void diff_answers_summary(FILE *out, const mf_diff_acc *a) {
    size_t items = 0, changed = 0;
    for (size_t i = 0; i < a->n_cases; i++) {
        const mf_case *c = &a->cases[i];
        items += c->answers;
        changed += c->answers && c->pred_ref != c->pred_tgt;
    }
    if (!items) return;
    fprintf(out, "  multiple-choice answers (%zu items, %zu changed)\n", items, changed);
    static const char *const names[] = {"answer_agreement_pct", "accuracy_pct (reference)", "accuracy_pct (target)"};
    for (int m = 0; m < 3; m++) {
        const double v = over(a, (answer_metric)m, NULL, a->n_cases);
        if (isfinite(v)) fprintf(out, "  %-40s %.6g\n", names[m], v);
        else fprintf(out, "  %-40s null (no item to count)\n", names[m]);
    }
}
