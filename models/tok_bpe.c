/* The BPE model as Hugging Face tokenizers runs it (models/bpe/model.rs and word.rs): each character of a
 * pre-tokenized word looked up (with continuing_subword_prefix and end_of_word_suffix), bytes of a missing one
 * as <0xXX> tokens (byte_fallback) or the unk token (fused when fuse_unk), then the merges applied by rank,
 * the lowest first and the leftmost among equals, through a heap; ignore_merges takes a whole word found in
 * the vocabulary as it is. Dropout above 0 draws at random and is refused. */
#include "tok_int.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

typedef struct entry {
    uint64_t h;
    size_t off;      /* key bytes in the arena */
    uint32_t len;
    int32_t id;
} entry;

typedef struct merge {
    uint64_t key;    /* a << 32 | b, +1 so that 0 is an empty slot */
    uint32_t rank;
    int32_t new_id;
} merge;

struct tk_bpe {
    char *arena;
    size_t arena_n, arena_cap;
    entry *e;
    size_t n, e_cap;
    uint32_t *slots;   /* index + 1 into e; 0 empty */
    size_t mask;
    uint32_t *by_id;   /* indices of e sorted by id */
    int32_t max_id;
    merge *m;
    size_t m_mask, m_n;
    char *unk, *prefix, *suffix;
    size_t unk_n, prefix_n, suffix_n;
    bool fuse_unk, byte_fallback, ignore_merges;
    int32_t byte_ids[256];
};

static uint64_t hash(const char *s, size_t n) { return XXH3_64bits(s, n); }

static int32_t lookup(const tk_bpe *m, const char *s, size_t n) {
    if (!m->slots) return -1;
    const uint64_t h = hash(s, n);
    for (size_t i = h & m->mask;; i = (i + 1) & m->mask) {
        const uint32_t k = m->slots[i];
        if (!k) return -1;
        const entry *e = &m->e[k - 1];
        if (e->h == h && e->len == n && !memcmp(m->arena + e->off, s, n)) return e->id;
    }
}

int32_t tk_bpe_token_id(const tk_bpe *m, const char *s, size_t n) { return lookup(m, s, n); }

size_t tk_bpe_count(const tk_bpe *m) { return m->n; }
int32_t tk_bpe_max_id(const tk_bpe *m) { return m->max_id; }

const char *tk_bpe_id_token(const tk_bpe *m, int32_t id, size_t *n) {
    size_t lo = 0, hi = m->n;
    while (lo < hi) {   /* the first entry with this id */
        const size_t mid = (lo + hi) / 2;
        if (m->e[m->by_id[mid]].id < id) lo = mid + 1;
        else hi = mid;
    }
    if (lo == m->n || m->e[m->by_id[lo]].id != id) return NULL;
    const entry *e = &m->e[m->by_id[lo]];
    *n = e->len;
    return m->arena + e->off;
}

/* Inserts or replaces (the last of duplicate keys wins, as serde's map does). */
static void vocab_set(tk_bpe *m, const char *s, size_t n, int32_t id) {
    const uint64_t h = hash(s, n);
    size_t i = h & m->mask;
    for (;; i = (i + 1) & m->mask) {
        const uint32_t k = m->slots[i];
        if (!k) break;
        entry *e = &m->e[k - 1];
        if (e->h == h && e->len == n && !memcmp(m->arena + e->off, s, n)) {
            e->id = id;
            return;
        }
    }
    if (m->arena_n + n + 1 > m->arena_cap) {
        while (m->arena_n + n + 1 > m->arena_cap) m->arena_cap = m->arena_cap ? m->arena_cap * 2 : 1 << 16;
        m->arena = mf_xrealloc(m->arena, m->arena_cap);
    }
    memcpy(m->arena + m->arena_n, s, n);
    m->arena[m->arena_n + n] = 0;
    if (m->n == m->e_cap) m->e = mf_xrealloc(m->e, (m->e_cap = m->e_cap ? m->e_cap * 2 : 1024) * sizeof *m->e);
    m->e[m->n] = (entry){h, m->arena_n, (uint32_t)n, id};
    m->arena_n += n + 1;
    m->slots[i] = (uint32_t)++m->n;
}

