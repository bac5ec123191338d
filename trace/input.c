/* Prompt files: JSON lines {"id": "...", "tokens": [ids]}, validated whole
 * before any computation starts. */
#include "mf_trace.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

void mf_prompts_free(mf_prompts *p) {
    for (size_t i = 0; i < p->n; i++) {
        free(p->seq[i].id);
        free(p->seq[i].tokens);
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

static int cmp_id(const void *a, const void *b) {
    return strcmp((*(const mf_prompt *const *)a)->id, (*(const mf_prompt *const *)b)->id);
}

int mf_prompts_load(mf_prompts *p, const char *path, int vocab, mf_error *err) {
    memset(p, 0, sizeof *p);
    char *text;
    size_t len;
    int rc = mf_read_file(path, &text, &len, err);
    if (rc) return rc;
    mf_digest_buffer(text, len, p->digest);
    size_t cap = 16;
    p->seq = mf_xcalloc(cap, sizeof *p->seq);
    char *line = text;
    int lineno = 0;
    while (line < text + len) {
        char *nl = memchr(line, '\n', (size_t)(text + len - line));
        char *end = nl ? nl : text + len;
        lineno++;
        size_t n = (size_t)(end - line);
        if (n && line[n - 1] == '\r') n--;
        bool blank = true;
        for (size_t i = 0; i < n && blank; i++) blank = line[i] == ' ' || line[i] == '\t';
        if (blank) {
            /* a final newline is fine; an empty line inside the file is not */
            if (nl && nl + 1 >= text + len && n == 0) break;
            rc = mf_fail(err, MF_EINVAL, "%s:%d: empty line", path, lineno);
            goto fail;
        }
        json_error_t jerr;
        json_t *o = json_loadb(line, n, JSON_REJECT_DUPLICATES, &jerr);
        json_t *id = o ? json_object_get(o, "id") : NULL, *toks = o ? json_object_get(o, "tokens") : NULL;
        if (!o || !json_is_object(o)) {
            rc = mf_fail(err, MF_EINVAL, "%s:%d: not a JSON object%s%s", path, lineno, o ? "" : ": ", o ? "" : jerr.text);
            json_decref(o);
            goto fail;
        }
        if (!json_is_string(id) || !mf_seq_id_valid(json_string_value(id))) {
            rc = mf_fail(err, MF_EINVAL,
                         "%s:%d: \"id\" must be a non-empty string of at most %d bytes (UTF-8) without '/', '\\' or "
                         "control characters",
                         path, lineno, MF_MAX_SEQ_ID);
            json_decref(o);
            goto fail;
        }
        const char *sid = json_string_value(id);
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
        if (p->n == cap) p->seq = mf_xrealloc(p->seq, (cap *= 2) * sizeof *p->seq);
        mf_prompt *s = &p->seq[p->n];
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
            json_int_t tok = json_integer_value(v);
            if (tok < 0 || tok >= vocab) {
                rc = mf_fail(err, MF_EINVAL, "%s:%d: sequence %s, position %d: token id %lld outside the vocabulary [0, %d)",
                             path, lineno, sid, t, (long long)tok, vocab);
                json_decref(o);
                goto fail;
            }
            s->tokens[t] = (int32_t)tok;
        }
        json_decref(o);
        if (!nl) break;
        line = nl + 1;
    }
    if (p->n == 0) {
        rc = mf_fail(err, MF_EINVAL, "%s: no sequences", path);
        goto fail;
    }
    {   /* ids must be unique: they name the sequence in the run */
        const mf_prompt **sorted = mf_xmalloc(p->n * sizeof *sorted);
        for (size_t i = 0; i < p->n; i++) sorted[i] = &p->seq[i];
        qsort(sorted, p->n, sizeof *sorted, cmp_id);
        for (size_t i = 1; i < p->n; i++)
            if (strcmp(sorted[i - 1]->id, sorted[i]->id) == 0) {
                rc = mf_fail(err, MF_EINVAL, "%s: sequence id %s appears twice", path, sorted[i]->id);
                free(sorted);
                goto fail;
            }
        free(sorted);
    }
    free(text);
    return MF_OK;
fail:
    free(text);
    mf_prompts_free(p);
    return rc;
}
