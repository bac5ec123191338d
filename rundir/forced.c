/* A run directory as a trace's input: its sequences, prompt and generated
 * tokens, traced as they stand in one pass (CroVA's teacher forcing: every
 * target sees the reference's response). */
#include "mf_rundir.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int mf_prompts_from_run(mf_prompts *p, mf_generation *forced, const char *run_dir, int vocab, mf_error *err) {
    memset(p, 0, sizeof *p);
    memset(forced, 0, sizeof *forced);
    mf_run *r;
    int rc = mf_run_open(&r, run_dir, err);   /* validated whole: shards, digests, ids within its model */
    if (rc) return rc;
    if (r->vocab != vocab) {
        rc = mf_fail(err, MF_EMISMATCH, "%s: its model has a vocabulary of %d tokens, this one %d", run_dir, r->vocab, vocab);
        goto done;
    }
    if (r->n_seqs == 0) {
        rc = mf_fail(err, MF_EINVAL, "%s: no sequences", run_dir);
        goto done;
    }
    /* the input's digest: over the ids and tokens (what is traced), so that --resume knows the same input */
    mf_buf all = {0};
    p->seq = mf_xcalloc(r->n_seqs, sizeof *p->seq);
    for (size_t i = 0; i < r->n_seqs && !rc; i++) {
        const mf_st_tensor *t;
        if ((rc = mf_run_tensor(r, i, "tokens", &t, err))) break;
        if (!t) {
            rc = mf_fail(err, MF_EFORMAT, "%s: sequence %s has no tokens", run_dir, r->seqs[i].id);
            break;
        }
        mf_prompt *s = &p->seq[p->n++];
        s->id = mf_xstrdup(r->seqs[i].id);
        s->T = r->seqs[i].length;
        s->generated = r->seqs[i].generated;
        s->tokens = mf_xmalloc((size_t)s->T * sizeof *s->tokens);
        memcpy(s->tokens, t->data, (size_t)s->T * sizeof *s->tokens);
        for (int k = 0; k < s->T; k++)
            if (s->tokens[k] < 0 || s->tokens[k] >= vocab) {
                rc = mf_fail(err, MF_EFORMAT, "%s: sequence %s, position %d: token %d outside the vocabulary", run_dir,
                             s->id, k, s->tokens[k]);
                break;
            }
        /* a multiple-choice item keeps its choices and answer: every target scores the same ones */
        s->answer = -1;
        const mf_run_choices *rc_ = r->seqs[i].choices;
        if (rc_) {
            s->n_choices = rc_->n;
            s->answer = rc_->answer;
            s->choices = mf_xcalloc((size_t)rc_->n, sizeof *s->choices);
            for (int k = 0; k < rc_->n; k++) {
                s->choices[k].n = rc_->v[k].n;
                s->choices[k].logprob = NAN;
                s->choices[k].tokens = mf_xmalloc((size_t)rc_->v[k].n * sizeof(int32_t));
                memcpy(s->choices[k].tokens, rc_->v[k].tokens, (size_t)rc_->v[k].n * sizeof(int32_t));
            }
        }
        mf_buf_put(&all, s->id, strlen(s->id) + 1);
        mf_buf_put(&all, s->tokens, (size_t)s->T * sizeof *s->tokens);
        for (int k = 0; k < s->n_choices; k++) {   /* the choices are input too */
            const char mark = k == s->answer ? 'A' : 'C';
            mf_buf_put(&all, &mark, 1);
            mf_buf_put(&all, s->choices[k].tokens, (size_t)s->choices[k].n * sizeof(int32_t));
        }
    }
    if (!rc) {
        mf_digest_buffer(all.s, all.n, p->digest);
        if (r->max_new_tokens > 0) {
            forced->max_new_tokens = r->max_new_tokens;
            forced->forced = true;
            snprintf(forced->eos_source, sizeof forced->eos_source, "none");
        }
    }
    mf_buf_free(&all);
done:
    mf_run_close(r);
    if (rc) mf_prompts_free(p);
    return rc;
}
