/* Safetensors: mmap reader with full header validation, and a writer.
 * Format: u64 little-endian header length N, N bytes of JSON, then data.
 * The JSON maps names to {"dtype", "shape", "data_offsets": [begin, end]}
 * (offsets relative to the data region), plus an optional "__metadata__"
 * object of strings. */
#include "mf_models.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Headers larger than this are refused: real checkpoints stay far below. */
#define MAX_HEADER_BYTES (100u << 20)

static int cmp_tensor_name(const void *a, const void *b) {
    return strcmp(((const mf_st_tensor *)a)->name, ((const mf_st_tensor *)b)->name);
}

typedef struct { size_t begin, end; const char *name; } range;

static int cmp_range(const void *a, const void *b) {
    const range *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

int64_t mf_st_numel(const mf_st_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

void mf_st_close(mf_st_file *f) {
    if (!f) return;
    for (size_t i = 0; i < f->count; i++) free(f->tensors[i].name);
    free(f->tensors);
    free(f->metadata_json);
    mf_mmap_close(&f->map);
    free(f->path);
    free(f);
}

static int parse_tensor(mf_st_tensor *t, const char *name, json_t *v, size_t data_size, const char *path,
                        mf_error *err) {
    if (!json_is_object(v)) return mf_fail(err, MF_EFORMAT, "%s: tensor %s: entry is not an object", path, name);
    json_t *dt = json_object_get(v, "dtype"), *sh = json_object_get(v, "shape"),
           *off = json_object_get(v, "data_offsets");
    if (!json_is_string(dt)) return mf_fail(err, MF_EFORMAT, "%s: tensor %s: missing dtype", path, name);
    t->dtype = mf_dtype_from_name(json_string_value(dt));
    if (t->dtype == MF_DTYPE_INVALID)
        return mf_fail(err, MF_EFORMAT, "%s: tensor %s: unknown dtype %s", path, name, json_string_value(dt));
    if (!json_is_array(sh) || json_array_size(sh) > MF_MAX_DIMS)
        return mf_fail(err, MF_EFORMAT, "%s: tensor %s: shape must be an array of at most %d integers", path, name,
                       MF_MAX_DIMS);
    t->ndim = (int)json_array_size(sh);
    uint64_t numel = 1;
    for (int i = 0; i < t->ndim; i++) {
        json_t *d = json_array_get(sh, (size_t)i);
        if (!json_is_integer(d) || json_integer_value(d) < 0)
            return mf_fail(err, MF_EFORMAT, "%s: tensor %s: shape entry %d is not a non-negative integer", path,
                           name, i);
        t->shape[i] = json_integer_value(d);
        if (t->shape[i] && numel > UINT64_MAX / (uint64_t)t->shape[i])
            return mf_fail(err, MF_EFORMAT, "%s: tensor %s: shape overflows", path, name);
        numel *= (uint64_t)t->shape[i];
    }
    if (!json_is_array(off) || json_array_size(off) != 2 || !json_is_integer(json_array_get(off, 0)) ||
        !json_is_integer(json_array_get(off, 1)))
        return mf_fail(err, MF_EFORMAT, "%s: tensor %s: data_offsets must be [begin, end]", path, name);
    json_int_t b = json_integer_value(json_array_get(off, 0)), e = json_integer_value(json_array_get(off, 1));
    if (b < 0 || e < b || (uint64_t)e > data_size)
        return mf_fail(err, MF_EFORMAT,
                       "%s: tensor %s: data_offsets [%lld, %lld] outside the %zu-byte data region (truncated file?)",
                       path, name, (long long)b, (long long)e, data_size);
    size_t esz = mf_dtype_size(t->dtype);
    if (numel > UINT64_MAX / esz || numel * esz != (uint64_t)(e - b))
        return mf_fail(err, MF_EFORMAT, "%s: tensor %s: %lld bytes of data for %llu elements of %s", path, name,
                       (long long)(e - b), (unsigned long long)numel, mf_dtype_name(t->dtype));
    t->nbytes = (size_t)(e - b);
    t->data = NULL;   /* set by the caller, which knows the data region */
    return MF_OK;
}

/* Reads the header with pread (nothing mapped): the caller maps the file
 * afterwards, or never (mf_st_open_header). A FIFO or device is refused
 * before it can block. */
static int st_open(mf_st_file **out, const char *path, bool map, mf_error *err) {
    *out = NULL;
    mf_st_file *f = mf_xcalloc(1, sizeof *f);
    f->path = mf_xstrdup(path);
    int rc = MF_OK;
    json_t *root = NULL;
    range *ranges = NULL;
    char *hbuf = NULL;
    struct stat st;
    int fd = mf_open_regular(path, &st, err);
    if (fd < 0) {
        rc = fd;
        goto fail;
    }
    snprintf(f->identity, sizeof f->identity, "%llu:%llu:%lld:%lld.%09ld:%lld.%09ld", (unsigned long long)st.st_dev,
             (unsigned long long)st.st_ino, (long long)st.st_size, (long long)st.st_mtim.tv_sec, st.st_mtim.tv_nsec,
             (long long)st.st_ctim.tv_sec, st.st_ctim.tv_nsec);
    const size_t size = (size_t)st.st_size;
    uint8_t lenbuf[8];
    if (size < 8 || pread(fd, lenbuf, 8, 0) != 8) {
        rc = mf_fail(err, MF_EFORMAT, "%s: not a safetensors file (%zu bytes, shorter than the 8-byte header length)",
                     path, size);
        goto fail;
    }
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | lenbuf[i];
    if (hlen > size - 8) {
        rc = mf_fail(err, MF_EFORMAT, "%s: header length %llu runs past the end of the %zu-byte file", path,
                     (unsigned long long)hlen, size);
        goto fail;
    }
    if (hlen > MAX_HEADER_BYTES || hlen < 2) {
        rc = mf_fail(err, MF_EFORMAT, "%s: implausible header length %llu", path, (unsigned long long)hlen);
        goto fail;
    }
    hbuf = mf_xmalloc((size_t)hlen);
    size_t got = 0;
    while (got < hlen) {
        const ssize_t r = pread(fd, hbuf + got, (size_t)hlen - got, (off_t)(8 + got));
        if (r <= 0) {
            rc = mf_fail(err, MF_EIO, "%s: reading the header failed: %s", path, r < 0 ? strerror(errno) : "short file");
            goto fail;
        }
        got += (size_t)r;
    }
    const uint8_t *p = (const uint8_t *)hbuf - 8;   /* p[8] is the header's first byte */
    if (p[8] != '{') {
        rc = mf_fail(err, MF_EFORMAT, "%s: header is not a JSON object", path);
        goto fail;
    }
    json_error_t jerr;
    /* Trailing spaces pad the header to alignment; jansson accepts them. */
    root = json_loadb(hbuf, (size_t)hlen, JSON_REJECT_DUPLICATES, &jerr);
    if (!root || !json_is_object(root)) {
        rc = mf_fail(err, MF_EFORMAT, "%s: header is not valid JSON: %s", path, root ? "not an object" : jerr.text);
        goto fail;
    }
    const size_t data_at = 8 + (size_t)hlen;
    size_t data_size = size - data_at;
    size_t n = json_object_size(root);
    f->tensors = mf_xcalloc(n, sizeof *f->tensors);
    ranges = mf_xcalloc(n, sizeof *ranges);
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        if (strcmp(key, "__metadata__") == 0) {
            if (!json_is_object(val)) {
                rc = mf_fail(err, MF_EFORMAT, "%s: __metadata__ is not an object", path);
                goto fail;
            }
            const char *mk;
            json_t *mv;
            json_object_foreach(val, mk, mv) {
                if (!json_is_string(mv)) {
                    rc = mf_fail(err, MF_EFORMAT, "%s: __metadata__ value %s is not a string", path, mk);
                    goto fail;
                }
            }
            f->metadata_json = json_dumps(val, JSON_COMPACT | JSON_SORT_KEYS);
            continue;
        }
        mf_st_tensor *t = &f->tensors[f->count];
        if ((rc = parse_tensor(t, key, val, data_size, path, err))) goto fail;
        json_t *off = json_object_get(val, "data_offsets");
        size_t b = (size_t)json_integer_value(json_array_get(off, 0));
        t->offset = data_at + b;
        t->name = mf_xstrdup(key);
        ranges[f->count] = (range){b, b + t->nbytes, t->name};
        f->count++;
    }
    /* The data region must be tiled exactly: no gaps, no overlaps, nothing after. */
    qsort(ranges, f->count, sizeof *ranges, cmp_range);
    size_t at = 0;
    for (size_t i = 0; i < f->count; i++) {
        if (ranges[i].begin != at) {
            rc = mf_fail(err, MF_EFORMAT, "%s: tensor %s: data starts at byte %zu, expected %zu (%s)", path,
                         ranges[i].name, ranges[i].begin, at, ranges[i].begin < at ? "overlap" : "gap");
            goto fail;
        }
        at = ranges[i].end;
    }
    if (at != data_size) {
        rc = mf_fail(err, MF_EFORMAT, "%s: %zu bytes of data after the last tensor", path, data_size - at);
        goto fail;
    }
    qsort(f->tensors, f->count, sizeof *f->tensors, cmp_tensor_name);
    if (map) {
        if ((rc = mf_mmap_open(&f->map, path, err))) goto fail;
        if (f->map.size != size) {
            rc = mf_fail(err, MF_EIO, "%s: the file changed size while it was opened", path);
            goto fail;
        }
        for (size_t i = 0; i < f->count; i++) f->tensors[i].data = f->map.data + f->tensors[i].offset;
    } else {
        f->map.size = size;
    }
    free(hbuf);
    free(ranges);
    json_decref(root);
    close(fd);
    *out = f;
    return MF_OK;
fail:
    free(hbuf);
    free(ranges);
    json_decref(root);
    if (fd >= 0) close(fd);
    mf_st_close(f);
    return rc;
}

int mf_st_open(mf_st_file **out, const char *path, mf_error *err) { return st_open(out, path, true, err); }

int mf_st_open_header(mf_st_file **out, const char *path, mf_error *err) { return st_open(out, path, false, err); }

const mf_st_tensor *mf_st_find(const mf_st_file *f, const char *name) {
    mf_st_tensor key = {.name = (char *)name};
    return bsearch(&key, f->tensors, f->count, sizeof key, cmp_tensor_name);
}

/* ---- writer ------------------------------------------------------------ */

typedef struct wtensor {
    char *name;
    mf_dtype dtype;
    int ndim;
    int64_t shape[MF_MAX_DIMS];
    uint8_t *data;          /* or, for a generated tensor, NULL and: */
    mf_st_fill_fn fill;
    uint8_t ud[64];
    size_t nbytes;
} wtensor;

struct mf_st_writer {
    wtensor *t;
    size_t n, cap;
    json_t *meta;
    size_t bytes;
};

mf_st_writer *mf_st_writer_new(void) {
    mf_st_writer *w = mf_xcalloc(1, sizeof *w);
    return w;
}

void mf_st_writer_free(mf_st_writer *w) {
    if (!w) return;
    for (size_t i = 0; i < w->n; i++) {
        free(w->t[i].name);
        free(w->t[i].data);
    }
    free(w->t);
    json_decref(w->meta);
    free(w);
}

static wtensor *add_entry(mf_st_writer *w, const char *name, mf_dtype dtype, int ndim, const int64_t *shape) {
    if (w->n == w->cap) {
        w->cap = w->cap ? 2 * w->cap : 16;
        w->t = mf_xrealloc(w->t, w->cap * sizeof *w->t);
    }
    wtensor *t = &w->t[w->n++];
    memset(t, 0, sizeof *t);
    t->name = mf_xstrdup(name);
    t->dtype = dtype;
    t->ndim = ndim;
    size_t numel = 1;
    for (int i = 0; i < ndim; i++) {
        t->shape[i] = shape[i];
        numel *= (size_t)shape[i];
    }
    t->nbytes = numel * mf_dtype_size(dtype);
    w->bytes += t->nbytes;
    return t;
}

void mf_st_writer_add_generated(mf_st_writer *w, const char *name, mf_dtype dtype, int ndim, const int64_t *shape,
                                mf_st_fill_fn fill, const void *ud, size_t ud_size) {
    wtensor *t = add_entry(w, name, dtype, ndim, shape);
    t->fill = fill;
    memcpy(t->ud, ud, ud_size < sizeof t->ud ? ud_size : sizeof t->ud);
}

void mf_st_writer_add(mf_st_writer *w, const char *name, mf_dtype dtype, int ndim, const int64_t *shape,
                      const void *data) {
    if (w->n == w->cap) {
        w->cap = w->cap ? 2 * w->cap : 16;
        w->t = mf_xrealloc(w->t, w->cap * sizeof *w->t);
    }
    wtensor *t = &w->t[w->n++];
    memset(t, 0, sizeof *t);
    t->name = mf_xstrdup(name);
    t->dtype = dtype;
    t->ndim = ndim;
    size_t numel = 1;
    for (int i = 0; i < ndim; i++) {
        t->shape[i] = shape[i];
        numel *= (size_t)shape[i];
    }
    t->nbytes = numel * mf_dtype_size(dtype);
    t->data = mf_xmalloc(t->nbytes);
    if (t->nbytes) memcpy(t->data, data, t->nbytes);
    w->bytes += t->nbytes;
}

void mf_st_writer_meta(mf_st_writer *w, const char *key, const char *value) {
    if (!w->meta) w->meta = json_object();
    json_object_set_new(w->meta, key, json_string(value));
}

size_t mf_st_writer_bytes(const mf_st_writer *w) { return w->bytes; }

int mf_st_writer_write(mf_st_writer *w, const char *path, mf_error *err) {
    json_t *root = json_object();
    if (w->meta) json_object_set(root, "__metadata__", w->meta);
    size_t off = 0;
    for (size_t i = 0; i < w->n; i++) {
        wtensor *t = &w->t[i];
        json_t *shape = json_array();
        for (int d = 0; d < t->ndim; d++) json_array_append_new(shape, json_integer(t->shape[d]));
        json_t *offs = json_array();
        json_array_append_new(offs, json_integer((json_int_t)off));
        json_array_append_new(offs, json_integer((json_int_t)(off + t->nbytes)));
        json_t *e = json_object();
        json_object_set_new(e, "dtype", json_string(mf_dtype_name(t->dtype)));
        json_object_set_new(e, "shape", shape);
        json_object_set_new(e, "data_offsets", offs);
        json_object_set_new(root, t->name, e);
        off += t->nbytes;
    }
    char *hdr = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    if (!hdr) return mf_fail(err, MF_ENOMEM, "%s: cannot encode safetensors header", path);
    size_t hlen = strlen(hdr), padded = (hlen + 7) & ~(size_t)7;   /* data starts 8-byte aligned */
    uint8_t lenbuf[8];
    for (int i = 0; i < 8; i++) lenbuf[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    mf_atomic_file af;
    int rc = mf_atomic_open(&af, path, err);
    if (!rc) rc = mf_atomic_write(&af, lenbuf, 8, err);
    if (!rc) rc = mf_atomic_write(&af, hdr, hlen, err);
    if (!rc) rc = mf_atomic_write(&af, "        ", padded - hlen, err);
    for (size_t i = 0; !rc && i < w->n; i++) {
        wtensor *t = &w->t[i];
        if (!t->fill) {
            rc = mf_atomic_write(&af, t->data, t->nbytes, err);
            continue;
        }
        uint8_t *buf = mf_xmalloc(t->nbytes ? t->nbytes : 1);   /* one generated tensor in memory at a time */
        t->fill(t->ud, buf, t->nbytes);
        rc = mf_atomic_write(&af, buf, t->nbytes, err);
        free(buf);
    }
    free(hdr);
    if (!rc) rc = mf_atomic_commit(&af, err);
    return rc;
}
