/* An upload: the body of PUT /api/runs/NAME is parsed on the loop thread
 *
 *   moeflip-run 1\n
 *   file <bytes> <name>\n  <bytes raw bytes>      (once per file: manifest.json, part-NNNNN.safetensors)
 *   end\n
 *
 * and its bytes are staged; the pool writes and hashes them into a private
 * directory under ROOT/.tmp, one batch at a time, fsyncs every file at the end, then
 * verifies the whole run (mf_run_open_given: the manifest, every shard's
 * safetensors header, every shard's digest as computed while its bytes were
 * written compared with the manifest, nothing extra) and renames the directory
 * into ROOT/runs in one step. A connection that goes away drops the directory;
 * nothing partial is ever under runs/.
 *
 * The bytes are copied once in user space at most: file bytes that arrive in
 * the connection's large read buffers (UPLOAD_READ) are staged by reference
 * (OP_DATA_REF, the upload keeps the buffer until the pool has written it);
 * only small pieces (headers, a file's short tail) are copied.
 *
 * Most of a large file's bytes do not pass through user space at all: once the
 * socket buffer libuv read is used up inside a file (UPLOAD_SPLICE_MIN or more
 * of it left) and the body has a Content-Length, the upload takes the socket
 * over from libuv (reading stopped, a uv_poll on a duplicate of its descriptor)
 * and, each time it is readable, the pool splice(2)s what has arrived, never
 * more than the file's remaining bytes, from the socket through a pipe into the
 * file (one copy, inside the kernel), then hashes those bytes as they lie in
 * the page cache. The socket is non-blocking and the splice too: a pool thread
 * only ever moves bytes that are already there, so a slow client holds none.
 * http-parser still reads the headers and every byte between files (the file
 * headers, "end"), and is told how many body bytes went past it
 * (conn_body_spliced). */
#include "serve_int.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define ALLOC_AHEAD (32u << 20)
#define WRITE_BACK (2u << 20)       /* writeback of a file is started each time this much more has been written */
#define SPLICE_PIPE (1u << 20)      /* the pipe between socket and file (F_SETPIPE_SZ; the kernel's default if refused) */
#define SPLICE_TURN (16u << 20)     /* at most this much per work item, so that other uploads and diffs get the pool */

enum { F_MAGIC, F_LINE, F_DATA, F_DONE };
enum { OP_OPEN = 1, OP_DATA, OP_CLOSE, OP_DATA_REF, OP_SPLICE };
enum { W_WRITE, W_FINAL, W_CLEANUP };

typedef struct wfile {
    char name[40];
    uint64_t size, written;
    char digest[33];
} wfile;

struct upload {
    server *s;
    conn *c;                  /* NULL once the connection is gone */
    char name[MF_SERVE_NAME_MAX + 1];
    char tmp[4200];
    char final[4200];
    bool listed;              /* the store listed a run of this name when the upload began */
    /* framing (loop thread) */
    int fstate;
    char line[320];
    size_t line_len;
    uint64_t remaining;
    uint64_t body_bytes;
    char (*names)[40];
    size_t n_names;
    /* staged operations for the pool */
    uint8_t *stage;
    size_t stage_len, stage_cap;
    char **bufs;              /* socket buffers adopted by OP_DATA_REF records of the stage */
    size_t n_bufs, cap_bufs;
    size_t held;              /* their capacity, counted as staged */
    uint8_t *batch;           /* what the pool is working on */
    size_t batch_len;
    char **batch_bufs;
    size_t n_batch_bufs;
    bool busy;
    bool finishing;
    bool final_queued;
    atomic_bool aborted;
    /* splicing (loop thread): the upload reads the socket itself while in a file's bytes */
    bool splicing;
    bool poll_open;
    uv_poll_t poll;           /* readability of sfd */
    int sfd;                  /* a duplicate of the connection's descriptor */
    /* what the last splice did (pool thread, read in after_cb) */
    uint64_t spliced;
    bool splice_eof;
    int splice_errno;
    /* pool-side state (one work item at a time) */
    bool made_dir;
    int fd;
    uint64_t synced;          /* bytes of the open file whose writeback has been started */
    uint64_t allocated;       /* bytes of the open file whose blocks are reserved (fallocate) */
    mf_digest_state *dg;
    int pipe_r, pipe_w;
    size_t pipe_cap;
    const uint8_t *map;       /* the open file mapped (its size), where spliced bytes are hashed in the page cache */
    size_t map_len;
    wfile *files;
    size_t n_files;
    int werr;                 /* HTTP status of a failure in the pool, 0 when fine */
    char wmsg[1200];
    int kind;
    /* result of the final step */
    int status;
    bool replaces;            /* the entry takes the place of the store's entry of the name (a continued run) */
    json_t *reply;
    run_entry *entry;
    uv_work_t work;
};

size_t upload_staged(const upload *u) { return u->stage_len + u->held; }

