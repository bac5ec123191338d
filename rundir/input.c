/* Prompt files: JSON lines {"id": "...", "tokens": [ids]} or {"id": "...", "text": "..."} (encoded with the
 * model's tokenizer.json), validated whole before any computation starts; and text files for `moeflip
 * tokenize`. */
#include "mf_rundir.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

void mf_prompts_free(mf_prompts *p) {
    for (size_t i = 0; i < p->n; i++) {
        free(p->seq[i].id);
        free(p->seq[i].tokens);
        for (int k = 0; k < p->seq[i].n_choices; k++) free(p->seq[i].choices[k].tokens);
        free(p->seq[i].choices);
    }
    free(p->seq);
    memset(p, 0, sizeof *p);
}

bool mf_seq_id_valid(const char *s) {
    size_t n = strlen(s);
    if (n == 0 || n > MF_MAX_SEQ_ID) return false;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x20 || s[i] == '/' || s[i] == '\\' || s[i] == 0x7f) return false;
    for (size_t i = 0; i < n;) {   /* UTF-8, as JSON strings are (a CroVA case's file name need not be) */
        const int len = mf_utf8_char((const unsigned char *)s + i, n - i);
        if (!len) return false;
        i += (size_t)len;
    }
    return true;
}

/* The lines of a JSON-lines file: blank lines are refused except a final newline. */
typedef struct lines {
    const char *path;
    char *text, *cur;
    size_t len;
    int lineno;
} lines;

/* 1 with the next line, 0 at the end, < 0 on a blank line inside the file */
static int next_line(lines *L, const char **line, size_t *n, mf_error *err) {
    if (L->cur >= L->text + L->len) return 0;
    char *nl = memchr(L->cur, '\n', (size_t)(L->text + L->len - L->cur));
    char *end = nl ? nl : L->text + L->len;
    L->lineno++;
    size_t k = (size_t)(end - L->cur);
    if (k && L->cur[k - 1] == '\r') k--;
    bool blank = true;
    for (size_t i = 0; i < k && blank; i++) blank = L->cur[i] == ' ' || L->cur[i] == '\t';
    if (blank) {
        /* a final newline is fine; an empty line inside the file is not */
        if (nl && nl + 1 >= L->text + L->len && k == 0) return 0;
        return mf_fail(err, MF_EINVAL, "%s:%d: empty line", L->path, L->lineno);
    }
    *line = L->cur;
    *n = k;
    L->cur = nl ? nl + 1 : L->text + L->len;
    return 1;
}

