/* The tokenizer against Hugging Face tokenizers:
 *  - tiny-olmoe's prompts.jsonl, whose tokens tokenizers 0.23.2 gave for the texts beside them;
 *  - tests/fixtures/tokenizers/: tokenizers of each family built with tokenizers 0.23 by
 *    tools/make_tokenizer_fixtures.py, and the ids tokenizers itself gave for tricky texts;
 *  - small cases worked out by hand from tokenizers' source (models/bpe/word.rs, added_vocabulary.rs,
 *    tokenizer/normalizer.rs, pre_tokenizers/, decoders/), where each exercises one rule;
 * and the command `moeflip tokenize`, and trace reading {"id", "text"} lines. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <jansson.h>
#include <stdarg.h>
#include <string.h>

#include "mf_models.h"
#include "mf_trace.h"
#include "testutil.h"

#define SP "\xe2\x96\x81" /* U+2581, SentencePiece's space */

static mf_tokenizer *parse_ok(const char *json) {
    mf_tokenizer *t;
    mf_error err = {0};
    cr_assert_eq(mf_tokenizer_parse(&t, json, strlen(json), "test.json", &err), MF_OK, "%s", err.msg);
    return t;
}

static void expect_ids_n(const mf_tokenizer *t, const char *text, size_t text_n, bool special, const int32_t *want, size_t n) {
    int32_t *ids;
    size_t got;
    mf_error err = {0};
    cr_assert_eq(mf_tokenizer_encode(t, text, text_n, special, &ids, &got, &err), MF_OK, "%s", err.msg);
    char a[512] = "", b[512] = "";
    for (size_t i = 0; i < got && strlen(a) < 480; i++) snprintf(a + strlen(a), sizeof a - strlen(a), " %d", ids[i]);
    for (size_t i = 0; i < n && strlen(b) < 480; i++) snprintf(b + strlen(b), sizeof b - strlen(b), " %d", want[i]);
    cr_expect(got == n && (n == 0 || !memcmp(ids, want, n * sizeof *ids)), "\"%s\": got [%s ] want [%s ]", text, a, b);
    free(ids);
}

#define EXPECT(t, text, special, ...)                                                                          \
    do {                                                                                                       \
        const int32_t want_[] = {__VA_ARGS__};                                                                 \
        expect_ids_n((t), (text), strlen(text), (special), want_, sizeof want_ / sizeof *want_);              \
    } while (0)
#define EXPECT_NONE(t, text, special) expect_ids_n((t), (text), strlen(text), (special), NULL, 0)

static void expect_decode(const mf_tokenizer *t, const int32_t *ids, size_t n, bool skip, const char *want) {
    char *s;
    size_t len;
    mf_error err = {0};
    cr_assert_eq(mf_tokenizer_decode_text(t, ids, n, skip, &s, &len, &err), MF_OK, "%s", err.msg);
    cr_expect(len == strlen(want) && !memcmp(s, want, len), "decoded \"%s\", want \"%s\"", s, want);
    free(s);
}

static void expect_refused(const char *json, int code, const char *needle) {
    mf_tokenizer *t;
    mf_error err = {0};
    cr_expect_eq(mf_tokenizer_parse(&t, json, strlen(json), "bad.json", &err), code, "%s", err.msg);
    cr_expect(strstr(err.msg, needle) && !strchr(err.msg, '\n'), "message \"%s\" should name %s", err.msg, needle);
}

/* A tokenizer.json with a BPE model: parts is the text after "model" (vocab, merges, options), rest the
 * other members. */
static char *tok_json(const char *model, const char *rest) {
    static char buf[8][16384];
    static int k;
    char *b = buf[k++ % 8];
    const int r = snprintf(b, sizeof buf[0], "{\"version\": \"1.0\", \"model\": {\"type\": \"BPE\", %s}%s%s}", model, rest[0] ? ", " : "", rest);
    cr_assert(r > 0 && (size_t)r < sizeof buf[0]);
    return b;
}

/* ---- decoding one token at a time (the report's token texts) --------------- */

Test(tokenizer, byte_level_decoding) {
    const char *d = temp_dir();
    /* "Ġ" (U+0120) stands for the space byte 0x20, "Ċ" (U+010A) for 0x0A,
     * "Ã©" for the two bytes 0xC3 0xA9 (UTF-8 of e-acute) */
    write_text(d, "tokenizer.json",
               "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"Hello\": 0, \"\\u0120world\": 1, \"\\u010a\": 2, \"caf\": 3,"
               " \"\\u00c3\\u00a9\": 4}, \"merges\": []}, \"decoder\": {\"type\": \"ByteLevel\"},"
               " \"added_tokens\": [{\"id\": 5, \"content\": \"<|endoftext|>\", \"special\": true, \"normalized\": false}]}");
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
    /* Tokenizer.decode: the same through the ByteLevel decoder; the special token left out when asked */
    expect_decode(t, ids, 7, false, "Hello world\ncaf\xc3\xa9<|endoftext|>");
    expect_decode(t, ids, 7, true, "Hello world\ncaf\xc3\xa9");
    /* a byte of a character alone: String::from_utf8_lossy's one U+FFFD per broken sequence */
    mf_tokenizer_free(t);
    write_text(d, "bad.json", "{\"model\": {\"type\": \"Unigram\", \"vocab\": [[\"a\", 0.0]]}}");
    snprintf(path, sizeof path, "%s/bad.json", d);
    cr_assert_eq(mf_tokenizer_load(&t, path, &err), MF_EUNSUPPORTED);
    cr_assert(strstr(err.msg, "Unigram"), "%s", err.msg);
}

