/* A Hugging Face tokenizer.json, encoding texts to the ids that tokenizers' Tokenizer.encode(text) gives and
 * decoding ids as its Tokenizer.decode does (0.23: tokenizer/mod.rs, added_vocabulary.rs, serialization.rs).
 *
 * Encoding: the added tokens that are not normalized are split out of the raw text; the normalizer runs on
 * each piece between them; the normalized added tokens are split out of the normalized pieces; the
 * pre-tokenizer cuts the rest into words; the BPE model gives each word's ids; the post-processor adds its
 * special tokens. Added tokens get their ids as tokenizers gives them when it reads the file (the model's id
 * of the content, else the next one past the vocabulary), match leftmost-longest, and honour single_word,
 * lstrip and rstrip. Truncation, padding and every component not implemented are refused by name. */
#include "tok_int.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

/* ---- added tokens ------------------------------------------------------- */

typedef struct added {
    char *content;
    size_t n;
    char *normed;   /* the content through the normalizer, when normalized and it differs (tokenizers' normalized_cache) */
    size_t normed_n;
    int32_t id;
    bool single_word, lstrip, rstrip, normalized, special;
} added;

/* A byte trie of the patterns, leftmost-longest. */
typedef struct trie {
    int32_t *term;   /* per node: the id of the pattern ending here, or -1 */
    size_t n_nodes, cap;
    uint64_t *ek;    /* edges: (node << 8 | byte) + 1 -> child */
    uint32_t *ev;
    size_t emask, en;
    uint8_t first[32];   /* bitmap of the patterns' first bytes */
} trie;

static void trie_init(trie *t) {
    memset(t, 0, sizeof *t);
    t->cap = 64;
    t->term = mf_xmalloc(t->cap * sizeof *t->term);
    t->term[0] = -1;
    t->n_nodes = 1;
    t->emask = 63;
    t->ek = mf_xcalloc(64, sizeof *t->ek);
    t->ev = mf_xcalloc(64, sizeof *t->ev);
}

static void trie_free(trie *t) {
    free(t->term);
    free(t->ek);
    free(t->ev);
    memset(t, 0, sizeof *t);
}

static size_t edge_slot(const trie *t, uint64_t key) {
    size_t i = XXH3_64bits(&key, sizeof key) & t->emask;
    while (t->ek[i] && t->ek[i] != key) i = (i + 1) & t->emask;
    return i;
}

static int64_t trie_child(const trie *t, uint32_t node, uint8_t b) {
    const uint64_t key = ((uint64_t)node << 8 | b) + 1;
    const size_t i = edge_slot(t, key);
    return t->ek[i] ? (int64_t)t->ev[i] : -1;
}

/* false when the pattern is already there */
static bool trie_add(trie *t, const char *s, size_t n, int32_t id) {
    uint32_t node = 0;
    t->first[(uint8_t)s[0] >> 3] |= (uint8_t)(1u << ((uint8_t)s[0] & 7));
    for (size_t i = 0; i < n; i++) {
        int64_t c = trie_child(t, node, (uint8_t)s[i]);
        if (c < 0) {
            if ((t->en + 1) * 2 > t->emask + 1) {   /* grow the edge table */
                const size_t oc = t->emask + 1;
                uint64_t *ok = t->ek;
                uint32_t *ov = t->ev;
                t->emask = oc * 2 - 1;
                t->ek = mf_xcalloc(oc * 2, sizeof *t->ek);
                t->ev = mf_xcalloc(oc * 2, sizeof *t->ev);
                for (size_t k = 0; k < oc; k++)
                    if (ok[k]) {
                        const size_t j = edge_slot(t, ok[k]);
                        t->ek[j] = ok[k];
                        t->ev[j] = ov[k];
                    }
                free(ok);
                free(ov);
            }
            if (t->n_nodes == t->cap) t->term = mf_xrealloc(t->term, (t->cap *= 2) * sizeof *t->term);
            t->term[t->n_nodes] = -1;
            const uint64_t key = ((uint64_t)node << 8 | (uint8_t)s[i]) + 1;
            const size_t j = edge_slot(t, key);
            t->ek[j] = key;
            t->ev[j] = (uint32_t)t->n_nodes;
            t->en++;
            c = (int64_t)t->n_nodes++;
        }
        node = (uint32_t)c;
    }
    if (t->term[node] >= 0) return false;
    t->term[node] = id;
    return true;
}

