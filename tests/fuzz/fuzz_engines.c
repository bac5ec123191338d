/* libFuzzer target: one input is an engine's routing capture of one sequence of the olmoe test model (its
 * config.json: 3 MoE layers, 16 experts, top-4), its first byte choosing the reader (0: vLLM .npy, 1: SGLang
 * base64/JSON, 2: llama.cpp moe-trace CSV; the byte mod 3), the rest the file. The tokens file holds one
 * sequence of 6 tokens. mf_import_engine must refuse it with one message and leave nothing behind, or write a
 * run that mf_run_open validates. */
#include "fuzz_util.h"
#include "mf_rundir.h"

#ifndef FUZZ_MODEL_CONFIG
#error "FUZZ_MODEL_CONFIG: the olmoe fixture's config.json"
#endif

static char model[256], tokens[256], capture[256], out[256];

static void setup(void) {
    const char *dir = fuzz_scratch();
    snprintf(model, sizeof model, "%s/model", dir);
    snprintf(tokens, sizeof tokens, "%s/tokens.jsonl", dir);
    snprintf(capture, sizeof capture, "%s/capture", dir);
    snprintf(out, sizeof out, "%s/run", dir);
    if (mkdir(model, 0755)) abort();
    char *text;
    size_t len;
    mf_error e = {0};
    if (mf_read_file(FUZZ_MODEL_CONFIG, &text, &len, &e)) {
        fprintf(stderr, "fuzz: %s\n", e.msg);
        abort();
    }
    char p[320];
    snprintf(p, sizeof p, "%s/config.json", model);   /* no weights: the import takes the config alone */
    fuzz_write(p, text, len);
    free(text);
    static const char line[] = "{\"id\": \"s0\", \"tokens\": [57, 329, 203, 101, 7, 110]}\n";
    fuzz_write(tokens, line, sizeof line - 1);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!model[0]) setup();
    if (size < 1) return 0;
    const mf_engine eng = (mf_engine)(data[0] % 3);
    fuzz_write(capture, data + 1, size - 1);
    fuzz_remove_flat(out);
    mf_error e = {0};
    const char *files[] = {capture};
    const int rc = mf_import_engine(eng, files, 1, model, tokens, out, &e);
    fuzz_check_refusal(rc, &e);
    if (rc) {
        if (mf_path_exists(out)) {
            fprintf(stderr, "fuzz: a refused import left %s\n", out);
            abort();
        }
        return 0;
    }
    mf_run *r = NULL;
    e = (mf_error){0};
    if (mf_run_open(&r, out, &e) != MF_OK) {
        fprintf(stderr, "fuzz: an import wrote a run that does not validate: %s\n", e.msg);
        abort();
    }
    mf_run_close(r);
    return 0;
}