/* ---- the BPE model -------------------------------------------------------------- */

Test(tokenizer, bpe_merges_by_rank_then_leftmost) {
    /* ranks: "b c" 0, "a b" 1, "a bc" 2, "a a" 3 */
    mf_tokenizer *t = parse_ok(tok_json("\"vocab\": {\"a\": 0, \"b\": 1, \"c\": 2, \"ab\": 3, \"bc\": 4, \"abc\": 5, \"aa\": 6},"
                                        " \"merges\": [\"b c\", \"a b\", \"a bc\", \"a a\"]", ""));
    EXPECT(t, "abc", true, 5);      /* b+c first (rank 0), then a+bc */
    EXPECT(t, "aaa", true, 6, 0);   /* two a+a at rank 3: the leftmost */
    EXPECT(t, "aabc", true, 0, 5);
    EXPECT(t, "ab", true, 3);
    /* a character outside the vocabulary without unk is dropped, and its neighbours then merge */
    EXPECT(t, "azb", true, 3);
    EXPECT_NONE(t, "", true);
    mf_tokenizer_free(t);
    /* the merges in pairs, as tokenizers 0.20 and later write them, mean the same */
    t = parse_ok(tok_json("\"vocab\": {\"a\": 0, \"b\": 1, \"c\": 2, \"ab\": 3, \"bc\": 4, \"abc\": 5, \"aa\": 6},"
                          " \"merges\": [[\"b\", \"c\"], [\"a\", \"b\"], [\"a\", \"bc\"], [\"a\", \"a\"]]", ""));
    EXPECT(t, "aabc", true, 0, 5);
    mf_tokenizer_free(t);
}

Test(tokenizer, bpe_byte_fallback_and_unk) {
    /* <0x7A> is 'z'; no byte token for 0xC3 (e-acute's first byte): that character is unk */
    const char *vocab = "\"vocab\": {\"<unk>\": 0, \"a\": 1, \"<0x7A>\": 2, \"<0xA9>\": 3}, \"merges\": [], \"unk_token\": \"<unk>\"";
    char model[512];
    snprintf(model, sizeof model, "%s, \"byte_fallback\": true, \"fuse_unk\": true", vocab);
    mf_tokenizer *t = parse_ok(tok_json(model, ""));
    EXPECT(t, "az", true, 1, 2);
    EXPECT(t, "\xc3\xa9\xc3\xa9" "a", true, 0, 1);       /* two unks fused into one */
    EXPECT(t, "\xc3\xa9" "a\xc3\xa9", true, 0, 1, 0);
    /* tokenizers adds the pending unk only after the byte tokens that follow it */
    EXPECT(t, "\xc3\xa9z", true, 2, 0);
    mf_tokenizer_free(t);
    snprintf(model, sizeof model, "%s, \"byte_fallback\": false, \"fuse_unk\": false", vocab);
    t = parse_ok(tok_json(model, ""));
    EXPECT(t, "\xc3\xa9\xc3\xa9z", true, 0, 0, 0);
    mf_tokenizer_free(t);
    /* an unk token that is not in the vocabulary fails the encoding, with a message */
    t = parse_ok(tok_json("\"vocab\": {\"a\": 0}, \"merges\": [], \"unk_token\": \"<unk>\"", ""));
    int32_t *ids;
    size_t n;
    mf_error err = {0};
    cr_expect_neq(mf_tokenizer_encode(t, "ab", 2, true, &ids, &n, &err), MF_OK);
    cr_expect(strstr(err.msg, "<unk>"), "%s", err.msg);
    mf_tokenizer_free(t);
}

Test(tokenizer, bpe_prefix_suffix_and_ignore_merges) {
    /* continuing_subword_prefix "##", end_of_word_suffix "</w>": "ab" is a + ##b</w>, merged to ab</w> */
    mf_tokenizer *t = parse_ok(tok_json("\"vocab\": {\"a\": 0, \"##b</w>\": 1, \"ab</w>\": 2, \"a</w>\": 3, \"##b\": 4},"
                                        " \"merges\": [\"a ##b</w>\"], \"continuing_subword_prefix\": \"##\", \"end_of_word_suffix\": \"</w>\"", ""));
    EXPECT(t, "ab", true, 2);
    EXPECT(t, "a", true, 3);
    mf_tokenizer_free(t);
    /* ignore_merges: a word in the vocabulary is taken whole, though no merge makes it */
    t = parse_ok(tok_json("\"vocab\": {\"a\": 0, \"b\": 1, \"c\": 2, \"abc\": 3}, \"merges\": [], \"ignore_merges\": true", ""));
    EXPECT(t, "abc", true, 3);
    EXPECT(t, "ab", true, 0, 1);
    mf_tokenizer_free(t);
}

