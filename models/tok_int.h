/* The tokenizer's parts, shared by models/tok_*.c and models/tokenizer.c (not part of the library's interface).
 *
 * A text goes through the stages of Hugging Face tokenizers' Tokenizer.encode, each in its own file:
 *   added tokens split out of the raw text           tokenizer.c
 *   normalizer on each remaining piece                tok_normalize.c
 *   added tokens split out of the normalized pieces  tokenizer.c
 *   pre-tokenizer                                     tok_pretok.c
 *   model (BPE)                                       tok_bpe.c
 *   post-processor                                    tokenizer.c
 * and ids go back through the decoder (tok_decode.c). Patterns are PCRE2 regular expressions that follow
 * Oniguruma's meaning of \s, \w and \h where PCRE2's differs (tok_text.c). */
#ifndef MF_TOK_INT_H
#define MF_TOK_INT_H

#include "mf_models.h"

#include <jansson.h>

/* ---- limits: a tokenizer.json and a text are hostile until checked ---- */

#define TK_MAX_FILE_BYTES ((size_t)512 << 20) /* tokenizer.json */
#define TK_MAX_VOCAB (1 << 24)                /* entries of model.vocab, merges, added tokens */
#define TK_MAX_ID 0x7ffffffe                  /* ids are int32 in moeflip (Hugging Face allows u32) */
#define TK_MAX_DEPTH 16                       /* nested Sequence components */
#define TK_MAX_PARTS 1024                     /* components of one Sequence */
#define TK_MAX_ADDED_BYTES (1 << 16)          /* one added token's content */
#define TK_MAX_PATTERN_BYTES (1 << 16)        /* one regular expression */
#define TK_MAX_TEXT_BYTES ((size_t)64 << 20)  /* one text to encode */

/* ---- growable byte strings ------------------------------------------- */

/* core's mf_buf under the tokenizer's short names */
typedef mf_buf tk_buf;

static inline void tkb_reserve(tk_buf *b, size_t more) { mf_buf_reserve(b, more); }
static inline void tkb_put(tk_buf *b, const void *p, size_t n) { mf_buf_put(b, p, n); }
static inline void tkb_putc(tk_buf *b, char c) { mf_buf_putc(b, c); }
void tkb_cp(tk_buf *b, uint32_t cp);   /* UTF-8 of a code point */
static inline void tkb_free(tk_buf *b) { mf_buf_free(b); }
/* the string, NUL-terminated, handed over (the buffer is left empty) */
static inline char *tkb_take(tk_buf *b, size_t *len) { return mf_buf_take(b, len); }

/* ---- UTF-8 and Unicode properties (tok_text.c) ------------------------ */

/* Decodes the character at s[i] of valid UTF-8 (n bytes); returns its length. */
int tk_utf8_dec(const char *s, size_t n, size_t i, uint32_t *cp);
/* The length of the valid UTF-8 character starting with byte c. */
static inline int tk_utf8_len(unsigned char c) { return c < 0x80 ? 1 : c < 0xe0 ? 2 : c < 0xf0 ? 3 : 4; }
/* Whether s (n bytes) is valid UTF-8 (NUL bytes allowed). */
bool tk_utf8_valid(const char *s, size_t n);
/* Rust's String::from_utf8_lossy: each maximal invalid subsequence becomes U+FFFD. */
void tk_utf8_lossy(tk_buf *out, const char *s, size_t n);
/* A string quoted for a message: at most max bytes, cut between characters, control characters escaped,
 * bytes that are not UTF-8 shown as '?'. Writes into dst (cap bytes, NUL-terminated); returns dst. */
char *tk_quote(char *dst, size_t cap, const char *s, size_t n);

bool tk_is_whitespace(uint32_t cp);   /* Unicode White_Space (Rust's char::is_whitespace, regex's \s) */
bool tk_is_numeric(uint32_t cp);      /* general category N (Rust's char::is_numeric) */
bool tk_is_punct(uint32_t cp);        /* ASCII punctuation or category P (the Punctuation pre-tokenizer) */
bool tk_is_mark(uint32_t cp);         /* category M (StripAccents) */
bool tk_is_word(uint32_t cp);         /* Rust regex's \w: Alphabetic, M, Nd, Pc, Join_Control */

/* GPT-2's bytes_to_unicode table: the code point that stands for byte b, and back (-1: none). */
uint32_t tk_byte_char(uint8_t b);
int tk_char_byte(uint32_t cp);

/* ---- regular expressions (tok_text.c) --------------------------------- */

typedef struct tk_regex tk_regex;
/* pattern (n bytes) as Oniguruma reads it (the engine of Hugging Face tokenizers); literal: the bytes are
 * matched as they are (a String pattern). what: the component, for messages. */
int tk_regex_new(tk_regex **out, const char *pattern, size_t n, bool literal, const char *what, mf_error *err);
void tk_regex_free(tk_regex *re);

/* Per encode: match data and a JIT stack, made when first needed (so an mf_tokenizer can be shared). */
typedef struct tk_ctx tk_ctx;
tk_ctx *tk_ctx_new(void);
void tk_ctx_free(tk_ctx *c);

/* A piece of a string: bytes [a, b), and whether a pattern matched it. */
typedef struct tk_range {
    size_t a, b;
    bool match;
} tk_range;
typedef struct tk_ranges {
    tk_range *v;
    size_t n, cap;
} tk_ranges;
void tkr_push(tk_ranges *r, size_t a, size_t b, bool match);

/* Hugging Face's Pattern::find_matches of a regex over s: the string cut into matches and the gaps between
 * them, in order, with Oniguruma's find_iter rule for empty matches. */
