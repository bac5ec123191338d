/* Content digests: XXH3-128, printed as 32 lower-case hex digits. */
#include "mf_core.h"

#include <stdlib.h>
#include <xxhash.h>

/* Streaming digests run on xxhash's header code built for AVX2 where the CPU
 * has it (digest_avx2.c), else on the library: the same XXH3-128. */
#if defined(MF_HAVE_XXH3_AVX2)
void *mf_xxh3_avx2_new(void);
void mf_xxh3_avx2_update(void *s, const void *data, size_t len);
void mf_xxh3_avx2_final(void *s, unsigned long long *high, unsigned long long *low);
static bool use_avx2(void) {
    static int cached = -1;
    if (cached < 0) {
        __builtin_cpu_init();
        cached = __builtin_cpu_supports("avx2") && !getenv("MOEFLIP_DIGEST_PORTABLE");
    }
    return cached;
}
#else
static bool use_avx2(void) { return false; }
#endif

struct mf_digest_state {
    XXH3_state_t *st;   /* the library's, or */
    void *avx2;
};

mf_digest_state *mf_digest_new(void) {
    mf_digest_state *s = mf_xcalloc(1, sizeof *s);
#if defined(MF_HAVE_XXH3_AVX2)
    if (use_avx2()) {
        if (!(s->avx2 = mf_xxh3_avx2_new())) abort();
        return s;
    }
#endif
    s->st = XXH3_createState();
    if (!s->st) abort();
    XXH3_128bits_reset(s->st);
    return s;
}

void mf_digest_update(mf_digest_state *s, const void *data, size_t len) {
#if defined(MF_HAVE_XXH3_AVX2)
    if (s->avx2) {
        mf_xxh3_avx2_update(s->avx2, data, len);
        return;
    }
#endif
    XXH3_128bits_update(s->st, data, len);
}

static void to_hex(XXH128_hash_t h, char hex[33]) {
    snprintf(hex, 33, "%016llx%016llx", (unsigned long long)h.high64, (unsigned long long)h.low64);
}

void mf_digest_final(mf_digest_state *s, char hex[33]) {
#if defined(MF_HAVE_XXH3_AVX2)
    if (s->avx2) {
        unsigned long long hi, lo;
        mf_xxh3_avx2_final(s->avx2, &hi, &lo);
        snprintf(hex, 33, "%016llx%016llx", hi, lo);
        free(s);
        return;
    }
#endif
    (void)use_avx2;
    to_hex(XXH3_128bits_digest(s->st), hex);
    XXH3_freeState(s->st);
    free(s);
}

void mf_digest_buffer(const void *data, size_t len, char hex[33]) { to_hex(XXH3_128bits(data, len), hex); }

int mf_digest_file(const char *path, char hex[33], mf_error *err) {
    mf_mmap m;
    int rc = mf_mmap_open(&m, path, err);
    if (rc) return rc;
    mf_digest_buffer(m.data, m.size, hex);
    mf_mmap_close(&m);
    return MF_OK;
}