/* ---- SentencePiece-style BPE (Llama-2, Mistral): normalizer, BOS, decoder ------------- */

#define LLAMA_VOCAB                                                                                            \
    "\"vocab\": {\"<unk>\": 0, \"<s>\": 1, \"</s>\": 2, \"" SP "\": 3, \"h\": 4, \"i\": 5, \"" SP "h\": 6, \"" SP "hi\": 7, \"hi\": 8," \
    " \"<0xC3>\": 9, \"<0xA9>\": 10}, \"merges\": [\"" SP " h\", \"" SP "h i\", \"h i\"], \"unk_token\": \"<unk>\","  \
    " \"byte_fallback\": true, \"fuse_unk\": true"
#define LLAMA_ADDED                                                                                            \
    "\"added_tokens\": [{\"id\": 0, \"content\": \"<unk>\", \"special\": true, \"normalized\": false},"          \
    " {\"id\": 1, \"content\": \"<s>\", \"special\": true, \"normalized\": false},"                              \
    " {\"id\": 2, \"content\": \"</s>\", \"special\": true, \"normalized\": false}]"
#define BOS_TEMPLATE                                                                                           \
    "\"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": \"<s>\", \"type_id\": 0}},"   \
    " {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}], \"pair\": [], \"special_tokens\": {\"<s>\": {\"id\": \"<s>\", \"ids\": [1],"  \
    " \"tokens\": [\"<s>\"]}}}"

Test(tokenizer, sentencepiece_style) {
    mf_tokenizer *t = parse_ok(tok_json(LLAMA_VOCAB,
        LLAMA_ADDED ", \"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Prepend\", \"prepend\": \"" SP "\"},"
        " {\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, \"content\": \"" SP "\"}]}, \"pre_tokenizer\": null, " BOS_TEMPLATE ","
        " \"decoder\": {\"type\": \"Sequence\", \"decoders\": [{\"type\": \"Replace\", \"pattern\": {\"String\": \"" SP "\"}, \"content\": \" \"},"
        " {\"type\": \"ByteFallback\"}, {\"type\": \"Fuse\"}, {\"type\": \"Strip\", \"content\": \" \", \"start\": 1, \"stop\": 0}]}"));
    EXPECT(t, "hi hi", true, 1, 7, 7);
    EXPECT(t, "hi hi", false, 7, 7);
    /* the normalizer runs on each piece between special tokens: both pieces get their prefix */
    EXPECT(t, "hi<s>hi", true, 1, 7, 1, 7);
    EXPECT(t, "\xc3\xa9", true, 1, 3, 9, 10);   /* byte fallback */
    EXPECT(t, "", true, 1);                      /* an empty text: the BOS alone (nothing is prepended to it) */
    /* byte tokens in a row decode together; a run that is not UTF-8 gives one U+FFFD per byte */
    const int32_t ids[] = {1, 7, 7, 9, 10, 7, 9, 9};
    expect_decode(t, ids, 8, false, "<s> hi hi\xc3\xa9 hi\xef\xbf\xbd\xef\xbf\xbd");
    expect_decode(t, ids, 8, true, "hi hi\xc3\xa9 hi\xef\xbf\xbd\xef\xbf\xbd");
    mf_tokenizer_free(t);
}

Test(tokenizer, metaspace_prepend_schemes) {
    const char *ms = "\"pre_tokenizer\": {\"type\": \"Metaspace\", \"replacement\": \"" SP "\", \"prepend_scheme\": \"%s\", \"split\": %s},"
                     " \"decoder\": {\"type\": \"Metaspace\", \"replacement\": \"" SP "\", \"prepend_scheme\": \"%s\", \"split\": true}";
    char rest[2048];
    snprintf(rest, sizeof rest, "%s, %s", LLAMA_ADDED, ms);
    char r2[2048];
    snprintf(r2, sizeof r2, rest, "first", "false", "first");
    mf_tokenizer *t = parse_ok(tok_json(LLAMA_VOCAB, r2));
    EXPECT(t, "hi", true, 7);
    EXPECT(t, "hi hi", true, 7, 7);
    /* "first": only the piece at the text's start gets the prefix, not the one after a special token */
    EXPECT(t, "hi<s>hi", true, 7, 1, 8);
    const int32_t ids[] = {7, 7};
    expect_decode(t, ids, 2, false, "hi hi");
    mf_tokenizer_free(t);
    snprintf(r2, sizeof r2, rest, "always", "true", "always");
    t = parse_ok(tok_json(LLAMA_VOCAB, r2));
    EXPECT(t, "hi<s>hi", true, 7, 1, 7);
    EXPECT(t, "hi  hi", true, 7, 3, 7);   /* split at each replacement, merged with what follows: "▁hi", "▁", "▁hi" */
    mf_tokenizer_free(t);
    snprintf(r2, sizeof r2, rest, "never", "true", "never");
    t = parse_ok(tok_json(LLAMA_VOCAB, r2));
    EXPECT(t, "hi hi", true, 8, 7);
    expect_decode(t, ids, 2, false, " hi hi");
    mf_tokenizer_free(t);
}

