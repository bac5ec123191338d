/* libFuzzer target: one input is a prompt file (JSON lines). mf_prompts_load
 * must refuse it with one message, or give sequences with valid, unique ids
 * and 1 to 2^20 tokens each inside the vocabulary. */
#include "fuzz_util.h"
#include "mf_rundir.h"

#define VOCAB 384

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[256];
    snprintf(path, sizeof path, "%s/p.jsonl", fuzz_scratch());
    fuzz_write(path, data, size);
    mf_prompts p;
    mf_error e = {0};
    const int rc = mf_prompts_load(&p, path, VOCAB, &e);
    fuzz_check_refusal(rc, &e);
    if (rc) return 0;
    if (p.n == 0) abort();
    for (size_t i = 0; i < p.n; i++) {
        const mf_prompt *s = &p.seq[i];
        if (!mf_seq_id_valid(s->id) || s->T < 1 || s->T > MF_MAX_SEQ_TOKENS) abort();
        for (int t = 0; t < s->T; t++)
            if (s->tokens[t] < 0 || s->tokens[t] >= VOCAB) abort();
        for (size_t j = 0; j < i; j++)
            if (!strcmp(p.seq[j].id, s->id)) abort();
    }
    mf_prompts_free(&p);
    return 0;
}
