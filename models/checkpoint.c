/* A Hub checkpoint directory: one model.safetensors, or shards listed in
 * model.safetensors.index.json ("weight_map": tensor name -> file name). */
#include "mf_models.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <omp.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void mf_checkpoint_close(mf_checkpoint *c) {
    if (!c) return;
    for (size_t i = 0; i < c->nfiles; i++) mf_st_close(c->files[i]);
    free(c->files);
    free(c->entries);
    free(c->dir);
    free(c);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int cmp_entry(const void *a, const void *b) {
    return strcmp(((const mf_ckpt_entry *)a)->name, ((const mf_ckpt_entry *)b)->name);
}

static bool valid_shard_name(const char *s) {
    return s[0] && !strchr(s, '/') && strcmp(s, "..") != 0 && strcmp(s, ".") != 0;
}

/* XXH3-128 of a whole file, read with pread: the bytes pass through buffers
 * instead of being faulted into the mapping, so hashing a checkpoint adds
 * nothing to the process's resident memory. A second thread reads ahead
 * while this one hashes (13.8 GB: 2.1 s read-then-hash, 1.3 s overlapped, on
 * page-aligned buffers; unaligned ones cost 50% more in the kernel's copy). */
#define DIGEST_CHUNK ((size_t)4 << 20)
#define DIGEST_BUFS 3