/* The leftmost-longest match at or after pos: its start, end and id; false when none. */
static bool trie_find(const trie *t, const char *s, size_t n, size_t pos, size_t *ms, size_t *me, int32_t *id) {
    if (t->n_nodes <= 1) return false;
    for (size_t a = pos; a < n; a++) {
        const uint8_t b0 = (uint8_t)s[a];
        if (!(t->first[b0 >> 3] & (1u << (b0 & 7)))) continue;
        uint32_t node = 0;
        int32_t best = -1;
        size_t best_end = 0;
        for (size_t k = a; k < n; k++) {
            const int64_t c = trie_child(t, node, (uint8_t)s[k]);
            if (c < 0) break;
            node = (uint32_t)c;
            if (t->term[node] >= 0) best = t->term[node], best_end = k + 1;
        }
        if (best >= 0) {
            *ms = a, *me = best_end, *id = best;
            return true;
        }
    }
    return false;
}

/* ---- post-processors ---------------------------------------------------- */

typedef enum { PP_TEMPLATE, PP_ROBERTA, PP_BERT, PP_BYTE_LEVEL, PP_SEQUENCE } pp_kind;

typedef struct pp_piece {
    bool sequence;   /* $A, else a special token's ids */
    int32_t *ids;
    size_t n;
} pp_piece;

typedef struct tk_post {
    pp_kind kind;
    pp_piece *pieces;
    size_t n_pieces;
    int32_t cls, sep;
    struct tk_post **parts;
    size_t n_parts;
} tk_post;

static void post_free(tk_post *p) {
    if (!p) return;
    for (size_t i = 0; i < p->n_pieces; i++) free(p->pieces[i].ids);
    free(p->pieces);
    for (size_t i = 0; i < p->n_parts; i++) post_free(p->parts[i]);
    free(p->parts);
    free(p);
}

static int id_value(json_t *v, int32_t *out) {
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > TK_MAX_ID) return -1;
    *out = (int32_t)json_integer_value(v);
    return 0;
}