static void stage_op(upload *u, uint8_t op, const void *a, size_t alen, uint64_t num) {
    size_t need = 1 + 8 + 4 + alen;
    if (u->stage_len + need > u->stage_cap) {
        u->stage_cap = (u->stage_len + need) * 2 > STAGE_FLUSH * 2 ? (u->stage_len + need) * 2 : STAGE_FLUSH * 2;
        u->stage = mf_xrealloc(u->stage, u->stage_cap);
    }
    uint8_t *p = u->stage + u->stage_len;
    uint32_t l32 = (uint32_t)alen;
    p[0] = op;
    memcpy(p + 1, &num, 8);
    memcpy(p + 9, &l32, 4);
    if (alen) memcpy(p + 13, a, alen);
    u->stage_len += need;
}

/* File bytes that lie in the socket buffer being parsed: the upload keeps the buffer and stages a reference.
 * false when the buffer has already gone to the pool with a batch: a chunked body brings several chunks in one
 * read, and a batch may be submitted between two of them. The batch gives the buffer back when it is done, so the
 * caller copies these bytes instead. */
static bool stage_ref(upload *u, const char *data, size_t len) {
    conn *c = u->c;
    if (!u->n_bufs || u->bufs[u->n_bufs - 1] != c->rbuf) {
        if (c->rbuf_kept) return false;
        if (u->n_bufs == u->cap_bufs) {
            u->cap_bufs = u->cap_bufs ? 2 * u->cap_bufs : 16;
            u->bufs = mf_xrealloc(u->bufs, u->cap_bufs * sizeof *u->bufs);
        }
        u->bufs[u->n_bufs++] = c->rbuf;
        u->held += c->rbuf_cap;
        c->rbuf_kept = true;
    }
    stage_op(u, OP_DATA_REF, &data, sizeof data, len);
    return true;
}

static void free_bufs(server *s, char **bufs, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (bufs[i] == s->feeding) s->feeding_released = true;   /* on_read is still parsing it: it frees it */
        else server_rbuf_put(s, bufs[i]);
    }
    free(bufs);
}

upload *upload_begin(conn *c, const char *name) {
    server *s = c->srv;
    upload *u = mf_xcalloc(1, sizeof *u);
    u->s = s;
    u->c = c;
    u->fd = -1;
    u->sfd = -1;
    u->pipe_r = u->pipe_w = -1;
    atomic_init(&u->aborted, false);
    snprintf(u->name, sizeof u->name, "%s", name);
    snprintf(u->tmp, sizeof u->tmp, "%s/.tmp/up-%ld-%llu", s->root, (long)getpid(), (unsigned long long)++s->seq);
    store_dir_of(s, name, u->final, sizeof u->final);
    u->listed = store_find(s, name) != NULL;
    s->n_uploads++;
    return u;
}

static void unmap_file(upload *u) {
    if (u->map) munmap((void *)u->map, u->map_len);
    u->map = NULL;
    u->map_len = 0;
}

static void on_poll_closed(uv_handle_t *h) {
    upload *u = h->data;
    close(u->sfd);
    u->s->n_uploads--;
    free(u);
}

static void upload_free(upload *u) {
    if (u->dg) {
        char d[33];
        mf_digest_final(u->dg, d);
    }
    if (u->fd >= 0) close(u->fd);
    unmap_file(u);
    json_decref(u->reply);
    free(u->stage);
    free(u->batch);
    free_bufs(u->s, u->bufs, u->n_bufs);
    free_bufs(u->s, u->batch_bufs, u->n_batch_bufs);
    free(u->names);
    free(u->files);
    if (u->pipe_r >= 0) close(u->pipe_r);
    if (u->pipe_w >= 0) close(u->pipe_w);
    if (u->poll_open) {   /* the descriptor is closed, and u freed, once the loop has let go of the poll handle */
        uv_close((uv_handle_t *)&u->poll, on_poll_closed);
        return;
    }
    if (u->sfd >= 0) close(u->sfd);
    u->s->n_uploads--;
    free(u);
}

/* ---- the pool side -------------------------------------------------------- */