static int digest_file(const mf_st_file *f, char hex[33], mf_error *err) {
    int fd = open(f->path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return mf_fail(err, MF_EIO, "%s: cannot open: %s", f->path, strerror(errno));
    posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    uint8_t *buf = aligned_alloc(4096, DIGEST_CHUNK * DIGEST_BUFS);
    if (!buf) {
        close(fd);
        return mf_fail(err, MF_ENOMEM, "%s: out of memory for the read buffers", f->path);
    }
    const size_t size = f->map.size, nchunks = (size + DIGEST_CHUNK - 1) / DIGEST_CHUNK;
    mf_digest_state *d = mf_digest_new();
    atomic_long filled, hashed;   /* chunks read so far; chunks hashed so far */
    atomic_init(&filled, 0);
    atomic_init(&hashed, 0);
    atomic_int failed;
    atomic_init(&failed, 0);
    int read_errno = 0;
#pragma omp parallel num_threads(2)
    {
        const bool reader = omp_get_thread_num() == 1 || omp_get_num_threads() == 1;
        const bool hasher = omp_get_thread_num() == 0;
        size_t next_read = 0, next_hash = 0;
        while ((reader && next_read < nchunks) || (hasher && next_hash < nchunks)) {
            if (atomic_load(&failed)) break;
            bool progressed = false;
            if (reader && next_read < nchunks && (long)next_read - atomic_load(&hashed) < DIGEST_BUFS) {
                uint8_t *dst = buf + (next_read % DIGEST_BUFS) * DIGEST_CHUNK;
                const size_t off = next_read * DIGEST_CHUNK, want = size - off < DIGEST_CHUNK ? size - off : DIGEST_CHUNK;
                size_t got = 0;
                while (got < want) {
                    const ssize_t r = pread(fd, dst + got, want - got, (off_t)(off + got));
                    if (r <= 0) {
                        read_errno = r < 0 ? errno : 0;
                        atomic_store(&failed, 1);
                        break;
                    }
                    got += (size_t)r;
                }
                if (got < want) break;
                atomic_store(&filled, (long)++next_read);
                progressed = true;
            }
            if (hasher && next_hash < nchunks && (long)next_hash < atomic_load(&filled)) {
                const size_t off = next_hash * DIGEST_CHUNK, n = size - off < DIGEST_CHUNK ? size - off : DIGEST_CHUNK;
                mf_digest_update(d, buf + (next_hash % DIGEST_BUFS) * DIGEST_CHUNK, n);
                atomic_store(&hashed, (long)++next_hash);
                progressed = true;
            }
            if (!progressed) sched_yield();
        }
    }
    mf_digest_final(d, hex);
    free(buf);
    close(fd);
    if (atomic_load(&failed))
        return mf_fail(err, MF_EIO, "%s: read failed: %s", f->path,
                       read_errno ? strerror(read_errno) : "the file is shorter than when it was opened");
    return MF_OK;
}

/* ---- the digest cache ---------------------------------------------------- */

static bool cache_path(char *dst, size_t n) {
    const char *v = getenv("MOEFLIP_DIGEST_CACHE");
    if (v && !strcmp(v, "0")) return false;
    const char *dir = getenv("MOEFLIP_CACHE_DIR"), *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    int w;
    if (dir && *dir) w = snprintf(dst, n, "%s/weights-digests", dir);
    else if (xdg && *xdg) w = snprintf(dst, n, "%s/moeflip/weights-digests", xdg);
    else if (home && *home) w = snprintf(dst, n, "%s/.cache/moeflip/weights-digests", home);
    else return false;
    return w > 0 && (size_t)w < n;
}

/* The cached digest of a file with this identity, or false. Lines: "IDENTITY HEX PATH". */
static bool cache_lookup(const char *identity, char hex[33]) {
    char path[4096];
    if (!cache_path(path, sizeof path)) return false;
    FILE *fp = fopen(path, "r");
    if (!fp) return false;
    char line[5000];
    const size_t il = strlen(identity);
    bool found = false;
    while (!found && fgets(line, sizeof line, fp)) {
        if (strncmp(line, identity, il) || line[il] != ' ') continue;
        const char *h = line + il + 1;
        bool ok = strlen(h) >= 33 && h[32] == ' ';
        for (int i = 0; ok && i < 32; i++) ok = (h[i] >= '0' && h[i] <= '9') || (h[i] >= 'a' && h[i] <= 'f');
        if (ok) {
            memcpy(hex, h, 32);
            hex[32] = 0;
            found = true;
        }
    }
    fclose(fp);
    return found;
}

/* Adds the checkpoint's files to the cache (newest first, at most 2000 lines kept); failures are ignored: the
 * cache only saves time. */
static void cache_store(const mf_checkpoint *c, char (*file_hex)[33]) {
    char path[4096];
    if (!cache_path(path, sizeof path)) return;
    char *old = NULL;
    size_t len = 0;
    mf_error ignore = {0};
    if (mf_path_exists(path) && mf_read_file(path, &old, &len, &ignore)) old = NULL;
    mf_buf out = {0};
    mf_buf_reserve(&out, 4096 + (old ? len : 0));
    int lines = 0;
    for (size_t i = 0; i < c->nfiles; i++, lines++)
        mf_buf_printf(&out, "%s %s %s\n", c->files[i]->identity, file_hex[i], c->files[i]->path);
    for (char *line = old, *next; line && *line && lines < 2000; line = next, lines++) {
        next = strchr(line, '\n');
        next = next ? next + 1 : line + strlen(line);
        bool mine = false;
        for (size_t i = 0; i < c->nfiles && !mine; i++) {
            const size_t il = strlen(c->files[i]->identity);
            mine = !strncmp(line, c->files[i]->identity, il) && line[il] == ' ';
        }
        if (mine) continue;
        mf_buf_put(&out, line, (size_t)(next - line));
    }
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = 0;
    if (!mf_mkdir_p(dir, &ignore)) mf_write_file_atomic(path, out.s, out.n, &ignore);
    mf_buf_free(&out);
    free(old);
}

/* The weights digest from the files' own: over (name, digest) in file order */
static void combine(mf_checkpoint *c, char (*file_hex)[33]) {
    mf_digest_state *ds = mf_digest_new();
    for (size_t i = 0; i < c->nfiles; i++) {
        const char *slash = strrchr(c->files[i]->path, '/');
        const char *name = slash ? slash + 1 : c->files[i]->path;
        mf_digest_update(ds, name, strlen(name) + 1);
        mf_digest_update(ds, file_hex[i], 32);
    }
    mf_digest_final(ds, c->weights_digest);
}

/* Whether the cache holds every file's digest; then the weights digest is made from them. */
static bool digest_from_cache(mf_checkpoint *c) {
    char(*hex)[33] = mf_xcalloc(c->nfiles ? c->nfiles : 1, sizeof *hex);
    bool all = c->nfiles > 0;
    for (size_t i = 0; i < c->nfiles && all; i++) all = cache_lookup(c->files[i]->identity, hex[i]);
    if (all) combine(c, hex);
    free(hex);
    return all;
}

void mf_checkpoint_digest_finish(mf_checkpoint *c, char (*file_hex)[33]) {
    cache_store(c, file_hex);
    combine(c, file_hex);
}

int mf_checkpoint_digest(mf_checkpoint *c, mf_error *err) {
    if (c->weights_digest[0] || digest_from_cache(c)) return MF_OK;
    char(*hex)[33] = mf_xcalloc(c->nfiles ? c->nfiles : 1, sizeof *hex);
    int rc = MF_OK;
    for (size_t i = 0; i < c->nfiles && !rc; i++) rc = digest_file(c->files[i], hex[i], err);
    if (!rc) mf_checkpoint_digest_finish(c, hex);
    free(hex);
    return rc;
}

uint64_t mf_checkpoint_bytes(const mf_checkpoint *c) {
    uint64_t n = 0;
    for (size_t i = 0; i < c->nfiles; i++) n += c->files[i]->map.size;
    return n;
}

int mf_checkpoint_open(mf_checkpoint **out, const char *dir, mf_error *err) {
    int rc = mf_checkpoint_open_deferred(out, dir, err);
    if (!rc && (rc = mf_checkpoint_digest(*out, err))) {
        mf_checkpoint_close(*out);
        *out = NULL;
    }
    return rc;
}

static int checkpoint_open(mf_checkpoint **out, const char *dir, bool map, mf_error *err);

int mf_checkpoint_open_deferred(mf_checkpoint **out, const char *dir, mf_error *err) {
    int rc = checkpoint_open(out, dir, true, err);
    if (!rc) digest_from_cache(*out);
    return rc;
}

int mf_checkpoint_open_headers(mf_checkpoint **out, const char *dir, mf_error *err) {
    return checkpoint_open(out, dir, false, err);
}

static int checkpoint_open(mf_checkpoint **out, const char *dir, bool map, mf_error *err) {
    *out = NULL;
    char path[4096];
    mf_checkpoint *c = mf_xcalloc(1, sizeof *c);
    c->dir = mf_xstrdup(dir);
    int rc = MF_OK;
    json_t *root = NULL;
    char **names = NULL;
    size_t nnames = 0;
    if (!mf_path_join(path, sizeof path, dir, "model.safetensors.index.json")) {
        rc = mf_fail(err, MF_EINVAL, "%s: path too long", dir);
        goto done;
    }
    if (mf_path_exists(path)) {
        json_error_t jerr;
        root = json_load_file(path, 0, &jerr);
        json_t *map = root ? json_object_get(root, "weight_map") : NULL;
        if (!root || !json_is_object(map)) {
            rc = mf_fail(err, MF_EFORMAT, "%s: %s", path, root ? "no \"weight_map\" object" : jerr.text);
            goto done;
        }
        names = mf_xcalloc(json_object_size(map) + 1, sizeof *names);
        const char *key;
        json_t *v;
        json_object_foreach(map, key, v) {
            if (!json_is_string(v) || !valid_shard_name(json_string_value(v))) {
                rc = mf_fail(err, MF_EFORMAT, "%s: weight_map entry %s does not name a file in the directory", path, key);
                goto done;
            }
            const char *fn = json_string_value(v);
            bool seen = false;
            for (size_t i = 0; i < nnames && !seen; i++) seen = strcmp(names[i], fn) == 0;
            if (!seen) names[nnames++] = (char *)fn;
        }
        if (nnames == 0) {
            rc = mf_fail(err, MF_EFORMAT, "%s: weight_map is empty", path);
            goto done;
        }
    } else {
        names = mf_xcalloc(1, sizeof *names);
        names[nnames++] = "model.safetensors";
        if (!mf_path_join(path, sizeof path, dir, names[0]) || !mf_path_exists(path)) {
            rc = mf_fail(err, MF_EIO, "%s: no model.safetensors or model.safetensors.index.json", dir);
            goto done;
        }
    }
    qsort(names, nnames, sizeof *names, cmp_str);
    c->files = mf_xcalloc(nnames, sizeof *c->files);
    for (size_t i = 0; i < nnames; i++) {
        mf_path_join(path, sizeof path, dir, names[i]);
        if ((rc = (map ? mf_st_open : mf_st_open_header)(&c->files[c->nfiles], path, err))) break;
        c->nfiles++;
    }
    if (rc) goto done;
    if (root) {   /* every tensor the index names must be in the file it names */
        json_t *map = json_object_get(root, "weight_map");
        const char *key;
        json_t *v;
        json_object_foreach(map, key, v) {
            const char *fn = json_string_value(v);
            const mf_st_file *f = NULL;
            for (size_t i = 0; i < c->nfiles && !f; i++)
                if (strcmp(names[i], fn) == 0) f = c->files[i];
            if (!f || !mf_st_find(f, key)) {
                rc = mf_fail(err, MF_EFORMAT, "%s/%s: tensor %s listed in the index is missing from the file", dir, fn,
                             key);
                goto done;
            }
        }
    }
    /* the entries: every tensor once, where the index puts it */
    size_t total = 0;
    for (size_t i = 0; i < c->nfiles; i++) total += c->files[i]->count;
    c->entries = mf_xcalloc(total ? total : 1, sizeof *c->entries);
    for (size_t i = 0; i < c->nfiles; i++)
        for (size_t t = 0; t < c->files[i]->count; t++) {
            const char *tn = c->files[i]->tensors[t].name;
            if (root) {
                json_t *where = json_object_get(json_object_get(root, "weight_map"), tn);
                if (!where) {
                    rc = mf_fail(err, MF_EFORMAT, "%s/%s: tensor %s is not in model.safetensors.index.json", dir, names[i],
                                 tn);
                    goto done;
                }
                if (strcmp(json_string_value(where), names[i]) != 0) {
                    rc = mf_fail(err, MF_EFORMAT, "%s: tensor %s is in %s and %s; the index names %s", dir, tn, names[i],
                                 json_string_value(where), json_string_value(where));
                    goto done;
                }
            }
            c->entries[c->n_entries++] = (mf_ckpt_entry){tn, i};
        }
    qsort(c->entries, c->n_entries, sizeof *c->entries, cmp_entry);
    for (size_t i = 1; i < c->n_entries; i++)   /* without an index, one file: names are unique within it */
        if (!strcmp(c->entries[i - 1].name, c->entries[i].name)) {
            rc = mf_fail(err, MF_EFORMAT, "%s: tensor %s is in %s and %s", dir, c->entries[i].name,
                         names[c->entries[i - 1].file], names[c->entries[i].file]);
            goto done;
        }
done:
    free(names);
    json_decref(root);
    if (rc) mf_checkpoint_close(c);
    else *out = c;
    return rc;
}

const mf_st_tensor *mf_checkpoint_find(const mf_checkpoint *c, const char *name) {
    const mf_ckpt_entry key = {name, 0};
    const mf_ckpt_entry *e = bsearch(&key, c->entries, c->n_entries, sizeof key, cmp_entry);
    return e ? mf_st_find(c->files[e->file], name) : NULL;
}
