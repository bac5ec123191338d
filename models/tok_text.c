/* The tokenizer's text machinery: byte strings, UTF-8, the Unicode properties the components ask, GPT-2's
 * byte table, regular expressions (PCRE2, read as Oniguruma reads them), and Hugging Face's ways of cutting
 * a string at a pattern's matches (NormalizedString::split and its five behaviours). */
#include "tok_int.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

/* ---- byte strings ------------------------------------------------------ */

void tkb_cp(tk_buf *b, uint32_t cp) {
    char u[4];
    int n;
    if (cp < 0x80) u[0] = (char)cp, n = 1;
    else if (cp < 0x800) u[0] = (char)(0xc0 | cp >> 6), u[1] = (char)(0x80 | (cp & 63)), n = 2;
    else if (cp < 0x10000)
        u[0] = (char)(0xe0 | cp >> 12), u[1] = (char)(0x80 | ((cp >> 6) & 63)), u[2] = (char)(0x80 | (cp & 63)), n = 3;
    else
        u[0] = (char)(0xf0 | cp >> 18), u[1] = (char)(0x80 | ((cp >> 12) & 63)), u[2] = (char)(0x80 | ((cp >> 6) & 63)),
        u[3] = (char)(0x80 | (cp & 63)), n = 4;
    tkb_put(b, u, (size_t)n);
}

/* ---- UTF-8 ------------------------------------------------------------- */

int tk_utf8_dec(const char *s, size_t n, size_t i, uint32_t *cp) {
    const unsigned char *p = (const unsigned char *)s + i;
    const int len = tk_utf8_len(p[0]);
    if ((size_t)len > n - i) {   /* never for valid UTF-8; keeps a caller's bug inside the buffer */
        *cp = 0xfffd;
        return 1;
    }
    switch (len) {
    case 1: *cp = p[0]; break;
    case 2: *cp = (uint32_t)(p[0] & 0x1f) << 6 | (p[1] & 0x3f); break;
    case 3: *cp = (uint32_t)(p[0] & 0x0f) << 12 | (uint32_t)(p[1] & 0x3f) << 6 | (p[2] & 0x3f); break;
    default:
        *cp = (uint32_t)(p[0] & 0x07) << 18 | (uint32_t)(p[1] & 0x3f) << 12 | (uint32_t)(p[2] & 0x3f) << 6 | (p[3] & 0x3f);
    }
    return len;
}

bool tk_utf8_valid(const char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        if ((unsigned char)s[i] < 0x80) {
            i++;
            continue;
        }
        const int len = mf_utf8_char((const unsigned char *)s + i, n - i);
        if (!len) return false;
        i += (size_t)len;
    }
    return true;
}

void tk_utf8_lossy(tk_buf *out, const char *s, size_t n) {
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    tkb_reserve(out, n);
    while (i < n) {
        const unsigned char c = p[i];
        if (c < 0x80) {
            tkb_putc(out, (char)c);
            i++;
            continue;
        }
        int width = c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
        if (!width) {
            tkb_put(out, "\xef\xbf\xbd", 3);
            i++;
            continue;
        }
        /* the second byte's range depends on the first (no overlong forms, surrogates or > U+10FFFF) */
        unsigned lo = 0x80, hi = 0xbf;
        if (c == 0xe0) lo = 0xa0;
        else if (c == 0xed) hi = 0x9f;
        else if (c == 0xf0) lo = 0x90;
        else if (c == 0xf4) hi = 0x8f;
        size_t k = 1;
        if (i + 1 < n && p[i + 1] >= lo && p[i + 1] <= hi) {
            k = 2;
            while ((int)k < width && i + k < n && p[i + k] >= 0x80 && p[i + k] <= 0xbf) k++;
        }
        if ((int)k == width) tkb_put(out, s + i, k);
        else tkb_put(out, "\xef\xbf\xbd", 3);   /* the maximal invalid subpart: one replacement character */
        i += k;
    }
}