static void werr(upload *u, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void werr(upload *u, int status, const char *fmt, ...) {
    if (u->werr) return;
    u->werr = status;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(u->wmsg, sizeof u->wmsg, fmt, ap);
    va_end(ap);
}

static void write_all(upload *u, const uint8_t *p, size_t n) {
    while (n && !u->werr) {
        ssize_t w = write(u->fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) {
            werr(u, 500, "storing the upload failed: %s", strerror(errno));
            return;
        }
        p += w;
        n -= (size_t)w;
    }
}

/* Blocks are reserved ahead of the bytes (at most ALLOC_AHEAD more than have arrived, so a client that announces a
 * large file and sends little reserves little): no per-page delayed allocation. */
static void reserve(upload *u, const wfile *f, uint64_t n) {
    if (f->written + n <= u->allocated || u->allocated >= f->size || u->werr) return;
    uint64_t to = f->written + n + ALLOC_AHEAD < f->size ? f->written + n + ALLOC_AHEAD : f->size;
    if (fallocate(u->fd, 0, (off_t)u->allocated, (off_t)(to - u->allocated)) == 0 || errno == EOPNOTSUPP)
        u->allocated = to;
    else
        werr(u, 500, "storing the upload failed: %s", strerror(errno));
}

/* Starts writing back what has come so far, so the fsync at the end has little left to do. */
static void write_back(upload *u, const wfile *f) {
    if (f->written - u->synced >= WRITE_BACK) {
        (void)sync_file_range(u->fd, (off_t)u->synced, (off_t)(f->written - u->synced), SYNC_FILE_RANGE_WRITE);
        u->synced = f->written;
    }
}

/* Moves up to want bytes of the open file from the socket into it, as many as have arrived (SPLICE_TURN at most):
 * socket -> pipe (no copy) -> file (one copy into the page cache), then hashes them from the page cache. Sets
 * u->spliced, and u->splice_eof or u->splice_errno when the client has gone. */
static void splice_in(upload *u, uint64_t want) {
    wfile *f = &u->files[u->n_files - 1];
    u->spliced = 0;
    u->splice_eof = false;
    u->splice_errno = 0;
    if (u->pipe_r < 0 && !u->werr) {
        int p[2];
        if (pipe2(p, O_CLOEXEC) != 0) {
            werr(u, 500, "storing the upload failed: pipe: %s", strerror(errno));
            return;
        }
        u->pipe_r = p[0];
        u->pipe_w = p[1];
        (void)fcntl(u->pipe_w, F_SETPIPE_SZ, (int)SPLICE_PIPE);
        const int cap = fcntl(u->pipe_w, F_GETPIPE_SZ);
        u->pipe_cap = cap > 0 ? (size_t)cap : 65536;
    }
    if (!u->map && !u->werr) {
        void *m = mmap(NULL, (size_t)f->size, PROT_READ, MAP_SHARED, u->fd, 0);
        if (m == MAP_FAILED) {
            werr(u, 500, "storing the upload failed: mapping %s: %s", f->name, strerror(errno));
            return;
        }
        u->map = m;
        u->map_len = (size_t)f->size;
    }
    while (want && !u->werr && u->spliced < SPLICE_TURN) {
        ssize_t n = splice(u->sfd, NULL, u->pipe_w, NULL, want < u->pipe_cap ? (size_t)want : u->pipe_cap,
                           SPLICE_F_NONBLOCK | SPLICE_F_MOVE);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;   /* all that had arrived is in */
        if (n < 0) {
            u->splice_errno = errno;
            break;
        }
        if (n == 0) {
            u->splice_eof = true;
            break;
        }
        reserve(u, f, (uint64_t)n);
        for (size_t left = (size_t)n; left && !u->werr;) {
            ssize_t w = splice(u->pipe_r, NULL, u->fd, NULL, left, SPLICE_F_MOVE);
            if (w < 0 && errno == EINTR) continue;
            if (w <= 0) werr(u, 500, "storing the upload failed: %s", w < 0 ? strerror(errno) : "the file took no bytes");
            else left -= (size_t)w;
        }
        if (u->werr) return;
        /* the bytes just written are hashed where they lie in the page cache (still in the CPU's caches) */
        mf_digest_update(u->dg, u->map + f->written, (size_t)n);
        f->written += (uint64_t)n;
        want -= (uint64_t)n;
        u->spliced += (uint64_t)n;
        write_back(u, f);
    }
}

static void run_ops(upload *u, const uint8_t *ops, size_t n) {
    if (!u->made_dir && !u->werr) {
        if (mkdir(u->tmp, 0755) != 0) werr(u, 500, "storing the upload failed: %s", strerror(errno));
        u->made_dir = true;
    }
    size_t i = 0;
    while (i < n && !u->werr) {
        const uint8_t op = ops[i];
        uint64_t num;
        uint32_t alen;
        memcpy(&num, ops + i + 1, 8);
        memcpy(&alen, ops + i + 9, 4);
        const uint8_t *a = ops + i + 13;
        i += 13 + alen;
        if (op == OP_OPEN) {
            u->files = mf_xrealloc(u->files, (u->n_files + 1) * sizeof *u->files);
            wfile *f = &u->files[u->n_files++];
            memset(f, 0, sizeof *f);
            memcpy(f->name, a, alen < sizeof f->name ? alen : sizeof f->name - 1);
            f->size = num;
            char p[4300];
            snprintf(p, sizeof p, "%s/%s", u->tmp, f->name);
            u->fd = open(p, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);   /* read too: spliced bytes are hashed back */
            if (u->fd < 0) werr(u, 500, "storing the upload failed: %s", strerror(errno));
            u->allocated = 0;
            u->dg = mf_digest_new();
            u->synced = 0;
        } else if (op == OP_DATA || op == OP_DATA_REF) {
            wfile *f = &u->files[u->n_files - 1];
            const uint8_t *d = a;
            size_t dl = alen;
            if (op == OP_DATA_REF) {
                memcpy(&d, a, sizeof d);
                dl = (size_t)num;
            }
            reserve(u, f, dl);
            write_all(u, d, dl);
            mf_digest_update(u->dg, d, dl);
            f->written += dl;
            write_back(u, f);
        } else if (op == OP_SPLICE) {
            splice_in(u, num);
        } else if (op == OP_CLOSE) {
            wfile *f = &u->files[u->n_files - 1];
            mf_digest_final(u->dg, f->digest);
            u->dg = NULL;
            unmap_file(u);
            /* the rest of the file goes to the disk now, but the fsync waits for the end of the run (sync_files):
             * here it would stall the next file's bytes in the socket for a journal commit (0.9-2.2 ms per file
             * on the bench's VM) */
            (void)sync_file_range(u->fd, 0, 0, SYNC_FILE_RANGE_WRITE);
            close(u->fd);
            u->fd = -1;
        }
    }
}

/* Every file of the run made durable before it is renamed into place. The last file's fsync commits the
 * journal with every file's metadata; the others' data went to the disk when they were closed, so theirs are
 * quick. */
static void sync_files(upload *u) {
    for (size_t i = u->n_files; i-- > 0 && !u->werr;) {
        char p[4300];
        snprintf(p, sizeof p, "%s/%s", u->tmp, u->files[i].name);
        int fd = open(p, O_RDONLY | O_CLOEXEC);
        if (fd < 0 || fsync(fd) != 0) werr(u, 500, "storing the upload failed: %s", strerror(errno));
        if (fd >= 0) close(fd);
    }
}


/* The message names the run, never the server's directories. */
static void scrub(char *msg, const char *tmp, const char *name) {
    size_t tl = strlen(tmp), nl = strlen(name);
    char *p;
    while ((p = strstr(msg, tmp))) {
        memmove(p + nl, p + tl, strlen(p + tl) + 1);
        memcpy(p, name, nl);
    }
}

/* the digest the pool computed while writing a file, for mf_run_open_given */
static const char *written_digest(void *ud, const char *file) {
    const upload *u = ud;
    for (size_t i = 0; i < u->n_files; i++)
        if (!strcmp(u->files[i].name, file) && u->files[i].written == u->files[i].size && u->files[i].digest[0])
            return u->files[i].digest;
    return NULL;
}

/* The upload's verified directory takes the stored copy's place, in one step where the file system can
 * (RENAME_EXCHANGE), and the stored copy, now under the upload's temporary name, is removed. what: "damaged" or
 * "incomplete", for the messages. */
static bool swap_in(upload *u, const char *what) {
    bool swapped = renameat2(AT_FDCWD, u->tmp, AT_FDCWD, u->final, RENAME_EXCHANGE) == 0;
    if (!swapped) {   /* no exchange here: the stored copy goes aside first */
        char aside[4300];
        snprintf(aside, sizeof aside, "%s-%s", u->tmp, what);
        if (rename(u->final, aside) != 0) {
            werr(u, 500, "run %s: the stored copy is %s and could not be replaced: %s", u->name, what, strerror(errno));
            return false;
        }
        if (rename(u->tmp, u->final) != 0) {
            werr(u, 500, "run %s: the stored copy is %s and could not be replaced: %s", u->name, what, strerror(errno));
            (void)rename(aside, u->final);   /* as it was */
            return false;
        }
        (void)rename(aside, u->tmp);   /* removed with the upload's directory below (else at the next start) */
    }
    char runs[4300];
    snprintf(runs, sizeof runs, "%s/runs", u->s->root);
    store_fsync_dir(runs);
    store_remove_tree(u->tmp);   /* the old copy, now under the upload's temporary name */
    return true;
}

static bool replace_damaged_locked(upload *u) {
    run_entry *old = NULL;
    mf_error err = {0};
    const int rc = store_load_run(u->final, u->name, NULL, NULL, &old, &err);
    if (rc == MF_OK) {
        store_entry_free(old);
        return false;
    }
    if (rc != MF_EDIGEST && rc != MF_EFORMAT) {
        werr(u, 500, "run %s: the stored copy could not be read: %s", u->name, err.msg);
        return false;
    }
    return swap_in(u, "damaged");
}

/* Whether the run of manifest neu continues the stored, incomplete run of manifest old: the same trace (every
 * field that names the model, the precision, the numerics, the record level, the input, the device and the
 * trace's start), every shard of old in neu with its bytes and digest (a writer never changes a shard it has
 * named), every sequence of old in neu in the same shard, and more of them (or neu complete). A run pushed while
 * it was traced is replaced by the finished one, and by nothing else. */
static bool continues(json_t *old, json_t *neu) {
    if (json_is_true(json_object_get(old, "complete"))) return false;
    static const char *keys[][2] = {{"model", "architecture"}, {"model", "config_digest"}, {"model", "weights_digest"},
                                    {"precision", "name"},      {NULL, "numerics"},           {NULL, "record"},
                                    {"input", "digest"},        {"device", "kind"},           {NULL, "created"},
                                    {NULL, "tool"}};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        json_t *a = keys[i][0] ? json_object_get(json_object_get(old, keys[i][0]), keys[i][1]) : json_object_get(old, keys[i][1]);
        json_t *b = keys[i][0] ? json_object_get(json_object_get(neu, keys[i][0]), keys[i][1]) : json_object_get(neu, keys[i][1]);
        if (!a || !b || !json_equal(a, b)) return false;
    }
    json_t *os = json_object_get(old, "shards"), *ns = json_object_get(neu, "shards");
    json_t *oq = json_object_get(old, "sequences"), *nq = json_object_get(neu, "sequences");
    if (json_array_size(os) > json_array_size(ns) || json_array_size(oq) > json_array_size(nq)) return false;
    for (size_t i = 0; i < json_array_size(os); i++)
        if (!json_equal(json_array_get(os, i), json_array_get(ns, i))) return false;
    for (size_t i = 0; i < json_array_size(oq); i++)
        if (!json_equal(json_array_get(oq, i), json_array_get(nq, i))) return false;
    return json_array_size(nq) > json_array_size(oq) || json_is_true(json_object_get(neu, "complete"));
}

