/* Decoders, as Hugging Face tokenizers chains them over the tokens' strings (Decoder::decode_chain, then the
 * results joined): ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip, BPEDecoder, WordPiece, CTC and
 * Sequence. Any other is refused with its name. */
#include "tok_int.h"

#include <stdlib.h>
#include <string.h>

typedef enum {
    DC_BYTE_LEVEL, DC_METASPACE, DC_REPLACE, DC_BYTE_FALLBACK, DC_FUSE, DC_STRIP, DC_BPE, DC_WORDPIECE, DC_CTC, DC_SEQUENCE
} dc_kind;

struct tk_decoder {
    dc_kind kind;
    uint32_t ch;            /* Metaspace's replacement, Strip's content */
    bool never;             /* Metaspace: prepend_scheme never */
    long long start, stop;  /* Strip */
    tk_regex *re;           /* Replace */
    char *text, *text2;     /* Replace's content, BPEDecoder's suffix, WordPiece's prefix, CTC's pad and delimiter */
    size_t text_n, text2_n;
    bool cleanup;           /* WordPiece, CTC */
    tk_decoder **parts;
    size_t n_parts;
};

void tk_decoder_free(tk_decoder *d) {
    if (!d) return;
    for (size_t i = 0; i < d->n_parts; i++) tk_decoder_free(d->parts[i]);
    free(d->parts);
    tk_regex_free(d->re);
    free(d->text);
    free(d->text2);
    free(d);
}

bool tk_decoder_byte_level(const tk_decoder *d) {
    if (!d) return false;
    if (d->kind == DC_BYTE_LEVEL) return true;
    for (size_t i = 0; i < d->n_parts; i++)
        if (tk_decoder_byte_level(d->parts[i])) return true;
    return false;
}

static int str_field(json_t *j, const char *key, const char *dflt, char **out, size_t *n, const char *what,
                     const char *origin, mf_error *err) {
    const char *s;
    size_t len;
    const int rc = tkj_str(j, key, true, &s, &len, what, origin, err);
    if (rc) return rc;
    if (!s) s = dflt, len = strlen(dflt);
    *out = mf_xmalloc(len + 1);
    memcpy(*out, s, len);
    (*out)[len] = 0;
    *n = len;
    return MF_OK;
}

