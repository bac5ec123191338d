/* Connections: reading requests with http-parser, routing, writing responses,
 * timeouts. Everything here runs on the loop thread and never touches a disk. */
#include "serve_int.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

enum { H_OTHER, H_AUTH, H_EXPECT };

enum {
    R_NONE,
    R_UI,
    R_HEALTH,
    R_LIST,
    R_MANIFEST,
    R_UPLOAD,
    R_DIFF_POST,
    R_DIFF_GET,
};

#define MAX_HEADERS 100
#define DRAIN_MS 2000

/* ---- helpers ---------------------------------------------------------- */

static const char *reason(int status) {
    switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 201: return "Created";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 411: return "Length Required";
    case 413: return "Content Too Large";
    case 414: return "URI Too Long";
    case 422: return "Unprocessable Content";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 503: return "Service Unavailable";
    default: return "Status";
    }
}

/* ---- connection lifetime ---------------------------------------------- */

void conn_ref(conn *c) { c->refs++; }

static void conn_free(conn *c) {
    server *s = c->srv;
    if (c->prev) c->prev->next = c->next;
    else s->conns = c->next;
    if (c->next) c->next->prev = c->prev;
    s->n_conns--;
    explicit_bzero(c->auth, sizeof c->auth);
    mf_buf_free(&c->body);
    if (c->leftover.s) explicit_bzero(c->leftover.s, c->leftover.n);   /* requests, perhaps with a token */
    mf_buf_free(&c->leftover);
    free(c);
}

void conn_unref(conn *c) {
    if (--c->refs == 0) conn_free(c);
}

static void on_handle_closed(uv_handle_t *h) { conn_unref(h->data); }

bool conn_alive(const conn *c) { return c->state != CS_CLOSING; }

void conn_close(conn *c) {
    if (c->state == CS_CLOSING) return;
    c->state = CS_CLOSING;
    if (c->up) {
        upload_abort(c->up);
        c->up = NULL;
    }
    if (c->waiting) diffs_conn_gone(c);
    uv_timer_stop(&c->timer);
    uv_close((uv_handle_t *)&c->timer, on_handle_closed);
    uv_close((uv_handle_t *)c->stream, on_handle_closed);
}

static void arm_timer(conn *c, int ms);

static void on_timeout(uv_timer_t *t) {
    conn *c = t->data;
    if (c->state == CS_CLOSING) return;
    if (c->writes > 0) {
        /* an answer is being written: a client that reads it, however slowly, gets the idle time again; one
         * that has read nothing of it for that long is closed */
        const size_t queued = uv_stream_get_write_queue_size(c->stream);
        if (queued < c->write_queue_seen) {
            c->write_queue_seen = queued;
            arm_timer(c, c->srv->o.idle_timeout_ms);
            return;
        }
        conn_close(c);
        return;
    }
    if (c->state == CS_DRAIN) {   /* the drain is over */
        conn_close(c);
        return;
    }
    if (c->state == CS_BODY || (c->state == CS_HEADERS && c->got > 0)) {
        server_log(c->srv, "closing a connection that stalled for %d ms", c->state == CS_BODY ? c->srv->o.idle_timeout_ms
                                                                                             : c->srv->o.header_timeout_ms);
        if (c->up) {
            upload_abort(c->up);
            c->up = NULL;
        }
        c->close_after = true;
        conn_error(c, 408, "the request did not arrive in time");
        return;
    }
    conn_close(c);   /* an idle kept-alive connection */
}

static void arm_timer(conn *c, int ms) {
    if (c->state == CS_CLOSING) return;
    uv_timer_start(&c->timer, on_timeout, (uint64_t)ms, 0);
}

/* ---- writing ------------------------------------------------------------ */

typedef struct write_req {
    uv_write_t req;
    conn *c;
    char *head;
    char *body;
} write_req;

static void begin_request(conn *c);
static void feed(conn *c, const char *data, size_t n);

static void on_shutdown(uv_shutdown_t *req, int status) {
    (void)status;
    conn *c = req->data;
    free(req);
    conn_unref(c);
}