static bool replace_incomplete_locked(upload *u, const run_entry *e) {
    char mp[4300], *text = NULL;
    size_t len;
    mf_error err = {0};
    snprintf(mp, sizeof mp, "%s/manifest.json", u->final);
    if (mf_read_file(mp, &text, &len, &err) != MF_OK) return false;
    json_t *old = json_loadb(text, len, 0, NULL), *neu = json_loads(e->manifest, 0, NULL);
    free(text);
    const bool go = old && neu && continues(old, neu);
    json_decref(old);
    json_decref(neu);
    return go && swap_in(u, "incomplete");
}

/* The name is taken by a run stored while it was still being traced: the upload of its continuation takes its
 * place (the same lock as below: what is there is judged when the turn comes). */
static bool replace_incomplete(upload *u, const run_entry *e) {
    uv_mutex_lock(&u->s->replace_lock);
    const bool done = replace_incomplete_locked(u, e);
    uv_mutex_unlock(&u->s->replace_lock);
    return done;
}

/* The name is taken by a directory the store did not list when the upload began: one left out as damaged when the
 * server started (or one another upload has just stored). It is verified in full; a damaged one (its bytes or its
 * format wrong, not a read that failed) is swapped for the upload's verified directory, in one step where the file
 * system can (RENAME_EXCHANGE), and removed. Uploads of the name do this one at a time (replace_lock), each
 * verifying what is there when its turn comes, so a second one finds the first one's run, not the damaged copy.
 * false when the copy there verifies, or could not be judged or replaced (then werr says why). */