/* ---- pre-tokenizers: Split's behaviours, Digits ------------------------------------------ */

Test(tokenizer, split_behaviors) {
    static const struct {
        const char *behavior;
        bool invert;
        int32_t ids[8];
        size_t n;
    } cases[] = {
        {"Removed", false, {0, 1, 2}, 3},
        {"Isolated", false, {0, 3, 1, 3, 3, 2}, 6},
        {"MergedWithPrevious", false, {4, 5, 3, 2}, 4},
        {"MergedWithNext", false, {0, 6, 3, 7}, 4},
        {"Contiguous", false, {0, 3, 1, 8, 2}, 5},
        {"Removed", true, {3, 3, 3}, 3},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char rest[512];
        snprintf(rest, sizeof rest, "\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"String\": \"-\"}, \"behavior\": \"%s\", \"invert\": %s}",
                 cases[i].behavior, cases[i].invert ? "true" : "false");
        mf_tokenizer *t = parse_ok(tok_json("\"vocab\": {\"a\": 0, \"b\": 1, \"c\": 2, \"-\": 3, \"a-\": 4, \"b-\": 5, \"-b\": 6, \"-c\": 7, \"--\": 8},"
                                            " \"merges\": [\"a -\", \"b -\", \"- b\", \"- c\", \"- -\"]", rest));
        expect_ids_n(t, "a-b--c", 6, true, cases[i].ids, cases[i].n);
        mf_tokenizer_free(t);
    }
    /* a Regex pattern with a class and a lookahead, as the real models' */
    mf_tokenizer *t = parse_ok(tok_json("\"vocab\": {\"a\": 0, \" \": 1, \"  \": 2, \" a\": 3}, \"merges\": [[\" \", \" \"], [\" \", \"a\"]]",
                                        "\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \" ?\\\\p{L}+|\\\\s+(?!\\\\S)|\\\\s+\"},"
                                        " \"behavior\": \"Isolated\", \"invert\": false}"));
    /* "a   a": "a", "  " (the spaces but the last, which goes with the letter), " a" */
    EXPECT(t, "a   a", true, 0, 2, 3);
    mf_tokenizer_free(t);
}

Test(tokenizer, digits) {
    const char *vocab = "\"vocab\": {\"a\": 0, \"b\": 1, \"1\": 2, \"2\": 3, \"c\": 4, \"3\": 5, \"ab\": 6, \"12\": 7, \"b1\": 8},"
                        " \"merges\": [\"b 1\", \"a b\", \"1 2\"]";
    mf_tokenizer *t = parse_ok(tok_json(vocab, "\"pre_tokenizer\": {\"type\": \"Digits\", \"individual_digits\": false}"));
    EXPECT(t, "ab12c3", true, 6, 7, 4, 5);
    mf_tokenizer_free(t);
    t = parse_ok(tok_json(vocab, "\"pre_tokenizer\": {\"type\": \"Digits\", \"individual_digits\": true}"));
    EXPECT(t, "ab12c3", true, 6, 2, 3, 4, 5);
    mf_tokenizer_free(t);
    t = parse_ok(tok_json(vocab, ""));   /* without it, b and 1 merge first */
    EXPECT(t, "ab12", true, 0, 8, 3);
    mf_tokenizer_free(t);
}

/* ---- added tokens ----------------------------------------------------------------------- */

Test(tokenizer, added_tokens) {
    /* no pre-tokenizer: a space is a token of its own, so what lstrip and rstrip take shows in the ids */
    const char *vocab = "\"vocab\": {\"a\": 0, \"b\": 1, \" \": 2, \"c\": 3, \"h\": 4, \"e\": 5, \"y\": 6}, \"merges\": []";
    mf_tokenizer *t = parse_ok(tok_json(vocab,
        "\"added_tokens\": [{\"id\": 999, \"content\": \"<x>\", \"special\": true, \"normalized\": false, \"lstrip\": true, \"rstrip\": true},"
        " {\"id\": 998, \"content\": \"<y>\", \"special\": true, \"normalized\": false},"
        " {\"id\": 5, \"content\": \"ab\", \"single_word\": true, \"normalized\": false, \"special\": false},"
        " {\"id\": 1, \"content\": \"a\", \"special\": true, \"normalized\": false}]"));
    /* ids as tokenizers gives them when it reads the file: the next ones past the vocabulary's 7 entries,
     * whatever the file says; a content that is in the vocabulary keeps the vocabulary's id */
    cr_expect_eq(mf_tokenizer_size(t), 10);
    EXPECT(t, "b <x>  b", true, 1, 7, 1);
    EXPECT(t, "b <y>  b", true, 1, 2, 8, 2, 2, 1);
    /* single_word: "ab" only where no word character touches it */
    EXPECT(t, "ab cab ab", true, 9, 2, 3, 0, 1, 2, 9);
    /* "a" is special and its id is the vocabulary's 0: decoding leaves it out when asked */
    const int32_t ids[] = {0, 1, 7};
    expect_decode(t, ids, 3, false, "a b <x>");
    expect_decode(t, ids, 3, true, "b");
    mf_tokenizer_free(t);
    /* a normalized added token matches the normalized text, and decodes as its normalized form */
    t = parse_ok(tok_json(vocab, "\"normalizer\": {\"type\": \"Lowercase\"},"
                                 " \"added_tokens\": [{\"id\": 7, \"content\": \"HEY\", \"special\": false, \"normalized\": true}]"));
    EXPECT(t, "HEY hey Hey", true, 7, 2, 7, 2, 7);
    const int32_t hey[] = {7};
    expect_decode(t, hey, 1, false, "hey");
    mf_tokenizer_free(t);
    /* the longest added token at the leftmost place wins */
    t = parse_ok(tok_json(vocab, "\"added_tokens\": [{\"content\": \"ab\", \"normalized\": false}, {\"content\": \"abc\", \"normalized\": false},"
                                 " {\"content\": \"bc\", \"normalized\": false}]"));
    EXPECT(t, "abcbc", true, 8, 9);
    mf_tokenizer_free(t);
}