static void on_written(uv_write_t *req, int status) {
    write_req *w = (write_req *)req;
    conn *c = w->c;
    free(w->head);
    free(w->body);
    free(w);
    c->writes--;
    if (c->state == CS_CLOSING) {
        conn_unref(c);
        return;
    }
    if (status < 0) {
        conn_close(c);
    } else if (c->writes == 0 && !c->responded) {
        if (c->eof && c->state != CS_WAIT) conn_close(c);   /* a 100 Continue went out; the client is gone */
    } else if (c->writes == 0 && c->responded) {
        if (c->close_after) {
            if (c->eof || c->state != CS_DRAIN) conn_close(c);
            else {   /* end our side, and read and drop what the client still sends, so it sees the answer */
                uv_shutdown_t *sh = mf_xcalloc(1, sizeof *sh);
                sh->data = c;
                conn_ref(c);
                if (uv_shutdown(sh, c->stream, on_shutdown) != 0) {
                    free(sh);
                    conn_unref(c);
                    conn_close(c);
                } else {
                    arm_timer(c, DRAIN_MS);
                }
            }
        } else if (c->state == CS_WAIT) {
            conn_resume(c);
        }
    }
    conn_unref(c);
}

static void write_raw(conn *c, char *head, size_t hlen, char *body, size_t blen) {
    write_req *w = mf_xcalloc(1, sizeof *w);
    w->c = c;
    w->head = head;
    w->body = body;
    uv_buf_t bufs[2] = {uv_buf_init(head, (unsigned)hlen), uv_buf_init(body ? body : head, (unsigned)blen)};
    conn_ref(c);
    c->writes++;
    int rc = uv_write(&w->req, c->stream, bufs, body && blen ? 2 : 1, on_written);
    if (rc < 0) {
        c->writes--;
        free(head);
        free(body);
        free(w);
        conn_unref(c);
        conn_close(c);
        return;
    }
    c->write_queue_seen = uv_stream_get_write_queue_size(c->stream);
    arm_timer(c, c->srv->o.idle_timeout_ms);
}

/* HTML pages may load nothing from elsewhere: the UI talks only to this server and runs only its own script (the
 * one carrying this answer's nonce), a report has no scripts. */
static const char *csp(const conn *c, const char *ctype, char *buf, size_t cap) {
    if (strncmp(ctype, "text/html", 9) != 0) return "";
    if (c->route == R_UI) {
        snprintf(buf, cap,
                 "Content-Security-Policy: default-src 'none'; script-src 'nonce-%s'; style-src 'unsafe-inline'; "
                 "img-src blob: data:; connect-src 'self'; frame-src 'self'; base-uri 'none'; form-action 'none'\r\n",
                 c->nonce);
        return buf;
    }
    return "Content-Security-Policy: default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; "
           "form-action 'none'\r\n";
}

/* The UI page with a fresh nonce on its script (the CSP allows that script and nothing else). */
static void serve_ui(conn *c, bool head_only) {
    unsigned char r[16];
    if (getrandom(r, sizeof r, 0) != (ssize_t)sizeof r) {
        conn_error(c, 500, "no random bytes for the page's nonce: %s", strerror(errno));
        return;
    }
    for (size_t i = 0; i < sizeof r; i++) snprintf(c->nonce + 2 * i, 3, "%02x", r[i]);
    if (head_only) {
        conn_respond(c, 200, "text/html; charset=utf-8", NULL, 0);
        return;
    }
    const char *at = strstr(mf_serve_ui_html, "<script>");
    char *page = NULL;
    const int n = asprintf(&page, "%.*s<script nonce=\"%s\">%s", (int)(at - mf_serve_ui_html), mf_serve_ui_html, c->nonce,
                           at + strlen("<script>"));
    if (n < 0) abort();
    conn_respond(c, 200, "text/html; charset=utf-8", page, (size_t)n);
    free(page);
}