static bool replace_damaged(upload *u) {
    uv_mutex_lock(&u->s->replace_lock);
    const bool done = replace_damaged_locked(u);
    uv_mutex_unlock(&u->s->replace_lock);
    return done;
}

static void finalize(upload *u) {
    if (u->werr) return;
    if (atomic_load(&u->aborted)) return;
    bool has_manifest = false;
    for (size_t i = 0; i < u->n_files; i++) has_manifest |= !strcmp(u->files[i].name, "manifest.json");
    if (!has_manifest) {
        werr(u, 422, "the upload of %s has no manifest.json", u->name);
        return;
    }
    run_entry *e;
    mf_error err = {0};
    if (store_load_run(u->tmp, u->name, written_digest, u, &e, &err)) {
        scrub(err.msg, u->tmp, u->name);
        werr(u, 422, "run %s does not verify: %s", u->name, err.msg);
        return;
    }
    /* every file sent is one the manifest names, with its size and digest */
    json_t *m = json_loads(e->manifest, 0, NULL), *shards = json_object_get(m, "shards");
    for (size_t i = 0; i < u->n_files && !u->werr; i++) {
        const wfile *f = &u->files[i];
        if (!strcmp(f->name, "manifest.json")) continue;
        bool named = false;
        for (size_t k = 0; k < json_array_size(shards); k++) {
            json_t *sh = json_array_get(shards, k);
            const char *fn = json_string_value(json_object_get(sh, "file")), *dg = json_string_value(json_object_get(sh, "digest"));
            if (fn && !strcmp(fn, f->name)) {
                named = true;
                if (!dg || strcmp(dg, f->digest) != 0 || (uint64_t)json_integer_value(json_object_get(sh, "bytes")) != f->size)
                    werr(u, 422, "run %s: %s does not match its manifest entry", u->name, f->name);
            }
        }
        if (!named) werr(u, 422, "run %s: %s is not named by its manifest", u->name, f->name);
    }
    json_decref(m);
    sync_files(u);   /* a run that verifies is made durable before it is renamed into place */
    if (u->werr) {
        store_entry_free(e);
        return;
    }
    store_fsync_dir(u->tmp);
    const char *digest = json_string_value(json_object_get(e->summary, "digest"));
    if (rename(u->tmp, u->final) == 0) {
        char runs[4300];
        snprintf(runs, sizeof runs, "%s/runs", u->s->root);
        store_fsync_dir(runs);
        u->status = 201;
        u->reply = json_pack("{sssbsssssO}", "name", u->name, "verified", 1, "stored", "new", "digest", digest, "run", e->summary);
        u->entry = e;
        return;
    }
    if (errno != EEXIST && errno != ENOTEMPTY) {
        werr(u, 500, "storing run %s failed: %s", u->name, strerror(errno));
    } else if (!u->listed && replace_damaged(u)) {
        u->status = 201;
        u->reply = json_pack("{sssbsssssO}", "name", u->name, "verified", 1, "stored", "replaced", "digest", digest, "run", e->summary);
        u->entry = e;
        return;
    } else if (!u->werr) {
        /* the name is taken: the same run again is harmless, another one is a conflict */
        char mp[4300], *text = NULL, have[33] = "";
        size_t len;
        snprintf(mp, sizeof mp, "%s/manifest.json", u->final);
        if (mf_read_file(mp, &text, &len, &err) == MF_OK) mf_digest_buffer(text, len, have);
        free(text);
        if (!strcmp(have, digest)) {
            u->status = 200;
            u->reply = json_pack("{sssbsssssO}", "name", u->name, "verified", 1, "stored", "existing", "digest", digest, "run",
                                 e->summary);
            u->entry = e;
        } else if (replace_incomplete(u, e)) {
            u->status = 201;
            u->reply = json_pack("{sssbsssssO}", "name", u->name, "verified", 1, "stored", "continued", "digest", digest, "run",
                                 e->summary);
            u->entry = e;
            u->replaces = true;
            return;
        } else if (!u->werr) {
            werr(u, 409, "a different run named %s is already stored (digest %s, this one %s)", u->name, have, digest);
        }
    }
    store_remove_tree(u->tmp);
    if (!u->entry) {
        store_entry_free(e);
    }
}

