/* Decoding with a byte-level BPE tokenizer.json, against strings worked out
 * from GPT-2's bytes_to_unicode table by hand. */
#include <criterion/criterion.h>
#include <string.h>

#include "mf_models.h"
#include "testutil.h"

Test(tokenizer, byte_level_decoding) {
    const char *d = temp_dir();
    /* "Ġ" (U+0120) stands for the space byte 0x20, "Ċ" (U+010A) for 0x0A,
     * "Ã©" for the two bytes 0xC3 0xA9 (UTF-8 of e-acute) */
    write_text(d, "tokenizer.json",
               "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"Hello\": 0, \"\\u0120world\": 1, \"\\u010a\": 2, \"caf\": 3,"
               " \"\\u00c3\\u00a9\": 4}}, \"decoder\": {\"type\": \"ByteLevel\"},"
               " \"added_tokens\": [{\"id\": 5, \"content\": \"<|endoftext|>\"}]}");
    char path[4200];
    snprintf(path, sizeof path, "%s/tokenizer.json", d);
    mf_tokenizer *t;
    mf_error err = {0};
    cr_assert_eq(mf_tokenizer_load(&t, path, &err), MF_OK, "%s", err.msg);
    cr_assert_eq(mf_tokenizer_size(t), 6);
    int32_t ids[] = {0, 1, 2, 3, 4, 5, 99};
    char *s = mf_tokenizer_decode(t, ids, 7);
    cr_assert_str_eq(s, "Hello world\ncaf\xc3\xa9<|endoftext|>");
    free(s);
    mf_tokenizer_free(t);
    write_text(d, "bad.json", "{\"model\": {\"type\": \"Unigram\"}}");
    snprintf(path, sizeof path, "%s/bad.json", d);
    cr_assert_eq(mf_tokenizer_load(&t, path, &err), MF_EUNSUPPORTED);
}