void conn_respond(conn *c, int status, const char *ctype, const void *body, size_t len) {
    if (c->state == CS_CLOSING || c->responded) return;
    c->responded = true;
    if (c->state == CS_HEADERS || c->state == CS_BODY) {
        /* answered before the request ended: the rest of it is not read */
        c->close_after = true;
        c->state = CS_DRAIN;
        if (HTTP_PARSER_ERRNO(&c->parser) == HPE_OK) http_parser_pause(&c->parser, 1);
        if (c->up) {
            upload_abort(c->up);
            c->up = NULL;
        }
        /* reading may have been stopped (an upload ahead of the pool, or splicing): the drain reads again, so that
         * the client, still sending, gets this answer and not a reset */
        conn_start_reading(c);
    }
    if (c->srv->stopping) c->close_after = true;
    char *head = NULL, policy[512];
    int hl = asprintf(&head,
                      "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\nCache-Control: no-store\r\n"
                      "X-Content-Type-Options: nosniff\r\n%s%s%s%s\r\n",
                      status, reason(status), ctype, len, csp(c, ctype, policy, sizeof policy), c->close_after ? "Connection: close\r\n" : "",
                      status == 401 ? "WWW-Authenticate: Bearer\r\n" : "", status == 429 || status == 503 ? "Retry-After: 1\r\n" : "");
    if (hl < 0) abort();
    char *b = NULL;
    if (len) {
        b = mf_xmalloc(len);
        memcpy(b, body, len);
    }
    if (status >= 400 || c->route == R_UPLOAD || c->route == R_DIFF_POST) {
        const char *q = strchr(c->url, '?');
        server_log(c->srv, "%s %.*s -> %d (%.0f ms)", http_method_str((enum http_method)c->parser.method),
                   (int)(q ? (size_t)(q - c->url) : c->url_len), c->url, status, 1e3 * (mf_now() - c->started));
    }
    write_raw(c, head, (size_t)hl, b, len);
}

void conn_error(conn *c, int status, const char *fmt, ...) {
    char msg[1100];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    /* messages carry what clients and files said (names, manifest strings): cut inside a character, or not
     * UTF-8 at all, they would be refused by jansson; the end of a split character goes, other such bytes
     * become '?' */
    size_t n = strlen(msg), start = n;
    while (start > 0 && n - start < 3 && ((unsigned char)msg[start - 1] & 0xc0) == 0x80) start--;
    if (start > 0 && (unsigned char)msg[start - 1] >= 0xc0 && mf_utf8_char((const unsigned char *)msg + start - 1, n - start + 1) == 0)
        msg[start - 1] = 0;
    mf_utf8_scrub(msg);
    for (char *p = msg; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f) *p = '?';   /* one line */
    json_t *j = json_pack("{ss}", "error", msg);
    conn_json(c, status, j);
}

void conn_json(conn *c, int status, json_t *j) {
    char *text = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!text) text = mf_xstrdup("{\"error\": \"the answer could not be encoded\"}");   /* never a NULL passed on */
    size_t n = strlen(text);
    text = mf_xrealloc(text, n + 2);
    text[n] = '\n';
    conn_respond(c, status, "application/json", text, n + 1);
    free(text);
}

/* ---- reading ------------------------------------------------------------ */

void server_rbuf_put(server *s, char *buf) {
    if (s->n_spare < (int)(sizeof s->spare / sizeof s->spare[0])) s->spare[s->n_spare++] = buf;
    else free(buf);
}

void server_rbufs_free(server *s) {
    while (s->n_spare) free(s->spare[--s->n_spare]);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
    (void)suggested;
    conn *c = h->data;
    /* an upload's body is read in large pieces, which the upload keeps instead of copying (upload_feed) */
    if (c && c->up && c->state == CS_BODY) {
        server *s = c->srv;
        buf->base = s->n_spare ? s->spare[--s->n_spare] : mf_xmalloc(UPLOAD_READ);
        buf->len = UPLOAD_READ;
        return;
    }
    buf->base = mf_xmalloc(64 * 1024);
    buf->len = 64 * 1024;
}