static void work_cb(uv_work_t *w) {
    upload *u = w->data;
    if (u->kind == W_CLEANUP) {
        if (u->fd >= 0) close(u->fd);
        u->fd = -1;
        unmap_file(u);
        if (u->made_dir) store_remove_tree(u->tmp);
        return;
    }
    if (!atomic_load(&u->aborted)) run_ops(u, u->batch, u->batch_len);
    if (u->kind == W_FINAL) {
        finalize(u);
        if (!u->entry && u->made_dir) {   /* refused, aborted, or the same run was already stored */
            if (u->fd >= 0) close(u->fd);
            u->fd = -1;
            store_remove_tree(u->tmp);
            u->made_dir = false;
        }
    }
}

static void submit(upload *u, int kind);

/* The socket is readable (or the peer has gone): the pool splices what is there, after the staged operations. */
static void on_readable(uv_poll_t *p, int status, int events) {
    (void)status;
    (void)events;
    upload *u = p->data;
    uv_poll_stop(p);
    if (!u->c || !u->splicing || u->busy || atomic_load(&u->aborted)) return;
    stage_op(u, OP_SPLICE, NULL, 0, u->remaining);
    uv_timer_stop(&u->c->timer);   /* the pool is at work: a slow disk is not the client's stall (re-armed after) */
    submit(u, W_WRITE);
}

/* Splicing ends without the file's end (the upload is dropped or refused): the poll stops, and libuv reads the
 * connection again, so that what the client still sends is drained while it gets its answer. */
static void splice_release(upload *u, conn *c) {
    if (u->poll_open) uv_poll_stop(&u->poll);
    if (!u->splicing) return;
    u->splicing = false;
    if (c && conn_alive(c)) conn_start_reading(c);
}

