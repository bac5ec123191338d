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

/* A sharded checkpoint: each tensor is taken from the file the index names.
 * A tensor present in two shards, or in a shard the index does not name for
 * it, or in no index entry, is refused with the names. */
static void write_shard(const char *dir, const char *file, const char *tensor, float value, const char *also) {
    mf_st_writer *w = mf_st_writer_new();
    const int64_t shape[1] = {2};
    const float v[2] = {value, value};
    mf_st_writer_add(w, tensor, MF_F32, 1, shape, v);
    if (also) mf_st_writer_add(w, also, MF_F32, 1, shape, v);
    char path[700];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    mf_error err = {0};
    cr_assert_eq(mf_st_writer_write(w, path, &err), MF_OK, "%s", err.msg);
    mf_st_writer_free(w);
}

static int open_sharded(const char *index, bool x_in_a, char *msg, size_t n) {
    const char *dir = temp_dir();
    char sub[600];
    static int k;
    snprintf(sub, sizeof sub, "%s/ck%d", dir, k++);
    mkdir(sub, 0755);
    write_shard(sub, "a.safetensors", "y", 1.0f, x_in_a ? "x" : NULL);
    write_shard(sub, "b.safetensors", "x", 2.0f, NULL);
    write_text(sub, "model.safetensors.index.json", index);
    mf_checkpoint *c = NULL;
    mf_error err = {0};
    const int rc = mf_checkpoint_open(&c, sub, &err);
    snprintf(msg, n, "%s", err.msg);
    if (!rc) {
        const mf_st_tensor *t = mf_checkpoint_find(c, "x");
        cr_assert(t);
        snprintf(msg, n, "%g", mf_load_as_f64(t->data, t->dtype, 0));
        mf_checkpoint_close(c);
    }
    return rc;
}

Test(checkpoint, a_tensor_comes_from_the_file_the_index_names) {
    char msg[1100];
    const char *index = "{\"weight_map\": {\"x\": \"b.safetensors\", \"y\": \"a.safetensors\"}}";
    /* x in b alone: b's value */
    cr_assert_eq(open_sharded(index, false, msg, sizeof msg), MF_OK, "%s", msg);
    cr_assert_str_eq(msg, "2");
    /* x in both shards (a's copy first in file order), the index names b: refused, both files named */
    cr_assert_neq(open_sharded(index, true, msg, sizeof msg), MF_OK, "%s", msg);
    cr_assert(strstr(msg, "tensor x is in a.safetensors and b.safetensors; the index names b.safetensors"), "%s", msg);
    /* x in a, and in no entry of the index */
    cr_assert_neq(open_sharded("{\"weight_map\": {\"y\": \"a.safetensors\"}}", true, msg, sizeof msg), MF_OK, "%s", msg);
    cr_assert(strstr(msg, "a.safetensors: tensor x is not in model.safetensors.index.json"), "%s", msg);
}
