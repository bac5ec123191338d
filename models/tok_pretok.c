/* Pre-tokenizers, as Hugging Face tokenizers runs them over the pieces that are not added tokens: ByteLevel
 * (with and without GPT-2's pattern), Split (the file's own pattern, five behaviours, invert), Metaspace,
 * Digits, Whitespace, WhitespaceSplit, Punctuation, CharDelimiterSplit, BertPreTokenizer and Sequence. Any
 * other is refused with its name. */
#include "tok_int.h"

#include <stdlib.h>
#include <string.h>

/* GPT-2's pattern, as tokenizers' ByteLevel pre-tokenizer has it */
static const char GPT2_PATTERN[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

typedef enum {
    PT_BYTE_LEVEL, PT_SPLIT, PT_METASPACE, PT_DIGITS, PT_WHITESPACE, PT_WHITESPACE_SPLIT, PT_PUNCTUATION, PT_CHAR_DELIMITER,
    PT_BERT, PT_SEQUENCE
} pt_kind;

typedef enum { PREPEND_ALWAYS, PREPEND_NEVER, PREPEND_FIRST } prepend_scheme;

struct tk_pretok {
    pt_kind kind;
    bool add_prefix_space, use_regex;   /* ByteLevel */
    tk_regex *re;                       /* ByteLevel's GPT-2 pattern, Split's */
    tk_behavior behavior;               /* Split, Punctuation */
    bool invert;                        /* Split */
    uint32_t ch;                        /* Metaspace's replacement, CharDelimiterSplit's delimiter */
    char rep[5];
    size_t rep_n;
    prepend_scheme scheme;              /* Metaspace */
    bool split;                         /* Metaspace */
    bool individual;                    /* Digits */
    tk_pretok **parts;
    size_t n_parts;
};

void tk_pretok_free(tk_pretok *p) {
    if (!p) return;
    for (size_t i = 0; i < p->n_parts; i++) tk_pretok_free(p->parts[i]);
    free(p->parts);
    tk_regex_free(p->re);
    free(p);
}

bool tk_pretok_byte_level(const tk_pretok *p) {
    if (!p) return false;
    if (p->kind == PT_BYTE_LEVEL) return true;
    for (size_t i = 0; i < p->n_parts; i++)
        if (tk_pretok_byte_level(p->parts[i])) return true;
    return false;
}

static int parse_behavior(json_t *j, const char *key, tk_behavior dflt, bool optional, tk_behavior *out, const char *what,
                          const char *origin, mf_error *err) {
    json_t *v = json_object_get(j, key);
    if (!v && optional) {
        *out = dflt;
        return MF_OK;
    }
    if (tk_behavior_parse(json_string_value(v), out))
        return mf_fail(err, MF_EFORMAT, "%s: %s: \"%s\" must be Removed, Isolated, MergedWithPrevious, MergedWithNext or Contiguous",
                       origin, what, key);
    return MF_OK;
}

int tk_pretok_parse(tk_pretok **out, json_t *j, const char *origin, int depth, mf_error *err) {
    *out = NULL;
    if (depth > TK_MAX_DEPTH) return mf_fail(err, MF_EUNSUPPORTED, "%s: pre-tokenizers nested more than %d deep", origin, TK_MAX_DEPTH);
    const char *type = tkj_type(j);
    if (!json_is_object(j) || !type) return mf_fail(err, MF_EFORMAT, "%s: a pre-tokenizer must be an object with a \"type\"", origin);
    static const struct {
        const char *name;
        pt_kind kind;
    } names[] = {{"ByteLevel", PT_BYTE_LEVEL}, {"Split", PT_SPLIT}, {"Metaspace", PT_METASPACE}, {"Digits", PT_DIGITS},
                 {"Whitespace", PT_WHITESPACE}, {"WhitespaceSplit", PT_WHITESPACE_SPLIT}, {"Punctuation", PT_PUNCTUATION},
                 {"CharDelimiterSplit", PT_CHAR_DELIMITER}, {"BertPreTokenizer", PT_BERT}, {"Sequence", PT_SEQUENCE}};
    int kind = -1;
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (!strcmp(type, names[i].name)) kind = (int)names[i].kind;
    if (kind < 0) {
        char q[80];
        return mf_fail(err, MF_EUNSUPPORTED, "%s: the pre-tokenizer %s is not supported (supported: ByteLevel, Split, Metaspace, "
                       "Digits, Whitespace, WhitespaceSplit, Punctuation, CharDelimiterSplit, BertPreTokenizer, Sequence)",
                       origin, tk_quote(q, sizeof q, type, strlen(type)));
    }
    tk_pretok *p = mf_xcalloc(1, sizeof *p);
    p->kind = (pt_kind)kind;
    int rc = MF_OK;
    switch (p->kind) {
    case PT_BYTE_LEVEL:
        if ((rc = tkj_bool(j, "add_prefix_space", 1, &p->add_prefix_space, "pre-tokenizer ByteLevel", origin, err))) break;
        if ((rc = tkj_bool(j, "use_regex", 1, &p->use_regex, "pre-tokenizer ByteLevel", origin, err))) break;
        if (p->use_regex) rc = tk_regex_new(&p->re, GPT2_PATTERN, strlen(GPT2_PATTERN), false, "GPT-2's pattern", err);
        break;
    case PT_SPLIT:
        if ((rc = tkj_pattern(j, "pattern", &p->re, "pre-tokenizer Split", origin, err))) break;
        if ((rc = parse_behavior(j, "behavior", TK_ISOLATED, false, &p->behavior, "pre-tokenizer Split", origin, err))) break;
        rc = tkj_bool(j, "invert", -1, &p->invert, "pre-tokenizer Split", origin, err);
        break;
    case PT_METASPACE: {
        if ((rc = tkj_char(j, "replacement", false, 0, &p->ch, "pre-tokenizer Metaspace", origin, err))) break;
        json_t *ps = json_object_get(j, "prepend_scheme"), *aps = json_object_get(j, "add_prefix_space");
        const char *s = json_string_value(ps);
        if (!ps) p->scheme = PREPEND_ALWAYS;
        else if (s && !strcmp(s, "always")) p->scheme = PREPEND_ALWAYS;
        else if (s && !strcmp(s, "never")) p->scheme = PREPEND_NEVER;
        else if (s && !strcmp(s, "first")) p->scheme = PREPEND_FIRST;
        else {
            rc = mf_fail(err, MF_EFORMAT, "%s: pre-tokenizer Metaspace: \"prepend_scheme\" must be always, never or first", origin);
            break;
        }
        if (aps && !json_is_null(aps) && !json_is_boolean(aps)) {
            rc = mf_fail(err, MF_EFORMAT, "%s: pre-tokenizer Metaspace: \"add_prefix_space\" must be true or false", origin);
            break;
        }
        if (json_is_false(aps)) {   /* the legacy spelling of prepend_scheme never */
            if (p->scheme != PREPEND_NEVER) {
                rc = mf_fail(err, MF_EFORMAT, "%s: pre-tokenizer Metaspace: add_prefix_space does not match declared prepend_scheme", origin);
                break;
            }
        }
        json_t *sp = json_object_get(j, "split");
        if (sp && !json_is_null(sp) && !json_is_boolean(sp)) {
            rc = mf_fail(err, MF_EFORMAT, "%s: pre-tokenizer Metaspace: \"split\" must be true or false", origin);
            break;
        }
        p->split = !json_is_false(sp);
        tk_buf b = {0};
        tkb_cp(&b, p->ch);
        memcpy(p->rep, b.s, b.n);
        p->rep_n = b.n;
        tkb_free(&b);
        break;
    }
    case PT_DIGITS: rc = tkj_bool(j, "individual_digits", 0, &p->individual, "pre-tokenizer Digits", origin, err); break;
    case PT_PUNCTUATION:
        rc = parse_behavior(j, "behavior", TK_ISOLATED, true, &p->behavior, "pre-tokenizer Punctuation", origin, err);
        break;
    case PT_CHAR_DELIMITER: rc = tkj_char(j, "delimiter", false, 0, &p->ch, "pre-tokenizer CharDelimiterSplit", origin, err); break;
    case PT_SEQUENCE: {
        json_t *a = json_object_get(j, "pretokenizers");
        if (!json_is_array(a)) {
            rc = mf_fail(err, MF_EFORMAT, "%s: pre-tokenizer Sequence: \"pretokenizers\" must be an array", origin);
            break;
        }
        if (json_array_size(a) > TK_MAX_PARTS) {
            rc = mf_fail(err, MF_EUNSUPPORTED, "%s: pre-tokenizer Sequence of more than %d parts", origin, TK_MAX_PARTS);
            break;
        }
        p->parts = mf_xcalloc(json_array_size(a) + 1, sizeof *p->parts);
        for (size_t i = 0; i < json_array_size(a) && !rc; i++) {
            rc = tk_pretok_parse(&p->parts[i], json_array_get(a, i), origin, depth + 1, err);
            if (!rc) p->n_parts++;
        }
        break;
    }
    default: break;
    }
    if (rc) {
        tk_pretok_free(p);
        return rc;
    }
    *out = p;
    return MF_OK;
}

static bool pred_numeric(uint32_t c, const void *ud) { (void)ud; return tk_is_numeric(c); }
static bool pred_space(uint32_t c, const void *ud) { (void)ud; return tk_is_whitespace(c); }
static bool pred_punct(uint32_t c, const void *ud) { (void)ud; return tk_is_punct(c); }
static bool pred_char(uint32_t c, const void *ud) { return c == *(const uint32_t *)ud; }

/* Whitespace's \w+|[^\w\s]+ (Rust regex classes): runs of word characters and runs of other non-spaces. */
static void whitespace_find(const char *s, size_t n, tk_ranges *out) {
    out->n = 0;
    size_t prev = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int len = tk_utf8_dec(s, n, i, &cp);
        if (tk_is_whitespace(cp)) {
            i += (size_t)len;
            continue;
        }
        const bool word = tk_is_word(cp);
        size_t j = i + (size_t)len;
        while (j < n) {
            len = tk_utf8_dec(s, n, j, &cp);
            if (tk_is_whitespace(cp) || tk_is_word(cp) != word) break;
            j += (size_t)len;
        }
        if (prev != i) tkr_push(out, prev, i, false);
        tkr_push(out, i, j, true);
        prev = i = j;
    }
    if (prev != n || n == 0) tkr_push(out, prev, n, false);
}

