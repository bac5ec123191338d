/* Helpers shared by the tests: fixture paths, running the moeflip command,
 * temporary directories, and reading Hugging Face reference tensors. */
#ifndef MF_TESTUTIL_H
#define MF_TESTUTIL_H

#include <jansson.h>

#include "mf_core.h"
#include "mf_models.h"

/* 1 in the sanitizer build (AddressSanitizer and UndefinedBehaviorSanitizer: about ten times slower), where a test
 * that repeats one check over many cases runs a sample of them; the plain build runs them all. */
#if defined(__SANITIZE_ADDRESS__)
#define MF_TEST_SANITIZED 1
#else
#define MF_TEST_SANITIZED 0
#endif

/* tests/fixtures/<rel> */
const char *fixture(const char *rel);
/* A fresh empty directory under /tmp, removed at exit. */
const char *temp_dir(void);
/* Runs `moeflip <args>` through the shell; stderr captured into err_out
 * (if not NULL, up to cap bytes). Returns the exit status. */
int run_moeflip(char *err_out, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Reads tensor `name` of a safetensors file as doubles (malloc'ed); n gets
 * the element count. Fails the test if absent. */
double *read_tensor(const char *path, const char *name, size_t *n);
/* The objects of a JSON-lines file (PATH as mf_read_file reads it, .xz included), one array element a non-empty
 * line; a line that is not JSON fails the test, naming the file and the line. */
json_t *read_jsonl(const char *path);
/* Copies a fixture checkpoint directory into a fresh temp dir and returns it. */
const char *copy_fixture_dir(const char *case_name);
/* Traces tests/fixtures/<model> (with its tokens.jsonl) into dir/<name> with the given options, quietly; the
 * path (one of 8 rotating buffers). Fails the test if the trace fails. */
const char *make_run(const char *dir, const char *name, const char *model, const char *opts);
/* The prompts file path, or under the sanitizers (MF_TEST_SANITIZED) a temporary copy of its first n lines. */
const char *sampled_prompts(const char *path, int n);
/* Writes text to dir/name. */
void write_text(const char *dir, const char *name, const char *text);
/* A file's bytes, NUL-terminated (malloc'ed); len gets their count unless NULL. Fails the test when the file
 * cannot be read. */
char *slurp(const char *path, size_t *len);
/* The entries of a directory (not "." or ".."), or -1 when it cannot be read: a check that a directory is
 * empty fails when the directory is missing. */
int dir_entries(const char *path);
/* The same, of the entries whose names hold `part`. */
int dir_entries_named(const char *path, const char *part);
/* Sleeps ms milliseconds, the whole time even when a signal interrupts. */
void sleep_ms(double ms);

#endif