static int post_parse(tk_post **out, json_t *j, const char *origin, int depth, mf_error *err) {
    *out = NULL;
    if (depth > TK_MAX_DEPTH) return mf_fail(err, MF_EUNSUPPORTED, "%s: post-processors nested more than %d deep", origin, TK_MAX_DEPTH);
    const char *type = tkj_type(j);
    if (!json_is_object(j) || !type) return mf_fail(err, MF_EFORMAT, "%s: a post-processor must be an object with a \"type\"", origin);
    tk_post *p = mf_xcalloc(1, sizeof *p);
    int rc = MF_OK;
    char q[120];
    if (!strcmp(type, "TemplateProcessing")) {
        p->kind = PP_TEMPLATE;
        json_t *single = json_object_get(j, "single"), *special = json_object_get(j, "special_tokens");
        if (!json_is_array(single) || json_array_size(single) > TK_MAX_PARTS || (special && !json_is_object(special))) {
            rc = mf_fail(err, MF_EFORMAT, "%s: post-processor TemplateProcessing: \"single\" must be an array (at most %d pieces) and "
                         "\"special_tokens\" an object", origin, TK_MAX_PARTS);
            goto done;
        }
        p->pieces = mf_xcalloc(json_array_size(single) + 1, sizeof *p->pieces);
        for (size_t i = 0; i < json_array_size(single); i++) {
            json_t *pc = json_array_get(single, i), *seq = json_object_get(pc, "Sequence"), *sp = json_object_get(pc, "SpecialToken");
            pp_piece *x = &p->pieces[p->n_pieces++];
            if (json_is_object(seq)) {
                const char *sid = json_string_value(json_object_get(seq, "id"));
                if (!sid || strcmp(sid, "A")) {
                    rc = mf_fail(err, MF_EUNSUPPORTED, "%s: post-processor TemplateProcessing: the single template's piece %zu is sequence "
                                 "%s (a single text is sequence A)", origin, i + 1, sid ? tk_quote(q, sizeof q, sid, strlen(sid)) : "?");
                    goto done;
                }
                x->sequence = true;
                continue;
            }
            const char *name = json_string_value(json_object_get(sp, "id"));
            json_t *tok = name ? json_object_get(special, name) : NULL, *ids = json_object_get(tok, "ids");
            if (!name || !json_is_array(ids) || json_array_size(ids) > TK_MAX_PARTS) {
                rc = mf_fail(err, MF_EFORMAT, "%s: post-processor TemplateProcessing: piece %zu must be a Sequence or a SpecialToken listed "
                             "in special_tokens with its ids%s%s", origin, i + 1, name ? ": missing " : "",
                             name ? tk_quote(q, sizeof q, name, strlen(name)) : "");
                goto done;
            }
            x->ids = mf_xmalloc((json_array_size(ids) + 1) * sizeof *x->ids);
            for (size_t k = 0; k < json_array_size(ids); k++)
                if (id_value(json_array_get(ids, k), &x->ids[x->n++])) {
                    rc = mf_fail(err, MF_EFORMAT, "%s: post-processor TemplateProcessing: special token %s: ids must be integers from 0 to %d",
                                 origin, tk_quote(q, sizeof q, name, strlen(name)), TK_MAX_ID);
                    goto done;
                }
        }
    } else if (!strcmp(type, "RobertaProcessing") || !strcmp(type, "BertProcessing")) {
        p->kind = type[0] == 'R' ? PP_ROBERTA : PP_BERT;
        json_t *cls = json_object_get(j, "cls"), *sep = json_object_get(j, "sep");
        if (!json_is_array(cls) || json_array_size(cls) != 2 || id_value(json_array_get(cls, 1), &p->cls) || !json_is_array(sep) ||
            json_array_size(sep) != 2 || id_value(json_array_get(sep, 1), &p->sep)) {
            rc = mf_fail(err, MF_EFORMAT, "%s: post-processor %s: \"cls\" and \"sep\" must be [token, id]", origin, type);
            goto done;
        }
    } else if (!strcmp(type, "ByteLevel")) {
        p->kind = PP_BYTE_LEVEL;   /* it trims offsets only */
    } else if (!strcmp(type, "Sequence")) {
        p->kind = PP_SEQUENCE;
        json_t *a = json_object_get(j, "processors");
        if (!json_is_array(a) || json_array_size(a) > TK_MAX_PARTS) {
            rc = mf_fail(err, MF_EFORMAT, "%s: post-processor Sequence: \"processors\" must be an array (at most %d)", origin, TK_MAX_PARTS);
            goto done;
        }
        p->parts = mf_xcalloc(json_array_size(a) + 1, sizeof *p->parts);
        for (size_t i = 0; i < json_array_size(a) && !rc; i++) {
            rc = post_parse(&p->parts[i], json_array_get(a, i), origin, depth + 1, err);
            if (!rc) p->n_parts++;
        }
    } else {
        rc = mf_fail(err, MF_EUNSUPPORTED, "%s: the post-processor %s is not supported (supported: TemplateProcessing, RobertaProcessing, "
                     "BertProcessing, ByteLevel, Sequence)", origin, tk_quote(q, sizeof q, type, strlen(type)));
    }
done:
    if (rc) {
        post_free(p);
        return rc;
    }
    *out = p;
    return MF_OK;
}

static void ids_push(int32_t **ids, size_t *n, size_t *cap, int32_t id) {
    if (*n == *cap) *ids = mf_xrealloc(*ids, (*cap = *cap ? *cap * 2 : 64) * sizeof **ids);
    (*ids)[(*n)++] = id;
}

/* The single sequence through the post-processor (add_special_tokens). */
static void post_apply(const tk_post *p, int32_t **ids, size_t *n, size_t *cap) {
    if (p->kind == PP_BYTE_LEVEL) return;
    if (p->kind == PP_SEQUENCE) {
        for (size_t i = 0; i < p->n_parts; i++) post_apply(p->parts[i], ids, n, cap);
        return;
    }
    int32_t *seq = *ids;
    const size_t sn = *n;
    int32_t *o = NULL;
    size_t on = 0, ocap = 0;
    if (p->kind == PP_TEMPLATE) {
        for (size_t i = 0; i < p->n_pieces; i++) {
            const pp_piece *x = &p->pieces[i];
            if (x->sequence)
                for (size_t k = 0; k < sn; k++) ids_push(&o, &on, &ocap, seq[k]);
            else
                for (size_t k = 0; k < x->n; k++) ids_push(&o, &on, &ocap, x->ids[k]);
        }
    } else {
        ids_push(&o, &on, &ocap, p->cls);
        for (size_t k = 0; k < sn; k++) ids_push(&o, &on, &ocap, seq[k]);
        ids_push(&o, &on, &ocap, p->sep);
    }
    free(seq);
    *ids = o, *n = on, *cap = ocap;
}

/* ---- the tokenizer ------------------------------------------------------ */