/* Maps a piece's bytes to GPT-2's characters. */
static void byte_map(tk_piece *p) {
    tk_buf o = {0};
    size_t o0 = 0;
    for (size_t i = 0; i < p->n; i++) {
        tkb_cp(&o, tk_byte_char((uint8_t)p->s[i]));
        if (i + 1 <= p->orig0) o0 = o.n;
    }
    free(p->s);
    p->s = tkb_take(&o, &p->n);
    p->orig0 = p->orig0 ? o0 : 0;
}

static void prepend(tk_piece *p, const char *s, size_t n) {
    char *t = mf_xmalloc(p->n + n + 1);
    memcpy(t, s, n);
    memcpy(t + n, p->s, p->n + 1);
    free(p->s);
    p->s = t;
    p->n += n;
    if (p->orig0) p->orig0 += n;
}

/* One pre-tokenizer over one piece (not an added token): its results appended to out. */
static int run_one(const tk_pretok *pt, tk_ctx *ctx, tk_piece *pc, tk_pieces *out, mf_error *err) {
    tk_ranges m = {0};
    int rc = MF_OK;
    switch (pt->kind) {
    case PT_BYTE_LEVEL: {
        if (pt->add_prefix_space && pc->s[0] != ' ') prepend(pc, " ", 1);
        const size_t first = out->n;
        if (pt->use_regex) {
            if ((rc = tk_regex_find(pt->re, ctx, pc->s, pc->n, &m, err))) break;
            tk_split_piece(pc, &m, TK_ISOLATED, false, out);
        } else {
            tkp_push(out, pc->s, pc->n, -1, pc->orig0);
            pc->s = NULL;
        }
        for (size_t i = first; i < out->n; i++) byte_map(&out->v[i]);
        break;
    }
    case PT_SPLIT:
        if ((rc = tk_regex_find(pt->re, ctx, pc->s, pc->n, &m, err))) break;
        tk_split_piece(pc, &m, pt->behavior, pt->invert, out);
        break;
    case PT_METASPACE: {
        tk_buf o = {0};
        size_t o0 = 0;
        for (size_t i = 0; i < pc->n; i++) {
            if (pc->s[i] == ' ') tkb_put(&o, pt->rep, pt->rep_n);
            else tkb_putc(&o, pc->s[i]);
            if (i + 1 <= pc->orig0) o0 = o.n;
        }
        free(pc->s);
        pc->s = tkb_take(&o, &pc->n);
        pc->orig0 = pc->orig0 ? o0 : 0;
        const bool starts = pc->n >= pt->rep_n && !memcmp(pc->s, pt->rep, pt->rep_n);
        if (!starts && (pt->scheme == PREPEND_ALWAYS || (pt->scheme == PREPEND_FIRST && pc->orig0))) prepend(pc, pt->rep, pt->rep_n);
        if (pt->split) {
            tk_pred_find(pred_char, &pt->ch, pc->s, pc->n, &m);
            tk_split_piece(pc, &m, TK_MERGED_WITH_NEXT, false, out);
        } else {
            tkp_push(out, pc->s, pc->n, -1, pc->orig0);
            pc->s = NULL;
        }
        break;
    }
    case PT_DIGITS:
        tk_pred_find(pred_numeric, NULL, pc->s, pc->n, &m);
        tk_split_piece(pc, &m, pt->individual ? TK_ISOLATED : TK_CONTIGUOUS, false, out);
        break;
    case PT_WHITESPACE:
        whitespace_find(pc->s, pc->n, &m);
        tk_split_piece(pc, &m, TK_REMOVED, true, out);
        break;
    case PT_WHITESPACE_SPLIT:
        tk_pred_find(pred_space, NULL, pc->s, pc->n, &m);
        tk_split_piece(pc, &m, TK_REMOVED, false, out);
        break;
    case PT_PUNCTUATION:
        tk_pred_find(pred_punct, NULL, pc->s, pc->n, &m);
        tk_split_piece(pc, &m, pt->behavior, false, out);
        break;
    case PT_CHAR_DELIMITER:
        tk_pred_find(pred_char, &pt->ch, pc->s, pc->n, &m);
        tk_split_piece(pc, &m, TK_REMOVED, false, out);
        break;
    case PT_BERT: {
        tk_pieces mid = {0};
        tk_pred_find(pred_space, NULL, pc->s, pc->n, &m);
        tk_split_piece(pc, &m, TK_REMOVED, false, &mid);
        for (size_t i = 0; i < mid.n; i++) {
            tk_pred_find(pred_punct, NULL, mid.v[i].s, mid.v[i].n, &m);
            tk_split_piece(&mid.v[i], &m, TK_ISOLATED, false, out);
        }
        tkp_free(&mid);
        break;
    }
    case PT_SEQUENCE: break;   /* handled by tk_pretokenize */
    }
    free(m.v);
    return rc;
}

int tk_pretokenize(const tk_pretok *pt, tk_ctx *ctx, tk_pieces *pieces, mf_error *err) {
    if (!pt) return MF_OK;
    if (pt->kind == PT_SEQUENCE) {
        for (size_t i = 0; i < pt->n_parts; i++) {
            const int rc = tk_pretokenize(pt->parts[i], ctx, pieces, err);
            if (rc) return rc;
        }
        return MF_OK;
    }
    tk_pieces out = {0};
    for (size_t i = 0; i < pieces->n; i++) {
        tk_piece *pc = &pieces->v[i];
        if (pc->id < 0 && pc->n == 0) continue;   /* empty pieces are dropped */
        if (pc->id >= 0) {   /* added tokens pass through */
            tkp_push(&out, pc->s, pc->n, pc->id, pc->orig0);
            pc->s = NULL;
            continue;
        }
        const int rc = run_one(pt, ctx, pc, &out, err);
        if (rc) {
            tkp_free(&out);
            return mf_fail_wrap(err, "pre-tokenizer");
        }
    }
    tkp_free(pieces);
    *pieces = out;
    return MF_OK;
}
