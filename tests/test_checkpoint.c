/* The weights digest: the same with and without its cache, and never a stale
 * one. The cache is keyed by the file's identity (device, inode, size,
 * modification and change times); a checkpoint rewritten in place, even to
 * the same size, must be hashed again. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "testutil.h"

static void digest_of(const char *dir, char out[33]) {
    mf_checkpoint *c;
    mf_error err = {0};
    cr_assert_eq(mf_checkpoint_open(&c, dir, &err), MF_OK, "%s", err.msg);
    memcpy(out, c->weights_digest, 33);
    mf_checkpoint_close(c);
}

Test(checkpoint, digest_cache_gives_the_digest_and_is_never_stale) {
    const char *model = copy_fixture_dir("hf/olmoe");
    char cache[600];
    snprintf(cache, sizeof cache, "%s/cache", temp_dir());
    setenv("MOEFLIP_CACHE_DIR", cache, 1);
    char uncached[33], first[33], second[33], changed[33];
    setenv("MOEFLIP_DIGEST_CACHE", "0", 1);
    digest_of(model, uncached);
    unsetenv("MOEFLIP_DIGEST_CACHE");
    digest_of(model, first);    /* hashed, then stored */
    char path[700];
    snprintf(path, sizeof path, "%s/weights-digests", cache);
    struct stat st;
    cr_assert_eq(stat(path, &st), 0, "the cache file was written");
    digest_of(model, second);   /* from the cache */
    cr_assert_str_eq(first, uncached);
    cr_assert_str_eq(second, uncached);
    /* the same mapping open, deferred: the digest is there at once */
    mf_checkpoint *c;
    mf_error err = {0};
    cr_assert_eq(mf_checkpoint_open_deferred(&c, model, &err), MF_OK, "%s", err.msg);
    cr_assert_str_eq(c->weights_digest, uncached);
    mf_checkpoint_close(c);
    /* one byte of the last tensor changed in place, same size */
    snprintf(path, sizeof path, "%s/model.safetensors", model);
    FILE *fp = fopen(path, "r+b");
    cr_assert(fp);
    cr_assert_eq(fseek(fp, -1, SEEK_END), 0);
    const int b = fgetc(fp);
    cr_assert_eq(fseek(fp, -1, SEEK_END), 0);
    fputc(b ^ 0x01, fp);
    fclose(fp);
    digest_of(model, changed);
    cr_assert_str_neq(changed, uncached, "a rewritten checkpoint must not get its old digest from the cache");
    setenv("MOEFLIP_DIGEST_CACHE", "0", 1);
    digest_of(model, uncached);
    unsetenv("MOEFLIP_DIGEST_CACHE");
    cr_assert_str_eq(changed, uncached);
    unsetenv("MOEFLIP_CACHE_DIR");
}