char *tk_quote(char *dst, size_t cap, const char *s, size_t n) {
    size_t o = 0;
    const size_t max = cap > 12 ? cap - 12 : 0;
    dst[0] = 0;
    for (size_t i = 0; i < n && o < max;) {
        const unsigned char c = (unsigned char)s[i];
        if (c < 0x20 || c == 0x7f) {
            o += (size_t)snprintf(dst + o, cap - o, "\\x%02x", c);
            i++;
        } else if (c < 0x80) {
            dst[o++] = (char)c;
            i++;
        } else {
            const int len = mf_utf8_char((const unsigned char *)s + i, n - i);
            if (!len) {
                dst[o++] = '?';
                i++;
            } else {
                if (o + (size_t)len > max) break;
                memcpy(dst + o, s + i, (size_t)len);
                o += (size_t)len;
                i += (size_t)len;
            }
        }
        if (i < n && o >= max) {
            memcpy(dst + o, "...", 4);
            return dst;
        }
    }
    dst[o] = 0;
    return dst;
}

/* ---- Unicode properties ------------------------------------------------- */

bool tk_is_whitespace(uint32_t c) {
    return (c >= 0x09 && c <= 0x0d) || c == 0x20 || c == 0x85 || c == 0xa0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200a) ||
           c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

static utf8proc_category_t cat(uint32_t c) { return c > 0x10ffff ? UTF8PROC_CATEGORY_CN : utf8proc_category((utf8proc_int32_t)c); }

bool tk_is_numeric(uint32_t c) {
    const utf8proc_category_t k = cat(c);
    return k == UTF8PROC_CATEGORY_ND || k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_NO;
}

bool tk_is_punct(uint32_t c) {
    if (c < 0x80) return (c >= 0x21 && c <= 0x2f) || (c >= 0x3a && c <= 0x40) || (c >= 0x5b && c <= 0x60) || (c >= 0x7b && c <= 0x7e);
    const utf8proc_category_t k = cat(c);
    return k >= UTF8PROC_CATEGORY_PC && k <= UTF8PROC_CATEGORY_PO;
}

bool tk_is_mark(uint32_t c) {
    const utf8proc_category_t k = cat(c);
    return k == UTF8PROC_CATEGORY_MN || k == UTF8PROC_CATEGORY_MC || k == UTF8PROC_CATEGORY_ME;
}

bool tk_is_word(uint32_t c) {
    const utf8proc_category_t k = cat(c);
    if (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO) return true;
    if (k >= UTF8PROC_CATEGORY_MN && k <= UTF8PROC_CATEGORY_ME) return true;
    if (k == UTF8PROC_CATEGORY_ND || k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_PC) return true;
    /* Join_Control, and the symbols that are Other_Alphabetic (circled and squared Latin letters) */
    return c == 0x200c || c == 0x200d || (c >= 0x24b6 && c <= 0x24e9) || (c >= 0x1f130 && c <= 0x1f149) ||
           (c >= 0x1f150 && c <= 0x1f169) || (c >= 0x1f170 && c <= 0x1f189);
}

/* ---- GPT-2's byte table ------------------------------------------------- */

static bool byte_printable(int b) { return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255); }

uint32_t tk_byte_char(uint8_t b) {
    if (byte_printable(b)) return b;
    uint32_t next = 0;
    for (int x = 0; x < b; x++)
        if (!byte_printable(x)) next++;
    return 256 + next;
}

int tk_char_byte(uint32_t cp) {
    static int table[324];
    static bool ready;
    if (!ready) {   /* idempotent: racing first calls write the same values */
        for (int i = 0; i < 324; i++) table[i] = -1;
        for (int b = 0; b < 256; b++) table[tk_byte_char((uint8_t)b)] = b;
        ready = true;
    }
    return cp < 324 ? table[cp] : -1;
}

/* ---- regular expressions ------------------------------------------------ */

struct tk_regex {
    pcre2_code *code;
};

struct tk_ctx {
    pcre2_match_data *md;
    pcre2_match_context *mc;
    pcre2_jit_stack *stack;
};

tk_ctx *tk_ctx_new(void) { return mf_xcalloc(1, sizeof(tk_ctx)); }

void tk_ctx_free(tk_ctx *c) {
    if (!c) return;
    pcre2_match_data_free(c->md);
    pcre2_match_context_free(c->mc);
    pcre2_jit_stack_free(c->stack);
    free(c);
}