struct mf_tokenizer {
    char *origin;
    tk_normalizer *norm;
    tk_pretok *pre;
    tk_bpe *bpe;
    tk_decoder *dec;
    tk_post *post;
    added *added;        /* sorted by id, one per id */
    size_t n_added;
    trie raw, normed;    /* tokenizers' split_trie and split_normalized_trie */
    char **special;      /* contents of the special tokens, sorted */
    size_t *special_n;
    size_t n_special;
    bool byte_level;     /* tokens' characters stand for bytes (the per-token decoding) */
    int size;
};

static int cmp_added(const void *a, const void *b) {
    const int32_t x = ((const added *)a)->id, y = ((const added *)b)->id;
    return x < y ? -1 : x > y;
}

static const added *added_by_id(const mf_tokenizer *t, int32_t id) {
    size_t lo = 0, hi = t->n_added;
    while (lo < hi) {
        const size_t mid = (lo + hi) / 2;
        if (t->added[mid].id < id) lo = mid + 1;
        else hi = mid;
    }
    return lo < t->n_added && t->added[lo].id == id ? &t->added[lo] : NULL;
}

typedef struct sref {
    const char *s;
    size_t n;
} sref;

static int cmp_sref(const void *a, const void *b) {
    const sref *x = a, *y = b;
    const int c = memcmp(x->s, y->s, x->n < y->n ? x->n : y->n);
    return c ? c : (x->n > y->n) - (x->n < y->n);
}