static void after_cb(uv_work_t *w, int status) {
    (void)status;
    upload *u = w->data;
    u->busy = false;
    free(u->batch);
    u->batch = NULL;
    u->batch_len = 0;
    free_bufs(u->s, u->batch_bufs, u->n_batch_bufs);
    u->batch_bufs = NULL;
    u->n_batch_bufs = 0;
    conn *c = u->c;
    if (u->kind == W_CLEANUP) {
        upload_free(u);
        return;
    }
    if (u->kind == W_FINAL) {
        if (u->entry) {
            if (u->replaces) store_replace(u->s, u->entry);
            else store_add(u->s, u->entry);
            u->entry = NULL;
        }
        if (c) c->up = NULL;
        if (c && conn_alive(c)) {
            if (u->werr) conn_error(c, u->werr, "%s", u->wmsg);
            else {
                server_log(u->s, "run %s: verified, %s", u->name, u->status == 201 ? "stored" : "already stored");
                conn_json(c, u->status, json_incref(u->reply));
            }
        }
        upload_free(u);
        return;
    }
    /* a write batch finished */
    if (atomic_load(&u->aborted) || !c) {
        submit(u, W_CLEANUP);
        return;
    }
    if (u->werr) {
        c->up = NULL;
        u->c = NULL;
        splice_release(u, c);
        atomic_store(&u->aborted, true);
        submit(u, W_CLEANUP);
        conn_error(c, u->werr, "%s", u->wmsg);
        return;
    }
    if (u->splicing) {
        const uint64_t n = u->spliced;
        u->spliced = 0;
        u->remaining -= n;
        u->body_bytes += n;
        conn_body_spliced(c, n);
        if (u->splice_eof || u->splice_errno) {   /* the client went away inside a file: the upload is dropped */
            if (u->splice_errno) server_log(u->s, "upload of %s: reading the connection failed: %s", u->name, strerror(u->splice_errno));
            c->eof = true;
            conn_close(c);   /* upload_abort: u is cleaned up */
            return;
        }
        if (u->remaining) {
            uv_poll_start(&u->poll, UV_READABLE | UV_DISCONNECT, on_readable);
            return;
        }
        /* the file is complete: its header's successor is read by libuv and http-parser again */
        u->splicing = false;
        stage_op(u, OP_CLOSE, NULL, 0, 0);
        u->fstate = F_LINE;
    }
    if (u->finishing && !u->final_queued) {
        u->final_queued = true;
        submit(u, W_FINAL);
    } else if (upload_staged(u) >= STAGE_FLUSH) {
        submit(u, W_WRITE);
    }
    if (upload_staged(u) < STAGE_PAUSE) conn_resume_body(c);
}

static void submit(upload *u, int kind) {
    u->kind = kind;
    u->busy = true;
    if (kind != W_CLEANUP) {
        u->batch = u->stage;
        u->batch_len = u->stage_len;
        u->stage = NULL;
        u->stage_len = u->stage_cap = 0;
        u->batch_bufs = u->bufs;
        u->n_batch_bufs = u->n_bufs;
        u->bufs = NULL;
        u->n_bufs = u->cap_bufs = 0;
        u->held = 0;
    }
    u->work.data = u;
    if (uv_queue_work(u->s->loop, &u->work, work_cb, after_cb) != 0) abort();
}

/* ---- the loop side ---------------------------------------------------------- */

static bool valid_file_name(const char *n) {
    if (!strcmp(n, "manifest.json")) return true;
    size_t l = strlen(n);
    if (l < 5 + 5 + 12 || l > 5 + 8 + 12 || strncmp(n, "part-", 5) != 0 || strcmp(n + l - 12, ".safetensors") != 0) return false;
    for (size_t i = 5; i < l - 12; i++)
        if (n[i] < '0' || n[i] > '9') return false;
    return true;
}

static bool refuse(upload *u, int status, const char *msg) {
    conn *c = u->c;
    /* conn_error sees the connection mid-body and drops the upload (upload_abort) */
    conn_error(c, status, "upload of %s: %s", u->name, msg);
    return false;
}

static bool header_line(upload *u) {
    char *l = u->line;
    if (!strcmp(l, "end")) {
        u->fstate = F_DONE;
        return true;
    }
    /* "file <bytes> <name>": bytes are decimal digits only (sscanf's %llu would take "-5" as 2^64 - 5), at most 19 */
    unsigned long long size = 0;
    int off = 0;
    char name[64];
    const char *dg = l + 5;
    size_t nd = 0;
    while (dg[nd] >= '0' && dg[nd] <= '9') nd++;
    if (strncmp(l, "file ", 5) != 0 || nd == 0 || dg[nd] != ' ')
        return refuse(u, 400, "a file header must be \"file <bytes> manifest.json|part-NNNNN.safetensors\" (bytes in decimal digits)");
    if (nd > 19) return refuse(u, 413, "a file is larger than the server takes");
    for (size_t i = 0; i < nd; i++) size = size * 10 + (unsigned)(dg[i] - '0');
    if (sscanf(dg + nd, " %63s%n", name, &off) != 1 || dg[nd + (size_t)off] != 0 || !valid_file_name(name))
        return refuse(u, 400, "a file header must be \"file <bytes> manifest.json|part-NNNNN.safetensors\"");
    for (size_t i = 0; i < u->n_names; i++)
        if (!strcmp(u->names[i], name)) return refuse(u, 400, "a file is sent twice");
    if (u->n_names >= MAX_UPLOAD_FILES) return refuse(u, 400, "too many files");
    if (size > u->s->o.max_run_bytes) return refuse(u, 413, "a file is larger than the server takes");
    if (!strcmp(name, "manifest.json") && size > MAX_MANIFEST_BYTES)
        return refuse(u, 413, "the manifest is larger than the server takes (64 MiB)");
    u->names = mf_xrealloc(u->names, (u->n_names + 1) * sizeof *u->names);
    snprintf(u->names[u->n_names++], 40, "%s", name);
    stage_op(u, OP_OPEN, name, strlen(name), size);
    u->remaining = size;
    u->fstate = F_DATA;
    if (size == 0) {
        stage_op(u, OP_CLOSE, NULL, 0, 0);
        u->fstate = F_LINE;
    }
    return true;
}

