/* Multiple-choice items scored as lm-evaluation-harness scores a
 * loglikelihood request: the sum of the log-probabilities of the choice's
 * tokens, each given the prompt and the choice's tokens before it.
 *
 * The log-probabilities are computed in double from the logits rounded to
 * the head's dtype (what the model hands over, as a run records them): the
 * harness takes log_softmax of the model's own logits, which in a bf16
 * model rounds the log-probabilities too; here only the logits are rounded,
 * so two choices whose sums differ in the last bf16 bit are still told
 * apart, and every run is scored the same way. */
#include "mf_trace.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* log softmax(row)[tok] in double over the logits rounded to the head's dtype; NaN where one is NaN. greedy
 * says whether tok is the row's argmax (the lower id of equal values, as torch.argmax). */
static double token_logprob(const mf_seq_result *r, int row, int32_t tok, mf_dtype head, bool *greedy) {
    const int V = r->V;
    double mx = -INFINITY;
    int arg = -1;
    double *x = mf_xmalloc((size_t)V * sizeof *x);
    for (int j = 0; j < V; j++) {
        const size_t i = (size_t)row * V + j;
        x[j] = mf_round_to(head, r->logits ? r->logits[i] : mf_load_as_f64(r->logits_raw, r->logits_raw_dtype, i));
        if (isnan(x[j])) {
            free(x);
            *greedy = false;
            return NAN;
        }
        if (arg < 0 || x[j] > mx) mx = x[j], arg = j;
    }
    double lp;
    if (isinf(mx)) {   /* an infinite logit: it alone has all the probability */
        lp = x[tok] == mx ? 0.0 : -INFINITY;
    } else {
        double sum = 0;
        for (int j = 0; j < V; j++) sum += exp(x[j] - mx);
        lp = x[tok] - mx - log(sum);
    }
    *greedy = arg == tok;
    free(x);
    return lp;
}

/* The CPU's way: the prompt once into a key-value-cache session, then each choice one token at a time from
 * the prompt's end, the cache rewound between choices. The session's results are the one pass's bits (its
 * test proves it), so the scores are those of a forward of prompt + choice, at a fraction of the work. */
static int score_cpu_session(mf_prompt *p, int P, const mf_model *m, const mf_run_opts *ro, mf_dtype head, int max_n,
                             mf_error *err) {
    mf_cpu_session *s;
    int rc = mf_cpu_session_open(&s, m, ro, P + max_n, err);
    if (rc) return rc;
    mf_seq_result last;   /* the prompt's results; its last row predicts every choice's first token */
    memset(&last, 0, sizeof last);
    if ((rc = mf_cpu_session_forward(s, p->tokens, P, &last, err))) {
        mf_cpu_session_close(s);
        return rc;
    }
    for (int k = 0; k < p->n_choices && !rc; k++) {
        mf_choice *c = &p->choices[k];
        bool g, all_greedy = true;
        double sum = token_logprob(&last, P - 1, c->tokens[0], head, &g);
        all_greedy &= g;
        if ((rc = mf_cpu_session_rewind(s, P, err))) break;
        for (int t = 1; t < c->n && !rc; t++) {
            mf_seq_result r;
            if ((rc = mf_cpu_session_forward(s, &c->tokens[t - 1], 1, &r, err))) {
                mf_fail_wrap(err, "choice %d", k);
                break;
            }
            sum += token_logprob(&r, 0, c->tokens[t], head, &g);
            all_greedy &= g;
            mf_seq_result_free(&r);
        }
        c->logprob = sum;
        c->greedy = all_greedy && !isnan(sum);
    }
    mf_seq_result_free(&last);
    mf_cpu_session_close(s);
    return rc;
}

int mf_choices_score(mf_prompt *p, const mf_model *m, const mf_run_opts *ro, mf_gpu *gpu, mf_error *err) {
    const int P = p->T - p->generated;   /* the choices follow the prompt, not what was generated after it */
    int max_n = 0;
    for (int k = 0; k < p->n_choices; k++) max_n = p->choices[k].n > max_n ? p->choices[k].n : max_n;
    const mf_dtype head = ro->prec.part[MF_PART_HEAD];
    mf_run_opts plain = *ro;
    plain.record_router_in = false;   /* only the logits are wanted */
    /* The session computes fewer rows, but each decode step reads the weights once more, where one pass per
     * choice reads them once for all its rows: it is taken when it reads them no more often (choices of one or
     * two tokens, such as answer letters after a long prompt). Dynamic NTK scaling makes a position's
     * frequencies depend on the whole length: one pass per choice there. */
    int steps = 1;
    for (int k = 0; k < p->n_choices; k++) steps += p->choices[k].n - 1;
    if (!gpu && m->cfg.rope.type != MF_ROPE_DYNAMIC && steps <= p->n_choices)
        return score_cpu_session(p, P, m, &plain, head, max_n, err);
    int32_t *seq = mf_xmalloc(((size_t)P + (size_t)max_n) * sizeof *seq);
    memcpy(seq, p->tokens, (size_t)P * sizeof *seq);
    int rc = MF_OK;
    for (int k = 0; k < p->n_choices && !rc; k++) {
        mf_choice *c = &p->choices[k];
        memcpy(seq + P, c->tokens, (size_t)c->n * sizeof *seq);
        mf_seq_result r;
        memset(&r, 0, sizeof r);
        rc = gpu ? mf_gpu_forward(gpu, seq, P + c->n, 0, &r, err) : mf_forward_cpu(m, &plain, seq, P + c->n, &r, err);
        if (!rc && gpu) r.logits_raw = mf_gpu_host_logits(gpu, &r.logits_raw_dtype);
        if (rc) {
            mf_fail_wrap(err, "choice %d", k);
            break;
        }
        double sum = 0;
        bool all_greedy = true;
        for (int t = 0; t < c->n; t++) {
            bool g;
            sum += token_logprob(&r, P + t - 1, c->tokens[t], head, &g);
            all_greedy &= g;
        }
        c->logprob = sum;
        c->greedy = all_greedy && !isnan(sum);
        mf_seq_result_free(&r);
    }
    free(seq);
    return rc;
}