/* Oniguruma's classes where PCRE2's differ (checked against Oniguruma 6.9.8 over every code point): \s is
 * Unicode White_Space (PCRE2 adds U+180E), \w is Alphabetic + M + Nd + Pc and six Latin-1 numbers when it stands alone (PCRE2 10.42:
 * L + N + '_'), and \b and [:alpha:] follow; \h is a hex digit; \uHHHH is a code point. */
#define ONIG_SPACE "\\t\\n\\x{0B}\\f\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"
#define ONIG_WORD_IN "\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}"   /* \\w inside brackets */
#define ONIG_WORD ONIG_WORD_IN "\\x{B2}\\x{B3}\\x{B9}\\x{BC}-\\x{BE}"     /* \\w alone takes 6 Latin-1 numbers too */
#define ONIG_BOUNDARY "(?:(?<=[" ONIG_WORD "])(?![" ONIG_WORD "])|(?<![" ONIG_WORD "])(?=[" ONIG_WORD "]))"
#define ONIG_NOT_BOUNDARY "(?:(?<=[" ONIG_WORD "])(?=[" ONIG_WORD "])|(?<![" ONIG_WORD "])(?![" ONIG_WORD "]))"
#define ONIG_HEX "0-9a-fA-F"

static bool is_hex(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

static void rewrite(const char *p, size_t n, tk_buf *o) {
    bool in_class = false;
    size_t class_start = 0;   /* index just after '[' or '[^' */
    for (size_t i = 0; i < n;) {
        const char c = p[i];
        if (c == '\\' && i + 1 < n) {
            const char e = p[i + 1];
            const char *inside = NULL, *outside = NULL;
            switch (e) {
            case 's': inside = ONIG_SPACE, outside = "[" ONIG_SPACE "]"; break;
            case 'S': outside = "[^" ONIG_SPACE "]"; break;
            case 'w': inside = ONIG_WORD_IN, outside = "[" ONIG_WORD "]"; break;
            case 'W': outside = "[^" ONIG_WORD "]"; break;
            case 'h': inside = ONIG_HEX, outside = "[" ONIG_HEX "]"; break;
            case 'H': outside = "[^" ONIG_HEX "]"; break;
            case 'b': outside = ONIG_BOUNDARY; break;
            case 'B': outside = ONIG_NOT_BOUNDARY; break;
            case 'u':
                if (i + 5 < n + 0 && is_hex(p[i + 2]) && is_hex(p[i + 3]) && is_hex(p[i + 4]) && is_hex(p[i + 5])) {
                    tkb_put(o, "\\x{", 3);
                    tkb_put(o, p + i + 2, 4);
                    tkb_putc(o, '}');
                    i += 6;
                    continue;
                }
                break;
            case 'Q': {   /* quoted up to \E: copied as it is */
                const char *q = NULL;
                for (size_t k = i + 2; k + 1 < n; k++)
                    if (p[k] == '\\' && p[k + 1] == 'E') {
                        q = p + k + 2;
                        break;
                    }
                const size_t end = q ? (size_t)(q - p) : n;
                tkb_put(o, p + i, end - i);
                i = end;
                continue;
            }
            default: break;
            }
            const char *with = in_class ? inside : outside;
            if (with) tkb_put(o, with, strlen(with));
            else tkb_put(o, p + i, 2);
            i += 2;
            continue;
        }
        if (!in_class && c == '[') {
            in_class = true;
            tkb_putc(o, c);
            i++;
            if (i < n && p[i] == '^') tkb_putc(o, p[i++]);
            class_start = i;
            continue;
        }
        if (in_class && c == '[' && i + 1 < n && p[i + 1] == ':') {   /* a POSIX class inside: [:alpha:] */
            size_t k = i + 2;
            while (k + 1 < n && !(p[k] == ':' && p[k + 1] == ']')) k++;
            const size_t end = k + 1 < n ? k + 2 : n;
            static const char *posix[][2] = {{"[:alpha:]", "\\p{Alphabetic}"}, {"[:alnum:]", "\\p{Alphabetic}\\p{Nd}"},
                                             {"[:space:]", ONIG_SPACE}, {"[:word:]", ONIG_WORD_IN}};
            const char *with = NULL;
            for (size_t q = 0; q < sizeof posix / sizeof *posix; q++)
                if (end - i == strlen(posix[q][0]) && !memcmp(p + i, posix[q][0], end - i)) with = posix[q][1];
            if (with) tkb_put(o, with, strlen(with));
            else tkb_put(o, p + i, end - i);
            i = end;
            continue;
        }
        if (in_class && c == ']' && i != class_start) in_class = false;
        tkb_putc(o, c);
        i++;
    }
}

int tk_regex_new(tk_regex **out, const char *pattern, size_t n, bool literal, const char *what, mf_error *err) {
    *out = NULL;
    if (n > TK_MAX_PATTERN_BYTES) return mf_fail(err, MF_EUNSUPPORTED, "%s: a pattern of %zu bytes (at most %d)", what, n, TK_MAX_PATTERN_BYTES);
    if (!tk_utf8_valid(pattern, n)) return mf_fail(err, MF_EFORMAT, "%s: the pattern is not UTF-8", what);
    tk_buf src = {0};
    if (literal) {   /* regex::escape, as Hugging Face compiles a String pattern */
        for (size_t i = 0; i < n; i++) {
            const unsigned char c = (unsigned char)pattern[i];
            if (c == 0) tkb_put(&src, "\\x{0}", 5);
            else {
                if (c < 0x80 && !((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == ' '))
                    tkb_putc(&src, '\\');
                tkb_putc(&src, (char)c);
            }
        }
        if (!src.s) tkb_put(&src, "", 0);
    } else {
        rewrite(pattern, n, &src);
        if (!src.s) tkb_put(&src, "", 0);
    }
    int ecode;
    PCRE2_SIZE eoff;
    pcre2_code *code = pcre2_compile((PCRE2_SPTR)src.s, src.n, PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE, &ecode, &eoff, NULL);
    tkb_free(&src);
    if (!code) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ecode, msg, sizeof msg);
        char q[160];
        return mf_fail(err, MF_EUNSUPPORTED, "%s: the pattern \"%s\" does not compile: %s", what, tk_quote(q, sizeof q, pattern, n),
                       (const char *)msg);
    }
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);   /* without JIT (where it is not built) it still matches */
    tk_regex *re = mf_xcalloc(1, sizeof *re);
    re->code = code;
    *out = re;
    return MF_OK;
}