static void on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf) {
    conn *c = st->data;
    if (nread > 0 && c->state != CS_CLOSING) {
        if (c->state == CS_DRAIN) {
            /* dropped */
        } else if (c->state == CS_WAIT) {
            mf_buf_put(&c->leftover, buf->base, (size_t)nread);
            conn_stop_reading(c);
        } else {
            server *s = c->srv;
            c->rbuf = buf->base;
            c->rbuf_len = (size_t)nread;
            c->rbuf_cap = buf->len;
            c->rbuf_kept = false;
            s->feeding = buf->base;
            s->feeding_released = false;
            feed(c, buf->base, (size_t)nread);
            const bool kept = c->rbuf_kept && !s->feeding_released;
            c->rbuf = NULL;
            c->rbuf_kept = false;
            s->feeding = NULL;
            if (c->up && c->state == CS_BODY && c->reading) upload_read_done(c->up);
            if (kept) return;   /* an upload owns it now */
        }
    } else if (nread < 0 && c->state != CS_CLOSING) {
        c->eof = true;
        conn_stop_reading(c);
        if (nread == UV_EOF && c->state == CS_HEADERS && c->got > 0 && !c->responded) {
            /* the client stopped writing inside a request's headers (it may still read) */
            c->close_after = true;
            conn_error(c, 400, "malformed HTTP request: the connection ended inside the request");
        } else if (nread != UV_EOF) {
            conn_close(c);   /* reset: nothing can be delivered */
        } else if (c->state == CS_WAIT && c->writes == 0 && diffs_waiting_to_start(c)) {
            /* closed while its diff waits for its turn: taken as gone (as proxies take a client's close), so that
             * diffs asked for and abandoned are not computed one after the other */
            conn_close(c);
        } else if (c->writes > 0 || c->state == CS_WAIT) {
            c->close_after = true;   /* finish the answer (or wait for the pool's), then close */
        } else {
            conn_close(c);   /* gone mid-request (an upload is dropped), or idle */
        }
    }
    if (buf->base && buf->len == UPLOAD_READ) {
        server_rbuf_put(c->srv, buf->base);   /* body bytes of an upload, kept for the next read */
    } else {
        if (buf->base && nread > 0) explicit_bzero(buf->base, (size_t)nread);   /* requests, perhaps with a token */
        free(buf->base);
    }
}

void conn_stop_reading(conn *c) {
    if (c->reading && c->state != CS_CLOSING) uv_read_stop(c->stream);
    c->reading = false;
}

void conn_resume_body(conn *c) {
    if (c->state != CS_BODY || c->reading) return;
    arm_timer(c, c->srv->o.idle_timeout_ms);
    conn_start_reading(c);
}

bool conn_body_spliceable(const conn *c, uint64_t n) {
    const http_parser *p = &c->parser;
    return c->state == CS_BODY && !c->responded && !c->eof && HTTP_PARSER_ERRNO(p) == HPE_OK && !(p->flags & F_CHUNKED) &&
           p->content_length != ULLONG_MAX && p->content_length > n;
}

void conn_body_spliced(conn *c, uint64_t n) {
    /* while http-parser reads a Content-Length body, content_length is what is left of it (http_parser.c,
     * s_body_identity); the bytes after a spliced file (a file header, "end") always go through the parser,
     * so it, not the splice, sees the body end */
    c->parser.content_length -= n;
    arm_timer(c, c->srv->o.idle_timeout_ms);
}

void conn_start_reading(conn *c) {
    if (c->reading || c->eof || c->state == CS_CLOSING) return;
    if (uv_read_start(c->stream, on_alloc, on_read) == 0) c->reading = true;
}

static void begin_request(conn *c) {
    c->state = CS_HEADERS;
    c->responded = false;
    c->url_len = 0;
    c->url[0] = 0;
    c->url_overflow = false;
    c->hfield_len = 0;
    c->hfield_overflow = false;
    c->hkind = H_OTHER;
    explicit_bzero(c->auth, sizeof c->auth);   /* the last request's token, if any */
    c->auth_len = 0;
    c->auth_overflow = false;
    c->n_auth = 0;
    c->expect_continue = false;
    c->n_headers = 0;
    c->route = R_NONE;
    c->arg[0] = 0;
    mf_buf_free(&c->body);
    c->started = mf_now();
    c->got = 0;
    /* a new connection has the header time from its accept; a kept-alive one waits up to the idle time for its
     * next request, whose header time starts with its first byte (feed) */
    arm_timer(c, c->kept_alive ? c->srv->o.idle_timeout_ms : c->srv->o.header_timeout_ms);
}

