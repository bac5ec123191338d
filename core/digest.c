/* Content digests: XXH3-128, printed as 32 lower-case hex digits. */
#include "mf_core.h"

#include <stdlib.h>
#include <xxhash.h>

struct mf_digest_state { XXH3_state_t *st; };

mf_digest_state *mf_digest_new(void) {
    mf_digest_state *s = mf_xmalloc(sizeof *s);
    s->st = XXH3_createState();
    if (!s->st) abort();
    XXH3_128bits_reset(s->st);
    return s;
}

void mf_digest_update(mf_digest_state *s, const void *data, size_t len) { XXH3_128bits_update(s->st, data, len); }

static void to_hex(XXH128_hash_t h, char hex[33]) {
    snprintf(hex, 33, "%016llx%016llx", (unsigned long long)h.high64, (unsigned long long)h.low64);
}

void mf_digest_final(mf_digest_state *s, char hex[33]) {
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