void tk_regex_free(tk_regex *re) {
    if (!re) return;
    pcre2_code_free(re->code);
    free(re);
}

void tkr_push(tk_ranges *r, size_t a, size_t b, bool match) {
    if (r->n == r->cap) r->v = mf_xrealloc(r->v, (r->cap = r->cap ? r->cap * 2 : 16) * sizeof *r->v);
    r->v[r->n++] = (tk_range){a, b, match};
}

static int match_at(const tk_regex *re, tk_ctx *ctx, const char *s, size_t n, size_t start, size_t *ms, size_t *me,
                    mf_error *err) {
    if (!ctx->md) {
        ctx->md = pcre2_match_data_create(1, NULL);
        ctx->mc = pcre2_match_context_create(NULL);
        ctx->stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, NULL);
        if (!ctx->md || !ctx->mc) {
            fputs("moeflip: out of memory (regular expression match data)\n", stderr);
            exit(1);
        }
        if (ctx->stack) pcre2_jit_stack_assign(ctx->mc, NULL, ctx->stack);
    }
    int rc = pcre2_match(re->code, (PCRE2_SPTR)s, n, start, PCRE2_NO_UTF_CHECK, ctx->md, ctx->mc);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) rc = pcre2_match(re->code, (PCRE2_SPTR)s, n, start, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, ctx->md, ctx->mc);
    if (rc == PCRE2_ERROR_NOMATCH) return 0;
    if (rc < 0) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(rc, msg, sizeof msg);
        return mf_fail(err, MF_EUNSUPPORTED, "matching a pattern failed at byte %zu of a %zu-byte piece: %s", start, n, (const char *)msg);
    }
    const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(ctx->md);
    if (ov[0] > ov[1] || ov[1] > n) return mf_fail(err, MF_EUNSUPPORTED, "a pattern reported a match outside the text (\\K in a lookaround?)");
    *ms = ov[0];
    *me = ov[1];
    return 1;
}

