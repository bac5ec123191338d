/* moeflip push: one PUT /api/runs/NAME with libcurl, streaming
 *
 *   moeflip-run 1\n
 *   file <bytes> manifest.json\n <manifest>
 *   file <bytes> part-NNNNN.safetensors\n <shard>   (each shard the manifest names)
 *   end\n
 *
 * from the run directory. The manifest and the shards' headers are checked
 * before anything is sent; the shards' bytes are not hashed here: the server
 * hashes every shard as it stores it and compares it with the manifest, and
 * refuses a damaged one (422, naming it; nothing is stored), which push
 * reports and does not retry. Connection failures, timeouts, a body that
 * stalls, 408, 429 and 5xx are retried with backoff; success is only the
 * server's answer that it verified and stored the run. */
#include "serve_int.h"
#include "mf_rundir.h"

#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <linux/sockios.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* the module interface this module was built for (mf_core.h) */
MF_MODULE_ABI_DEFINE;

#define UPLOAD_BUFFER (2L << 20)   /* curl's upload buffer: the most curl takes, for fewer and larger sends */
#define FIRST_READ (256u << 10)     /* the first read callback's bytes, doubled on each call up to UPLOAD_BUFFER */
#define ANSWER_WAIT 600.0           /* seconds the answer to a whole body is awaited (the server verifies and fsyncs) */

typedef struct segment {
    const char *mem;       /* bytes in memory, or */
    char *path;            /* a file */
    uint64_t size;
    char head[128];
} segment;

typedef struct body {
    segment *seg;
    size_t n;
    uint64_t total;
    /* reading position */
    size_t cur;
    uint64_t off;
    int fd;
    bool failed;
    size_t ramp;           /* the current attempt's read size while it ramps up to curl's buffer */
    char msg[600];
    mf_progress prog;
    bool progress;
    /* stalls: the body's bytes must keep moving; once all are sent, the server has its time to verify and fsync */
    double stall_s;
    double moved_at;        /* when ulnow last changed (or the attempt began) */
    curl_off_t moved;       /* ulnow then */
    int queued;             /* bytes in the socket's send queue once all were handed to it (SIOCOUTQ) */
    curl_socket_t sock;     /* the attempt's socket (sockopt_cb) */
    const char *gave_up;    /* why xfer_cb ended the attempt, NULL if it did not */
    double gave_up_s;       /* after how long */
    char reply[65536];
    size_t reply_len;
} body;

static size_t read_cb(char *buf, size_t size, size_t nitems, void *ud) {
    body *b = ud;
    size_t cap = size * nitems, out = 0;
    /* The first reads are short and double up to curl's buffer: the buffer is new, and filling all 2 MiB of it
     * at once takes ~1.5 ms of page faults before the server has a byte to work on. */
    if (b->ramp < cap) {
        b->ramp = b->ramp ? 2 * b->ramp : FIRST_READ;
        if (b->ramp < cap) cap = b->ramp;
    }
    while (out < cap && b->cur < b->n) {
        segment *s = &b->seg[b->cur];
        uint64_t left = s->size - b->off;
        size_t want = cap - out < left ? cap - out : (size_t)left;
        if (s->mem) {
            memcpy(buf + out, s->mem + b->off, want);
        } else {
            if (b->fd < 0) {
                b->fd = open(s->path, O_RDONLY | O_CLOEXEC);
                struct stat st;
                if (b->fd < 0 || fstat(b->fd, &st) != 0 || (uint64_t)st.st_size != s->size) {
                    snprintf(b->msg, sizeof b->msg, "%s: %s", s->path, b->fd < 0 ? strerror(errno) : "changed size while pushing");
                    b->failed = true;
                    return CURL_READFUNC_ABORT;
                }
            }
            ssize_t r = pread(b->fd, buf + out, want, (off_t)b->off);
            if (r <= 0) {
                snprintf(b->msg, sizeof b->msg, "%s: %s", s->path, r < 0 ? strerror(errno) : "ended early");
                b->failed = true;
                return CURL_READFUNC_ABORT;
            }
            want = (size_t)r;
        }
        out += want;
        b->off += want;
        if (b->off == s->size) {
            if (b->fd >= 0) close(b->fd);
            b->fd = -1;
            b->cur++;
            b->off = 0;
        }
    }
    return out;
}

