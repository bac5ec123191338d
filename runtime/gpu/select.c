/* Which GPU backend a device string names, and whether this build has it. */
#include "mf_runtime.h"

#include <stdlib.h>
#include <string.h>

#define DECLARE(prefix)                                                                                          \
    int prefix##_gpu_open(void **out, int device, const mf_model *m, const mf_precision *prec,                   \
                          const mf_numerics *num, mf_error *err);                                                \
    int prefix##_gpu_forward(void *impl, const int32_t *tokens, int T, unsigned capture, mf_seq_result *r,       \
                             mf_error *err);                                                                     \
    const void *prefix##_gpu_host_logits(const void *impl, mf_dtype *dtype);                                     \
    const char *prefix##_gpu_describe(const void *impl);                                                         \
    void prefix##_gpu_close(void *impl);
DECLARE(mf_cuda)
DECLARE(mf_hip)

typedef enum { BACKEND_CUDA, BACKEND_HIP } backend;

struct mf_gpu {
    backend b;
    void *impl;
};

bool mf_gpu_built(const char *name) {
#ifdef MF_HAVE_CUDA
    if (!strcmp(name, "cuda")) return true;
#endif
#ifdef MF_HAVE_HIP
    if (!strcmp(name, "hip")) return true;
#endif
    (void)name;
    return false;
}

bool mf_device_is_gpu(const char *device) { return strcmp(device, "cpu") != 0; }

static int parse_device(const char *device, backend *b, int *index, mf_error *err) {
    const char *rest;
    if (!strncmp(device, "cuda", 4)) {
        *b = BACKEND_CUDA;
        rest = device + 4;
    } else if (!strncmp(device, "hip", 3)) {
        *b = BACKEND_HIP;
        rest = device + 3;
    } else {
        return mf_fail(err, MF_EINVAL, "unknown device \"%s\" (cpu, cuda[:N], hip[:N])", device);
    }
    *index = 0;
    if (*rest) {
        char *end;
        long v = rest[0] == ':' ? strtol(rest + 1, &end, 10) : -1;
        if (rest[0] != ':' || !rest[1] || *end || v < 0 || v > 1023)
            return mf_fail(err, MF_EINVAL, "device \"%s\": expected %s or %s:N", device, *b == BACKEND_CUDA ? "cuda" : "hip",
                           *b == BACKEND_CUDA ? "cuda" : "hip");
        *index = (int)v;
    }
    if (!mf_gpu_built(*b == BACKEND_CUDA ? "cuda" : "hip"))
        return mf_fail(err, MF_EUNSUPPORTED, "device \"%s\": this moeflip was built without the %s backend (%s was not "
                       "found when it was configured)", device, *b == BACKEND_CUDA ? "CUDA" : "HIP",
                       *b == BACKEND_CUDA ? "nvcc" : "hipcc");
    return MF_OK;
}

int mf_gpu_open(mf_gpu **out, const char *device, const mf_model *m, const mf_precision *prec, const mf_numerics *num,
                mf_error *err) {
    *out = NULL;
    backend b = BACKEND_CUDA;
    int index = 0, rc;
    if ((rc = parse_device(device, &b, &index, err))) return rc;
    void *impl = NULL;
#ifdef MF_HAVE_CUDA
    if (b == BACKEND_CUDA) rc = mf_cuda_gpu_open(&impl, index, m, prec, num, err);
#endif
#ifdef MF_HAVE_HIP
    if (b == BACKEND_HIP) rc = mf_hip_gpu_open(&impl, index, m, prec, num, err);
#endif
    (void)m;
    (void)prec;
    (void)num;
    if (rc) return rc;
    mf_gpu *g = mf_xmalloc(sizeof *g);
    g->b = b;
    g->impl = impl;
    *out = g;
    return MF_OK;
}

int mf_gpu_forward(mf_gpu *g, const int32_t *tokens, int T, unsigned capture, mf_seq_result *r, mf_error *err) {
#ifdef MF_HAVE_CUDA
    if (g->b == BACKEND_CUDA) return mf_cuda_gpu_forward(g->impl, tokens, T, capture, r, err);
#endif
#ifdef MF_HAVE_HIP
    if (g->b == BACKEND_HIP) return mf_hip_gpu_forward(g->impl, tokens, T, capture, r, err);
#endif
    (void)tokens;
    (void)T;
    (void)capture;
    (void)r;
    return mf_fail(err, MF_EUNSUPPORTED, "no GPU backend in this build");
}

const void *mf_gpu_host_logits(const mf_gpu *g, mf_dtype *dtype) {
#ifdef MF_HAVE_CUDA
    if (g->b == BACKEND_CUDA) return mf_cuda_gpu_host_logits(g->impl, dtype);
#endif
#ifdef MF_HAVE_HIP
    if (g->b == BACKEND_HIP) return mf_hip_gpu_host_logits(g->impl, dtype);
#endif
    (void)g;
    *dtype = MF_DTYPE_INVALID;
    return NULL;
}

const char *mf_gpu_describe(const mf_gpu *g) {
#ifdef MF_HAVE_CUDA
    if (g->b == BACKEND_CUDA) return mf_cuda_gpu_describe(g->impl);
#endif
#ifdef MF_HAVE_HIP
    if (g->b == BACKEND_HIP) return mf_hip_gpu_describe(g->impl);
#endif
    (void)g;
    return "none";
}

void mf_gpu_close(mf_gpu *g) {
    if (!g) return;
#ifdef MF_HAVE_CUDA
    if (g->b == BACKEND_CUDA) mf_cuda_gpu_close(g->impl);
#endif
#ifdef MF_HAVE_HIP
    if (g->b == BACKEND_HIP) mf_hip_gpu_close(g->impl);
#endif
    free(g);
}