static merge *merge_slot(const tk_bpe *m, int32_t a, int32_t b) {
    const uint64_t key = ((uint64_t)(uint32_t)a << 32 | (uint32_t)b) + 1;
    for (size_t i = XXH3_64bits(&key, sizeof key) & m->m_mask;; i = (i + 1) & m->m_mask)
        if (m->m[i].key == key || m->m[i].key == 0) return &m->m[i];
}

static const merge *merge_get(const tk_bpe *m, int32_t a, int32_t b) {
    if (!m->m_n) return NULL;
    const merge *x = merge_slot(m, a, b);
    return x->key ? x : NULL;
}

void tk_bpe_free(tk_bpe *m) {
    if (!m) return;
    free(m->arena);
    free(m->e);
    free(m->slots);
    free(m->by_id);
    free(m->m);
    free(m->unk);
    free(m->prefix);
    free(m->suffix);
    free(m);
}

static int cmp_by_id(const void *a, const void *b, void *ud) {
    const entry *e = ud;
    const int32_t x = e[*(const uint32_t *)a].id, y = e[*(const uint32_t *)b].id;
    if (x != y) return x < y ? -1 : 1;
    return *(const uint32_t *)a < *(const uint32_t *)b ? -1 : 1;
}

static int opt_str(json_t *model, const char *key, char **out, size_t *n, const char *origin, mf_error *err) {
    const char *s;
    const int rc = tkj_str(model, key, true, &s, n, "model BPE", origin, err);
    if (rc) return rc;
    if (s) {
        *out = mf_xmalloc(*n + 1);
        memcpy(*out, s, *n + 1);
    }
    return MF_OK;
}

static int opt_bool(json_t *model, const char *key, bool *out, const char *origin, mf_error *err) {
    json_t *v = json_object_get(model, key);
    if (!v || json_is_null(v)) return MF_OK;   /* null keeps the default */
    return tkj_bool(model, key, -1, out, "model BPE", origin, err);
}

/* A merge's two tokens: ["a", "b"], or "a b" (the legacy spelling: exactly one space). */
static int merge_parts(json_t *v, bool legacy, const char **a, size_t *an, const char **b, size_t *bn) {
    if (legacy) {
        const char *s = json_string_value(v);
        const size_t n = json_string_length(v);
        const char *sp = s ? memchr(s, ' ', n) : NULL;
        if (!sp || memchr(sp + 1, ' ', n - (size_t)(sp + 1 - s))) return -1;
        *a = s, *an = (size_t)(sp - s), *b = sp + 1, *bn = n - *an - 1;
        return 0;
    }
    json_t *x = json_array_get(v, 0), *y = json_array_get(v, 1);
    if (!json_is_array(v) || json_array_size(v) != 2 || !json_is_string(x) || !json_is_string(y)) return -1;
    *a = json_string_value(x), *an = json_string_length(x), *b = json_string_value(y), *bn = json_string_length(y);
    return 0;
}

