/* Normalizers, as Hugging Face tokenizers applies them to each piece of text between added tokens: NFC, NFD,
 * NFKC, NFKD (utf8proc), Lowercase (Rust's char::to_lowercase), Prepend, Replace (a String or a Regex),
 * Strip, StripAccents, ByteLevel and Sequence. Any other is refused with its name. */
#include "tok_int.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

typedef enum {
    NZ_NFC, NZ_NFD, NZ_NFKC, NZ_NFKD, NZ_LOWERCASE, NZ_PREPEND, NZ_REPLACE, NZ_STRIP, NZ_STRIP_ACCENTS, NZ_BYTE_LEVEL,
    NZ_SEQUENCE
} nz_kind;

struct tk_normalizer {
    nz_kind kind;
    char *text;         /* Prepend's prefix, Replace's content */
    size_t text_n;
    tk_regex *re;       /* Replace's pattern */
    bool left, right;   /* Strip */
    tk_normalizer **parts;
    size_t n_parts;
};

void tk_normalizer_free(tk_normalizer *n) {
    if (!n) return;
    for (size_t i = 0; i < n->n_parts; i++) tk_normalizer_free(n->parts[i]);
    free(n->parts);
    free(n->text);
    tk_regex_free(n->re);
    free(n);
}

static char *dup_n(const char *s, size_t n) {
    char *d = mf_xmalloc(n + 1);
    if (n) memcpy(d, s, n);
    d[n] = 0;
    return d;
}

int tk_normalizer_parse(tk_normalizer **out, json_t *j, const char *origin, int depth, mf_error *err) {
    *out = NULL;
    if (depth > TK_MAX_DEPTH) return mf_fail(err, MF_EUNSUPPORTED, "%s: normalizers nested more than %d deep", origin, TK_MAX_DEPTH);
    const char *type = tkj_type(j);
    if (!json_is_object(j) || !type) return mf_fail(err, MF_EFORMAT, "%s: a normalizer must be an object with a \"type\"", origin);
    static const struct {
        const char *name;
        nz_kind kind;
    } names[] = {{"NFC", NZ_NFC}, {"NFD", NZ_NFD}, {"NFKC", NZ_NFKC}, {"NFKD", NZ_NFKD}, {"Lowercase", NZ_LOWERCASE},
                 {"Prepend", NZ_PREPEND}, {"Replace", NZ_REPLACE}, {"Strip", NZ_STRIP}, {"StripAccents", NZ_STRIP_ACCENTS},
                 {"ByteLevel", NZ_BYTE_LEVEL}, {"Sequence", NZ_SEQUENCE}};
    int kind = -1;
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (!strcmp(type, names[i].name)) kind = (int)names[i].kind;
    if (kind < 0) {
        char q[80];
        return mf_fail(err, MF_EUNSUPPORTED, "%s: the normalizer %s is not supported (supported: NFC, NFD, NFKC, NFKD, Lowercase, "
                       "Prepend, Replace, Strip, StripAccents, ByteLevel, Sequence)", origin, tk_quote(q, sizeof q, type, strlen(type)));
    }
    tk_normalizer *n = mf_xcalloc(1, sizeof *n);
    n->kind = (nz_kind)kind;
    int rc = MF_OK;
    const char *s;
    size_t len;
    switch (n->kind) {
    case NZ_PREPEND:
        if (!(rc = tkj_str(j, "prepend", false, &s, &len, "normalizer Prepend", origin, err))) n->text = dup_n(s, len), n->text_n = len;
        break;
    case NZ_REPLACE:
        if ((rc = tkj_str(j, "content", false, &s, &len, "normalizer Replace", origin, err))) break;
        n->text = dup_n(s, len);
        n->text_n = len;
        rc = tkj_pattern(j, "pattern", &n->re, "normalizer Replace", origin, err);
        break;
    case NZ_STRIP:
        if (!(rc = tkj_bool(j, "strip_left", -1, &n->left, "normalizer Strip", origin, err)))
            rc = tkj_bool(j, "strip_right", -1, &n->right, "normalizer Strip", origin, err);
        break;
    case NZ_SEQUENCE: {
        json_t *a = json_object_get(j, "normalizers");
        if (!json_is_array(a)) {
            rc = mf_fail(err, MF_EFORMAT, "%s: normalizer Sequence: \"normalizers\" must be an array", origin);
            break;
        }
        if (json_array_size(a) > TK_MAX_PARTS) {
            rc = mf_fail(err, MF_EUNSUPPORTED, "%s: normalizer Sequence of more than %d parts", origin, TK_MAX_PARTS);
            break;
        }
        n->parts = mf_xcalloc(json_array_size(a) + 1, sizeof *n->parts);
        for (size_t i = 0; i < json_array_size(a) && !rc; i++) {
            rc = tk_normalizer_parse(&n->parts[i], json_array_get(a, i), origin, depth + 1, err);
            if (!rc) n->n_parts++;
        }
        break;
    }
    default: break;
    }
    if (rc) {
        tk_normalizer_free(n);
        return rc;
    }
    *out = n;
    return MF_OK;
}