static bool is_special(const mf_tokenizer *t, const char *s, size_t n) {
    size_t lo = 0, hi = t->n_special;
    const sref k = {s, n};
    while (lo < hi) {
        const size_t mid = (lo + hi) / 2;
        const int c = cmp_sref(&(sref){t->special[mid], t->special_n[mid]}, &k);
        if (c == 0) return true;
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return false;
}

void mf_tokenizer_free(mf_tokenizer *t) {
    if (!t) return;
    tk_normalizer_free(t->norm);
    tk_pretok_free(t->pre);
    tk_bpe_free(t->bpe);
    tk_decoder_free(t->dec);
    post_free(t->post);
    for (size_t i = 0; i < t->n_added; i++) {
        free(t->added[i].content);
        free(t->added[i].normed);
    }
    free(t->added);
    trie_free(&t->raw);
    trie_free(&t->normed);
    for (size_t i = 0; i < t->n_special; i++) free(t->special[i]);
    free(t->special);
    free(t->special_n);
    free(t->origin);
    free(t);
}

int mf_tokenizer_size(const mf_tokenizer *t) { return t->size; }

/* The added_tokens array, ids assigned as AddedVocabulary::add_tokens does. */
static int parse_added(mf_tokenizer *t, json_t *arr, tk_ctx *ctx, mf_error *err) {
    const char *o = t->origin;
    if (arr && !json_is_array(arr)) return mf_fail(err, MF_EFORMAT, "%s: \"added_tokens\" must be an array", o);
    const size_t na = json_array_size(arr);
    if (na > TK_MAX_VOCAB) return mf_fail(err, MF_EUNSUPPORTED, "%s: more than %d added tokens", o, TK_MAX_VOCAB);
    /* by content while assigning (a linear table: contents are few) */
    added *v = mf_xcalloc(na + 1, sizeof *v);
    size_t nv = 0;
    sref *specials = mf_xcalloc(na + 1, sizeof *specials);
    size_t ns = 0;
    const size_t vocab_n = tk_bpe_count(t->bpe);
    int64_t next_id = (int64_t)vocab_n;
    int rc = MF_OK;
    /* content -> index in v, through a small open-addressing table */
    size_t hcap = 64;
    while (hcap < na * 2) hcap *= 2;
    uint32_t *h = mf_xcalloc(hcap, sizeof *h), *hid = mf_xcalloc(hcap, sizeof *hid);   /* by content, by id */
    tk_buf nb = {0};
    for (size_t i = 0; i < na && !rc; i++) {
        json_t *e = json_array_get(arr, i), *c = json_object_get(e, "content");
        char q[120];
        if (!json_is_object(e) || !json_is_string(c)) {
            rc = mf_fail(err, MF_EFORMAT, "%s: added token %zu must be an object with a string \"content\"", o, i + 1);
            break;
        }
        added x = {0};
        const char *cs = json_string_value(c);
        x.n = json_string_length(c);
        if (x.n == 0) continue;   /* ignored, as tokenizers does */
        if (x.n > TK_MAX_ADDED_BYTES) {
            rc = mf_fail(err, MF_EUNSUPPORTED, "%s: added token %zu: %zu bytes (at most %d)", o, i + 1, x.n, TK_MAX_ADDED_BYTES);
            break;
        }
        x.normalized = true;
        const char *what = "added token";
        if ((rc = tkj_bool(e, "single_word", 0, &x.single_word, what, o, err)) || (rc = tkj_bool(e, "lstrip", 0, &x.lstrip, what, o, err)) ||
            (rc = tkj_bool(e, "rstrip", 0, &x.rstrip, what, o, err)) || (rc = tkj_bool(e, "normalized", 1, &x.normalized, what, o, err)) ||
            (rc = tkj_bool(e, "special", 0, &x.special, what, o, err)))
            break;
        const uint64_t hh = XXH3_64bits(cs, x.n);
        size_t slot = hh & (hcap - 1);
        while (h[slot] && !(v[h[slot] - 1].n == x.n && !memcmp(v[h[slot] - 1].content, cs, x.n))) slot = (slot + 1) & (hcap - 1);
        added *prev = h[slot] ? &v[h[slot] - 1] : NULL;
        if (prev && prev->single_word == x.single_word && prev->lstrip == x.lstrip && prev->rstrip == x.rstrip &&
            prev->normalized == x.normalized && prev->special == x.special)
            continue;   /* the same token again */
        int64_t id;
        if (prev) id = prev->id;
        else {
            const int32_t mid = tk_bpe_token_id(t->bpe, cs, x.n);
            id = mid >= 0 ? mid : next_id++;
        }
        if (id > TK_MAX_ID) {
            rc = mf_fail(err, MF_EUNSUPPORTED, "%s: added token %s would get id %lld (beyond %d)", o, tk_quote(q, sizeof q, cs, x.n),
                         (long long)id, TK_MAX_ID);
            break;
        }
        x.id = (int32_t)id;
        if (x.special) specials[ns++] = (sref){cs, x.n};
        /* a token of the same id (another content that is the model's token of that id cannot be: ids are the
         * model's or new) is replaced */
        const uint64_t ih = XXH3_64bits(&x.id, sizeof x.id);
        size_t islot = ih & (hcap - 1);
        while (hid[islot] && v[hid[islot] - 1].id != x.id) islot = (islot + 1) & (hcap - 1);
        added *dst = hid[islot] ? &v[hid[islot] - 1] : NULL;
        char *old_normed = dst ? dst->normed : NULL;
        size_t old_normed_n = dst ? dst->normed_n : 0;
        if (dst) free(dst->content);
        else {
            dst = &v[nv++];
            h[slot] = hid[islot] = (uint32_t)nv;
        }
        x.content = mf_xmalloc(x.n + 1);
        memcpy(x.content, cs, x.n);
        x.content[x.n] = 0;
        x.normed = old_normed, x.normed_n = old_normed_n;   /* tokenizers keeps a stale cache entry too */
        if (x.normalized && t->norm) {
            size_t orig0 = 0;
            if ((rc = tk_normalize(t->norm, ctx, cs, x.n, &nb, &orig0, err))) {
                *dst = x;
                rc = mf_fail_wrap(err, "%s: added token %s", o, tk_quote(q, sizeof q, cs, x.n));
                break;
            }
            if (nb.n != x.n || memcmp(nb.s, cs, x.n)) {
                free(x.normed);
                x.normed = mf_xmalloc(nb.n + 1);
                memcpy(x.normed, nb.s ? nb.s : "", nb.n);
                x.normed[nb.n] = 0;
                x.normed_n = nb.n;
            }
        }
        *dst = x;
    }
    tkb_free(&nb);
    free(h);
    free(hid);
    if (!rc) {
        qsort(v, nv, sizeof *v, cmp_added);
        trie_init(&t->raw);
        trie_init(&t->normed);
        for (size_t i = 0; i < nv && !rc; i++) {
            const bool nz = v[i].normalized;
            const char *p = nz && v[i].normed ? v[i].normed : v[i].content;
            const size_t pn = nz && v[i].normed ? v[i].normed_n : v[i].n;
            char q[120];
            if (pn == 0) rc = mf_fail(err, MF_EUNSUPPORTED, "%s: added token %s normalizes to nothing", o, tk_quote(q, sizeof q, v[i].content, v[i].n));
            else if (!trie_add(nz ? &t->normed : &t->raw, p, pn, v[i].id))
                rc = mf_fail(err, MF_EUNSUPPORTED, "%s: two added tokens match the same text %s (tokenizers refuses the file too)", o,
                             tk_quote(q, sizeof q, p, pn));
        }
        qsort(specials, ns, sizeof *specials, cmp_sref);
        t->special = mf_xcalloc(ns + 1, sizeof *t->special);
        t->special_n = mf_xcalloc(ns + 1, sizeof *t->special_n);
        for (size_t i = 0; i < ns; i++) {
            if (t->n_special && cmp_sref(&(sref){t->special[t->n_special - 1], t->special_n[t->n_special - 1]}, &specials[i]) == 0) continue;
            t->special[t->n_special] = mf_xmalloc(specials[i].n + 1);
            memcpy(t->special[t->n_special], specials[i].s, specials[i].n);
            t->special[t->n_special][specials[i].n] = 0;
            t->special_n[t->n_special++] = specials[i].n;
        }
    }
    free(specials);
    t->added = v;
    t->n_added = nv;
    return rc;
}

int mf_tokenizer_parse(mf_tokenizer **out, const char *text, size_t len, const char *origin, mf_error *err) {
    *out = NULL;
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_ALLOW_NUL, &je);
    if (!root) return mf_fail(err, MF_EFORMAT, "%s:%d: not JSON: %s", origin, je.line, je.text);
    mf_tokenizer *t = mf_xcalloc(1, sizeof *t);
    t->origin = mf_xstrdup(origin);
    tk_ctx *ctx = tk_ctx_new();
    int rc = MF_OK;
    json_t *v;
    if (!json_is_object(root)) {
        rc = mf_fail(err, MF_EFORMAT, "%s: not a tokenizer.json (not an object)", origin);
        goto done;
    }
    v = json_object_get(root, "version");
    if (v && !(json_is_string(v) && !strcmp(json_string_value(v), "1.0"))) {
        rc = mf_fail(err, MF_EUNSUPPORTED, "%s: unknown tokenizer version (only \"1.0\")", origin);
        goto done;
    }
    if ((v = json_object_get(root, "truncation")) && !json_is_null(v)) {
        rc = mf_fail(err, MF_EUNSUPPORTED, "%s: truncation is not supported (set \"truncation\" to null)", origin);
        goto done;
    }
    if ((v = json_object_get(root, "padding")) && !json_is_null(v)) {
        rc = mf_fail(err, MF_EUNSUPPORTED, "%s: padding is not supported (set \"padding\" to null)", origin);
        goto done;
    }
    if (!(v = json_object_get(root, "model"))) {
        rc = mf_fail(err, MF_EFORMAT, "%s: no \"model\"", origin);
        goto done;
    }
    if ((rc = tk_bpe_parse(&t->bpe, v, origin, err))) goto done;
    if ((v = json_object_get(root, "normalizer")) && !json_is_null(v) && (rc = tk_normalizer_parse(&t->norm, v, origin, 0, err))) goto done;
    if ((v = json_object_get(root, "pre_tokenizer")) && !json_is_null(v) && (rc = tk_pretok_parse(&t->pre, v, origin, 0, err))) goto done;
    if ((v = json_object_get(root, "post_processor")) && !json_is_null(v) && (rc = post_parse(&t->post, v, origin, 0, err))) goto done;
    if ((v = json_object_get(root, "decoder")) && !json_is_null(v) && (rc = tk_decoder_parse(&t->dec, v, origin, 0, err))) goto done;
    if ((rc = parse_added(t, json_object_get(root, "added_tokens"), ctx, err))) goto done;
    int64_t max = tk_bpe_max_id(t->bpe);
    for (size_t i = 0; i < t->n_added; i++)
        if (t->added[i].id > max) max = t->added[i].id;
    t->size = (int)(max + 1);
    t->byte_level = tk_decoder_byte_level(t->dec) || (!t->dec && tk_pretok_byte_level(t->pre));
done:
    tk_ctx_free(ctx);
    json_decref(root);
    if (rc) {
        mf_tokenizer_free(t);
        return rc;
    }
    *out = t;
    return MF_OK;
}

