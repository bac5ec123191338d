/* Decoding token ids to text with a Hugging Face tokenizer.json of the
 * byte-level BPE kind (GPT-2, OLMoE, Qwen): each token is a string of
 * characters that stand for bytes (GPT-2's bytes_to_unicode table: the
 * printable bytes stand for themselves, the other 68 for U+0100 upwards).
 * Added (special) tokens decode to their content. Encoding is not here. */
#include "mf_models.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

struct mf_tokenizer {
    char **bytes;    /* [n] decoded byte strings */
    size_t *len;
    int n;
};

static bool printable(int b) { return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255); }

/* code point -> byte of the bytes_to_unicode table, or -1 */
static int unicode_to_byte(unsigned cp) {
    static int table[512];
    static bool ready;
    if (!ready) {
        for (int i = 0; i < 512; i++) table[i] = -1;
        int next = 0;
        for (int b = 0; b < 256; b++) {
            if (printable(b)) table[b] = b;
            else table[256 + next++] = b;
        }
        ready = true;
    }
    return cp < 512 ? table[cp] : -1;
}

/* Decodes one UTF-8 code point from s; returns its length (0 at the end, -1 if malformed). */
static int utf8_next(const unsigned char *s, unsigned *cp) {
    if (!s[0]) return 0;
    if (s[0] < 0x80) {
        *cp = s[0];
        return 1;
    }
    int n = (s[0] & 0xe0) == 0xc0 ? 2 : (s[0] & 0xf0) == 0xe0 ? 3 : (s[0] & 0xf8) == 0xf0 ? 4 : -1;
    if (n < 0) return -1;
    unsigned v = s[0] & (0x7f >> n);
    for (int i = 1; i < n; i++) {
        if ((s[i] & 0xc0) != 0x80) return -1;
        v = v << 6 | (s[i] & 0x3f);
    }
    *cp = v;
    return n;
}

static void set_token(mf_tokenizer *t, int id, const char *s, bool byte_level) {
    if (id < 0 || id >= t->n) return;
    free(t->bytes[id]);
    size_t cap = strlen(s) + 1, n = 0;
    char *out = mf_xmalloc(cap);
    const unsigned char *p = (const unsigned char *)s;
    unsigned cp;
    int k;
    while ((k = utf8_next(p, &cp)) > 0) {
        int b = byte_level ? unicode_to_byte(cp) : -1;
        if (b >= 0) out[n++] = (char)b;
        else {   /* not a byte-level character: keep it as it is */
            memcpy(out + n, p, (size_t)k);
            n += (size_t)k;
        }
        p += k;
    }
    out[n] = 0;
    t->bytes[id] = out;
    t->len[id] = n;
}

int mf_tokenizer_load(mf_tokenizer **out, const char *path, mf_error *err) {
    *out = NULL;
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (!root) return mf_fail(err, MF_EFORMAT, "%s: %s", path, je.text);
    json_t *model = json_object_get(root, "model"), *vocab = json_object_get(model, "vocab");
    if (!json_is_object(vocab)) {
        json_decref(root);
        return mf_fail(err, MF_EUNSUPPORTED, "%s: no model.vocab (only BPE tokenizers are read)", path);
    }
    int maxid = -1;
    const char *key;
    json_t *v;
    json_object_foreach(vocab, key, v) if (json_integer_value(v) > maxid) maxid = (int)json_integer_value(v);
    size_t i;
    json_array_foreach(json_object_get(root, "added_tokens"), i, v) {
        int id = (int)json_integer_value(json_object_get(v, "id"));
        if (id > maxid) maxid = id;
    }
    mf_tokenizer *t = mf_xcalloc(1, sizeof *t);
    t->n = maxid + 1;
    t->bytes = mf_xcalloc((size_t)t->n + 1, sizeof(char *));
    t->len = mf_xcalloc((size_t)t->n + 1, sizeof(size_t));
    const char *dec = json_string_value(json_object_get(json_object_get(root, "decoder"), "type"));
    const bool byte_level = !dec || !strcmp(dec, "ByteLevel");
    json_object_foreach(vocab, key, v) set_token(t, (int)json_integer_value(v), key, byte_level);
    json_array_foreach(json_object_get(root, "added_tokens"), i, v)
        set_token(t, (int)json_integer_value(json_object_get(v, "id")), json_string_value(json_object_get(v, "content")) ?: "", false);
    json_decref(root);
    *out = t;
    return MF_OK;
}

void mf_tokenizer_free(mf_tokenizer *t) {
    if (!t) return;
    for (int i = 0; i < t->n; i++) free(t->bytes[i]);
    free(t->bytes);
    free(t->len);
    free(t);
}

int mf_tokenizer_size(const mf_tokenizer *t) { return t->n; }

char *mf_tokenizer_decode(const mf_tokenizer *t, const int32_t *ids, int n) {
    size_t total = 1;
    for (int i = 0; i < n; i++)
        if (ids[i] >= 0 && ids[i] < t->n && t->bytes[ids[i]]) total += t->len[ids[i]];
    char *s = mf_xmalloc(total), *p = s;
    for (int i = 0; i < n; i++)
        if (ids[i] >= 0 && ids[i] < t->n && t->bytes[ids[i]]) {
            memcpy(p, t->bytes[ids[i]], t->len[ids[i]]);
            p += t->len[ids[i]];
        }
    *p = 0;
    return s;
}
