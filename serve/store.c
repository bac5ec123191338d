/* The run store: names, the directory of each run, the index the list
 * endpoint shows, and rebuilding it from disk at start. */
#include "serve_int.h"
#include "mf_rundir.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <string.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <dirent.h>
#include <unistd.h>

bool mf_serve_name_valid(const char *name, size_t len) {
    if (len == 0 || len > MF_SERVE_NAME_MAX) return false;
    for (size_t i = 0; i < len; i++) {
        const char ch = name[i];
        const bool alnum = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9');
        if (i == 0 && !alnum) return false;
        if (!alnum && ch != '.' && ch != '_' && ch != '-') return false;
        if (ch == '.' && i + 1 < len && name[i + 1] == '.') return false;
    }
    return true;
}

int mf_serve_read_token(const char *path, char *token, size_t cap, mf_error *err) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return mf_fail(err, MF_EIO, "token file %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return mf_fail(err, MF_EINVAL, "token file %s: not a regular file", path);
    }
    if (st.st_mode & 077) {
        close(fd);
        return mf_fail(err, MF_EINVAL, "token file %s is accessible to group or others (mode %04o); chmod 600 it", path,
                       (unsigned)(st.st_mode & 07777));
    }
    char buf[MF_SERVE_TOKEN_MAX + 3];
    ssize_t n = read(fd, buf, sizeof buf);
    close(fd);
    if (n < 0) return mf_fail(err, MF_EIO, "token file %s: %s", path, strerror(errno));
    size_t len = (size_t)n;
    if (len && buf[len - 1] == '\n') len--;
    if (len && buf[len - 1] == '\r') len--;
    int rc = MF_OK;
    if (len < 8 || len > MF_SERVE_TOKEN_MAX || len >= cap)
        rc = mf_fail(err, MF_EINVAL, "token file %s: the token must be 8 to %d characters on one line", path, MF_SERVE_TOKEN_MAX);
    for (size_t i = 0; i < len && !rc; i++)
        if (buf[i] <= ' ' || buf[i] > '~')
            rc = mf_fail(err, MF_EINVAL, "token file %s: the token must be printable ASCII without spaces", path);
    if (!rc) {
        memcpy(token, buf, len);
        token[len] = 0;
    }
    explicit_bzero(buf, sizeof buf);   /* the secret lives in token only */
    return rc;
}

void store_dir_of(const server *s, const char *name, char *out, size_t cap) {
    char hex[2 * MF_SERVE_NAME_MAX + 1];
    hex_encode(name, strlen(name), hex);
    snprintf(out, cap, "%s/runs/%s", s->root, hex);
}

static bool hex_decode(const char *hex, char *out, size_t cap) {
    size_t n = strlen(hex);
    if (n == 0 || n % 2 || n / 2 >= cap) return false;
    for (size_t i = 0; i < n / 2; i++) {
        int v = 0;
        for (int k = 0; k < 2; k++) {
            const char ch = hex[2 * i + (size_t)k];
            v = v * 16 + (ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : -1000);
        }
        if (v < 0) return false;
        out[i] = (char)v;
    }
    out[n / 2] = 0;
    return true;
}

run_entry *store_find(server *s, const char *name) {
    for (size_t i = 0; i < s->n_runs; i++)
        if (!strcmp(s->runs[i]->name, name)) return s->runs[i];
    return NULL;
}

void store_entry_free(run_entry *e) {
    if (!e) return;
    free(e->manifest);
    json_decref(e->summary);
    free(e);
}

void store_add(server *s, run_entry *e) {
    if (store_find(s, e->name)) {
        store_entry_free(e);
        return;
    }
    if (s->n_runs == s->cap_runs) {
        s->cap_runs = s->cap_runs ? 2 * s->cap_runs : 16;
        s->runs = mf_xrealloc(s->runs, s->cap_runs * sizeof *s->runs);
    }
    s->runs[s->n_runs++] = e;
    free(s->list_cache);
    s->list_cache = NULL;
}

