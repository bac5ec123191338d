/* libFuzzer target: one input is a CroVA case file (logits/<case>.safetensors)
 * of a capture of the olmoe test model (its config.json: vocabulary 384, 3 MoE
 * layers, 16 experts, top-4). mf_import_crova must refuse it with one message
 * and leave nothing behind, or write a run that mf_run_open validates. */
#include "fuzz_util.h"
#include "mf_rundir.h"

#ifndef FUZZ_MODEL_CONFIG
#error "FUZZ_MODEL_CONFIG: the olmoe fixture's config.json"
#endif

static char model[256], capture[256], out[256];

static void setup(void) {
    const char *dir = fuzz_scratch();
    snprintf(model, sizeof model, "%s/model", dir);
    snprintf(capture, sizeof capture, "%s/capture", dir);
    snprintf(out, sizeof out, "%s/run", dir);
    char p[320];
    if (mkdir(model, 0755) || mkdir(capture, 0755)) abort();
    snprintf(p, sizeof p, "%s/logits", capture);
    if (mkdir(p, 0755)) abort();
    char *text;
    size_t len;
    mf_error e = {0};
    if (mf_read_file(FUZZ_MODEL_CONFIG, &text, &len, &e)) {
        fprintf(stderr, "fuzz: %s\n", e.msg);
        abort();
    }
    snprintf(p, sizeof p, "%s/config.json", model);   /* no weights: the import takes the config alone */
    fuzz_write(p, text, len);
    free(text);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!model[0]) setup();
    char p[320];
    snprintf(p, sizeof p, "%s/logits/c.safetensors", capture);
    fuzz_write(p, data, size);
    fuzz_remove_flat(out);
    mf_error e = {0};
    const int rc = mf_import_crova(capture, model, out, &e);
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