int tk_regex_find(const tk_regex *re, tk_ctx *ctx, const char *s, size_t n, tk_ranges *out, mf_error *err);
/* The same with a character predicate: every matching character is one match. */
void tk_pred_find(bool (*pred)(uint32_t, const void *), const void *ud, const char *s, size_t n, tk_ranges *out);

/* ---- the pieces of a text --------------------------------------------- */

typedef struct tk_piece {
    char *s;        /* owned, valid UTF-8 */
    size_t n;
    int32_t id;     /* an added token's id, or -1: still to be tokenized */
    /* how many leading bytes stand at offset 0 of the original text (0: the piece does not start the text);
     * Metaspace's prepend_scheme "first" asks it */
    size_t orig0;
} tk_piece;

typedef struct tk_pieces {
    tk_piece *v;
    size_t n, cap;
} tk_pieces;

void tkp_push(tk_pieces *p, char *s, size_t n, int32_t id, size_t orig0);   /* takes s */
void tkp_free(tk_pieces *p);

typedef enum tk_behavior {
    TK_REMOVED, TK_ISOLATED, TK_MERGED_WITH_PREVIOUS, TK_MERGED_WITH_NEXT, TK_CONTIGUOUS
} tk_behavior;
int tk_behavior_parse(const char *s, tk_behavior *out);
/* NormalizedString::split: applies the behavior to the matches of piece and appends the non-empty results
 * to out. invert: matches and gaps swap roles first. */
void tk_split_piece(const tk_piece *piece, const tk_ranges *m, tk_behavior b, bool invert, tk_pieces *out);

/* ---- normalizers (tok_normalize.c) ------------------------------------ */

typedef struct tk_normalizer tk_normalizer;
/* j: the "normalizer" value (not null); origin: the file, for messages. */
int tk_normalizer_parse(tk_normalizer **out, json_t *j, const char *origin, int depth, mf_error *err);
void tk_normalizer_free(tk_normalizer *n);
/* Normalizes s (n bytes) into out (replacing its content); orig0 is updated as the piece's. */
int tk_normalize(const tk_normalizer *nz, tk_ctx *ctx, const char *s, size_t n, tk_buf *out, size_t *orig0,
                 mf_error *err);

/* ---- pre-tokenizers (tok_pretok.c) ------------------------------------ */

typedef struct tk_pretok tk_pretok;
int tk_pretok_parse(tk_pretok **out, json_t *j, const char *origin, int depth, mf_error *err);
void tk_pretok_free(tk_pretok *p);
/* Splits and transforms the pieces that are not added tokens (in place). */
int tk_pretokenize(const tk_pretok *p, tk_ctx *ctx, tk_pieces *pieces, mf_error *err);
/* Whether it maps bytes to GPT-2's characters (a ByteLevel somewhere in it). */
bool tk_pretok_byte_level(const tk_pretok *p);

/* ---- the BPE model (tok_bpe.c) ---------------------------------------- */

typedef struct tk_bpe tk_bpe;
int tk_bpe_parse(tk_bpe **out, json_t *model, const char *origin, mf_error *err);
void tk_bpe_free(tk_bpe *m);
/* model.vocab's entries (Hugging Face's get_vocab_size) and the largest id in it (-1 when empty). */
size_t tk_bpe_count(const tk_bpe *m);
int32_t tk_bpe_max_id(const tk_bpe *m);
/* The id of a token string, or -1. */
int32_t tk_bpe_token_id(const tk_bpe *m, const char *s, size_t n);
/* The string of an id (not NUL-terminated), or NULL. */
const char *tk_bpe_id_token(const tk_bpe *m, int32_t id, size_t *n);
/* Appends the ids of one pre-tokenized word. */
int tk_bpe_tokenize(const tk_bpe *m, const char *w, size_t n, int32_t **ids, size_t *n_ids, size_t *cap,
                    mf_error *err);

/* ---- decoders (tok_decode.c) ------------------------------------------ */

typedef struct tk_decoder tk_decoder;
int tk_decoder_parse(tk_decoder **out, json_t *j, const char *origin, int depth, mf_error *err);
void tk_decoder_free(tk_decoder *d);
/* Decoder::decode: the tokens' strings through decode_chain, joined. tokens are taken (freed). */
int tk_decode_chain(const tk_decoder *d, tk_ctx *ctx, tk_buf *tokens, size_t n, tk_buf *out, mf_error *err);
bool tk_decoder_byte_level(const tk_decoder *d);

/* ---- JSON helpers for the parsers ------------------------------------- */

/* A member that must be a boolean (absent: dflt when dflt >= 0, else an error). */
int tkj_bool(json_t *o, const char *key, int dflt, bool *out, const char *what, const char *origin, mf_error *err);
/* A member that must be a string (absent or null: *out = NULL when optional, else an error). */
int tkj_str(json_t *o, const char *key, bool optional, const char **out, size_t *len, const char *what,
            const char *origin, mf_error *err);
/* A member that must be a non-negative integer <= max (absent: dflt when dflt >= 0). */
int tkj_uint(json_t *o, const char *key, long long dflt, long long max, long long *out, const char *what,
             const char *origin, mf_error *err);
/* A string of exactly one character (serde's char): its code point. */
int tkj_char(json_t *o, const char *key, bool optional, uint32_t dflt, uint32_t *out, const char *what,
             const char *origin, mf_error *err);
/* {"String": s} or {"Regex": r} compiled. */
int tkj_pattern(json_t *o, const char *key, tk_regex **out, const char *what, const char *origin, mf_error *err);
/* The "type" member of a component (NULL when absent or not a string). */
const char *tkj_type(json_t *o);

#endif
