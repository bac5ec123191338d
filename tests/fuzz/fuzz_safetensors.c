/* libFuzzer target: one input is a whole .safetensors file. mf_st_open must
 * refuse it with one message or give tensors whose data lies inside the file
 * and holds exactly their elements; every element of every tensor is read. */
#include "fuzz_util.h"
#include "mf_models.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[256];
    snprintf(path, sizeof path, "%s/x.safetensors", fuzz_scratch());
    fuzz_write(path, data, size);
    mf_st_file *f = NULL;
    mf_error e = {0};
    const int rc = mf_st_open(&f, path, &e);
    fuzz_check_refusal(rc, &e);
    if (rc) return 0;
    volatile double sink = 0;
    for (size_t i = 0; i < f->count; i++) {
        const mf_st_tensor *t = &f->tensors[i];
        if (mf_st_find(f, t->name) == NULL) abort();   /* every listed name is found */
        const size_t es = mf_dtype_size(t->dtype), n = (size_t)mf_st_numel(t);
        if (es == 0 || n * es != t->nbytes || t->data < f->map.data || t->data + t->nbytes > f->map.data + f->map.size) abort();
        for (size_t k = 0; k < n && k < 4096; k++) sink += mf_load_as_f64(t->data, t->dtype, k);
        if (n) sink += mf_load_as_f64(t->data, t->dtype, n - 1);
    }
    (void)sink;
    mf_st_close(f);
    return 0;
}
