/* push's sender for plain http: the shards leave with sendfile(2).
 *
 * libcurl uploads only through a read callback, which costs every byte two
 * copies (file into curl's buffer, buffer into the socket); on loopback those
 * copies were about a third of push's time and took the CPU the server needs
 * for its own copy into the page cache. Here libcurl still resolves and
 * connects (CURLOPT_CONNECT_ONLY: its address handling and connect timeout),
 * and this file writes the PUT itself: the head and the small segments with
 * send(2), each shard with sendfile(2), which hands the page cache's pages to
 * the socket without copying them. The answer is read with http-parser, the
 * parser the server reads requests with. https and proxies go through
 * libcurl's own sender (push.c). */
#include "push_int.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define IDLE_MS 60000          /* nothing moves either way for this long: a timeout (push.c's low-speed limit) */
#define CONTINUE_WAIT_MS 1000  /* the head waits this long for 100 Continue, then the body goes anyway, as in libcurl */
#define SENDFILE_CHUNK (4u << 20)

bool push_send_direct_usable(const char *url) {
    const char *knob = getenv("MOEFLIP_PUSH_SENDFILE");
    if (knob && !strcmp(knob, "0")) return false;
    if (strncmp(url, "http://", 7) != 0) return false;
    /* the proxies libcurl would take from the environment for an http URL */
    static const char *const proxy_vars[] = {"http_proxy", "all_proxy", "ALL_PROXY"};
    for (size_t i = 0; i < sizeof proxy_vars / sizeof *proxy_vars; i++) {
        const char *v = getenv(proxy_vars[i]);
        if (v && *v) return false;
    }
    /* credentials in the URL are libcurl's to send */
    CURLU *u = curl_url();
    char *user = NULL;
    bool plain = curl_url_set(u, CURLUPART_URL, url, 0) == CURLUE_OK && curl_url_get(u, CURLUPART_USER, &user, 0) == CURLUE_NO_USER;
    curl_free(user);
    curl_url_cleanup(u);
    return plain;
}

/* ---- the answer ---------------------------------------------------------- */

typedef struct answer {
    http_parser parser;
    push_body *b;
    long status;            /* of the last answer whose head was read */
    long retry_after;
    char field[16];         /* the header name being read (cut; only Retry-After matters) */
    size_t field_len;
    bool in_value;
    bool is_retry_after;
    char value[24];
    size_t value_len;
    bool got_continue;      /* a 1xx answer came */
    bool done;              /* the final answer is complete */
    bool any;               /* the server sent something */
    bool eof;
} answer;

static void header_done(answer *a) {
    if (a->is_retry_after) {
        a->value[a->value_len] = 0;
        char *end;
        long v = strtol(a->value, &end, 10);
        if (end != a->value && v >= 0) a->retry_after = v;
    }
    a->field_len = a->value_len = 0;
    a->in_value = a->is_retry_after = false;
}

static int on_header_field(http_parser *p, const char *at, size_t n) {
    answer *a = p->data;
    if (a->in_value) header_done(a);
    size_t room = sizeof a->field - 1 - a->field_len;
    memcpy(a->field + a->field_len, at, n < room ? n : room);
    a->field_len += n < room ? n : room;
    a->field[a->field_len] = 0;
    if (n > room) a->field[0] = '-';   /* too long to be one we read */
    return 0;
}

static int on_header_value(http_parser *p, const char *at, size_t n) {
    answer *a = p->data;
    if (!a->in_value) {
        a->in_value = true;
        a->is_retry_after = !strcasecmp(a->field, "retry-after");
    }
    size_t room = sizeof a->value - 1 - a->value_len;
    memcpy(a->value + a->value_len, at, n < room ? n : room);
    a->value_len += n < room ? n : room;
    return 0;
}

static int on_headers_complete(http_parser *p) {
    answer *a = p->data;
    if (a->in_value) header_done(a);
    a->status = p->status_code;
    if (a->status >= 200) {
        a->b->reply_len = 0;
        a->b->reply[0] = 0;
    }
    return 0;
}

static int on_body(http_parser *p, const char *at, size_t n) {
    answer *a = p->data;
    push_body *b = a->b;
    size_t room = sizeof b->reply - 1 - b->reply_len;
    memcpy(b->reply + b->reply_len, at, n < room ? n : room);
    b->reply_len += n < room ? n : room;
    b->reply[b->reply_len] = 0;
    return 0;
}

static int on_message_complete(http_parser *p) {
    answer *a = p->data;
    if (a->status >= 100 && a->status < 200) {
        a->got_continue = true;   /* an interim answer: the final one follows on the same connection */
        a->retry_after = 0;
        return 0;
    }
    a->done = true;
    http_parser_pause(p, 1);      /* nothing after the final answer is ours */
    return 0;
}

static const http_parser_settings answer_settings = {
    .on_header_field = on_header_field,
    .on_header_value = on_header_value,
    .on_headers_complete = on_headers_complete,
    .on_body = on_body,
    .on_message_complete = on_message_complete,
};

