/* An upload: the body of PUT /api/runs/NAME is parsed on the loop thread
 *
 *   moeflip-run 1\n
 *   file <bytes> <name>\n  <bytes raw bytes>      (once per file: manifest.json, part-NNNNN.safetensors)
 *   end\n
 *
 * and its bytes are staged; the pool writes and hashes them into a private
 * directory under ROOT/.tmp, one batch at a time, fsyncs every file, then
 * verifies the whole run (mf_run_open_given: the manifest, every shard's
 * safetensors header, every shard's digest as computed while its bytes were
 * written compared with the manifest, nothing extra) and renames the directory
 * into ROOT/runs in one step. A connection that goes away drops the directory;
 * nothing partial is ever under runs/.
 *
 * The bytes are copied once in user space at most: file bytes that arrive in
 * the connection's large read buffers (UPLOAD_READ) are staged by reference
 * (OP_DATA_REF, the upload keeps the buffer until the pool has written it);
 * only small pieces (headers, a file's short tail) are copied. */
#include "serve_int.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int store_remove_tree(const char *path);

#define ALLOC_AHEAD (32u << 20)

enum { F_MAGIC, F_LINE, F_DATA, F_DONE };
enum { OP_OPEN = 1, OP_DATA, OP_CLOSE, OP_DATA_REF };
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
    /* pool-side state (one work item at a time) */
    bool made_dir;
    int fd;
    uint64_t synced;          /* bytes of the open file whose writeback has been started */
    uint64_t allocated;       /* bytes of the open file whose blocks are reserved (fallocate) */
    mf_digest_state *dg;
    wfile *files;
    size_t n_files;
    int werr;                 /* HTTP status of a failure in the pool, 0 when fine */
    char wmsg[1200];
    int kind;
    /* result of the final step */
    int status;
    json_t *reply;
    run_entry *entry;
    uv_work_t work;
};

size_t upload_staged(const upload *u) { return u->stage_len + u->held; }

static void stage_op(upload *u, uint8_t op, const void *a, size_t alen, uint64_t num) {
    size_t need = 1 + 8 + 4 + alen;
    if (u->stage_len + need > u->stage_cap) {
        u->stage_cap = (u->stage_len + need) * 2 > STAGE_FLUSH * 2 ? (u->stage_len + need) * 2 : STAGE_FLUSH * 2;
        u->stage = realloc(u->stage, u->stage_cap);
        if (!u->stage) abort();
    }
    uint8_t *p = u->stage + u->stage_len;
    uint32_t l32 = (uint32_t)alen;
    p[0] = op;
    memcpy(p + 1, &num, 8);
    memcpy(p + 9, &l32, 4);
    if (alen) memcpy(p + 13, a, alen);
    u->stage_len += need;
}

/* File bytes that lie in the socket buffer being parsed: the upload keeps the buffer and stages a reference. */
static void stage_ref(upload *u, const char *data, size_t len) {
    conn *c = u->c;
    if (!u->n_bufs || u->bufs[u->n_bufs - 1] != c->rbuf) {
        if (u->n_bufs == u->cap_bufs) {
            u->cap_bufs = u->cap_bufs ? 2 * u->cap_bufs : 16;
            u->bufs = realloc(u->bufs, u->cap_bufs * sizeof *u->bufs);
            if (!u->bufs) abort();
        }
        u->bufs[u->n_bufs++] = c->rbuf;
        u->held += c->rbuf_cap;
        c->rbuf_kept = true;
    }
    stage_op(u, OP_DATA_REF, &data, sizeof data, len);
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
    atomic_init(&u->aborted, false);
    snprintf(u->name, sizeof u->name, "%s", name);
    snprintf(u->tmp, sizeof u->tmp, "%s/.tmp/up-%ld-%llu", s->root, (long)getpid(), (unsigned long long)++s->seq);
    store_dir_of(s, name, u->final, sizeof u->final);
    s->n_uploads++;
    return u;
}