int tk_decoder_parse(tk_decoder **out, json_t *j, const char *origin, int depth, mf_error *err) {
    *out = NULL;
    if (depth > TK_MAX_DEPTH) return mf_fail(err, MF_EUNSUPPORTED, "%s: decoders nested more than %d deep", origin, TK_MAX_DEPTH);
    const char *type = tkj_type(j);
    if (!json_is_object(j) || !type) return mf_fail(err, MF_EFORMAT, "%s: a decoder must be an object with a \"type\"", origin);
    static const struct {
        const char *name;
        dc_kind kind;
    } names[] = {{"ByteLevel", DC_BYTE_LEVEL}, {"Metaspace", DC_METASPACE}, {"Replace", DC_REPLACE}, {"ByteFallback", DC_BYTE_FALLBACK},
                 {"Fuse", DC_FUSE}, {"Strip", DC_STRIP}, {"BPEDecoder", DC_BPE}, {"WordPiece", DC_WORDPIECE}, {"CTC", DC_CTC},
                 {"Sequence", DC_SEQUENCE}};
    int kind = -1;
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (!strcmp(type, names[i].name)) kind = (int)names[i].kind;
    if (kind < 0) {
        char q[80];
        return mf_fail(err, MF_EUNSUPPORTED, "%s: the decoder %s is not supported (supported: ByteLevel, Metaspace, Replace, "
                       "ByteFallback, Fuse, Strip, BPEDecoder, WordPiece, CTC, Sequence)", origin, tk_quote(q, sizeof q, type, strlen(type)));
    }
    tk_decoder *d = mf_xcalloc(1, sizeof *d);
    d->kind = (dc_kind)kind;
    int rc = MF_OK;
    switch (d->kind) {
    case DC_METASPACE: {
        if ((rc = tkj_char(j, "replacement", false, 0, &d->ch, "decoder Metaspace", origin, err))) break;
        json_t *ps = json_object_get(j, "prepend_scheme");
        const char *s = json_string_value(ps);
        if (ps && !(s && (!strcmp(s, "always") || !strcmp(s, "never") || !strcmp(s, "first")))) {
            rc = mf_fail(err, MF_EFORMAT, "%s: decoder Metaspace: \"prepend_scheme\" must be always, never or first", origin);
            break;
        }
        d->never = s && !strcmp(s, "never");
        if (json_is_false(json_object_get(j, "add_prefix_space"))) {
            if (ps && !d->never) {
                rc = mf_fail(err, MF_EFORMAT, "%s: decoder Metaspace: add_prefix_space does not match declared prepend_scheme", origin);
                break;
            }
            d->never = true;
        }
        break;
    }
    case DC_REPLACE:
        if ((rc = str_field(j, "content", "", &d->text, &d->text_n, "decoder Replace", origin, err))) break;
        if (!json_is_string(json_object_get(j, "content"))) {
            rc = mf_fail(err, MF_EFORMAT, "%s: decoder Replace: \"content\" must be a string", origin);
            break;
        }
        rc = tkj_pattern(j, "pattern", &d->re, "decoder Replace", origin, err);
        break;
    case DC_STRIP:
        if ((rc = tkj_char(j, "content", false, 0, &d->ch, "decoder Strip", origin, err))) break;
        if ((rc = tkj_uint(j, "start", -1, 1 << 30, &d->start, "decoder Strip", origin, err))) break;
        rc = tkj_uint(j, "stop", -1, 1 << 30, &d->stop, "decoder Strip", origin, err);
        break;
    case DC_BPE: rc = str_field(j, "suffix", "</w>", &d->text, &d->text_n, "decoder BPEDecoder", origin, err); break;
    case DC_WORDPIECE:
        if ((rc = str_field(j, "prefix", "##", &d->text, &d->text_n, "decoder WordPiece", origin, err))) break;
        rc = tkj_bool(j, "cleanup", 1, &d->cleanup, "decoder WordPiece", origin, err);
        break;
    case DC_CTC:
        if ((rc = str_field(j, "pad_token", "<pad>", &d->text, &d->text_n, "decoder CTC", origin, err))) break;
        if ((rc = str_field(j, "word_delimiter_token", "|", &d->text2, &d->text2_n, "decoder CTC", origin, err))) break;
        rc = tkj_bool(j, "cleanup", 1, &d->cleanup, "decoder CTC", origin, err);
        break;
    case DC_SEQUENCE: {
        json_t *a = json_object_get(j, "decoders");
        if (!json_is_array(a)) {
            rc = mf_fail(err, MF_EFORMAT, "%s: decoder Sequence: \"decoders\" must be an array", origin);
            break;
        }
        if (json_array_size(a) > TK_MAX_PARTS) {
            rc = mf_fail(err, MF_EUNSUPPORTED, "%s: decoder Sequence of more than %d parts", origin, TK_MAX_PARTS);
            break;
        }
        d->parts = mf_xcalloc(json_array_size(a) + 1, sizeof *d->parts);
        for (size_t i = 0; i < json_array_size(a) && !rc; i++) {
            rc = tk_decoder_parse(&d->parts[i], json_array_get(a, i), origin, depth + 1, err);
            if (!rc) d->n_parts++;
        }
        break;
    }
    default: break;
    }
    if (rc) {
        tk_decoder_free(d);
        return rc;
    }
    *out = d;
    return MF_OK;
}

/* ---- the chain ---------------------------------------------------------- */

typedef struct toks {
    tk_buf *v;
    size_t n, cap;
} toks;

static void toks_push(toks *t, tk_buf b) {
    if (t->n == t->cap) t->v = mf_xrealloc(t->v, (t->cap = t->cap ? t->cap * 2 : 16) * sizeof *t->v);
    if (!b.s) tkb_put(&b, "", 0);
    t->v[t->n++] = b;
}

static void toks_free(toks *t) {
    for (size_t i = 0; i < t->n; i++) tkb_free(&t->v[i]);
    free(t->v);
    memset(t, 0, sizeof *t);
}

/* Every occurrence of a (non-empty) by b, as Rust's str::replace. */
static void replace_all(tk_buf *s, const char *a, size_t an, const char *b, size_t bn) {
    if (!an || s->n < an) return;
    tk_buf o = {0};
    size_t i = 0;
    while (i < s->n) {
        if (i + an <= s->n && !memcmp(s->s + i, a, an)) {
            tkb_put(&o, b, bn);
            i += an;
        } else tkb_putc(&o, s->s[i++]);
    }
    if (!o.s) tkb_put(&o, "", 0);
    tkb_free(s);
    *s = o;
}