/* Reads what the socket holds now into the parser. CURLE_OK, or how the connection or the answer failed. */
static CURLcode take_answer(int fd, answer *a) {
    char buf[16384];
    while (!a->done && !a->eof) {
        ssize_t r = recv(fd, buf, sizeof buf, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return CURLE_OK;
        if (r < 0) return CURLE_RECV_ERROR;
        if (r == 0) {
            a->eof = true;
            http_parser_execute(&a->parser, &answer_settings, NULL, 0);   /* an answer that ends with the connection */
        } else {
            a->any = true;
            size_t used = http_parser_execute(&a->parser, &answer_settings, buf, (size_t)r);
            if (!a->done && (used != (size_t)r || HTTP_PARSER_ERRNO(&a->parser) != HPE_OK)) return CURLE_WEIRD_SERVER_REPLY;
        }
    }
    return CURLE_OK;
}

/* Waits up to ms for the final answer, or with until_continue for a 100 Continue as well. */
static CURLcode await_answer(int fd, answer *a, int ms, bool until_continue) {
    while (!a->done && !a->eof && !(until_continue && a->got_continue)) {
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        int n = poll(&pf, 1, ms);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return CURLE_RECV_ERROR;
        if (n == 0) return CURLE_OPERATION_TIMEDOUT;
        CURLcode c = take_answer(fd, a);
        if (c != CURLE_OK) return c;
    }
    if (a->done || (until_continue && a->got_continue)) return CURLE_OK;
    return a->any ? CURLE_PARTIAL_FILE : CURLE_GOT_NOTHING;
}

/* ---- the request ----------------------------------------------------------- */

typedef struct sender {
    int sock;
    answer *a;
    push_body *b;
    uint64_t sent;        /* body bytes */
} sender;

/* Waits until the socket takes more, or the server answered early (x->a->done). */
static CURLcode wait_writable(sender *x) {
    for (;;) {
        struct pollfd pf = {.fd = x->sock, .events = POLLOUT | POLLIN};
        int n = poll(&pf, 1, IDLE_MS);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return CURLE_SEND_ERROR;
        if (n == 0) return CURLE_OPERATION_TIMEDOUT;
        if (pf.revents & POLLIN) {
            CURLcode c = take_answer(x->sock, x->a);
            if (c != CURLE_OK) return c;
            if (x->a->done || x->a->eof) return CURLE_SEND_ERROR;   /* the server stopped listening to the body */
        }
        if (pf.revents & (POLLOUT | POLLERR | POLLHUP)) return CURLE_OK;
    }
}

/* more: further bytes follow at once, so the kernel may hold these for a full segment (MSG_MORE) */
static CURLcode send_bytes(sender *x, const char *p, size_t n, bool body, bool more) {
    while (n) {
        ssize_t w = send(x->sock, p, n, MSG_NOSIGNAL | (more ? MSG_MORE : 0));
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            CURLcode c = wait_writable(x);
            if (c != CURLE_OK) return c;
            continue;
        }
        if (w < 0) return CURLE_SEND_ERROR;
        p += w;
        n -= (size_t)w;
        if (body) x->sent += (uint64_t)w;
    }
    return CURLE_OK;
}

static CURLcode send_file(sender *x, const push_segment *s) {
    push_body *b = x->b;
    int fd = open(s->path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0 || (uint64_t)st.st_size != s->size) {
        snprintf(b->msg, sizeof b->msg, "%s: %s", s->path, fd < 0 ? strerror(errno) : "changed size while pushing");
        b->failed = true;
        if (fd >= 0) close(fd);
        return CURLE_READ_ERROR;
    }
    CURLcode c = CURLE_OK;
    off_t off = 0;
    while (c == CURLE_OK && (uint64_t)off < s->size) {
        uint64_t left = s->size - (uint64_t)off;
        ssize_t w = sendfile(x->sock, fd, &off, left < SENDFILE_CHUNK ? (size_t)left : SENDFILE_CHUNK);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            c = wait_writable(x);
        } else if (w < 0 && (errno == EPIPE || errno == ECONNRESET)) {
            c = CURLE_SEND_ERROR;
        } else if (w <= 0) {
            snprintf(b->msg, sizeof b->msg, "%s: %s", s->path, w < 0 ? strerror(errno) : "ended early");
            b->failed = true;
            c = CURLE_READ_ERROR;
        } else {
            x->sent += (uint64_t)w;
            if (b->progress) mf_progress_update(&b->prog, x->sent, NULL);
        }
    }
    close(fd);
    return c;
}

