/* libFuzzer target: one input is a tokenizer.json, a NUL byte, and a text. mf_tokenizer_parse must refuse the
 * file with one message or give a tokenizer; encoding the text (with and without special tokens) must refuse
 * it with one message or give ids that are not negative; decoding those ids, and the text's bytes read as ids,
 * must refuse with one message or give a string. */
#include "fuzz_util.h"
#include "mf_models.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *nul = memchr(data, 0, size);
    const size_t json_n = nul ? (size_t)(nul - data) : size;
    const char *text = nul ? (const char *)nul + 1 : "";
    const size_t text_n = nul ? size - json_n - 1 : 0;
    mf_tokenizer *t;
    mf_error e = {0};
    int rc = mf_tokenizer_parse(&t, (const char *)data, json_n, "tokenizer.json", &e);
    fuzz_check_refusal(rc, &e);
    if (rc) return 0;
    if (mf_tokenizer_size(t) < 0) abort();
    for (int special = 0; special < 2; special++) {
        int32_t *ids;
        size_t n;
        memset(&e, 0, sizeof e);
        rc = mf_tokenizer_encode(t, text, text_n, special, &ids, &n, &e);
        fuzz_check_refusal(rc, &e);
        if (rc) continue;
        for (size_t i = 0; i < n; i++)
            if (ids[i] < 0) abort();
        char *s;
        size_t len;
        memset(&e, 0, sizeof e);
        rc = mf_tokenizer_decode_text(t, ids, n, special, &s, &len, &e);
        fuzz_check_refusal(rc, &e);
        if (!rc && (!s || strlen(s) > len)) abort();
        if (!rc) free(s);
        free(mf_tokenizer_decode(t, ids, (int)(n < 4096 ? n : 4096)));
        free(ids);
    }
    /* arbitrary ids: the text's bytes, pairs of them as larger ids */
    int32_t raw[256];
    size_t nr = 0;
    for (size_t i = 0; i + 1 < text_n && nr < 256; i += 2) raw[nr++] = (int32_t)((uint8_t)text[i] | (uint8_t)text[i + 1] << 8) - 8;
    char *s;
    size_t len;
    memset(&e, 0, sizeof e);
    rc = mf_tokenizer_decode_text(t, raw, nr, false, &s, &len, &e);
    fuzz_check_refusal(rc, &e);
    if (!rc) free(s);
    mf_tokenizer_free(t);
    return 0;
}