static void upload_free(upload *u) {
    u->s->n_uploads--;
    if (u->dg) {
        char d[33];
        mf_digest_final(u->dg, d);
    }
    if (u->fd >= 0) close(u->fd);
    json_decref(u->reply);
    free(u->stage);
    free(u->batch);
    free_bufs(u->s, u->bufs, u->n_bufs);
    free_bufs(u->s, u->batch_bufs, u->n_batch_bufs);
    free(u->names);
    free(u->files);
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
            u->files = realloc(u->files, (u->n_files + 1) * sizeof *u->files);
            wfile *f = &u->files[u->n_files++];
            memset(f, 0, sizeof *f);
            memcpy(f->name, a, alen < sizeof f->name ? alen : sizeof f->name - 1);
            f->size = num;
            char p[4300];
            snprintf(p, sizeof p, "%s/%s", u->tmp, f->name);
            u->fd = open(p, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
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
            /* blocks are reserved ahead of the bytes (at most ALLOC_AHEAD more than have arrived, so a client
             * that announces a large file and sends little reserves little): no per-page delayed allocation */
            if (f->written + dl > u->allocated && u->allocated < f->size) {
                uint64_t to = f->written + dl + ALLOC_AHEAD < f->size ? f->written + dl + ALLOC_AHEAD : f->size;
                if (fallocate(u->fd, 0, (off_t)u->allocated, (off_t)(to - u->allocated)) == 0 || errno == EOPNOTSUPP)
                    u->allocated = to;
                else
                    werr(u, 500, "storing the upload failed: %s", strerror(errno));
            }
            write_all(u, d, dl);
            mf_digest_update(u->dg, d, dl);
            f->written += dl;
            /* start writing back what has come so far, so the fsync at the end has little left to do */
            if (f->written - u->synced >= (8u << 20)) {
                (void)sync_file_range(u->fd, (off_t)u->synced, (off_t)(f->written - u->synced), SYNC_FILE_RANGE_WRITE);
                u->synced = f->written;
            }
        } else if (op == OP_CLOSE) {
            wfile *f = &u->files[u->n_files - 1];
            mf_digest_final(u->dg, f->digest);
            u->dg = NULL;
            if (fsync(u->fd) != 0) werr(u, 500, "storing the upload failed: %s", strerror(errno));
            close(u->fd);
            u->fd = -1;
        }
    }
}

static void fsync_dir(const char *path) {
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        (void)fsync(fd);
        close(fd);
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
    if (u->werr) {
        json_decref(e->summary);
        free(e->manifest);
        free(e);
        return;
    }
    fsync_dir(u->tmp);
    const char *digest = json_string_value(json_object_get(e->summary, "digest"));
    if (rename(u->tmp, u->final) == 0) {
        char runs[4300];
        snprintf(runs, sizeof runs, "%s/runs", u->s->root);
        fsync_dir(runs);
        u->status = 201;
        u->reply = json_pack("{sssbsssssO}", "name", u->name, "verified", 1, "stored", "new", "digest", digest, "run", e->summary);
        u->entry = e;
        return;
    }
    if (errno != EEXIST && errno != ENOTEMPTY) {
        werr(u, 500, "storing run %s failed: %s", u->name, strerror(errno));
    } else {
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
        } else {
            werr(u, 409, "a different run named %s is already stored (digest %s, this one %s)", u->name, have, digest);
        }
    }
    store_remove_tree(u->tmp);
    if (!u->entry) {
        json_decref(e->summary);
        free(e->manifest);
        free(e);
    }
}

static void work_cb(uv_work_t *w) {
    upload *u = w->data;
    if (u->kind == W_CLEANUP) {
        if (u->fd >= 0) close(u->fd);
        u->fd = -1;
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
            store_add(u->s, u->entry);
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
        atomic_store(&u->aborted, true);
        submit(u, W_CLEANUP);
        conn_error(c, u->werr, "%s", u->wmsg);
        return;
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
    unsigned long long size;
    int off = 0;
    char name[64];
    if (sscanf(l, "file %llu %63s%n", &size, name, &off) != 2 || l[off] != 0 || !valid_file_name(name))
        return refuse(u, 400, "a file header must be \"file <bytes> manifest.json|part-NNNNN.safetensors\"");
    for (size_t i = 0; i < u->n_names; i++)
        if (!strcmp(u->names[i], name)) return refuse(u, 400, "a file is sent twice");
    if (u->n_names >= MAX_UPLOAD_FILES) return refuse(u, 400, "too many files");
    if (size > u->s->o.max_run_bytes) return refuse(u, 413, "a file is larger than the server takes");
    u->names = realloc(u->names, (u->n_names + 1) * sizeof *u->names);
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
            if (take >= UPLOAD_ADOPT && c && c->rbuf && c->rbuf_cap == UPLOAD_READ && data + i >= c->rbuf && data + i + take <= c->rbuf + c->rbuf_len) {
                stage_ref(u, data + i, take);   /* no copy: the pool writes from the socket buffer */
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

void upload_abort(upload *u) {
    if (u->c && u->c->up == u) u->c->up = NULL;
    u->c = NULL;
    atomic_store(&u->aborted, true);
    if (u->busy) return;   /* after_cb cleans up */
    if (u->made_dir || u->fd >= 0) submit(u, W_CLEANUP);
    else upload_free(u);
}