void conn_resume(conn *c) {
    if (c->state == CS_CLOSING) return;
    if (c->close_after || c->eof) {
        if (c->writes == 0) conn_close(c);
        return;
    }
    c->kept_alive = true;
    begin_request(c);
    http_parser_pause(&c->parser, 0);
    conn_start_reading(c);
    if (c->leftover.n) {
        mf_buf l = c->leftover;
        c->leftover = (mf_buf){0};
        feed(c, l.s, l.n);
        explicit_bzero(l.s, l.n);
        mf_buf_free(&l);
    }
}

static void feed(conn *c, const char *data, size_t n) {
    if (c->state == CS_HEADERS) {
        if (c->got == 0) {
            c->started = mf_now();
            if (c->kept_alive) arm_timer(c, c->srv->o.header_timeout_ms);
        }
        c->got += n;
    }
    size_t done = http_parser_execute(&c->parser, &c->srv->settings, data, n);
    if (c->state == CS_CLOSING) return;
    enum http_errno e = HTTP_PARSER_ERRNO(&c->parser);
    if (e == HPE_PAUSED) {
        if (c->state == CS_WAIT && done < n) {   /* a pipelined request: kept for later */
            mf_buf_put(&c->leftover, data + done, n - done);
            conn_stop_reading(c);
        }
        return;
    }
    if (e != HPE_OK || done != n) {
        c->close_after = true;
        if (c->responded) {
            conn_close(c);
            return;
        }
        conn_error(c, 400, "malformed HTTP request: %s", http_errno_description(e));
    }
}

/* ---- http-parser callbacks --------------------------------------------- */

static int on_message_begin(http_parser *p) {
    conn *c = p->data;
    if (c->state != CS_HEADERS) return 1;
    return 0;
}

static int on_url(http_parser *p, const char *at, size_t len) {
    conn *c = p->data;
    if (c->url_len + len > MAX_URL) {
        c->url_overflow = true;
        return 0;
    }
    memcpy(c->url + c->url_len, at, len);
    c->url_len += len;
    c->url[c->url_len] = 0;
    return 0;
}

static int on_header_field(http_parser *p, const char *at, size_t len) {
    conn *c = p->data;
    if (c->hkind != -1) {   /* a new field begins */
        c->hfield_len = 0;
        c->hfield_overflow = false;
        c->hkind = -1;
        c->n_headers++;
    }
    if (c->hfield_len + len >= sizeof c->hfield) {
        c->hfield_overflow = true;
        return 0;
    }
    memcpy(c->hfield + c->hfield_len, at, len);
    c->hfield_len += len;
    c->hfield[c->hfield_len] = 0;
    return 0;
}

static int on_header_value(http_parser *p, const char *at, size_t len) {
    conn *c = p->data;
    if (c->hkind == -1) {   /* the field is complete */
        c->hkind = H_OTHER;
        if (!c->hfield_overflow && !strcasecmp(c->hfield, "authorization")) {
            c->hkind = H_AUTH;
            /* one Authorization header: a second one (wrong, then right: which one a proxy checked?) is refused at
             * headers complete, never taken in place of the first */
            c->n_auth++;
            c->auth_len = 0;
            c->auth_overflow = false;
        } else if (!c->hfield_overflow && !strcasecmp(c->hfield, "expect")) {
            c->hkind = H_EXPECT;
        }
    }
    if (c->hkind == H_AUTH) {
        if (c->auth_len + len >= sizeof c->auth) c->auth_overflow = true;
        else {
            memcpy(c->auth + c->auth_len, at, len);
            c->auth_len += len;
            c->auth[c->auth_len] = 0;
        }
    } else if (c->hkind == H_EXPECT) {
        if (len >= 12 && !strncasecmp(at, "100-continue", 12)) c->expect_continue = true;
    }
    return 0;
}

/* "Bearer <token>" matching the secret, in the request's only Authorization header */
static bool authorized(conn *c, const char *secret) {
    if (c->n_auth != 1 || c->auth_overflow || c->auth_len < 7 || strncasecmp(c->auth, "Bearer ", 7) != 0) {
        (void)ct_token_equal("", 0, secret);
        return false;
    }
    const char *t = c->auth + 7;
    size_t n = c->auth_len - 7;
    while (n && (*t == ' ' || *t == '\t')) t++, n--;
    while (n && (t[n - 1] == ' ' || t[n - 1] == '\t')) n--;
    return ct_token_equal(t, n, secret);
}