int mf_tokenizer_load(mf_tokenizer **out, const char *path, mf_error *err) {
    *out = NULL;
    char *text;
    size_t len;
    int rc = mf_read_file(path, &text, &len, err);
    if (rc) return rc;
    if (len > TK_MAX_FILE_BYTES) {
        free(text);
        return mf_fail(err, MF_EUNSUPPORTED, "%s: %zu bytes (a tokenizer.json of at most %zu is read)", path, len, TK_MAX_FILE_BYTES);
    }
    rc = mf_tokenizer_parse(out, text, len, path, err);
    free(text);
    return rc;
}

/* ---- encoding ------------------------------------------------------------ */

/* AddedVocabulary::find_matches: the string cut at the added tokens of one trie, single_word, lstrip and rstrip
 * applied; each range with its token's id or -1. */
static void find_added(const mf_tokenizer *t, const trie *tr, const char *s, size_t n, tk_ranges *out, int32_t **ids,
                       size_t *ids_cap) {
    out->n = 0;
    size_t nid = 0;
#define PUSH(a, b, id)                                                                                                 \
    do {                                                                                                               \
        tkr_push(out, (a), (b), (id) >= 0);                                                                            \
        if (nid == *ids_cap) *ids = mf_xrealloc(*ids, (*ids_cap = *ids_cap ? *ids_cap * 2 : 16) * sizeof **ids);        \
        (*ids)[nid++] = (id);                                                                                          \
    } while (0)
    if (n == 0) {
        PUSH(0, 0, -1);
        return;
    }
    size_t start_offset = 0, pos = 0, ms, me;
    int32_t id;
    while (pos < n && trie_find(tr, s, n, pos, &ms, &me, &id)) {
        pos = me;   /* the automaton goes on after the match, whether it is taken or not */
        const added *a = added_by_id(t, id);
        size_t start = ms, stop = me;
        if (a->single_word) {
            uint32_t cp;
            bool start_space = start == 0, stop_space = stop == n;
            if (!start_space) {
                size_t k = start - 1;
                while (k > 0 && ((unsigned char)s[k] & 0xc0) == 0x80) k--;
                tk_utf8_dec(s, n, k, &cp);
                start_space = !tk_is_word(cp);
            }
            if (!stop_space) {
                tk_utf8_dec(s, n, stop, &cp);
                stop_space = !tk_is_word(cp);
            }
            if (!start_space || !stop_space) continue;
        }
        if (a->lstrip) {   /* the spaces before it, not before what an earlier match took */
            size_t k = start;
            while (k > 0) {
                size_t j = k - 1;
                while (j > 0 && ((unsigned char)s[j] & 0xc0) == 0x80) j--;
                uint32_t cp;
                tk_utf8_dec(s, n, j, &cp);
                if (!tk_is_whitespace(cp)) break;
                k = j;
            }
            start = k > start_offset ? k : start_offset;
        }
        if (a->rstrip)
            while (stop < n) {
                uint32_t cp;
                const int len = tk_utf8_dec(s, n, stop, &cp);
                if (!tk_is_whitespace(cp)) break;
                stop += (size_t)len;
            }
        if (start_offset < start) PUSH(start_offset, start, -1);
        PUSH(start, stop, id);
        start_offset = stop;
    }
    if (start_offset != n) PUSH(start_offset, n, -1);
#undef PUSH
}