/* The bytes of the lowercase of one character (Rust: U+0130 is the one with two). */
static void lower_cp(tk_buf *o, uint32_t cp) {
    if (cp == 0x130) {
        tkb_put(o, "i\xcc\x87", 3);
        return;
    }
    tkb_cp(o, (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp));
}

static int unicode_form(nz_kind k, const char *s, size_t n, tk_buf *out, mf_error *err) {
    utf8proc_option_t opt = UTF8PROC_STABLE;
    if (k == NZ_NFC || k == NZ_NFKC) opt |= UTF8PROC_COMPOSE;
    else opt |= UTF8PROC_DECOMPOSE;
    if (k == NZ_NFKC || k == NZ_NFKD) opt |= UTF8PROC_COMPAT;
    utf8proc_uint8_t *dst = NULL;
    const utf8proc_ssize_t r = n ? utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &dst, opt) : 0;
    if (r < 0) {
        free(dst);
        return mf_fail(err, MF_EINVAL, "Unicode normalization failed: %s", utf8proc_errmsg(r));
    }
    out->n = 0;
    tkb_put(out, dst ? (const char *)dst : "", (size_t)r);
    free(dst);
    return MF_OK;
}

/* One normalizer on `cur` (replaced with its result). */
static int apply(const tk_normalizer *nz, tk_ctx *ctx, tk_buf *cur, size_t *orig0, mf_error *err) {
    tk_buf o = {0};
    int rc = MF_OK;
    switch (nz->kind) {
    case NZ_SEQUENCE:
        for (size_t i = 0; i < nz->n_parts && !rc; i++) rc = apply(nz->parts[i], ctx, cur, orig0, err);
        return rc;
    case NZ_NFC: case NZ_NFD: case NZ_NFKC: case NZ_NFKD: {
        if ((rc = unicode_form(nz->kind, cur->s, cur->n, &o, err))) break;
        if (*orig0 && o.n) {
            /* what the first character became stands at offset 0 (approximately: its own normal form) */
            tk_buf first = {0};
            const size_t l0 = (size_t)tk_utf8_len((unsigned char)cur->s[0]);
            if (unicode_form(nz->kind, cur->s, l0 <= cur->n ? l0 : cur->n, &first, err) == MF_OK && first.n && first.n <= o.n)
                *orig0 = (nz->kind == NZ_NFC || nz->kind == NZ_NFKC) ? (size_t)tk_utf8_len((unsigned char)o.s[0]) : first.n;
            else *orig0 = (size_t)tk_utf8_len((unsigned char)o.s[0]);
            tkb_free(&first);
        }
        break;
    }
    case NZ_LOWERCASE: {
        size_t o0 = 0;
        for (size_t i = 0; i < cur->n;) {
            uint32_t cp;
            const int len = tk_utf8_dec(cur->s, cur->n, i, &cp);
            lower_cp(&o, cp);
            i += (size_t)len;
            if (i <= *orig0) o0 = o.n;
        }
        *orig0 = *orig0 ? o0 : 0;
        break;
    }
    case NZ_BYTE_LEVEL: {
        size_t o0 = 0;
        for (size_t i = 0; i < cur->n; i++) {
            tkb_cp(&o, tk_byte_char((uint8_t)cur->s[i]));
            if (i + 1 <= *orig0) o0 = o.n;
        }
        *orig0 = *orig0 ? o0 : 0;
        break;
    }
    case NZ_PREPEND:
        if (cur->n == 0) return MF_OK;
        tkb_put(&o, nz->text, nz->text_n);
        tkb_put(&o, cur->s, cur->n);
        if (*orig0) *orig0 += nz->text_n;
        break;
    case NZ_REPLACE: {
        tk_ranges m = {0};
        if ((rc = tk_regex_find(nz->re, ctx, cur->s, cur->n, &m, err))) {
            free(m.v);
            break;
        }
        size_t o0 = 0;
        for (size_t i = 0; i < m.n; i++) {
            if (m.v[i].match) tkb_put(&o, nz->text, nz->text_n);
            else tkb_put(&o, cur->s + m.v[i].a, m.v[i].b - m.v[i].a);
            if (m.v[i].b <= *orig0 && (m.v[i].b > m.v[i].a || m.v[i].a == 0)) o0 = o.n;
        }
        free(m.v);
        *orig0 = *orig0 ? o0 : 0;
        break;
    }
    case NZ_STRIP: {
        size_t a = 0, b = cur->n;
        if (nz->left)
            while (a < b) {
                uint32_t cp;
                const int len = tk_utf8_dec(cur->s, cur->n, a, &cp);
                if (!tk_is_whitespace(cp)) break;
                a += (size_t)len;
            }
        if (nz->right)
            while (b > a) {
                size_t k = b - 1;
                while (k > a && ((unsigned char)cur->s[k] & 0xc0) == 0x80) k--;
                uint32_t cp;
                tk_utf8_dec(cur->s, cur->n, k, &cp);
                if (!tk_is_whitespace(cp)) break;
                b = k;
            }
        tkb_put(&o, cur->s + a, b - a);
        if (a > 0) *orig0 = 0;
        break;
    }
    case NZ_STRIP_ACCENTS: {
        size_t o0 = 0;
        for (size_t i = 0; i < cur->n;) {
            uint32_t cp;
            const int len = tk_utf8_dec(cur->s, cur->n, i, &cp);
            if (!tk_is_mark(cp)) tkb_put(&o, cur->s + i, (size_t)len);
            i += (size_t)len;
            if (i <= *orig0) o0 = o.n;
        }
        *orig0 = *orig0 ? o0 : 0;
        break;
    }
    }
    if (rc) {
        tkb_free(&o);
        return rc;
    }
    if (!o.s) tkb_put(&o, "", 0);
    tkb_free(cur);
    *cur = o;
    if (*orig0 > cur->n) *orig0 = cur->n;
    if (cur->n > TK_MAX_TEXT_BYTES) return mf_fail(err, MF_EUNSUPPORTED, "normalized text of more than %zu bytes", TK_MAX_TEXT_BYTES);
    return MF_OK;
}

int tk_normalize(const tk_normalizer *nz, tk_ctx *ctx, const char *s, size_t n, tk_buf *out, size_t *orig0,
                 mf_error *err) {
    out->n = 0;
    tkb_put(out, s, n);
    if (!nz) return MF_OK;
    const int rc = apply(nz, ctx, out, orig0, err);
    return rc ? mf_fail_wrap(err, "normalizer") : MF_OK;
}