/* "PUT PATH HTTP/1.1" and the headers, into head; false when the URL cannot be taken apart. */
static bool request_head(const push_request *rq, uint64_t length, char *head, size_t cap) {
    CURLU *u = curl_url();
    char *host = NULL, *port = NULL, *path = NULL;
    bool ok = curl_url_set(u, CURLUPART_URL, rq->url, 0) == CURLUE_OK && curl_url_get(u, CURLUPART_HOST, &host, 0) == CURLUE_OK &&
              curl_url_get(u, CURLUPART_PATH, &path, 0) == CURLUE_OK;
    if (ok && curl_url_get(u, CURLUPART_PORT, &port, 0) != CURLUE_OK) port = NULL;
    if (ok) {
        int n = snprintf(head, cap,
                         "PUT %s HTTP/1.1\r\nHost: %s%s%s\r\nUser-Agent: moeflip-push\r\nAccept: */*\r\nContent-Type: %s\r\n"
                         "%s%s%sContent-Length: %llu\r\nExpect: 100-continue\r\n\r\n",
                         path, host, port ? ":" : "", port ? port : "", rq->content_type, rq->authorization ? "Authorization: " : "",
                         rq->authorization ? rq->authorization : "", rq->authorization ? "\r\n" : "", (unsigned long long)length);
        ok = n > 0 && (size_t)n < cap;
    }
    curl_free(host);
    curl_free(port);
    curl_free(path);
    curl_url_cleanup(u);
    return ok;
}

/* The body, segment by segment. */
static CURLcode send_body(sender *x) {
    push_body *b = x->b;
    for (size_t i = 0; i < b->n; i++) {
        const push_segment *s = &b->seg[i];
        CURLcode c = s->mem ? send_bytes(x, s->mem, (size_t)s->size, true, i + 1 < b->n) : send_file(x, s);
        if (c != CURLE_OK) return c;
    }
    if (b->progress) mf_progress_update(&b->prog, x->sent, NULL);
    return CURLE_OK;
}

/* The request on a connected socket, and its answer. */
static push_outcome exchange(int sock, const push_request *rq, push_body *b) {
    push_outcome out = {.code = CURLE_OK};
    char head[2 * MAX_URL + MF_SERVE_TOKEN_MAX + 512];
    if (!request_head(rq, b->total, head, sizeof head)) {
        out.code = CURLE_URL_MALFORMAT;
        return out;
    }
    answer a = {.b = b};
    http_parser_init(&a.parser, HTTP_RESPONSE);
    a.parser.data = &a;
    sender x = {.sock = sock, .a = &a, .b = b};

    /* sendfile(2) has no MSG_NOSIGNAL: a server that hangs up would raise SIGPIPE, so it is blocked in this
     * thread while the request goes, and one it raised is taken before the mask is restored */
    sigset_t pipe_only, old, pending;
    sigemptyset(&pipe_only);
    sigaddset(&pipe_only, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_only, &old);
    sigpending(&pending);
    bool pipe_was_pending = sigismember(&pending, SIGPIPE);

    CURLcode c = send_bytes(&x, head, strlen(head), false, false);
    explicit_bzero(head, sizeof head);   /* it held the token */
    /* the server refuses a request (401, 413, 429, ...) before its body; otherwise it says 100 Continue */
    if (c == CURLE_OK) {
        c = await_answer(sock, &a, CONTINUE_WAIT_MS, true);
        if (c == CURLE_OPERATION_TIMEDOUT) c = CURLE_OK;   /* no word from the server: the body goes anyway */
        if (c == CURLE_OK && !a.done) c = send_body(&x);
    }

    if (!pipe_was_pending) {
        sigpending(&pending);
        if (sigismember(&pending, SIGPIPE)) {
            const struct timespec now = {0, 0};
            sigtimedwait(&pipe_only, NULL, &now);
        }
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);

    if (b->failed) {
        out.code = CURLE_READ_ERROR;
        return out;
    }
    /* after the body, or after the server stopped taking it: an answer it gave counts */
    CURLcode r = a.done ? CURLE_OK : await_answer(sock, &a, IDLE_MS, false);
    if (a.done) {
        out.status = a.status;
        out.retry_after = a.retry_after;
    } else {
        out.code = c != CURLE_OK ? c : r;
    }
    return out;
}

push_outcome push_send_direct(const push_request *rq, push_body *b) {
    push_outcome out = {.code = CURLE_OK};
    CURL *cu = curl_easy_init();
    curl_easy_setopt(cu, CURLOPT_URL, rq->url);
    curl_easy_setopt(cu, CURLOPT_CONNECT_ONLY, 1L);
    curl_easy_setopt(cu, CURLOPT_PROXY, "");   /* push_send_direct_usable saw no proxy; none is taken */
    curl_easy_setopt(cu, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(cu, CURLOPT_CONNECTTIMEOUT, 10L);
    curl_socket_t sock = CURL_SOCKET_BAD;
    if ((out.code = curl_easy_perform(cu)) == CURLE_OK) {
        if (curl_easy_getinfo(cu, CURLINFO_ACTIVESOCKET, &sock) == CURLE_OK && sock != CURL_SOCKET_BAD)
            out = exchange(sock, rq, b);
        else
            out.code = CURLE_COULDNT_CONNECT;
    }
    curl_easy_cleanup(cu);
    return out;
}