/* Cuts piece at the added tokens of trie into out (empty pieces dropped). */
static void split_added(const mf_tokenizer *t, const trie *tr, tk_piece *pc, tk_pieces *out) {
    tk_ranges r = {0};
    int32_t *ids = NULL;
    size_t cap = 0;
    find_added(t, tr, pc->s, pc->n, &r, &ids, &cap);
    for (size_t i = 0; i < r.n; i++) {
        const size_t a = r.v[i].a, b = r.v[i].b;
        if (b <= a || b > pc->n) continue;
        char *s = mf_xmalloc(b - a + 1);
        memcpy(s, pc->s + a, b - a);
        s[b - a] = 0;
        tkp_push(out, s, b - a, ids[i], pc->orig0 > a ? pc->orig0 - a : 0);
    }
    free(r.v);
    free(ids);
}

int mf_tokenizer_encode(const mf_tokenizer *t, const char *text, size_t len, bool add_special_tokens, int32_t **ids_out,
                        size_t *n_out, mf_error *err) {
    *ids_out = NULL;
    *n_out = 0;
    if (len > TK_MAX_TEXT_BYTES) return mf_fail(err, MF_EUNSUPPORTED, "a text of %zu bytes (at most %zu are encoded)", len, TK_MAX_TEXT_BYTES);
    if (!tk_utf8_valid(text, len)) return mf_fail(err, MF_EINVAL, "the text is not UTF-8");
    tk_ctx *ctx = tk_ctx_new();
    tk_pieces raw = {0}, pieces = {0};
    tk_buf nb = {0};
    int32_t *ids = NULL;
    size_t n = 0, cap = 0;
    int rc = MF_OK;
    {
        tk_piece whole = {(char *)text, len, -1, len ? (size_t)tk_utf8_len((unsigned char)text[0]) : 0};
        split_added(t, &t->raw, &whole, &raw);
    }
    for (size_t i = 0; i < raw.n && !rc; i++) {
        tk_piece *pc = &raw.v[i];
        if (pc->id >= 0) {
            tkp_push(&pieces, pc->s, pc->n, pc->id, pc->orig0);
            pc->s = NULL;
            continue;
        }
        size_t orig0 = pc->orig0;
        if ((rc = tk_normalize(t->norm, ctx, pc->s, pc->n, &nb, &orig0, err))) break;
        tk_piece np = {nb.s ? nb.s : "", nb.n, -1, orig0 < nb.n ? orig0 : nb.n};
        split_added(t, &t->normed, &np, &pieces);
    }
    if (!rc) rc = tk_pretokenize(t->pre, ctx, &pieces, err);
    for (size_t i = 0; i < pieces.n && !rc; i++) {
        if (pieces.v[i].id >= 0) ids_push(&ids, &n, &cap, pieces.v[i].id);
        else rc = tk_bpe_tokenize(t->bpe, pieces.v[i].s, pieces.v[i].n, &ids, &n, &cap, err);
    }
    if (!rc && add_special_tokens && t->post) post_apply(t->post, &ids, &n, &cap);
    tkp_free(&raw);
    tkp_free(&pieces);
    tkb_free(&nb);
    tk_ctx_free(ctx);
    if (rc) {
        free(ids);
        return mf_fail_wrap(err, "%s", t->origin);
    }
    *ids_out = ids ? ids : mf_xmalloc(sizeof *ids);
    *n_out = n;
    return MF_OK;
}