int tk_bpe_parse(tk_bpe **out, json_t *model, const char *origin, mf_error *err) {
    *out = NULL;
    const char *type = tkj_type(model);
    if (!json_is_object(model)) return mf_fail(err, MF_EFORMAT, "%s: \"model\" must be an object", origin);
    if (type && strcmp(type, "BPE")) {
        char q[80];
        return mf_fail(err, MF_EUNSUPPORTED, "%s: the model %s is not supported (only BPE)", origin, tk_quote(q, sizeof q, type, strlen(type)));
    }
    json_t *vocab = json_object_get(model, "vocab"), *merges = json_object_get(model, "merges");
    if (!type && json_object_get(model, "scores")) return mf_fail(err, MF_EUNSUPPORTED, "%s: the model is not BPE (only BPE is supported)", origin);
    if (!json_is_object(vocab)) return mf_fail(err, MF_EFORMAT, "%s: model BPE: \"vocab\" must be an object of token: id", origin);
    if (!json_is_array(merges)) return mf_fail(err, MF_EFORMAT, "%s: model BPE: \"merges\" must be an array (Missing vocab/merges)", origin);
    if (json_object_size(vocab) > TK_MAX_VOCAB || json_array_size(merges) > TK_MAX_VOCAB)
        return mf_fail(err, MF_EUNSUPPORTED, "%s: model BPE: more than %d vocabulary entries or merges", origin, TK_MAX_VOCAB);
    json_t *dropout = json_object_get(model, "dropout");
    if (dropout && !json_is_null(dropout)) {
        if (!json_is_number(dropout) || json_number_value(dropout) < 0 || json_number_value(dropout) > 1)
            return mf_fail(err, MF_EFORMAT, "%s: model BPE: \"dropout\" must be null or a number from 0 to 1", origin);
        if (json_number_value(dropout) > 0)
            return mf_fail(err, MF_EUNSUPPORTED, "%s: model BPE: dropout %g draws merges at random: not supported (set it to null)",
                           origin, json_number_value(dropout));
    }
    tk_bpe *m = mf_xcalloc(1, sizeof *m);
    m->max_id = -1;
    int rc = MF_OK;
    if ((rc = opt_str(model, "unk_token", &m->unk, &m->unk_n, origin, err)) ||
        (rc = opt_str(model, "continuing_subword_prefix", &m->prefix, &m->prefix_n, origin, err)) ||
        (rc = opt_str(model, "end_of_word_suffix", &m->suffix, &m->suffix_n, origin, err)) ||
        (rc = opt_bool(model, "fuse_unk", &m->fuse_unk, origin, err)) ||
        (rc = opt_bool(model, "byte_fallback", &m->byte_fallback, origin, err)) ||
        (rc = opt_bool(model, "ignore_merges", &m->ignore_merges, origin, err)))
        goto fail;
    size_t cap = 64;
    while (cap < json_object_size(vocab) * 2) cap *= 2;
    m->slots = mf_xcalloc(cap, sizeof *m->slots);
    m->mask = cap - 1;
    const char *key;
    size_t klen;
    json_t *v;
    json_object_keylen_foreach(vocab, key, klen, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > TK_MAX_ID) {
            char q[80];
            rc = mf_fail(err, json_is_integer(v) && json_integer_value(v) > 0 ? MF_EUNSUPPORTED : MF_EFORMAT,
                         "%s: model BPE: the id of vocabulary entry \"%s\" must be an integer from 0 to %d", origin,
                         tk_quote(q, sizeof q, key, klen), TK_MAX_ID);
            goto fail;
        }
        vocab_set(m, key, klen, (int32_t)json_integer_value(v));
    }
    m->by_id = mf_xmalloc((m->n + 1) * sizeof *m->by_id);
    for (size_t i = 0; i < m->n; i++) {
        m->by_id[i] = (uint32_t)i;
        if (m->e[i].id > m->max_id) m->max_id = m->e[i].id;
    }
    qsort_r(m->by_id, m->n, sizeof *m->by_id, cmp_by_id, m->e);
    /* merges: all pairs, or all "a b" strings (serde tries the pairs first) */
    const size_t nm = json_array_size(merges);
    bool legacy = nm && json_is_string(json_array_get(merges, 0));
    size_t mcap = 64;
    while (mcap < nm * 2) mcap *= 2;
    m->m = mf_xcalloc(mcap, sizeof *m->m);
    m->m_mask = mcap - 1;
    tk_buf joined = {0};
    uint32_t rank = 0;
    for (size_t i = 0; i < nm; i++) {
        json_t *x = json_array_get(merges, i);
        const char *a, *b;
        size_t an, bn;
        if (legacy && json_is_string(x) && json_string_length(x) >= 8 && !memcmp(json_string_value(x), "#version", 8)) continue;
        if (legacy != json_is_string(x) || merge_parts(x, legacy, &a, &an, &b, &bn)) {
            rc = mf_fail(err, MF_EFORMAT, "%s: model BPE: merge %zu must be [\"a\", \"b\"] (or \"a b\" with one space, as every merge "
                         "is then)", origin, i + 1);
            break;
        }
        const int32_t ia = lookup(m, a, an), ib = lookup(m, b, bn);
        char q[80];
        if (ia < 0 || ib < 0) {
            rc = mf_fail(err, MF_EFORMAT, "%s: model BPE: merge %zu: \"%s\" is not in the vocabulary", origin, i + 1,
                         ia < 0 ? tk_quote(q, sizeof q, a, an) : tk_quote(q, sizeof q, b, bn));
            break;
        }
        if (bn < m->prefix_n) {
            rc = mf_fail(err, MF_EFORMAT, "%s: model BPE: merge %zu: \"%s\" is shorter than continuing_subword_prefix", origin, i + 1,
                         tk_quote(q, sizeof q, b, bn));
            break;
        }
        joined.n = 0;
        tkb_put(&joined, a, an);
        tkb_put(&joined, b + m->prefix_n, bn - m->prefix_n);
        const int32_t inew = lookup(m, joined.s, joined.n);
        if (inew < 0) {
            rc = mf_fail(err, MF_EFORMAT, "%s: model BPE: merge %zu: its result \"%s\" is not in the vocabulary", origin, i + 1,
                         tk_quote(q, sizeof q, joined.s, joined.n));
            break;
        }
        merge *slot = merge_slot(m, ia, ib);
        if (!slot->key) m->m_n++;
        *slot = (merge){((uint64_t)(uint32_t)ia << 32 | (uint32_t)ib) + 1, rank, inew};
        rank++;
    }
    tkb_free(&joined);
    if (rc) goto fail;
    for (int b = 0; b < 256; b++) {
        char code[8];
        snprintf(code, sizeof code, "<0x%02X>", b);
        m->byte_ids[b] = lookup(m, code, 6);
    }
    *out = m;
    return MF_OK;
