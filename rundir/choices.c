/* Multiple-choice items as prompt files give them (a line's "choices" and
 * "answer") and as a run's manifest records them (the choices' tokens, their
 * scores, the prediction: the highest score), checked on the way back in.
 * trace/score.c computes the scores. */
#include "mf_rundir.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static void choices_free(mf_choice *v, int n) {
    for (int i = 0; v && i < n; i++) free(v[i].tokens);
    free(v);
}

/* A choice given as a list of token ids. */
static int choice_tokens(mf_choice *c, json_t *arr, int vocab, const char *where, int k, mf_error *err) {
    const size_t n = json_array_size(arr);
    if (n == 0 || n > (size_t)MF_MAX_SEQ_TOKENS)
        return mf_fail(err, MF_EINVAL, "%s: choice %d must hold 1 to %d tokens", where, k, MF_MAX_SEQ_TOKENS);
    c->tokens = mf_xmalloc(n * sizeof *c->tokens);
    c->n = (int)n;
    for (size_t t = 0; t < n; t++) {
        json_t *v = json_array_get(arr, t);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= vocab)
            return mf_fail(err, MF_EINVAL, "%s: choice %d, token %zu: not a token id in [0, %d)", where, k, t, vocab);
        c->tokens[t] = (int32_t)json_integer_value(v);
    }
    return MF_OK;
}

/* A choice given as text: what encoding prompt + choice adds after the prompt's own tokens. */
static int choice_text(mf_choice *c, json_t *text, const char *prompt, size_t prompt_len, int vocab, mf_tokenizer *tok,
                       const char *where, int k, mf_error *err) {
    if (!tok) return mf_fail(err, MF_EINVAL, "%s: choice %d is a text, and the model has no tokenizer.json to encode it", where, k);
    const size_t cl = json_string_length(text);
    if (cl > MF_MAX_TEXT_BYTES || prompt_len > MF_MAX_TEXT_BYTES)
        return mf_fail(err, MF_EINVAL, "%s: choice %d: a text of more than %d bytes", where, k, MF_MAX_TEXT_BYTES);
    char *whole = mf_xmalloc(prompt_len + cl + 1);
    if (prompt_len) memcpy(whole, prompt, prompt_len);
    memcpy(whole + prompt_len, json_string_value(text), cl + 1);
    int32_t *all = NULL, *ctx = NULL;
    size_t n_all = 0, n_ctx = 0;
    int rc = mf_tokenizer_encode(tok, whole, prompt_len + cl, false, &all, &n_all, err);
    if (!rc && prompt_len) rc = mf_tokenizer_encode(tok, prompt, prompt_len, false, &ctx, &n_ctx, err);
    free(whole);
    if (rc) {
        free(all);
        free(ctx);
        return mf_fail_wrap(err, "%s: choice %d: encoding it", where, k);
    }
    free(ctx);
    /* the harness slices the whole's tokens at the prompt's count, whether or not a merge crossed the seam */
    if (n_all <= n_ctx) {
        free(all);
        return mf_fail(err, MF_EINVAL, "%s: choice %d adds no token after the prompt", where, k);
    }
    if (n_all - n_ctx > (size_t)MF_MAX_SEQ_TOKENS) {
        free(all);
        return mf_fail(err, MF_EINVAL, "%s: choice %d encodes to more than %d tokens", where, k, MF_MAX_SEQ_TOKENS);
    }
    c->n = (int)(n_all - n_ctx);
    c->tokens = mf_xmalloc((size_t)c->n * sizeof *c->tokens);
    memcpy(c->tokens, all + n_ctx, (size_t)c->n * sizeof *c->tokens);
    free(all);
    for (int t = 0; t < c->n; t++)
        if (c->tokens[t] >= vocab)
            return mf_fail(err, MF_EINVAL, "%s: choice %d encodes to token id %d, outside the model's vocabulary [0, %d)", where,
                           k, c->tokens[t], vocab);
    return MF_OK;
}

int mf_choices_parse(mf_prompt *s, json_t *line, const char *prompt_text, size_t prompt_len, int vocab,
                     mf_tokenizer *tok, const char *where, mf_error *err) {
    json_t *choices = json_object_get(line, "choices"), *answer = json_object_get(line, "answer");
    s->answer = -1;
    if (!choices) {
        if (answer) return mf_fail(err, MF_EINVAL, "%s: an \"answer\" without \"choices\"", where);
        return MF_OK;
    }
    if (!json_is_array(choices) || json_array_size(choices) < 2 || json_array_size(choices) > MF_MAX_CHOICES)
        return mf_fail(err, MF_EINVAL, "%s: \"choices\" must be an array of 2 to %d texts or token lists", where, MF_MAX_CHOICES);
    const int n = (int)json_array_size(choices);
    mf_choice *v = mf_xcalloc((size_t)n, sizeof *v);
    int rc = MF_OK;
    for (int k = 0; k < n && !rc; k++) {
        json_t *c = json_array_get(choices, (size_t)k);
        v[k].logprob = NAN;
        if (json_is_string(c)) {
            if (strlen(json_string_value(c)) != json_string_length(c))
                rc = mf_fail(err, MF_EINVAL, "%s: choice %d holds a NUL character", where, k);
            else
                rc = choice_text(&v[k], c, prompt_text, prompt_text ? prompt_len : 0, vocab, tok, where, k, err);
        } else if (json_is_array(c)) {
            rc = choice_tokens(&v[k], c, vocab, where, k, err);
        } else {
            rc = mf_fail(err, MF_EINVAL, "%s: choice %d must be a text or a list of token ids", where, k);
        }
        if (!rc && (int64_t)s->T + v[k].n > MF_MAX_SEQ_TOKENS)
            rc = mf_fail(err, MF_EINVAL, "%s: choice %d: the prompt and the choice hold more than %d tokens", where, k,
                         MF_MAX_SEQ_TOKENS);
    }
    if (!rc && answer) {
        if (!json_is_integer(answer) || json_integer_value(answer) < 0 || json_integer_value(answer) >= n)
            rc = mf_fail(err, MF_EINVAL, "%s: \"answer\" must be the index of a choice, 0 to %d", where, n - 1);
        else
            s->answer = (int)json_integer_value(answer);
    }
    if (rc) {
        choices_free(v, n);
        s->answer = -1;
        return rc;
    }
    s->choices = v;
    s->n_choices = n;
    return MF_OK;
}

