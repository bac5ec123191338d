/* Which GPU backend a device string names, whether this build has it, and
 * loading its module (libmoeflip_cuda.so, libmoeflip_hip.so) on first use:
 * the vendor libraries come in only with a GPU run. The module looks for
 * the core's functions in the program (built with exported symbols). */
#include "mf_runtime.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef enum { BACKEND_CUDA, BACKEND_HIP } backend;

typedef struct backend_api {
    int (*open)(void **out, int device, mf_model *m, const mf_precision *prec, const mf_numerics *num, int max_T,
                int cache_T, mf_error *err);
    int (*forward)(void *impl, const int32_t *tokens, int T, unsigned capture, mf_seq_result *r, mf_error *err);
    int (*session_forward)(void *impl, const int32_t *tokens, int n, unsigned capture, mf_seq_result *r, mf_error *err);
    int (*session_rewind)(void *impl, int pos, mf_error *err);
    void (*set_replay)(void *impl, const mf_replay *rp);
    const void *(*host_logits)(const void *impl, mf_dtype *dtype);
    const char *(*describe)(const void *impl);
    void (*close)(void *impl);
    int (*count)(int *count, mf_error *err);
    int (*matmul)(int device, const mf_numerics *num, mf_dtype in, mf_dtype out, const mf_mat *w, int experts,
                  const double *a, int M, const int *offsets, double *c, mf_error *err);
} backend_api;

struct mf_gpu {
    const backend_api *api;
    void *impl;
};

static const char *const backend_names[2] = {"cuda", "hip"};

static int load_backend(backend b, const backend_api **out, mf_error *err) {
    static backend_api apis[2];
    static bool loaded[2];
    if (loaded[b]) {
        *out = &apis[b];
        return MF_OK;
    }
    enum { N_ENTRIES = 10 };
    char file[64], names[N_ENTRIES][64];
    snprintf(file, sizeof file, "libmoeflip_%s.so", backend_names[b]);
    backend_api *a = &apis[b];
    static const char *const entry[N_ENTRIES] = {"gpu_open", "gpu_forward", "gpu_session_forward", "gpu_session_rewind",
                                                 "gpu_set_replay", "gpu_host_logits", "gpu_describe", "gpu_close",
                                                 "gpu_count", "gpu_matmul"};
    void **slots[N_ENTRIES] = {(void **)&a->open, (void **)&a->forward, (void **)&a->session_forward,
                               (void **)&a->session_rewind, (void **)&a->set_replay, (void **)&a->host_logits,
                               (void **)&a->describe, (void **)&a->close, (void **)&a->count, (void **)&a->matmul};
    mf_module_fn fns[N_ENTRIES];
    for (int i = 0; i < N_ENTRIES; i++) {
        snprintf(names[i], sizeof names[i], "mf_%s_%s", backend_names[b], entry[i]);
        fns[i] = (mf_module_fn){names[i], slots[i]};
    }
    void *h;
    if (mf_module_load(&h, file, fns, N_ENTRIES, err))
        return mf_fail_wrap(err, "cannot load the %s backend", backend_names[b]);
    loaded[b] = true;
    *out = a;
    return MF_OK;
}

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

static int parse_device(const char *device, backend *b, int *index, mf_error *err);

int mf_device_check(const char *device, mf_error *err) {
    if (!strcmp(device, "cpu")) return MF_OK;
    backend b;
    int index;
    const int rc = parse_device(device, &b, &index, err);
    return rc == MF_EUNSUPPORTED ? MF_OK : rc;   /* well formed; whether this build has the backend is said later */
}

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

int mf_gpu_open(mf_gpu **out, const char *device, mf_model *m, const mf_precision *prec, const mf_numerics *num,
                int max_tokens, int cache_tokens, mf_error *err) {
    *out = NULL;
    backend b = BACKEND_CUDA;
    int index = 0, rc;
    const backend_api *api;
    if ((rc = parse_device(device, &b, &index, err)) || (rc = load_backend(b, &api, err))) return rc;
    void *impl = NULL;
    if ((rc = api->open(&impl, index, m, prec, num, max_tokens, cache_tokens, err))) return rc;
    mf_gpu *g = mf_xmalloc(sizeof *g);
    g->api = api;
    g->impl = impl;
    *out = g;
    return MF_OK;
}

int mf_gpu_matmul(const char *device, const mf_numerics *num, mf_dtype in, mf_dtype out, const mf_mat *w, int experts,
                  const double *a, int M, const int *offsets, double *c, mf_error *err) {
    backend b = BACKEND_CUDA;
    int index = 0, rc;
    const backend_api *api;
    if ((rc = parse_device(device, &b, &index, err)) || (rc = load_backend(b, &api, err))) return rc;
    return api->matmul(index, num, in, out, w, experts, a, M, offsets, c, err);
}

int mf_gpu_forward(mf_gpu *g, const int32_t *tokens, int T, unsigned capture, mf_seq_result *r, mf_error *err) {
    return g->api->forward(g->impl, tokens, T, capture, r, err);
}

int mf_gpu_session_forward(mf_gpu *g, const int32_t *tokens, int n, unsigned capture, mf_seq_result *r, mf_error *err) {
    return g->api->session_forward(g->impl, tokens, n, capture, r, err);
}

int mf_gpu_session_rewind(mf_gpu *g, int pos, mf_error *err) { return g->api->session_rewind(g->impl, pos, err); }

void mf_gpu_set_replay(mf_gpu *g, const mf_replay *rp) { g->api->set_replay(g->impl, rp); }

const void *mf_gpu_host_logits(const mf_gpu *g, mf_dtype *dtype) { return g->api->host_logits(g->impl, dtype); }

const char *mf_gpu_describe(const mf_gpu *g) { return g->api->describe(g->impl); }

void mf_gpu_close(mf_gpu *g) {
    if (!g) return;
    g->api->close(g->impl);
    free(g);
}

int mf_gpu_count(const char *device, int *count, mf_error *err) {
    *count = 0;
    backend b = BACKEND_CUDA;
    int index = 0;
    const backend_api *api = NULL;
    int rc = parse_device(device, &b, &index, err);
    if (!rc) rc = load_backend(b, &api, err);
    return rc ? rc : api->count(count, err);
}

int mf_device_for_rank(const char *device, int rank, int count, char *out, size_t cap, mf_error *err) {
    int rc = mf_device_check(device, err);
    if (rc) return rc;
    const char *colon = strchr(device, ':');
    /* the CPU, and a GPU named with its index, are every rank's own choice */
    if (!mf_device_is_gpu(device) || colon) {
        if (strlen(device) >= cap) return mf_fail(err, MF_EINVAL, "device \"%s\": name too long", device);
        snprintf(out, cap, "%s", device);
        return MF_OK;
    }
    if (count < 1) return mf_fail(err, MF_EIO, "%s: no GPU to give rank %d", device, rank);
    if (rank < 0) return mf_fail(err, MF_EINVAL, "rank %d: not a rank", rank);
    if ((size_t)snprintf(out, cap, "%s:%d", device, rank % count) >= cap)
        return mf_fail(err, MF_EINVAL, "device \"%s\": name too long", device);
    return MF_OK;
}