fail:
    tk_bpe_free(m);
    return rc;
}

/* ---- tokenizing one word ------------------------------------------------ */

typedef struct symbol {
    int32_t c, prev, next;
    uint32_t len;
} symbol;

typedef struct hitem {
    uint32_t rank, pos;
    int32_t new_id;
} hitem;

typedef struct word {
    symbol *s;
    size_t n, cap;
    hitem *h;
    size_t hn, hcap;
} word;

static void word_add(word *w, int32_t c, uint32_t len) {
    if (w->n == w->cap) w->s = mf_xrealloc(w->s, (w->cap = w->cap ? w->cap * 2 : 64) * sizeof *w->s);
    if (w->n) w->s[w->n - 1].next = (int32_t)w->n;
    w->s[w->n] = (symbol){c, (int32_t)w->n - 1, -1, len};
    w->n++;
}

static bool h_less(hitem a, hitem b) { return a.rank != b.rank ? a.rank < b.rank : a.pos < b.pos; }

static void h_push(word *w, hitem x) {
    if (w->hn == w->hcap) w->h = mf_xrealloc(w->h, (w->hcap = w->hcap ? w->hcap * 2 : 64) * sizeof *w->h);
    size_t i = w->hn++;
    while (i > 0 && h_less(x, w->h[(i - 1) / 2])) {
        w->h[i] = w->h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    w->h[i] = x;
}

static hitem h_pop(word *w) {
    const hitem top = w->h[0], last = w->h[--w->hn];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= w->hn) break;
        if (c + 1 < w->hn && h_less(w->h[c + 1], w->h[c])) c++;
        if (!h_less(w->h[c], last)) break;
        w->h[i] = w->h[c];
        i = c;
    }
    if (w->hn) w->h[i] = last;
    return top;
}