/* ---- normalizers ---------------------------------------------------------------------------- */

Test(tokenizer, normalizers) {
    /* the characters of the vocabulary are the results the normalizers must give */
    const char *vocab = "\"vocab\": {\"e\": 0, \"\\u0301\": 1, \"\\u00e9\": 2, \"f\": 3, \"i\": 4, \"\\u0307\": 5, \"x\": 6, \"\\ufb01\": 7},"
                        " \"merges\": []";
    static const struct {
        const char *norm;
        const char *text;
        int32_t ids[4];
        size_t n;
    } cases[] = {
        {"{\"type\": \"NFC\"}", "e\xcc\x81", {2}, 1},
        {"{\"type\": \"NFD\"}", "\xc3\xa9", {0, 1}, 2},
        {"{\"type\": \"NFKC\"}", "\xef\xac\x81", {3, 4}, 2},   /* the fi ligature */
        {"{\"type\": \"NFKD\"}", "\xef\xac\x81", {3, 4}, 2},
        {"{\"type\": \"NFC\"}", "\xef\xac\x81", {7}, 1},
        {"{\"type\": \"Lowercase\"}", "\xc4\xb0", {4, 5}, 2},   /* U+0130 lowercases to i + U+0307 */
        {"{\"type\": \"Lowercase\"}", "\xc3\x89", {2}, 1},
        {"{\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"NFD\"}, {\"type\": \"StripAccents\"}]}", "\xc3\xa9", {0}, 1},
        {"{\"type\": \"Strip\", \"strip_left\": true, \"strip_right\": false}", " \xe3\x80\x80x ", {6}, 1},   /* the space after x: no token */
        {"{\"type\": \"Replace\", \"pattern\": {\"Regex\": \"[0-9]+\"}, \"content\": \"x\"}", "e12e3", {0, 6, 0, 6}, 4},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char rest[512];
        snprintf(rest, sizeof rest, "\"normalizer\": %s", cases[i].norm);
        mf_tokenizer *t = parse_ok(tok_json(vocab, rest));
        expect_ids_n(t, cases[i].text, strlen(cases[i].text), true, cases[i].ids, cases[i].n);
        mf_tokenizer_free(t);
    }
}

/* ---- byte-level BPE: GPT-2's table, its pattern, prefix space ------------------------------------- */

Test(tokenizer, byte_level_pre_tokenizer) {
    /* the 256 byte characters, then merges */
    static char vocab[16384];
    size_t o = (size_t)snprintf(vocab, sizeof vocab, "\"vocab\": {");
    static const char *extra[] = {"\\u0120t", "he", "\\u0120the", "\\u0120\\u0120"};
    int id = 0;
    for (int b = 0; b < 256; b++) {
        int cp = b;
        if (!((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255))) {
            int k = 0;
            for (int x = 0; x < b; x++) k += !((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255));
            cp = 256 + k;
        }
        o += (size_t)snprintf(vocab + o, sizeof vocab - o, "%s\"\\u%04x\": %d", b ? ", " : "", cp, id++);
    }
    for (int i = 0; i < 4; i++) o += (size_t)snprintf(vocab + o, sizeof vocab - o, ", \"%s\": %d", extra[i], id++);
    snprintf(vocab + o, sizeof vocab - o, "}, \"merges\": [\"\\u0120 t\", \"h e\", \"\\u0120t he\", \"\\u0120 \\u0120\"]");
    mf_tokenizer *t = parse_ok(tok_json(vocab, "\"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": true},"
                                               " \"decoder\": {\"type\": \"ByteLevel\"}"));
    /* " the" is one word: Ġ t h e -> Ġt, he -> Ġthe (258); "x" alone is byte 'x' */
    EXPECT(t, "x the", true, 'x', 258);
    /* three spaces before a word: "  " (\s+(?!\S)) then " the"; the two spaces merge */
    EXPECT(t, "x   the", true, 'x', 259, 258);
    /* "it's": 's is a word of the pattern */
    EXPECT(t, "'s", true, '\'', 's');
    const int32_t broken[] = {0xc3};   /* a lone lead byte decodes to U+FFFD */
    expect_decode(t, broken, 1, false, "\xef\xbf\xbd");
    mf_tokenizer_free(t);
    t = parse_ok(tok_json(vocab, "\"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true, \"use_regex\": true}"));
    EXPECT(t, "the", true, 258);   /* the prefix space makes it " the" */
    mf_tokenizer_free(t);
    t = parse_ok(tok_json(vocab, "\"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": false}"));
    EXPECT(t, "x  the", true, 'x', ' ', 258);   /* no pattern: one word; Ġt (rank 0) goes before ĠĠ (rank 3) */
    mf_tokenizer_free(t);
}