static bool may_read(conn *c) {
    server *s = c->srv;
    if (!s->has_read_token) return true;
    bool r = authorized(c, s->read_token);
    bool w = s->has_token && authorized(c, s->token);
    return r | w;
}

/* Splits the path (query dropped) into route and argument. */
static int route_of(conn *c, int *method_ok) {
    char path[MAX_URL + 1];
    size_t n = strcspn(c->url, "?#");
    memcpy(path, c->url, n);
    path[n] = 0;
    const int m = c->parser.method;
    *method_ok = 1;
    c->arg[0] = 0;
    if (!strcmp(path, "/") || !strcmp(path, "/index.html")) {
        *method_ok = m == HTTP_GET || m == HTTP_HEAD;
        return R_UI;
    }
    if (!strcmp(path, "/api/health")) {
        *method_ok = m == HTTP_GET;
        return R_HEALTH;
    }
    if (!strcmp(path, "/api/runs") || !strcmp(path, "/api/runs/")) {
        *method_ok = m == HTTP_GET;
        return R_LIST;
    }
    if (!strncmp(path, "/api/runs/", 10)) {
        const char *rest = path + 10;
        size_t rl = strlen(rest);
        if (rl > 14 && !strcmp(rest + rl - 14, "/manifest.json")) {
            snprintf(c->arg, sizeof c->arg, "%.*s", (int)(rl - 14), rest);
            *method_ok = m == HTTP_GET;
            return R_MANIFEST;
        }
        snprintf(c->arg, sizeof c->arg, "%s", rest);
        *method_ok = m == HTTP_GET || m == HTTP_PUT;
        return m == HTTP_PUT ? R_UPLOAD : R_MANIFEST;
    }
    if (!strcmp(path, "/api/diffs")) {
        *method_ok = m == HTTP_POST;
        return R_DIFF_POST;
    }
    if (!strncmp(path, "/api/diffs/", 11)) {
        snprintf(c->arg, sizeof c->arg, "%s", path + 11);
        *method_ok = m == HTTP_GET;
        return R_DIFF_GET;
    }
    return R_NONE;
}

static int on_headers_complete(http_parser *p) {
    conn *c = p->data;
    server *s = c->srv;
    c->state = CS_BODY;
    if (c->url_overflow) {
        conn_error(c, 414, "the request URL is longer than %d bytes", MAX_URL);
        return 0;
    }
    if (c->n_headers > MAX_HEADERS) {
        conn_error(c, 431, "more than %d header fields", MAX_HEADERS);
        return 0;
    }
    if (c->n_auth > 1) {
        conn_error(c, 400, "a request may carry one Authorization header; this one has %d", c->n_auth);
        return 0;
    }
    int method_ok;
    c->route = route_of(c, &method_ok);
    if (c->route == R_NONE) {
        conn_error(c, 404, "no such resource");
        return 0;
    }
    if (!method_ok) {
        conn_error(c, 405, "method %s is not allowed here", http_method_str((enum http_method)p->method));
        return 0;
    }
    const bool chunked = (p->flags & F_CHUNKED) != 0;
    const bool has_len = p->content_length != ULLONG_MAX && !chunked;
    if (c->route == R_UPLOAD) {
        if (!s->has_token) {
            conn_error(c, 403, "this server takes no uploads: it was started without --token-file");
            return 0;
        }
        if (!authorized(c, s->token)) {
            conn_error(c, 401, "uploads need the server's bearer token (Authorization: Bearer ...)");
            return 0;
        }
        if (!mf_serve_name_valid(c->arg, strlen(c->arg))) {
            conn_error(c, 400, "invalid run name: use 1 to %d characters of A-Z a-z 0-9 . _ -, starting with a letter or digit, no \"..\"",
                       MF_SERVE_NAME_MAX);
            return 0;
        }
        if (!has_len && !chunked) {
            conn_error(c, 411, "an upload needs Content-Length or chunked transfer encoding");
            return 0;
        }
        if (has_len && p->content_length > s->o.max_run_bytes) {
            conn_error(c, 413, "the run is %llu bytes; this server takes at most %llu", (unsigned long long)p->content_length,
                       (unsigned long long)s->o.max_run_bytes);
            return 0;
        }
        if (s->n_uploads >= s->o.max_uploads) {
            conn_error(c, 429, "%d uploads are in progress; try again shortly", s->n_uploads);
            return 0;
        }
        c->up = upload_begin(c, c->arg);
    } else {
        if (c->route != R_UI && !may_read(c)) {
            conn_error(c, 401, "reads need the server's read token (Authorization: Bearer ...)");
            return 0;
        }
        if ((has_len && p->content_length > MAX_SMALL_BODY)) {
            conn_error(c, 413, "request bodies here are limited to %d bytes", MAX_SMALL_BODY);
            return 0;
        }
    }
    if (c->expect_continue && (has_len ? p->content_length > 0 : chunked)) {
        static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
        char *h = mf_xstrdup(cont);
        write_raw(c, h, sizeof cont - 1, NULL, 0);
    }
    arm_timer(c, s->o.idle_timeout_ms);
    return 0;
}