/* The line's object and its id (valid as a sequence id). */
static int line_object(const lines *L, const char *line, size_t n, json_t **out, const char **sid, mf_error *err) {
    json_error_t jerr;
    json_t *o = json_loadb(line, n, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &jerr);
    *out = NULL;
    if (!o || !json_is_object(o)) {
        const int rc = mf_fail(err, MF_EINVAL, "%s:%d: not a JSON object%s%s", L->path, L->lineno, o ? "" : ": ", o ? "" : jerr.text);
        json_decref(o);
        return rc;
    }
    json_t *id = json_object_get(o, "id");
    if (!json_is_string(id) || strlen(json_string_value(id)) != json_string_length(id) || !mf_seq_id_valid(json_string_value(id))) {
        json_decref(o);
        return mf_fail(err, MF_EINVAL,
                       "%s:%d: \"id\" must be a non-empty string of at most %d bytes (UTF-8) without '/', '\\' or "
                       "control characters",
                       L->path, L->lineno, MF_MAX_SEQ_ID);
    }
    *sid = json_string_value(id);
    *out = o;
    return MF_OK;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

/* ids must be unique: they name the sequence in the run */
static int unique_ids(const char **ids, size_t n, const char *path, mf_error *err) {
    qsort(ids, n, sizeof *ids, cmp_str);
    for (size_t i = 1; i < n; i++)
        if (strcmp(ids[i - 1], ids[i]) == 0) return mf_fail(err, MF_EINVAL, "%s: sequence id %s appears twice", path, ids[i]);
    return MF_OK;
}

/* The tokenizer, read at the first line that needs it (what names what needs it in messages). */
static int need_tokenizer(const lines *L, const char *sid, const char *what, const char *tok_path, mf_tokenizer **tok,
                          mf_error *err) {
    if (*tok) return MF_OK;
    if (!tok_path)
        return mf_fail(err, MF_EINVAL, "%s:%d: sequence %s has %s, and no tokenizer.json is given to encode it", L->path,
                       L->lineno, sid, what);
    if (!mf_path_exists(tok_path))
        return mf_fail(err, MF_EINVAL, "%s:%d: sequence %s has %s, and %s, which would encode it, does not exist", L->path,
                       L->lineno, sid, what, tok_path);
    const int rc = mf_tokenizer_load(tok, tok_path, err);
    if (rc) return mf_fail_wrap(err, "%s:%d: sequence %s: %s needs the tokenizer", L->path, L->lineno, sid, what);
    return MF_OK;
}

/* Whether a line's choices include a text (they need the tokenizer). */
static bool has_text_choice(json_t *o) {
    json_t *c = json_object_get(o, "choices");
    for (size_t i = 0; json_is_array(c) && i < json_array_size(c); i++)
        if (json_is_string(json_array_get(c, i))) return true;
    return false;
}

/* A line's text through the tokenizer, into s (tokens in [0, vocab)). */
static int encode_text(const lines *L, const char *sid, json_t *text, int vocab, const char *tok_path, mf_tokenizer **tok,
                       mf_prompt *s, mf_error *err) {
    int rc = need_tokenizer(L, sid, "a \"text\" and no \"tokens\"", tok_path, tok, err);
    if (rc) return rc;
    if (json_string_length(text) > MF_MAX_TEXT_BYTES)
        return mf_fail(err, MF_EINVAL, "%s:%d: sequence %s: a text of more than %d bytes", L->path, L->lineno, sid, MF_MAX_TEXT_BYTES);
    int32_t *ids;
    size_t n;
    rc = mf_tokenizer_encode(*tok, json_string_value(text), json_string_length(text), true, &ids, &n, err);
    if (rc) return mf_fail_wrap(err, "%s:%d: sequence %s: encoding its text", L->path, L->lineno, sid);
    if (n == 0) rc = mf_fail(err, MF_EINVAL, "%s:%d: sequence %s: its text encodes to no tokens", L->path, L->lineno, sid);
    else if (n > (size_t)MF_MAX_SEQ_TOKENS)
        rc = mf_fail(err, MF_EINVAL, "%s:%d: sequence %s: its text encodes to more than %d tokens", L->path, L->lineno, sid, MF_MAX_SEQ_TOKENS);
    for (size_t t = 0; t < n && !rc; t++)
        if (ids[t] >= vocab)
            rc = mf_fail(err, MF_EINVAL, "%s:%d: sequence %s, position %zu: its text encodes to token id %d, outside the model's "
                         "vocabulary [0, %d)", L->path, L->lineno, sid, t, ids[t], vocab);
    if (rc) {
        free(ids);
        return rc;
    }
    s->tokens = ids;
    s->T = (int)n;
    return MF_OK;
}

/* The line's "choices" and "answer", and its "max_new_tokens", if any, into s. */
static int line_choices(const lines *L, const char *sid, json_t *o, mf_prompt *s, const char *text, size_t text_len, int vocab,
                        const char *tok_path, mf_tokenizer **tok, mf_error *err) {
    int rc = MF_OK;
    json_t *mx = json_object_get(o, "max_new_tokens");
    if (mx) {
        if (!json_is_integer(mx) || json_integer_value(mx) < 0 || json_integer_value(mx) > MF_MAX_NEW_TOKENS)
            return mf_fail(err, MF_EINVAL, "%s:%d: sequence %s: \"max_new_tokens\" must be an integer from 0 to %d", L->path,
                           L->lineno, sid, MF_MAX_NEW_TOKENS);
        s->own_max_new = true;
        s->max_new = (int)json_integer_value(mx);
    }
    if (has_text_choice(o) && (rc = need_tokenizer(L, sid, "a choice given as text", tok_path, tok, err))) return rc;
    char where[MF_MAX_SEQ_ID + 4200];
    snprintf(where, sizeof where, "%s:%d: sequence %s", L->path, L->lineno, sid);
    return mf_choices_parse(s, o, text, text_len, vocab, *tok, where, err);
}

int mf_prompts_load_text(mf_prompts *p, const char *path, int vocab, const char *tokenizer_path, mf_error *err) {
    memset(p, 0, sizeof *p);
    lines L = {path, NULL, NULL, 0, 0};
    int rc = mf_read_file(path, &L.text, &L.len, err);
    if (rc) return rc;
    L.cur = L.text;
    mf_digest_buffer(L.text, L.len, p->digest);
    size_t cap = 16;
    p->seq = mf_xcalloc(cap, sizeof *p->seq);
    mf_tokenizer *tok = NULL;
    const char *line;
    size_t n;
    while ((rc = next_line(&L, &line, &n, err)) > 0) {
        json_t *o;
        const char *sid;
        if ((rc = line_object(&L, line, n, &o, &sid, err))) goto fail;
        const int lineno = L.lineno;
        json_t *toks = json_object_get(o, "tokens"), *text = json_object_get(o, "text");
        if (p->n == cap) p->seq = mf_xrealloc(p->seq, (cap *= 2) * sizeof *p->seq);
        mf_prompt *s = &p->seq[p->n];
        memset(s, 0, sizeof *s);
        s->answer = -1;
        if (!toks && json_is_string(text)) {   /* a text to encode */
            if ((rc = encode_text(&L, sid, text, vocab, tokenizer_path, &tok, s, err))) {
                json_decref(o);
                goto fail;
            }
            s->id = mf_xstrdup(sid);
            p->n++;
            rc = line_choices(&L, sid, o, s, json_string_value(text), json_string_length(text), vocab, tokenizer_path, &tok, err);
            json_decref(o);
            if (rc) goto fail;
            continue;
        }
        if (!toks && text) {
            rc = mf_fail(err, MF_EINVAL, "%s:%d: sequence %s: \"text\" must be a string", path, lineno, sid);
            json_decref(o);
            goto fail;
        }
        if (!json_is_array(toks) || json_array_size(toks) == 0) {
            rc = mf_fail(err, MF_EINVAL, "%s:%d: sequence %s: \"tokens\" must be a non-empty array", path, lineno, sid);
            json_decref(o);
            goto fail;
        }
        if (json_array_size(toks) > (size_t)MF_MAX_SEQ_TOKENS) {
            rc = mf_fail(err, MF_EINVAL, "%s:%d: sequence %s: more than %d tokens", path, lineno, sid, MF_MAX_SEQ_TOKENS);
            json_decref(o);
            goto fail;
        }
        s->T = (int)json_array_size(toks);
        s->tokens = mf_xmalloc((size_t)s->T * sizeof(int32_t));
        s->id = mf_xstrdup(sid);
        p->n++;
        for (int t = 0; t < s->T; t++) {
            json_t *v = json_array_get(toks, (size_t)t);
            if (!json_is_integer(v)) {
                rc = mf_fail(err, MF_EINVAL, "%s:%d: sequence %s, position %d: token is not an integer", path, lineno,
                             sid, t);
                json_decref(o);
                goto fail;
            }
            json_int_t tk = json_integer_value(v);
            if (tk < 0 || tk >= vocab) {
                rc = mf_fail(err, MF_EINVAL, "%s:%d: sequence %s, position %d: token id %lld outside the vocabulary [0, %d)",
                             path, lineno, sid, t, (long long)tk, vocab);
                json_decref(o);
                goto fail;
            }
            s->tokens[t] = (int32_t)tk;
        }
        rc = line_choices(&L, sid, o, s, NULL, 0, vocab, tokenizer_path, &tok, err);
        json_decref(o);
        if (rc) goto fail;
    }
    if (rc < 0) goto fail;
    if (p->n == 0) {
        rc = mf_fail(err, MF_EINVAL, "%s: no sequences", path);
        goto fail;
    }
    {
        const char **ids = mf_xmalloc(p->n * sizeof *ids);
        for (size_t i = 0; i < p->n; i++) ids[i] = p->seq[i].id;
        rc = unique_ids(ids, p->n, path, err);
        free(ids);
        if (rc) goto fail;
    }
    mf_tokenizer_free(tok);
    free(L.text);
    return MF_OK;
fail:
    mf_tokenizer_free(tok);
    free(L.text);
    mf_prompts_free(p);
    return rc;
}

int mf_prompts_load(mf_prompts *p, const char *path, int vocab, mf_error *err) {
    return mf_prompts_load_text(p, path, vocab, NULL, err);
}

void mf_texts_free(mf_texts *t) {
    for (size_t i = 0; i < t->n; i++) {
        free(t->v[i].id);
        free(t->v[i].text);
    }
    free(t->v);
    memset(t, 0, sizeof *t);
}

int mf_texts_load(mf_texts *t, const char *path, mf_error *err) {
    memset(t, 0, sizeof *t);
    lines L = {path, NULL, NULL, 0, 0};
    int rc = mf_read_file(path, &L.text, &L.len, err);
    if (rc) return rc;
    L.cur = L.text;
    size_t cap = 16;
    t->v = mf_xcalloc(cap, sizeof *t->v);
    const char *line;
    size_t n;
    while ((rc = next_line(&L, &line, &n, err)) > 0) {
        json_t *o;
        const char *sid;
        if ((rc = line_object(&L, line, n, &o, &sid, err))) break;
        json_t *text = json_object_get(o, "text");
        if (!json_is_string(text)) rc = mf_fail(err, MF_EINVAL, "%s:%d: sequence %s: \"text\" must be a string", path, L.lineno, sid);
        else if (json_string_length(text) > MF_MAX_TEXT_BYTES)
            rc = mf_fail(err, MF_EINVAL, "%s:%d: sequence %s: a text of more than %d bytes", path, L.lineno, sid, MF_MAX_TEXT_BYTES);
        if (rc) {
            json_decref(o);
            break;
        }
        if (t->n == cap) t->v = mf_xrealloc(t->v, (cap *= 2) * sizeof *t->v);
        mf_text *x = &t->v[t->n++];
        x->id = mf_xstrdup(sid);
        x->len = json_string_length(text);
        x->text = mf_xmalloc(x->len + 1);
        memcpy(x->text, json_string_value(text), x->len + 1);
        json_decref(o);
    }
    if (!rc && t->n == 0) rc = mf_fail(err, MF_EINVAL, "%s: no texts", path);
    if (!rc) {
        const char **ids = mf_xmalloc(t->n * sizeof *ids);
        for (size_t i = 0; i < t->n; i++) ids[i] = t->v[i].id;
        rc = unique_ids(ids, t->n, path, err);
        free(ids);
    }
    free(L.text);
    if (rc) mf_texts_free(t);
    return rc;
}