static void merge_all(const tk_bpe *m, word *w) {
    for (size_t i = 0; i + 1 < w->n; i++) {
        const merge *x = merge_get(m, w->s[i].c, w->s[i + 1].c);
        if (x) h_push(w, (hitem){x->rank, (uint32_t)i, x->new_id});
    }
    while (w->hn) {
        const hitem top = h_pop(w);
        symbol *cur = &w->s[top.pos];
        if (cur->len == 0 || cur->next == -1) continue;
        const size_t next_pos = (size_t)cur->next;
        const symbol right = w->s[next_pos];
        const merge *x = merge_get(m, cur->c, right.c);
        if (!x || x->new_id != top.new_id) continue;   /* an entry that has expired */
        cur->c = top.new_id;
        cur->len += right.len;
        cur->next = right.next;
        w->s[next_pos].len = 0;
        if (right.next > -1 && (size_t)right.next < w->n) w->s[right.next].prev = (int32_t)top.pos;
        if (cur->prev >= 0) {
            const merge *y = merge_get(m, w->s[cur->prev].c, cur->c);
            if (y) h_push(w, (hitem){y->rank, (uint32_t)cur->prev, y->new_id});
        }
        if (cur->next >= 0 && (size_t)cur->next < w->n) {
            const merge *y = merge_get(m, cur->c, w->s[cur->next].c);
            if (y) h_push(w, (hitem){y->rank, top.pos, y->new_id});
        }
    }
}

static void push_id(int32_t **ids, size_t *n, size_t *cap, int32_t id) {
    if (*n == *cap) *ids = mf_xrealloc(*ids, (*cap = *cap ? *cap * 2 : 64) * sizeof **ids);
    (*ids)[(*n)++] = id;
}

int tk_bpe_tokenize(const tk_bpe *m, const char *w, size_t n, int32_t **ids, size_t *n_ids, size_t *cap,
                    mf_error *err) {
    if (n == 0) return MF_OK;
    if (m->ignore_merges) {
        const int32_t id = lookup(m, w, n);
        if (id >= 0) {
            push_id(ids, n_ids, cap, id);
            return MF_OK;
        }
    }
    word wd = {0};
    tk_buf s = {0};
    bool have_unk = false;
    int32_t unk_id = -1;
    uint32_t unk_len = 0;
    int rc = MF_OK;
    for (size_t i = 0; i < n;) {
        const size_t len = (size_t)tk_utf8_len((unsigned char)w[i]);
        const bool last = i + len >= n;
        s.n = 0;
        if (i > 0 && m->prefix) tkb_put(&s, m->prefix, m->prefix_n);
        tkb_put(&s, w + i, len);
        if (last && m->suffix) tkb_put(&s, m->suffix, m->suffix_n);
        i += len;
        const int32_t id = lookup(m, s.s, s.n);
        if (id >= 0) {
            if (have_unk) word_add(&wd, unk_id, unk_len), have_unk = false;
            word_add(&wd, id, (uint32_t)len);
            continue;
        }
        if (m->byte_fallback) {
            bool all = true;
            for (size_t k = 0; k < s.n && all; k++) all = m->byte_ids[(unsigned char)s.s[k]] >= 0;
            if (all) {   /* (a pending unk is not added first: tokenizers does not either) */
                for (size_t k = 0; k < s.n; k++) word_add(&wd, m->byte_ids[(unsigned char)s.s[k]], 1);
                continue;
            }
        }
        if (m->unk) {
            if (have_unk && m->fuse_unk) {
                unk_len += (uint32_t)len;
                continue;
            }
            const int32_t u = lookup(m, m->unk, m->unk_n);
            if (u < 0) {
                char q[80];
                rc = mf_fail(err, MF_EFORMAT, "model BPE: the unk token \"%s\" is not in the vocabulary", tk_quote(q, sizeof q, m->unk, m->unk_n));
                break;
            }
            if (have_unk) word_add(&wd, unk_id, unk_len);
            have_unk = true, unk_id = u, unk_len = (uint32_t)len;
        }
    }
    if (!rc) {
        if (have_unk) word_add(&wd, unk_id, unk_len);
        merge_all(m, &wd);
        for (size_t i = 0; i < wd.n; i++)
            if (wd.s[i].len) push_id(ids, n_ids, cap, wd.s[i].c);
    }
    tkb_free(&s);
    free(wd.s);
    free(wd.h);
    return rc;
}