int tk_regex_find(const tk_regex *re, tk_ctx *ctx, const char *s, size_t n, tk_ranges *out, mf_error *err) {
    out->n = 0;
    if (n == 0) {
        tkr_push(out, 0, 0, false);
        return MF_OK;
    }
    size_t prev = 0, last_end = 0, last_match_end = 0;
    bool have_last = false;
    while (last_end <= n) {   /* Oniguruma's FindMatches: an empty match right after the last match is skipped */
        size_t ms, me;
        const int rc = match_at(re, ctx, s, n, last_end, &ms, &me, err);
        if (rc < 0) return rc;
        if (rc == 0) break;
        if (ms == me && have_last && last_match_end == me) {
            last_end += last_end < n ? (size_t)tk_utf8_len((unsigned char)s[last_end]) : 1;
            continue;
        }
        last_end = me;
        last_match_end = me;
        have_last = true;
        if (prev != ms) tkr_push(out, prev, ms, false);
        tkr_push(out, ms, me, true);
        prev = me;
    }
    if (prev != n) tkr_push(out, prev, n, false);
    return MF_OK;
}

void tk_pred_find(bool (*pred)(uint32_t, const void *), const void *ud, const char *s, size_t n, tk_ranges *out) {
    out->n = 0;
    if (n == 0) {
        tkr_push(out, 0, 0, false);
        return;
    }
    size_t last_offset = 0, last_seen = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        const int len = tk_utf8_dec(s, n, i, &cp);
        last_seen = i + (size_t)len;
        if (pred(cp, ud)) {
            if (last_offset < i) tkr_push(out, last_offset, i, false);
            tkr_push(out, i, i + (size_t)len, true);
            last_offset = i + (size_t)len;
        }
        i += (size_t)len;
    }
    if (last_seen > last_offset) tkr_push(out, last_offset, last_seen, false);
}

/* ---- pieces and splitting ---------------------------------------------- */

void tkp_push(tk_pieces *p, char *s, size_t n, int32_t id, size_t orig0) {
    if (p->n == p->cap) p->v = mf_xrealloc(p->v, (p->cap = p->cap ? p->cap * 2 : 16) * sizeof *p->v);
    p->v[p->n++] = (tk_piece){s, n, id, orig0 < n ? orig0 : n};
}

void tkp_free(tk_pieces *p) {
    for (size_t i = 0; i < p->n; i++) free(p->v[i].s);
    free(p->v);
    memset(p, 0, sizeof *p);
}