bool upload_feed(upload *u, const char *data, size_t len) {
    u->body_bytes += len;
    if (u->body_bytes > u->s->o.max_run_bytes) return refuse(u, 413, "the body is larger than the server takes");
    size_t i = 0;
    while (i < len) {
        if (u->fstate == F_DONE) return refuse(u, 400, "bytes after \"end\"");
        if (u->fstate == F_DATA) {
            size_t take = len - i < u->remaining ? len - i : (size_t)u->remaining;
            const conn *c = u->c;
            if (take >= UPLOAD_ADOPT && c && c->rbuf && c->rbuf_cap == UPLOAD_READ && data + i >= c->rbuf &&
                data + i + take <= c->rbuf + c->rbuf_len && stage_ref(u, data + i, take)) {   /* no copy: the pool writes from the socket buffer */
                i += take;
                u->remaining -= take;
                take = 0;
            }
            while (take) {   /* records of at most 1 MiB */
                size_t t = take > STAGE_FLUSH ? STAGE_FLUSH : take;
                stage_op(u, OP_DATA, data + i, t, 0);
                i += t;
                take -= t;
                u->remaining -= t;
            }
            if (u->remaining == 0) {
                stage_op(u, OP_CLOSE, NULL, 0, 0);
                u->fstate = F_LINE;
            }
            continue;
        }
        const char ch = data[i++];
        if (ch == '\n') {
            u->line[u->line_len] = 0;
            if (u->fstate == F_MAGIC) {
                if (strcmp(u->line, "moeflip-run 1") != 0) return refuse(u, 400, "the body does not start with \"moeflip-run 1\"");
                u->fstate = F_LINE;
            } else if (!header_line(u)) {
                return false;
            }
            u->line_len = 0;
        } else {
            if (u->line_len + 1 >= sizeof u->line) return refuse(u, 400, "a header line is too long");
            u->line[u->line_len++] = ch;
        }
    }
    if (!u->busy && upload_staged(u) >= STAGE_FLUSH) submit(u, W_WRITE);
    return true;
}

void upload_finish(upload *u) {
    conn *c = u->c;
    if (u->fstate != F_DONE) {
        char name[MF_SERVE_NAME_MAX + 1];
        snprintf(name, sizeof name, "%s", u->name);
        c->up = NULL;
        upload_abort(u);   /* frees u */
        conn_error(c, 400, "upload of %s: the body ends before \"end\"", name);
        return;
    }
    u->finishing = true;
    if (!u->busy) {
        u->final_queued = true;
        submit(u, W_FINAL);
    }
}

void upload_read_done(upload *u) {
    conn *c = u->c;
    if (!c || u->splicing || u->fstate != F_DATA || u->remaining < UPLOAD_SPLICE_MIN || atomic_load(&u->aborted)) return;
    if (!conn_body_spliceable(c, u->remaining)) return;
    if (!u->poll_open) {
        int fd;
        if (uv_fileno((const uv_handle_t *)c->stream, &fd) != 0) return;
        u->sfd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
        if (u->sfd < 0) return;   /* libuv goes on reading: slower, the same result */
        if (uv_poll_init(u->s->loop, &u->poll, u->sfd) != 0) {
            close(u->sfd);
            u->sfd = -1;
            return;
        }
        u->poll.data = u;
        u->poll_open = true;
    }
    u->splicing = true;
    conn_stop_reading(c);
    /* while the pool writes what is staged, nothing reads the socket, and a slow disk is not the client's stall:
     * after_cb starts the poll and the idle timer again */
    if (u->busy) uv_timer_stop(&c->timer);
    else uv_poll_start(&u->poll, UV_READABLE | UV_DISCONNECT, on_readable);
}

void upload_abort(upload *u) {
    conn *c = u->c;
    if (c && c->up == u) c->up = NULL;
    u->c = NULL;
    splice_release(u, c);
    atomic_store(&u->aborted, true);
    if (u->busy) return;   /* after_cb cleans up */
    if (u->made_dir || u->fd >= 0) submit(u, W_CLEANUP);
    else upload_free(u);
}