static size_t write_cb(char *ptr, size_t size, size_t nmemb, void *ud) {
    body *b = ud;
    size_t n = size * nmemb, room = sizeof b->reply - 1 - b->reply_len;
    memcpy(b->reply + b->reply_len, ptr, n < room ? n : room);
    b->reply_len += n < room ? n : room;
    b->reply[b->reply_len] = 0;
    return n;
}

/* libcurl calls this at least once a second. Its own low-speed limit cannot tell a stalled body from a server
 * that has all of it and is verifying and fsyncing it (minutes for a large run on a slow disk), so the two are
 * timed here: no byte of the body taken for stall_s, or no answer ANSWER_WAIT after the last one, ends the attempt. */
static int xfer_cb(void *ud, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal, curl_off_t ulnow) {
    (void)dltotal;
    (void)dlnow;
    body *b = ud;
    const double now = mf_now();
    if (ulnow != b->moved) {
        b->moved = ulnow;
        b->moved_at = now;
    }
    bool all_sent = ultotal > 0 && ulnow >= ultotal;
    if (all_sent) {
        /* ulnow counts bytes handed to the kernel: while some wait in the socket's send queue (the server's window
         * is shut), the body is still being sent, or stalled */
        int queued = 0;
        if (b->sock != CURL_SOCKET_BAD && ioctl(b->sock, SIOCOUTQ, &queued) == 0 && queued > 0) {
            all_sent = false;
            if (queued != b->queued) {
                b->queued = queued;
                b->moved_at = now;
            }
        }
    }
    if (!all_sent && now - b->moved_at > b->stall_s) {
        b->gave_up = "the upload stalled: the server took no byte";
        b->gave_up_s = b->stall_s;
        return 1;
    }
    if (all_sent && now - b->moved_at > ANSWER_WAIT) {
        b->gave_up = "no answer after the whole run was sent";
        b->gave_up_s = ANSWER_WAIT;
        return 1;
    }
    if (b->progress) mf_progress_update(&b->prog, (uint64_t)ulnow, NULL);
    return 0;
}

/* libcurl made the attempt's socket: kept for xfer_cb's look at its send queue */
static int sockopt_cb(void *ud, curl_socket_t fd, curlsocktype purpose) {
    if (purpose == CURLSOCKTYPE_IPCXN) ((body *)ud)->sock = fd;
    return CURL_SOCKOPT_OK;
}

static void rewind_body(body *b) {
    if (b->fd >= 0) close(b->fd);
    b->fd = -1;
    b->cur = 0;
    b->off = 0;
    b->failed = false;
    b->reply_len = 0;
    b->reply[0] = 0;
    b->ramp = 0;
    b->moved = -1;
    b->queued = 0;
    b->sock = CURL_SOCKET_BAD;
    b->moved_at = mf_now();
    b->gave_up = NULL;
}

static bool transient_curl(CURLcode c) {
    return c == CURLE_COULDNT_CONNECT || c == CURLE_OPERATION_TIMEDOUT || c == CURLE_SEND_ERROR || c == CURLE_RECV_ERROR ||
           c == CURLE_GOT_NOTHING || c == CURLE_PARTIAL_FILE;
}

static bool transient_http(long s) { return s == 408 || s == 429 || s == 500 || s == 502 || s == 503 || s == 504; }

static const char *server_message(body *b) {
    static char m[600];
    json_t *j = json_loads(b->reply, 0, NULL);
    const char *e = json_string_value(json_object_get(j, "error"));
    snprintf(m, sizeof m, "%s", e ? e : b->reply_len ? "(no error message)" : "(empty answer)");
    json_decref(j);
    return m;
}