int tk_behavior_parse(const char *s, tk_behavior *out) {
    static const char *names[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"};
    for (int i = 0; i < 5; i++)
        if (s && !strcmp(s, names[i])) {
            *out = (tk_behavior)i;
            return 0;
        }
    return -1;
}

void tk_split_piece(const tk_piece *piece, const tk_ranges *m, tk_behavior b, bool invert, tk_pieces *out) {
    /* (a, b, remove) after the behaviour, as NormalizedString::split folds its matches */
    tk_ranges r = {0};
    bool prev_match = false;
    switch (b) {
    case TK_ISOLATED:
        for (size_t i = 0; i < m->n; i++) tkr_push(&r, m->v[i].a, m->v[i].b, false);
        break;
    case TK_REMOVED:
        for (size_t i = 0; i < m->n; i++) tkr_push(&r, m->v[i].a, m->v[i].b, m->v[i].match != invert);
        break;
    case TK_CONTIGUOUS:
        for (size_t i = 0; i < m->n; i++) {
            const bool is_match = m->v[i].match != invert;
            if (is_match == prev_match && r.n) r.v[r.n - 1].b = m->v[i].b;
            else tkr_push(&r, m->v[i].a, m->v[i].b, false);
            prev_match = is_match;
        }
        break;
    case TK_MERGED_WITH_PREVIOUS:
        for (size_t i = 0; i < m->n; i++) {
            const bool is_match = m->v[i].match != invert;
            if (is_match && !prev_match && r.n) r.v[r.n - 1].b = m->v[i].b;
            else tkr_push(&r, m->v[i].a, m->v[i].b, false);
            prev_match = is_match;
        }
        break;
    case TK_MERGED_WITH_NEXT:
        for (size_t k = m->n; k-- > 0;) {
            const bool is_match = m->v[k].match != invert;
            if (is_match && !prev_match && r.n) r.v[r.n - 1].a = m->v[k].a;
            else tkr_push(&r, m->v[k].a, m->v[k].b, false);
            prev_match = is_match;
        }
        for (size_t i = 0; i < r.n / 2; i++) {
            const tk_range t = r.v[i];
            r.v[i] = r.v[r.n - 1 - i];
            r.v[r.n - 1 - i] = t;
        }
        break;
    }
    for (size_t i = 0; i < r.n; i++) {
        const tk_range x = r.v[i];
        if (x.match || x.b <= x.a || x.b > piece->n) continue;   /* removed, or empty */
        char *s = mf_xmalloc(x.b - x.a + 1);
        memcpy(s, piece->s + x.a, x.b - x.a);
        s[x.b - x.a] = 0;
        tkp_push(out, s, x.b - x.a, -1, piece->orig0 > x.a ? piece->orig0 - x.a : 0);
    }
    free(r.v);
}

/* ---- JSON helpers ------------------------------------------------------- */

const char *tkj_type(json_t *o) { return json_string_value(json_object_get(o, "type")); }

int tkj_bool(json_t *o, const char *key, int dflt, bool *out, const char *what, const char *origin, mf_error *err) {
    json_t *v = json_object_get(o, key);
    if (!v && dflt >= 0) {
        *out = dflt;
        return MF_OK;
    }
    if (!json_is_boolean(v)) return mf_fail(err, MF_EFORMAT, "%s: %s: \"%s\" must be true or false", origin, what, key);
    *out = json_is_true(v);
    return MF_OK;
}

int tkj_str(json_t *o, const char *key, bool optional, const char **out, size_t *len, const char *what,
            const char *origin, mf_error *err) {
    json_t *v = json_object_get(o, key);
    if ((!v || json_is_null(v)) && optional) {
        *out = NULL;
        if (len) *len = 0;
        return MF_OK;
    }
    if (!json_is_string(v)) return mf_fail(err, MF_EFORMAT, "%s: %s: \"%s\" must be a string", origin, what, key);
    *out = json_string_value(v);
    if (len) *len = json_string_length(v);
    return MF_OK;
}

int tkj_uint(json_t *o, const char *key, long long dflt, long long max, long long *out, const char *what,
             const char *origin, mf_error *err) {
    json_t *v = json_object_get(o, key);
    if (!v && dflt >= 0) {
        *out = dflt;
        return MF_OK;
    }
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > max)
        return mf_fail(err, MF_EFORMAT, "%s: %s: \"%s\" must be an integer from 0 to %lld", origin, what, key, max);
    *out = json_integer_value(v);
    return MF_OK;
}

int tkj_char(json_t *o, const char *key, bool optional, uint32_t dflt, uint32_t *out, const char *what,
             const char *origin, mf_error *err) {
    json_t *v = json_object_get(o, key);
    if (!v && optional) {
        *out = dflt;
        return MF_OK;
    }
    const char *s = json_string_value(v);
    const size_t n = json_string_length(v);
    uint32_t cp;
    if (!s || n == 0 || !tk_utf8_valid(s, n) || (size_t)tk_utf8_dec(s, n, 0, &cp) != n)
        return mf_fail(err, MF_EFORMAT, "%s: %s: \"%s\" must be a string of one character", origin, what, key);
    *out = cp;
    return MF_OK;
}

int tkj_pattern(json_t *o, const char *key, tk_regex **out, const char *what, const char *origin, mf_error *err) {
    json_t *p = json_object_get(o, key), *s = json_object_get(p, "String"), *r = json_object_get(p, "Regex");
    char who[300];
    snprintf(who, sizeof who, "%s: %s", origin, what);
    if (json_is_object(p) && json_object_size(p) == 1 && json_is_string(s))
        return tk_regex_new(out, json_string_value(s), json_string_length(s), true, who, err);
    if (json_is_object(p) && json_object_size(p) == 1 && json_is_string(r))
        return tk_regex_new(out, json_string_value(r), json_string_length(r), false, who, err);
    return mf_fail(err, MF_EFORMAT, "%s: \"%s\" must be {\"String\": ...} or {\"Regex\": ...}", who, key);
}