static int on_body(http_parser *p, const char *at, size_t len) {
    conn *c = p->data;
    if (c->state != CS_BODY || c->responded) return 0;
    arm_timer(c, c->srv->o.idle_timeout_ms);
    if (c->route == R_UPLOAD) {
        if (c->up && !upload_feed(c->up, at, len)) return 0;
        if (c->up && upload_staged(c->up) >= STAGE_PAUSE) {   /* the pool is behind: the client waits for us, not we for it */
            conn_stop_reading(c);
            uv_timer_stop(&c->timer);
        }
        return 0;
    }
    if (c->route == R_DIFF_POST) {
        if (c->body.n + len > MAX_SMALL_BODY) {
            conn_error(c, 413, "request bodies here are limited to %d bytes", MAX_SMALL_BODY);
            return 0;
        }
        mf_buf_put(&c->body, at, len);
    }
    return 0;
}

static void health(conn *c) {
    server *s = c->srv;
    conn_json(c, 200, json_pack("{sssIsisisb}", "status", "ok", "runs", (json_int_t)s->n_runs, "uploads", s->n_uploads,
                                "connections", s->n_conns, "uploads_accepted", s->has_token));
}

static void manifest(conn *c) {
    if (!mf_serve_name_valid(c->arg, strlen(c->arg))) {
        conn_error(c, 400, "invalid run name");
        return;
    }
    run_entry *e = store_find(c->srv, c->arg);
    if (!e) {
        conn_error(c, 404, "no run named %s", c->arg);
        return;
    }
    conn_respond(c, 200, "application/json", e->manifest, e->manifest_len);
}

static int on_message_complete(http_parser *p) {
    conn *c = p->data;
    if (c->responded || c->state != CS_BODY) {
        http_parser_pause(p, 1);
        return 0;
    }
    if (!http_should_keep_alive(p)) c->close_after = true;
    c->state = CS_WAIT;
    http_parser_pause(p, 1);
    uv_timer_stop(&c->timer);
    switch (c->route) {
    case R_UI: serve_ui(c, p->method == HTTP_HEAD); break;
    case R_HEALTH: health(c); break;
    case R_LIST: {
        size_t n;
        const char *t = store_list_json(c->srv, &n);
        conn_respond(c, 200, "application/json", t, n);
        break;
    }
    case R_MANIFEST: manifest(c); break;
    case R_UPLOAD:
        if (c->up) {
            upload *u = c->up;
            upload_finish(u);   /* answers when the pool has verified and stored the run */
        }
        break;
    case R_DIFF_POST: diffs_post(c, c->body.s ? c->body.s : "", c->body.n); break;
    case R_DIFF_GET: diffs_get(c, c->arg); break;
    default: conn_error(c, 404, "no such resource");
    }
    return 0;
}

/* ---- server ------------------------------------------------------------- */