int mf_push(const mf_push_opts *o, mf_push_result *res, mf_error *err) {
    memset(res, 0, sizeof *res);
    /* the name: --name, else the directory's base name */
    char base[4096];
    snprintf(base, sizeof base, "%s", o->run_dir);
    size_t bl = strlen(base);
    while (bl > 1 && base[bl - 1] == '/') base[--bl] = 0;
    const char *nm = o->name ? o->name : (strrchr(base, '/') ? strrchr(base, '/') + 1 : base);
    if (!mf_serve_name_valid(nm, strlen(nm)))
        return mf_fail(err, MF_EINVAL, "\"%s\" is not a valid run name (1 to %d of A-Z a-z 0-9 . _ -, starting with a letter or digit, no \"..\"); give --name",
                       nm, MF_SERVE_NAME_MAX);
    snprintf(res->name, sizeof res->name, "%s", nm);
    if (strncmp(o->url, "http://", 7) != 0 && strncmp(o->url, "https://", 8) != 0)
        return mf_fail(err, MF_EINVAL, "--to %s: give the server's URL, http://HOST:PORT", o->url);
    char token[MF_SERVE_TOKEN_MAX + 1] = "";
    int rc;
    if (o->token_file && (rc = mf_serve_read_token(o->token_file, token, sizeof token, err))) return rc;
    mf_run *r;
    /* the manifest and the shards' headers are checked here; the shards' digests by the server */
    if ((rc = mf_run_open_unhashed(&r, o->run_dir, err))) {
        explicit_bzero(token, sizeof token);
        return mf_fail_wrap(err, "push %s", nm);
    }

    body b = {0};
    b.fd = -1;
    b.stall_s = o->stall_s > 0 ? o->stall_s : 60;
    b.n = 2 + r->n_shards;
    b.seg = mf_xcalloc(2 * b.n + 2, sizeof *b.seg);
    size_t k = 0;
    b.seg[k++] = (segment){.mem = BODY_FORMAT_MAGIC, .size = strlen(BODY_FORMAT_MAGIC)};
    segment *h = &b.seg[k++];
    const size_t mlen = strlen(r->manifest_text);
    snprintf(h->head, sizeof h->head, "file %zu manifest.json\n", mlen);
    h->mem = h->head;
    h->size = strlen(h->head);
    b.seg[k++] = (segment){.mem = r->manifest_text, .size = mlen};
    for (size_t i = 0; i < r->n_shards; i++) {
        h = &b.seg[k++];
        snprintf(h->head, sizeof h->head, "file %llu %s\n", (unsigned long long)r->shard_bytes[i], r->shard_files[i]);
        h->mem = h->head;
        h->size = strlen(h->head);
        segment *f = &b.seg[k++];
        char p[4300];
        snprintf(p, sizeof p, "%s/%s", o->run_dir, r->shard_files[i]);
        f->path = mf_xstrdup(p);
        f->size = r->shard_bytes[i];
    }
    b.seg[k++] = (segment){.mem = "end\n", .size = 4};
    b.n = k;
    for (size_t i = 0; i < b.n; i++) b.total += b.seg[i].size;
    res->bytes = b.total;

    char url[4400];
    snprintf(url, sizeof url, "%.*s/api/runs/%s", (int)(strlen(o->url) - (o->url[strlen(o->url) - 1] == '/')), o->url, nm);
    curl_global_init(CURL_GLOBAL_DEFAULT);
    CURL *cu = curl_easy_init();
    struct curl_slist *hdr = curl_slist_append(NULL, "Content-Type: application/x-moeflip-run");
    char auth[MF_SERVE_TOKEN_MAX + 32];
    if (token[0]) {
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", token);
        hdr = curl_slist_append(hdr, auth);
        explicit_bzero(auth, sizeof auth);
        explicit_bzero(token, sizeof token);
    }
    curl_easy_setopt(cu, CURLOPT_URL, url);
    curl_easy_setopt(cu, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt(cu, CURLOPT_INFILESIZE_LARGE, (curl_off_t)b.total);
    curl_easy_setopt(cu, CURLOPT_READFUNCTION, read_cb);
    curl_easy_setopt(cu, CURLOPT_READDATA, &b);
    curl_easy_setopt(cu, CURLOPT_WRITEFUNCTION, write_cb);
    curl_easy_setopt(cu, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(cu, CURLOPT_HTTPHEADER, hdr);
    curl_easy_setopt(cu, CURLOPT_NOSIGNAL, 1L);
    char why[CURL_ERROR_SIZE];   /* libcurl's own account of a failure: more than curl_easy_strerror's */
    curl_easy_setopt(cu, CURLOPT_ERRORBUFFER, why);
    curl_easy_setopt(cu, CURLOPT_CONNECTTIMEOUT, 10L);
    curl_easy_setopt(cu, CURLOPT_UPLOAD_BUFFERSIZE, UPLOAD_BUFFER);
    curl_easy_setopt(cu, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(cu, CURLOPT_XFERINFOFUNCTION, xfer_cb);
    curl_easy_setopt(cu, CURLOPT_XFERINFODATA, &b);
    curl_easy_setopt(cu, CURLOPT_SOCKOPTFUNCTION, sockopt_cb);
    curl_easy_setopt(cu, CURLOPT_SOCKOPTDATA, &b);

    double t0 = mf_now();
    int retries = o->retries < 0 ? 0 : o->retries;
    rc = MF_EIO;
    for (int attempt = 0; attempt <= retries; attempt++) {
        res->attempts = attempt + 1;
        rewind_body(&b);
        b.progress = o->progress;
        if (b.progress) mf_progress_begin(&b.prog, nm, b.total);
        why[0] = 0;
        CURLcode cc = curl_easy_perform(cu);
        if (b.progress) mf_progress_end(&b.prog);
        long status = 0, retry_after = 0;
        curl_easy_getinfo(cu, CURLINFO_RESPONSE_CODE, &status);
        curl_off_t ra = 0;
        if (curl_easy_getinfo(cu, CURLINFO_RETRY_AFTER, &ra) == CURLE_OK) retry_after = (long)ra;
        bool again = false;
        if (b.failed) {
            rc = mf_fail(err, MF_EIO, "push %s: %s", nm, b.msg);
            break;
        } else if (cc == CURLE_ABORTED_BY_CALLBACK && b.gave_up) {
            rc = mf_fail(err, MF_EIO, "push %s to %s: %s for %.0f s", nm, o->url, b.gave_up, b.gave_up_s);
            again = true;
        } else if (cc != CURLE_OK) {
            const char *detail = why[0] ? why : curl_easy_strerror(cc);
            if (cc == CURLE_UNSUPPORTED_PROTOCOL || cc == CURLE_WEIRD_SERVER_REPLY)   /* the URL was checked: the answer is at fault */
                rc = mf_fail(err, MF_EIO, "push %s to %s: the answer is not HTTP (%s); is this a moeflip serve?", nm, o->url, detail);
            else
                rc = mf_fail(err, MF_EIO, "push %s to %s: %s", nm, o->url, detail);
            again = transient_curl(cc);
        } else if (status == 200 || status == 201) {
            json_t *j = json_loads(b.reply, 0, NULL);
            bool verified = json_is_true(json_object_get(j, "verified"));
            const char *stored = json_string_value(json_object_get(j, "stored"));
            res->existed = stored && !strcmp(stored, "existing");
            json_decref(j);
            rc = verified ? MF_OK : mf_fail(err, MF_EFORMAT, "push %s: the server did not say it verified the run", nm);
            break;
        } else {
            rc = mf_fail(err, status == 401 || status == 403 ? MF_EINVAL : MF_EIO, "push %s: the server answered %ld: %s", nm,
                         status, server_message(&b));
            again = transient_http(status);
        }
        if (!again || attempt == retries) break;
        double wait = 0.25 * (double)(1 << (attempt < 5 ? attempt : 5));
        if (retry_after > 0) wait = retry_after < 30 ? (double)retry_after : 30;
        struct timespec ts = {(time_t)wait, (long)((wait - (double)(time_t)wait) * 1e9)};
        nanosleep(&ts, NULL);
    }
    res->seconds = mf_now() - t0;
    rewind_body(&b);
    curl_easy_cleanup(cu);
    for (struct curl_slist *l = hdr; l; l = l->next) explicit_bzero(l->data, strlen(l->data));   /* the token's copy */
    curl_slist_free_all(hdr);
    for (size_t i = 0; i < b.n; i++) free(b.seg[i].path);
    free(b.seg);
    mf_run_close(r);
    return rc;
}