/* ---- refusals: one line naming what is not supported ------------------------------------------------ */

Test(tokenizer, refusals) {
    const char *v = "\"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": []";
    expect_refused("{\"model\": {\"type\": \"WordPiece\", \"vocab\": {}}}", MF_EUNSUPPORTED, "WordPiece");
    expect_refused(tok_json(v, "\"normalizer\": {\"type\": \"Precompiled\", \"precompiled_charsmap\": \"\"}"), MF_EUNSUPPORTED, "Precompiled");
    expect_refused(tok_json(v, "\"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"BertNormalizer\"}]}"), MF_EUNSUPPORTED,
                   "BertNormalizer");
    expect_refused(tok_json(v, "\"pre_tokenizer\": {\"type\": \"UnicodeScripts\"}"), MF_EUNSUPPORTED, "UnicodeScripts");
    expect_refused(tok_json(v, "\"decoder\": {\"type\": \"Nope\"}"), MF_EUNSUPPORTED, "Nope");
    expect_refused(tok_json(v, "\"post_processor\": {\"type\": \"Nope2\"}"), MF_EUNSUPPORTED, "Nope2");
    expect_refused(tok_json(v, "\"truncation\": {\"max_length\": 8}"), MF_EUNSUPPORTED, "truncation");
    expect_refused(tok_json(v, "\"padding\": {\"strategy\": \"BatchLongest\"}"), MF_EUNSUPPORTED, "padding");
    expect_refused(tok_json("\"vocab\": {\"a\": 0}, \"merges\": [], \"dropout\": 0.1", ""), MF_EUNSUPPORTED, "dropout");
    expect_refused(tok_json(v, "\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"(\"}, \"behavior\": \"Isolated\", \"invert\": false}"),
                   MF_EUNSUPPORTED, "does not compile");
    expect_refused(tok_json(v, "\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"a\"}, \"behavior\": \"Sideways\", \"invert\": false}"),
                   MF_EFORMAT, "behavior");
    expect_refused(tok_json("\"vocab\": {\"a\": 0}, \"merges\": [\"a c\"]", ""), MF_EFORMAT, "\"c\" is not in the vocabulary");
    expect_refused(tok_json("\"vocab\": {\"a\": 0}, \"merges\": [\"a a\"]", ""), MF_EFORMAT, "\"aa\" is not in the vocabulary");
    expect_refused(tok_json(v, "\"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": \"<s>\", "
                               "\"type_id\": 0}}], \"special_tokens\": {}}"), MF_EFORMAT, "<s>");
    expect_refused(tok_json(v, "\"added_tokens\": [{\"content\": \"x\", \"normalized\": true}, {\"content\": \"X\", \"normalized\": true}],"
                               " \"normalizer\": {\"type\": \"Lowercase\"}"), MF_EUNSUPPORTED, "same text");
    expect_refused("{\"model\": ", MF_EFORMAT, "not JSON");
    expect_refused("{\"version\": \"2.0\", \"model\": {}}", MF_EUNSUPPORTED, "version");
}

/* ---- against tokenizers itself ---------------------------------------------------------------------- */

/* tiny-olmoe's 32 held-out passages: their tokens are what tokenizers 0.23.2 gave for their texts */
Test(tokenizer, tiny_olmoe_prompts) {
    mf_tokenizer *t;
    mf_error err = {0};
    cr_assert_eq(mf_tokenizer_load(&t, fixture("../../models/tiny-olmoe/tokenizer.json"), &err), MF_OK, "%s", err.msg);
    FILE *f = fopen(fixture("../../models/tiny-olmoe/prompts.jsonl"), "r");
    cr_assert(f);
    char *line = NULL;
    size_t cap = 0;
    int n_lines = 0;
    while (getline(&line, &cap, f) > 0) {
        json_t *o = json_loads(line, 0, NULL), *text = json_object_get(o, "text"), *toks = json_object_get(o, "tokens");
        cr_assert(json_is_string(text) && json_is_array(toks));
        int32_t *want = malloc(json_array_size(toks) * sizeof *want);
        for (size_t i = 0; i < json_array_size(toks); i++) want[i] = (int32_t)json_integer_value(json_array_get(toks, i));
        expect_ids_n(t, json_string_value(text), json_string_length(text), true, want, json_array_size(toks));
        expect_decode(t, want, json_array_size(toks), false, json_string_value(text));
        free(want);
        json_decref(o);
        n_lines++;
    }
    free(line);
    fclose(f);
    cr_expect_eq(n_lines, 32);
    mf_tokenizer_free(t);
}

/* tests/fixtures/tokenizers/NAME.tokenizer.json and NAME.cases.json, made by tools/make_tokenizer_fixtures.py
 * with tokenizers itself: every case's ids (with and without special tokens) and decodings. */
Test(tokenizer, hugging_face_fixtures) {
    const char *dir = fixture("tokenizers");
    DIR *d = opendir(dir);
    cr_assert(d, "%s: cannot open (tools/make_tokenizer_fixtures.py makes it)", dir);
    struct dirent *e;
    int files = 0, cases = 0;
    char names[64][256];
    int n_names = 0;
    while ((e = readdir(d)) && n_names < 64) {
        const size_t l = strlen(e->d_name);
        if (l > 11 && !strcmp(e->d_name + l - 11, ".cases.json") && l < 200) snprintf(names[n_names++], 256, "%.*s", (int)(l - 11), e->d_name);
    }
    closedir(d);
    cr_assert_geq(n_names, 11, "%s: %d tokenizer families, the fixture script makes 11", dir, n_names);
    for (int k = 0; k < n_names; k++) {
        char path[4400];
        cr_assert((size_t)snprintf(path, sizeof path, "%s/%s.tokenizer.json", dir, names[k]) < sizeof path);
        mf_tokenizer *t;
        mf_error err = {0};
        cr_assert_eq(mf_tokenizer_load(&t, path, &err), MF_OK, "%s: %s", names[k], err.msg);
        cr_assert((size_t)snprintf(path, sizeof path, "%s/%s.cases.json", dir, names[k]) < sizeof path);
        json_error_t je;
        json_t *root = json_load_file(path, JSON_ALLOW_NUL, &je), *arr = json_object_get(root, "cases");
        cr_assert(json_is_array(arr), "%s: %s", path, je.text);
        size_t i;
        json_t *c;
        json_array_foreach(arr, i, c) {
            json_t *text = json_object_get(c, "text");
            static const char *keys[2] = {"ids", "ids_no_special"};
            for (int s = 0; s < 2; s++) {
                json_t *ids = json_object_get(c, keys[s]);
                int32_t *want = malloc((json_array_size(ids) + 1) * sizeof *want);
                for (size_t j = 0; j < json_array_size(ids); j++) want[j] = (int32_t)json_integer_value(json_array_get(ids, j));
                int32_t *got;
                size_t n;
                cr_assert_eq(mf_tokenizer_encode(t, json_string_value(text), json_string_length(text), s == 0, &got, &n, &err), MF_OK,
                             "%s case %zu: %s", names[k], i, err.msg);
                bool same = n == json_array_size(ids) && (n == 0 || !memcmp(got, want, n * sizeof *got));
                cr_expect(same, "%s case %zu (%s): %zu ids, tokenizers gave %zu", names[k], i, keys[s], n, json_array_size(ids));
                if (s == 0) {
                    static const char *dk[2] = {"decoded", "decoded_skip_special"};
                    for (int sk = 0; sk < 2; sk++) {
                        json_t *want_text = json_object_get(c, dk[sk]);
                        char *out;
                        size_t len;
                        cr_assert_eq(mf_tokenizer_decode_text(t, want, json_array_size(ids), sk, &out, &len, &err), MF_OK, "%s", err.msg);
                        cr_expect(len == json_string_length(want_text) && !memcmp(out, json_string_value(want_text), len),
                                  "%s case %zu: %s \"%s\", tokenizers gave \"%s\"", names[k], i, dk[sk], out, json_string_value(want_text));
                        free(out);
                    }
                }
                free(got);
                free(want);
            }
            cases++;
        }
        json_decref(root);
        mf_tokenizer_free(t);
        files++;
    }
    cr_log_info("%d tokenizers, %d cases", files, cases);
}

/* ---- the command, and trace's text lines --------------------------------------------------------------- */

Test(tokenizer, command) {
    const char *d = temp_dir();
    const char *model = fixture("../../models/tiny-olmoe");
    write_text(d, "texts.jsonl", "{\"id\": \"a\", \"text\": \"Hello world<|endoftext|>\"}\n{\"id\": \"b\", \"text\": \"\"}\n");
    char err[2048];
    cr_assert_eq(run_moeflip(err, sizeof err, "tokenize --model '%s' --input '%s/texts.jsonl' -o '%s/tokens.jsonl'", model, d, d), 0, "%s", err);
    char path[4200];
    snprintf(path, sizeof path, "%s/tokens.jsonl", d);
    char *text;
    size_t len;
    mf_error e = {0};
    cr_assert_eq(mf_read_file(path, &text, &len, &e), MF_OK);
    mf_tokenizer *t;
    cr_assert_eq(mf_tokenizer_load(&t, fixture("../../models/tiny-olmoe/tokenizer.json"), &e), MF_OK);
    int32_t *ids;
    size_t n;
    cr_assert_eq(mf_tokenizer_encode(t, "Hello world<|endoftext|>", 24, true, &ids, &n, &e), MF_OK);
    cr_assert_eq(ids[n - 1], 0);   /* <|endoftext|> is id 0 */
    char want[1024] = "{\"id\": \"a\", \"tokens\": [";
    for (size_t i = 0; i < n; i++) snprintf(want + strlen(want), sizeof want - strlen(want), i ? ", %d" : "%d", ids[i]);
    strcat(want, "]}\n{\"id\": \"b\", \"tokens\": []}\n");
    cr_expect_str_eq(text, want);
    free(ids);
    free(text);
    mf_tokenizer_free(t);
    /* back to text */
    cr_assert_eq(run_moeflip(err, sizeof err, "tokenize --tokenizer '%s/tokenizer.json' --decode --input '%s/texts.jsonl' -o '%s/x' 2>/dev/null",
                             model, d, d), 1);
    write_text(d, "one.jsonl", "{\"id\": \"a\", \"tokens\": [0, 2]}\n");
    cr_assert_eq(run_moeflip(err, sizeof err, "tokenize --model '%s' --decode --skip-special --input '%s/one.jsonl' -o '%s/dec.jsonl'", model, d, d),
                 0, "%s", err);
    snprintf(path, sizeof path, "%s/dec.jsonl", d);
    cr_assert_eq(mf_read_file(path, &text, &len, &e), MF_OK);
    cr_expect(strstr(text, "\"id\": \"a\"") && !strstr(text, "endoftext"), "%s", text);
    free(text);
    /* usage and failures */
    cr_expect_eq(run_moeflip(err, sizeof err, "tokenize --input x"), 2);
    cr_expect_eq(run_moeflip(err, sizeof err, "tokenize --model a --tokenizer b --input x"), 2);
    cr_expect_eq(run_moeflip(err, sizeof err, "tokenize --model '%s' --input '%s/missing.jsonl'", model, d), 1);
    cr_expect(strstr(err, "missing.jsonl"), "%s", err);
    write_text(d, "dup.jsonl", "{\"id\": \"a\", \"text\": \"x\"}\n{\"id\": \"a\", \"text\": \"y\"}\n");
    cr_expect_eq(run_moeflip(err, sizeof err, "tokenize --model '%s' --input '%s/dup.jsonl' -o '%s/never.jsonl'", model, d, d), 1);
    cr_expect(strstr(err, "appears twice"), "%s", err);
    snprintf(path, sizeof path, "%s/never.jsonl", d);
    cr_expect(!mf_path_exists(path), "a failed tokenize left its output");
    write_text(d, "bad.json", "{\"model\": {\"type\": \"Unigram\", \"vocab\": []}}");
    cr_expect_eq(run_moeflip(err, sizeof err, "tokenize --tokenizer '%s/bad.json' --input '%s/texts.jsonl'", d, d), 1);
    cr_expect(strstr(err, "Unigram") && strstr(err, "bad.json"), "%s", err);
}

Test(tokenizer, prompts_with_text) {
    const char *d = temp_dir();
    write_text(d, "p.jsonl", "{\"id\": \"t\", \"text\": \"Certain parts of the Packaging manual\"}\n{\"id\": \"k\", \"tokens\": [35, 264]}\n");
    char path[4200], tok[4200];
    snprintf(path, sizeof path, "%s/p.jsonl", d);
    snprintf(tok, sizeof tok, "%s", fixture("../../models/tiny-olmoe/tokenizer.json"));
    mf_prompts p;
    mf_error e = {0};
    cr_assert_eq(mf_prompts_load_text(&p, path, 4096, tok, &e), MF_OK, "%s", e.msg);
    cr_assert_eq(p.n, 2);
    /* prompts.jsonl's p00 starts with these tokens (its text starts with this sentence) */
    const int32_t want[] = {35, 264, 1062, 3509, 296, 263, 365, 409, 344, 280, 3451};
    cr_expect_eq(p.seq[0].T, 11);
    cr_expect(!memcmp(p.seq[0].tokens, want, sizeof want));
    mf_prompts_free(&p);
    /* without a tokenizer a text line is refused, naming the line */
    cr_expect_neq(mf_prompts_load(&p, path, 4096, &e), MF_OK);
    cr_expect(strstr(e.msg, "p.jsonl:1") && strstr(e.msg, "\"text\""), "%s", e.msg);
    /* a text whose ids fall outside the model's vocabulary */
    cr_expect_neq(mf_prompts_load_text(&p, path, 100, tok, &e), MF_OK);
    cr_expect(strstr(e.msg, "outside the model's vocabulary"), "%s", e.msg);
    write_text(d, "e.jsonl", "{\"id\": \"t\", \"text\": \"\"}\n");
    snprintf(path, sizeof path, "%s/e.jsonl", d);
    cr_expect_neq(mf_prompts_load_text(&p, path, 4096, tok, &e), MF_OK);
    cr_expect(strstr(e.msg, "no tokens"), "%s", e.msg);
}