static conn *conn_new(server *s) {
    conn *c = mf_xcalloc(1, sizeof *c);
    c->srv = s;
    c->next = s->conns;
    if (s->conns) s->conns->prev = c;
    s->conns = c;
    s->n_conns++;
    http_parser_init(&c->parser, HTTP_REQUEST);
    c->parser.data = c;
    uv_timer_init(s->loop, &c->timer);
    c->timer.data = c;
    c->refs = 1;   /* the timer */
    return c;
}

static void conn_start(conn *c) {
    c->stream->data = c;
    c->refs++;   /* the stream */
    begin_request(c);
    conn_start_reading(c);
}

static void on_connection(uv_stream_t *l, int status) {
    server *s = l->data;
    if (status < 0) return;
    conn *c = conn_new(s);
    uv_tcp_init(s->loop, &c->h.tcp);
    c->stream = (uv_stream_t *)&c->h.tcp;
    if (uv_accept(l, c->stream) != 0) {
        c->stream->data = c;
        c->refs++;
        conn_close(c);
        return;
    }
    uv_tcp_nodelay(&c->h.tcp, 1);
    conn_start(c);
    if (s->n_conns > s->o.max_connections || s->stopping) {
        c->close_after = true;
        conn_error(c, 503, "too many connections");
    }
}

conn *server_adopt_pipe(server *s, int fd) {
    conn *c = conn_new(s);
    uv_pipe_init(s->loop, &c->h.pipe, 0);
    c->stream = (uv_stream_t *)&c->h.pipe;
    if (uv_pipe_open(&c->h.pipe, fd) != 0) {
        c->stream->data = c;
        c->refs++;
        conn_close(c);
        return NULL;
    }
    conn_start(c);
    return c;
}

void server_init(server *s, uv_loop_t *loop, const mf_serve_opts *o) {
    memset(s, 0, sizeof *s);
    s->loop = loop;
    uv_mutex_init(&s->replace_lock);
    s->o = *o;
    s->lock_fd = -1;
    http_parser_settings_init(&s->settings);
    s->settings.on_message_begin = on_message_begin;
    s->settings.on_url = on_url;
    s->settings.on_header_field = on_header_field;
    s->settings.on_header_value = on_header_value;
    s->settings.on_headers_complete = on_headers_complete;
    s->settings.on_body = on_body;
    s->settings.on_message_complete = on_message_complete;
}

int server_listen(server *s, mf_error *err);
int server_listen(server *s, mf_error *err) {
    char host[256];
    const char *colon = strrchr(s->o.listen, ':');
    long port;
    char *end;
    if (!colon || colon == s->o.listen || (size_t)(colon - s->o.listen) >= sizeof host)
        return mf_fail(err, MF_EINVAL, "--listen %s: give HOST:PORT", s->o.listen);
    port = strtol(colon + 1, &end, 10);
    if (!colon[1] || *end || port < 0 || port > 65535) return mf_fail(err, MF_EINVAL, "--listen %s: bad port", s->o.listen);
    size_t hl = (size_t)(colon - s->o.listen);
    memcpy(host, s->o.listen, hl);
    host[hl] = 0;
    if (host[0] == '[' && hl > 2 && host[hl - 1] == ']') {
        memmove(host, host + 1, hl - 2);
        host[hl - 2] = 0;
    }
    if (!strcmp(host, "localhost")) snprintf(host, sizeof host, "127.0.0.1");
    struct sockaddr_storage addr;
    if (uv_ip4_addr(host, (int)port, (struct sockaddr_in *)&addr) != 0 &&
        uv_ip6_addr(host, (int)port, (struct sockaddr_in6 *)&addr) != 0)
        return mf_fail(err, MF_EINVAL, "--listen %s: %s is not an IP address (127.0.0.1, ::1, 0.0.0.0, ...)", s->o.listen, host);
    uv_tcp_init(s->loop, &s->listener);
    s->listener.data = s;
    int rc = uv_tcp_bind(&s->listener, (const struct sockaddr *)&addr, 0);
    if (rc == 0) rc = uv_listen((uv_stream_t *)&s->listener, 511, on_connection);
    if (rc != 0) {
        uv_close((uv_handle_t *)&s->listener, NULL);
        return mf_fail(err, MF_EIO, "cannot listen on %s: %s", s->o.listen, uv_strerror(rc));
    }
    s->listening = true;
    return MF_OK;
}