/* ---- decoding ------------------------------------------------------------ */

/* An id's string as Tokenizer::decode takes it (an added token's normalized form), or NULL. */
static const char *id_string(const mf_tokenizer *t, int32_t id, size_t *n, bool *is_added) {
    const added *a = added_by_id(t, id);
    *is_added = a != NULL;
    if (a) {
        *n = a->normed ? a->normed_n : a->n;
        return a->normed ? a->normed : a->content;
    }
    return tk_bpe_id_token(t->bpe, id, n);
}

int mf_tokenizer_decode_text(const mf_tokenizer *t, const int32_t *ids, size_t n, bool skip_special_tokens, char **text,
                             size_t *len, mf_error *err) {
    *text = NULL;
    if (len) *len = 0;
    tk_buf *toks = mf_xcalloc(n + 1, sizeof *toks);
    size_t nt = 0;
    for (size_t i = 0; i < n; i++) {
        size_t sn;
        bool is_added;
        const char *s = id_string(t, ids[i], &sn, &is_added);
        if (!s || (skip_special_tokens && is_special(t, s, sn))) continue;
        tkb_put(&toks[nt++], s, sn);
    }
    tk_buf out = {0};
    tk_ctx *ctx = tk_ctx_new();
    const int rc = tk_decode_chain(t->dec, ctx, toks, nt, &out, err);
    tk_ctx_free(ctx);
    if (rc) {
        tkb_free(&out);
        return mf_fail_wrap(err, "%s", t->origin);
    }
    *text = tkb_take(&out, len);
    return MF_OK;
}

char *mf_tokenizer_decode(const mf_tokenizer *t, const int32_t *ids, int n) {
    tk_buf out = {0};
    for (int i = 0; i < n; i++) {
        size_t sn;
        bool is_added;
        const char *s = id_string(t, ids[i], &sn, &is_added);
        if (!s) continue;
        if (is_added) {   /* added tokens as their content */
            const added *a = added_by_id(t, ids[i]);
            tkb_put(&out, a->content, a->n);
            continue;
        }
        for (size_t k = 0; k < sn;) {
            uint32_t cp;
            const int l = tk_utf8_dec(s, sn, k, &cp);
            const int b = t->byte_level ? tk_char_byte(cp) : -1;
            if (b >= 0) tkb_putc(&out, (char)b);
            else tkb_put(&out, s + k, (size_t)l);   /* not a byte-level character: kept as it is */
            k += (size_t)l;
        }
    }
    return tkb_take(&out, NULL);
}
