/* Files: mmap for reading, atomic replacement for writing. */
#include "mf_core.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <lzma.h>

/* Opens path for reading if it is a regular file. O_NONBLOCK: opening a FIFO (or a device) must not wait for a
 * writer, and it is refused as soon as fstat says what it is. */
int mf_open_regular(const char *path, struct stat *st, mf_error *err) {
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) return mf_fail(err, MF_EIO, "%s: cannot open: %s", path, strerror(errno));
    if (fstat(fd, st) != 0) {
        int e = errno;
        close(fd);
        return mf_fail(err, MF_EIO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(st->st_mode)) {
        close(fd);
        return mf_fail(err, MF_EIO, "%s: not a regular file (%s)", path,
                       S_ISFIFO(st->st_mode) ? "a FIFO" : S_ISDIR(st->st_mode) ? "a directory" : S_ISSOCK(st->st_mode) ? "a socket"
                       : "a device");
    }
    /* reads of a regular file do not block anyway; the flag is cleared so that nothing below sees EAGAIN */
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0) (void)fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    return fd;
}

int mf_mmap_open(mf_mmap *m, const char *path, mf_error *err) {
    m->data = NULL;
    m->size = 0;
    struct stat st;
    int fd = mf_open_regular(path, &st, err);
    if (fd < 0) return fd;
    if (st.st_size == 0) {   /* mmap of length 0 fails; an empty file is simply empty */
        close(fd);
        return MF_OK;
    }
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (p == MAP_FAILED) return mf_fail(err, MF_EIO, "%s: cannot map: %s", path, strerror(e));
    m->data = p;
    m->size = (size_t)st.st_size;
    return MF_OK;
}

void mf_mmap_close(mf_mmap *m) {
    if (m->data) munmap((void *)m->data, m->size);
    m->data = NULL;
    m->size = 0;
}

int mf_read_file(const char *path, char **out, size_t *len, mf_error *err) {
    *out = NULL;
    struct stat st;
    int fd = mf_open_regular(path, &st, err);
    if (fd < 0) return fd;
    FILE *fp = fdopen(fd, "rb");
    if (!fp) {
        int e = errno;
        close(fd);
        return mf_fail(err, MF_EIO, "%s: cannot open: %s", path, strerror(e));
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = mf_xmalloc(cap);
    for (;;) {
        if (n + 1 >= cap) buf = mf_xrealloc(buf, cap *= 2);
        size_t got = fread(buf + n, 1, cap - n - 1, fp);
        n += got;
        if (got == 0) break;
    }
    int bad = ferror(fp);
    fclose(fp);
    if (bad) {
        free(buf);
        return mf_fail(err, MF_EIO, "%s: read error", path);
    }
    buf[n] = 0;
    static const uint8_t xz_magic[6] = {0xfd, '7', 'z', 'X', 'Z', 0};
    if (n >= 6 && memcmp(buf, xz_magic, 6) == 0) {   /* an .xz file: hand back its content */
        char *plain;
        size_t plen;
        int rc = mf_xz_decode(buf, n, &plain, &plen);
        free(buf);
        if (rc) return mf_fail(err, MF_EFORMAT, "%s: damaged xz data", path);
        buf = plain;
        n = plen;
    }
    *out = buf;
    if (len) *len = n;
    return MF_OK;
}

int mf_xz_decode(const void *in, size_t n, char **out, size_t *out_len) {
    lzma_stream st = LZMA_STREAM_INIT;
    if (lzma_stream_decoder(&st, UINT64_MAX, LZMA_CONCATENATED) != LZMA_OK) return MF_EFORMAT;
    size_t cap = n * 4 + 4096, len = 0;
    char *buf = mf_xmalloc(cap);
    st.next_in = in;
    st.avail_in = n;
    lzma_ret r;
    do {
        if (cap - len < 4096) {
            cap *= 2;
            buf = mf_xrealloc(buf, cap);
        }
        st.next_out = (uint8_t *)buf + len;
        st.avail_out = cap - len - 1;
        r = lzma_code(&st, LZMA_FINISH);
        len = cap - 1 - st.avail_out;
    } while (r == LZMA_OK);
    lzma_end(&st);
    if (r != LZMA_STREAM_END) {
        free(buf);
        return MF_EFORMAT;
    }
    buf[len] = 0;
    *out = buf;
    *out_len = len;
    return MF_OK;
}

static void fsync_parent_dir(const char *path) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s", path);
    int fd = open(dirname(tmp), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        fsync(fd);   /* best effort: some file systems refuse fsync on directories */
        close(fd);
    }
}