void store_replace(server *s, run_entry *e) {
    for (size_t i = 0; i < s->n_runs; i++)
        if (!strcmp(s->runs[i]->name, e->name)) {
            store_entry_free(s->runs[i]);
            s->runs[i] = e;
            free(s->list_cache);
            s->list_cache = NULL;
            return;
        }
    store_add(s, e);
}

static int by_name(const void *a, const void *b) {
    return strcmp((*(run_entry *const *)a)->name, (*(run_entry *const *)b)->name);
}

const char *store_list_json(server *s, size_t *len) {
    if (!s->list_cache) {
        if (s->n_runs) qsort(s->runs, s->n_runs, sizeof *s->runs, by_name);
        json_t *arr = json_array();
        for (size_t i = 0; i < s->n_runs; i++) json_array_append(arr, s->runs[i]->summary);
        json_t *o = json_pack("{so}", "runs", arr);
        char *t = json_dumps(o, JSON_COMPACT);
        json_decref(o);
        s->list_len = strlen(t);
        s->list_cache = mf_xrealloc(t, s->list_len + 2);
        s->list_cache[s->list_len++] = '\n';
        s->list_cache[s->list_len] = 0;
    }
    *len = s->list_len;
    return s->list_cache;
}

static json_t *jget(json_t *o, const char *path) {
    char key[64];
    while (o && *path) {
        size_t n = strcspn(path, ".");
        snprintf(key, sizeof key, "%.*s", (int)n, path);
        o = json_object_get(o, key);
        path += n + (path[n] == '.');
    }
    return o;
}

/* A manifest field for the run list, of the type the API documents (a string, or an integer for the model's
 * sizes), else null: a manifest is whatever its writer made it, and one odd field must not break clients. */
static json_t *string_or_null(json_t *v) { return json_is_string(v) ? json_string(json_string_value(v)) : json_null(); }
static json_t *integer_or_null(json_t *v) { return json_is_integer(v) ? json_integer(json_integer_value(v)) : json_null(); }

/* Opens (verifies) a run directory and describes it. */
int store_load_run(const char *dir, const char *name, const char *(*given)(void *ud, const char *file), void *ud,
                   run_entry **out, mf_error *err) {
    *out = NULL;
    mf_run *r;
    int rc = mf_run_open_given(&r, dir, given, ud, err);   /* given NULL: every shard hashed */
    if (rc) return rc;
    json_t *m = json_loads(r->manifest_text, 0, NULL);
    if (!m) {
        mf_run_close(r);
        return mf_fail(err, MF_EFORMAT, "%s: manifest is not JSON", dir);
    }
    run_entry *e = mf_xcalloc(1, sizeof *e);
    snprintf(e->name, sizeof e->name, "%s", name);
    e->manifest_len = strlen(r->manifest_text);
    e->manifest = mf_xstrdup(r->manifest_text);
    char digest[33];
    mf_digest_buffer(e->manifest, e->manifest_len, digest);
    uint64_t bytes = e->manifest_len, tokens = 0;
    for (size_t i = 0; i < r->n_shards; i++) bytes += r->shard_bytes[i];
    for (size_t i = 0; i < r->n_seqs; i++) tokens += (uint64_t)r->seqs[i].length;
    json_t *model = json_object();
    static const char *model_text[] = {"architecture", "weights_digest"};
    static const char *model_sizes[] = {"parameters", "n_layers", "n_experts", "top_k", "vocab"};
    json_t *mm = json_object_get(m, "model");
    for (size_t i = 0; i < sizeof model_text / sizeof model_text[0]; i++)
        json_object_set_new(model, model_text[i], string_or_null(json_object_get(mm, model_text[i])));
    for (size_t i = 0; i < sizeof model_sizes / sizeof model_sizes[0]; i++)
        json_object_set_new(model, model_sizes[i], integer_or_null(json_object_get(mm, model_sizes[i])));
    e->summary = json_pack("{ss ss so s{so so} so so so so sI sI sI sb}", "name", name, "digest", digest, "model", model,
                           "device", "kind", string_or_null(jget(m, "device.kind")), "name", string_or_null(jget(m, "device.name")),
                           "numerics", string_or_null(jget(m, "numerics")), "precision", string_or_null(jget(m, "precision.name")),
                           "record", string_or_null(jget(m, "record")), "created", string_or_null(jget(m, "created")),
                           "sequences", (json_int_t)r->n_seqs, "tokens", (json_int_t)tokens, "bytes", (json_int_t)bytes,
                           "complete", r->complete);
    json_decref(m);
    mf_run_close(r);
    *out = e;
    return MF_OK;
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb;
    (void)ftw;
    return flag == FTW_DP ? rmdir(path) : unlink(path);
}