static void wordpiece_cleanup(tk_buf *s) {
    static const char *pairs[][2] = {{" .", "."}, {" ?", "?"}, {" !", "!"}, {" ,", ","}, {" ' ", "'"}, {" n't", "n't"},
                                     {" 'm", "'m"}, {" do not", " don't"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
    for (size_t i = 0; i < sizeof pairs / sizeof *pairs; i++) replace_all(s, pairs[i][0], strlen(pairs[i][0]), pairs[i][1], strlen(pairs[i][1]));
}

/* A "<0xXX>" token's byte (Rust's u8::from_str_radix over the two characters, which takes a leading '+'). */
static int fallback_byte(const tk_buf *t) {
    if (t->n != 6 || memcmp(t->s, "<0x", 3) || t->s[5] != '>') return -1;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        const char c = t->s[i];
        if (i == 3 && c == '+') continue;
        const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

static void flush_bytes(toks *out, tk_buf *bytes) {
    if (!bytes->n) return;
    if (tk_utf8_valid(bytes->s, bytes->n)) {
        tk_buf t = {0};
        tkb_put(&t, bytes->s, bytes->n);
        toks_push(out, t);
    } else
        for (size_t i = 0; i < bytes->n; i++) {
            tk_buf t = {0};
            tkb_put(&t, "\xef\xbf\xbd", 3);
            toks_push(out, t);
        }
    bytes->n = 0;
}

static int chain(const tk_decoder *d, tk_ctx *ctx, toks *t, mf_error *err) {
    toks out = {0};
    int rc = MF_OK;
    switch (d->kind) {
    case DC_SEQUENCE:
        for (size_t i = 0; i < d->n_parts && !rc; i++) rc = chain(d->parts[i], ctx, t, err);
        return rc;
    case DC_BYTE_LEVEL: {
        tk_buf bytes = {0}, one = {0};
        for (size_t i = 0; i < t->n; i++) {
            const tk_buf *s = &t->v[i];
            bool all = true;
            const size_t mark = bytes.n;
            for (size_t k = 0; k < s->n && all;) {
                uint32_t cp;
                const int len = tk_utf8_dec(s->s, s->n, k, &cp);
                const int b = tk_char_byte(cp);
                if (b < 0) all = false;
                else tkb_putc(&bytes, (char)b);
                k += (size_t)len;
            }
            if (!all) {   /* a token with a character outside the table goes in as its bytes */
                bytes.n = mark;
                tkb_put(&bytes, s->s, s->n);
            }
        }
        tk_utf8_lossy(&one, bytes.s ? bytes.s : "", bytes.n);
        tkb_free(&bytes);
        toks_push(&out, one);
        break;
    }
    case DC_METASPACE:
        for (size_t i = 0; i < t->n; i++) {
            tk_buf o = {0};
            const tk_buf *s = &t->v[i];
            for (size_t k = 0; k < s->n;) {
                uint32_t cp;
                const int len = tk_utf8_dec(s->s, s->n, k, &cp);
                if (cp == d->ch) {
                    if (!(i == 0 && !d->never)) tkb_putc(&o, ' ');
                } else tkb_put(&o, s->s + k, (size_t)len);
                k += (size_t)len;
            }
            toks_push(&out, o);
        }
        break;
    case DC_REPLACE: {
        tk_ranges m = {0};
        for (size_t i = 0; i < t->n && !rc; i++) {
            const tk_buf *s = &t->v[i];
            if ((rc = tk_regex_find(d->re, ctx, s->s ? s->s : "", s->n, &m, err))) break;
            tk_buf o = {0};
            for (size_t k = 0; k < m.n; k++) {
                if (m.v[k].match) tkb_put(&o, d->text, d->text_n);
                else tkb_put(&o, s->s + m.v[k].a, m.v[k].b - m.v[k].a);
            }
            toks_push(&out, o);
        }
        free(m.v);
        break;
    }
    case DC_BYTE_FALLBACK: {
        tk_buf bytes = {0};
        for (size_t i = 0; i < t->n; i++) {
            const int b = fallback_byte(&t->v[i]);
            if (b >= 0) {
                tkb_putc(&bytes, (char)b);
                continue;
            }
            flush_bytes(&out, &bytes);
            toks_push(&out, t->v[i]);
            memset(&t->v[i], 0, sizeof t->v[i]);
        }
        flush_bytes(&out, &bytes);
        tkb_free(&bytes);
        break;
    }
    case DC_FUSE: {
        tk_buf o = {0};
        for (size_t i = 0; i < t->n; i++) tkb_put(&o, t->v[i].s, t->v[i].n);
        toks_push(&out, o);
        break;
    }
    case DC_STRIP:
        for (size_t i = 0; i < t->n; i++) {
            const tk_buf *s = &t->v[i];
            size_t nc = 0, *starts = mf_xmalloc((s->n + 1) * sizeof *starts);
            uint32_t *cps = mf_xmalloc((s->n + 1) * sizeof *cps);
            for (size_t k = 0; k < s->n;) {
                starts[nc] = k;
                k += (size_t)tk_utf8_dec(s->s, s->n, k, &cps[nc]);
                nc++;
            }
            starts[nc] = s->n;
            size_t a = 0, b = nc;
            for (size_t k = 0; k < nc && (long long)k < d->start; k++) {
                if (cps[k] != d->ch) break;
                a = k + 1;
            }
            for (long long k = 0; k < d->stop && (size_t)k < nc; k++) {
                const size_t idx = nc - (size_t)k - 1;
                if (cps[idx] != d->ch) break;
                b = idx;
            }
            tk_buf o = {0};
            if (a < b) tkb_put(&o, s->s + starts[a], starts[b] - starts[a]);
            free(starts);
            free(cps);
            toks_push(&out, o);
        }
        break;
    case DC_BPE:
        for (size_t i = 0; i < t->n; i++) {
            tk_buf o = t->v[i];
            memset(&t->v[i], 0, sizeof t->v[i]);
            if (!o.s) tkb_put(&o, "", 0);
            replace_all(&o, d->text, d->text_n, i + 1 == t->n ? "" : " ", i + 1 == t->n ? 0 : 1);
            toks_push(&out, o);
        }
        break;
    case DC_WORDPIECE:
        for (size_t i = 0; i < t->n; i++) {
            tk_buf o = {0};
            const tk_buf *s = &t->v[i];
            if (i != 0) {
                if (s->n >= d->text_n && !memcmp(s->s, d->text, d->text_n)) tkb_put(&o, s->s + d->text_n, s->n - d->text_n);
                else {
                    tkb_putc(&o, ' ');
                    tkb_put(&o, s->s, s->n);
                }
            } else tkb_put(&o, s->s, s->n);
            if (d->cleanup) wordpiece_cleanup(&o);
            toks_push(&out, o);
        }
        break;
    case DC_CTC:
        for (size_t i = 0; i < t->n; i++) {
            if (i > 0 && t->v[i].n == t->v[i - 1].n && !memcmp(t->v[i].s, t->v[i - 1].s, t->v[i].n)) continue;   /* dedup */
            tk_buf o = {0};
            tkb_put(&o, t->v[i].s, t->v[i].n);
            replace_all(&o, d->text, d->text_n, "", 0);
            if (d->cleanup) {
                wordpiece_cleanup(&o);
                replace_all(&o, d->text2, d->text2_n, " ", 1);
            }
            if (o.n) toks_push(&out, o);
            else tkb_free(&o);
        }
        break;
    }
    if (rc) {
        toks_free(&out);
        return rc;
    }
    toks_free(t);
    *t = out;
    return MF_OK;
}

int tk_decode_chain(const tk_decoder *d, tk_ctx *ctx, tk_buf *tokens, size_t n, tk_buf *out, mf_error *err) {
    toks t = {tokens, n, n};
    out->n = 0;
    int rc = MF_OK;
    if (d) rc = chain(d, ctx, &t, err);
    if (!rc)
        for (size_t i = 0; i < t.n; i++) {
            if (!d && i) tkb_putc(out, ' ');   /* no decoder: the tokens joined by spaces */
            tkb_put(out, t.v[i].s, t.v[i].n);
        }
    if (!out->s) tkb_put(out, "", 0);
    toks_free(&t);
    return rc ? mf_fail_wrap(err, "decoder") : MF_OK;
}