int mf_atomic_open(mf_atomic_file *af, const char *path, mf_error *err) {
    memset(af, 0, sizeof *af);
    if (strlen(path) >= sizeof af->path) return mf_fail(err, MF_EINVAL, "%s: path too long", path);
    snprintf(af->path, sizeof af->path, "%s", path);
    snprintf(af->tmp, sizeof af->tmp, "%s.tmp.%ld", path, (long)getpid());
    af->fp = fopen(af->tmp, "wb");
    if (!af->fp) return mf_fail(err, MF_EIO, "%s: cannot write: %s", path, strerror(errno));
    return MF_OK;
}

int mf_atomic_write(mf_atomic_file *af, const void *data, size_t len, mf_error *err) {
    if (len && fwrite(data, 1, len, af->fp) != len) {
        int e = errno;
        mf_atomic_abort(af);
        return mf_fail(err, MF_EIO, "%s: write failed: %s", af->path, strerror(e));
    }
    return MF_OK;
}

int mf_atomic_commit(mf_atomic_file *af, mf_error *err) {
    if (fflush(af->fp) != 0 || fsync(fileno(af->fp)) != 0) {
        int e = errno;
        mf_atomic_abort(af);
        return mf_fail(err, MF_EIO, "%s: flush failed: %s", af->path, strerror(e));
    }
    if (fclose(af->fp) != 0) {
        int e = errno;
        af->fp = NULL;
        unlink(af->tmp);
        return mf_fail(err, MF_EIO, "%s: close failed: %s", af->path, strerror(e));
    }
    af->fp = NULL;
    if (rename(af->tmp, af->path) != 0) {
        int e = errno;
        unlink(af->tmp);
        return mf_fail(err, MF_EIO, "%s: cannot rename into place: %s", af->path, strerror(e));
    }
    fsync_parent_dir(af->path);
    return MF_OK;
}

void mf_atomic_abort(mf_atomic_file *af) {
    if (af->fp) fclose(af->fp);
    af->fp = NULL;
    if (af->tmp[0]) unlink(af->tmp);
}

int mf_write_file_atomic(const char *path, const void *data, size_t len, mf_error *err) {
    mf_atomic_file af;
    int rc = mf_atomic_open(&af, path, err);
    if (rc) return rc;
    if ((rc = mf_atomic_write(&af, data, len, err))) return rc;
    return mf_atomic_commit(&af, err);
}

int mf_mkdir_p(const char *path, mf_error *err) {
    char tmp[4096];
    if (strlen(path) >= sizeof tmp) return mf_fail(err, MF_EINVAL, "%s: path too long", path);
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(tmp, 0777) != 0 && errno != EEXIST)
            return mf_fail(err, MF_EIO, "%s: cannot create directory: %s", tmp, strerror(errno));
        *p = '/';
    }
    if (mkdir(tmp, 0777) != 0 && errno != EEXIST)
        return mf_fail(err, MF_EIO, "%s: cannot create directory: %s", tmp, strerror(errno));
    if (!mf_is_dir(tmp)) return mf_fail(err, MF_EIO, "%s: exists and is not a directory", tmp);
    return MF_OK;
}

bool mf_path_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

bool mf_is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

bool mf_path_join(char *dst, size_t cap, const char *dir, const char *name) {
    int n = snprintf(dst, cap, "%s/%s", dir, name);
    return n >= 0 && (size_t)n < cap;
}