int mf_choices_predicted(const mf_choice *c, int n) {
    int best = -1;
    for (int k = 0; k < n; k++) {
        if (isnan(c[k].logprob)) return -1;
        if (best < 0 || c[k].logprob > c[best].logprob) best = k;
    }
    return best;
}

json_t *mf_choices_json(const mf_prompt *p) {
    if (!p->n_choices) return NULL;
    json_t *o = json_object(), *toks = json_array(), *lps = json_array(), *greedy = json_array();
    for (int k = 0; k < p->n_choices; k++) {
        const mf_choice *c = &p->choices[k];
        json_t *t = json_array();
        for (int i = 0; i < c->n; i++) json_array_append_new(t, json_integer(c->tokens[i]));
        json_array_append_new(toks, t);
        /* a NaN score is written null, and so is the prediction it leaves */
        json_array_append_new(lps, isfinite(c->logprob) || c->logprob == -INFINITY
                                       ? (isfinite(c->logprob) ? json_real(c->logprob) : json_string("-inf"))
                                       : json_null());
        json_array_append_new(greedy, json_boolean(c->greedy));
    }
    json_object_set_new(o, "tokens", toks);
    json_object_set_new(o, "logprob", lps);
    json_object_set_new(o, "greedy", greedy);
    const int pred = mf_choices_predicted(p->choices, p->n_choices);
    json_object_set_new(o, "predicted", pred >= 0 ? json_integer(pred) : json_null());
    json_object_set_new(o, "answer", p->answer >= 0 ? json_integer(p->answer) : json_null());
    return o;
}

void mf_run_choices_free(mf_run_choices *c) {
    if (!c) return;
    choices_free(c->v, c->n);
    free(c);
}

int mf_choices_from_json(mf_run_choices *out, json_t *o, int vocab, const char *where, mf_error *err) {
    memset(out, 0, sizeof *out);
    json_t *toks = json_object_get(o, "tokens"), *lps = json_object_get(o, "logprob"), *gr = json_object_get(o, "greedy");
    json_t *pred = json_object_get(o, "predicted"), *ans = json_object_get(o, "answer");
    const size_t n = json_array_size(toks);
    if (!json_is_object(o) || !json_is_array(toks) || n < 2 || n > MF_MAX_CHOICES || !json_is_array(lps) ||
        json_array_size(lps) != n || !json_is_array(gr) || json_array_size(gr) != n)
        return mf_fail(err, MF_EFORMAT, "%s: choices must hold tokens, logprob and greedy for 2 to %d choices", where,
                       MF_MAX_CHOICES);
    out->n = (int)n;
    out->v = mf_xcalloc(n, sizeof *out->v);
    for (size_t k = 0; k < n; k++) {
        mf_choice *c = &out->v[k];
        json_t *lp = json_array_get(lps, k);
        if (json_is_number(lp) && json_number_value(lp) <= 0) c->logprob = json_number_value(lp);
        else if (json_is_string(lp) && !strcmp(json_string_value(lp), "-inf")) c->logprob = -INFINITY;
        else if (json_is_null(lp)) c->logprob = NAN;
        else return mf_fail(err, MF_EFORMAT, "%s: choice %zu: logprob must be a number <= 0, \"-inf\" or null", where, k);
        if (!json_is_boolean(json_array_get(gr, k))) return mf_fail(err, MF_EFORMAT, "%s: choice %zu: greedy must be a boolean", where, k);
        c->greedy = json_is_true(json_array_get(gr, k));
        if (choice_tokens(c, json_array_get(toks, k), vocab, where, (int)k, err)) return MF_EFORMAT;
    }
    out->answer = -1;
    if (ans && !json_is_null(ans)) {
        if (!json_is_integer(ans) || json_integer_value(ans) < 0 || json_integer_value(ans) >= (json_int_t)n)
            return mf_fail(err, MF_EFORMAT, "%s: answer must be a choice's index, 0 to %zu, or null", where, n - 1);
        out->answer = (int)json_integer_value(ans);
    }
    /* the recorded prediction must be the one its scores make: a reader trusts one or the other, never both */
    out->predicted = mf_choices_predicted(out->v, out->n);
    const bool null_pred = !pred || json_is_null(pred);
    if (null_pred ? out->predicted >= 0 : !json_is_integer(pred) || json_integer_value(pred) != out->predicted)
        return mf_fail(err, MF_EFORMAT, "%s: predicted is %s, its scores make it %d", where,
                       null_pred ? "null" : "another", out->predicted);
    return MF_OK;
}