int store_remove_tree(const char *path) { return nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS); }

void store_fsync_dir(const char *path) {
    const int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        (void)fsync(fd);
        close(fd);
    }
}

int store_sync_dir(const char *path) {
    DIR *d = opendir(path);
    if (!d) return -1;
    int first = 0;   /* the first failure's errno, left in errno for the caller's message */
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_type != DT_REG && de->d_type != DT_UNKNOWN) continue;
        const int fd = openat(dirfd(d), de->d_name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        struct stat st;
        if ((fd < 0 || fstat(fd, &st) != 0 || (S_ISREG(st.st_mode) && fsync(fd) != 0)) && !first) first = errno;
        if (fd >= 0) close(fd);
    }
    if (fsync(dirfd(d)) != 0 && !first) first = errno;
    closedir(d);
    errno = first;
    return first ? -1 : 0;
}

int store_open(server *s, mf_error *err) {
    char p[4200];
    int rc;
    if ((rc = mf_mkdir_p(s->root, err))) return rc;
    snprintf(p, sizeof p, "%s/.lock", s->root);
    s->lock_fd = open(p, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (s->lock_fd < 0) return mf_fail(err, MF_EIO, "%s: %s", p, strerror(errno));
    if (flock(s->lock_fd, LOCK_EX | LOCK_NB) != 0)
        return mf_fail(err, MF_EIO, "%s is in use by another moeflip serve", s->root);
    /* uploads and diffs that were under way when the last server stopped are dropped */
    snprintf(p, sizeof p, "%s/.tmp", s->root);
    if (mf_path_exists(p) && store_remove_tree(p) != 0) return mf_fail(err, MF_EIO, "cannot empty %s: %s", p, strerror(errno));
    static const char *subs[] = {".tmp", "runs", "diffs"};
    for (int i = 0; i < 3; i++) {
        snprintf(p, sizeof p, "%s/%s", s->root, subs[i]);
        if ((rc = mf_mkdir_p(p, err))) return rc;
    }
    snprintf(p, sizeof p, "%s/runs", s->root);
    DIR *d = opendir(p);
    if (!d) return mf_fail(err, MF_EIO, "%s: %s", p, strerror(errno));
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.') continue;
        char name[MF_SERVE_NAME_MAX + 1], dir[4500];
        snprintf(dir, sizeof dir, "%s/%s", p, de->d_name);
        if (!hex_decode(de->d_name, name, sizeof name) || !mf_serve_name_valid(name, strlen(name))) {
            server_log(s, "ignoring %s: not a stored run's directory", dir);
            continue;
        }
        run_entry *e;
        mf_error e2 = {0};
        if (store_load_run(dir, name, NULL, NULL, &e, &e2)) {
            server_log(s, "run %s is left out: %s", name, e2.msg);
            continue;
        }
        store_add(s, e);
    }
    closedir(d);
    return MF_OK;
}

void store_free(server *s);
void store_free(server *s) {
    for (size_t i = 0; i < s->n_runs; i++) store_entry_free(s->runs[i]);
    free(s->runs);
    s->runs = NULL;
    s->n_runs = s->cap_runs = 0;
    free(s->list_cache);
    s->list_cache = NULL;
    if (s->lock_fd >= 0) close(s->lock_fd);
    s->lock_fd = -1;
}
