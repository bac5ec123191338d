/* serve/ internals shared by its files (not a public header). */
#ifndef MF_SERVE_INT_H
#define MF_SERVE_INT_H

#include "mf_serve.h"

#include <http_parser.h>
#include <jansson.h>
#include <uv.h>

#define BODY_FORMAT_MAGIC "moeflip-run 1\n"
#define MAX_URL 2048
#define MAX_SMALL_BODY (64 * 1024)
#define MAX_UPLOAD_FILES 4096
#define MAX_MANIFEST_BYTES (64u << 20)   /* a manifest is parsed whole in memory, where the store keeps it */
/* Upload sizes. The fuzz target is built with small ones (tests/CMakeLists.txt), so that its inputs, a few KB,
 * reach every path of a large upload: adopted buffers, batches, the pause, splicing. */
#ifndef STAGE_FLUSH
#define STAGE_FLUSH (1u << 20)         /* hand staged upload bytes to the pool at this size */
#endif
#ifndef STAGE_PAUSE
#define STAGE_PAUSE (8u << 20)         /* stop reading the socket while this much waits */
#endif
#ifndef UPLOAD_READ
#define UPLOAD_READ (256u << 10)       /* a connection with an upload reads into buffers this large */
#endif
#ifndef UPLOAD_ADOPT
#define UPLOAD_ADOPT (16u << 10)       /* a run of file bytes this long in one such buffer is staged by reference */
#endif
#ifndef UPLOAD_SPLICE_MIN
#define UPLOAD_SPLICE_MIN (64u << 10)  /* a file with this much left after a read is spliced from the socket (upload.c) */
#endif

typedef struct server server;
typedef struct conn conn;
typedef struct upload upload;
typedef struct diff_job diff_job;

/* ---- helpers (util.c): what the store and the connections both use ------ */

/* One line on stderr, "moeflip serve: ...", unless the server is quiet. */
void server_log(server *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Whether a presented token equals the secret, in time that depends on neither. */
bool ct_token_equal(const char *given, size_t given_len, const char *secret);
/* 2n lowercase hex digits and a NUL into out. */
void hex_encode(const void *data, size_t n, char *out);

/* ---- the run store (store.c) ------------------------------------------- */

typedef struct run_entry {
    char name[MF_SERVE_NAME_MAX + 1];
    char *manifest;       /* manifest.json text */
    size_t manifest_len;
    json_t *summary;      /* what the list shows */
} run_entry;

/* hex-encodes a valid name: the directory under ROOT/runs */
void store_dir_of(const server *s, const char *name, char *out, size_t cap);
run_entry *store_find(server *s, const char *name);
void store_add(server *s, run_entry *e);   /* takes e */
void store_replace(server *s, run_entry *e);   /* takes e, in place of the entry of its name (added if none) */
/* The list endpoint's body, rebuilt only when the store changed. */
const char *store_list_json(server *s, size_t *len);
int store_open(server *s, mf_error *err);
/* Reads ROOT/runs/<dir> in full (verifying it) into a new entry; name gets the decoded name. With given, the
 * shard digests it returns (computed from the bytes as they were written) stand for a second hashing pass
 * (mf_run_open_given). */
int store_load_run(const char *dir, const char *name, const char *(*given)(void *ud, const char *file), void *ud,
                   run_entry **out, mf_error *err);
/* Removes a directory tree (nftw); 0 when done. */
int store_remove_tree(const char *path);
/* fsyncs every file in a directory (not below it) and the directory: what is renamed into place is on the disk. */
int store_sync_dir(const char *path);
/* fsyncs a directory alone: an entry just renamed into it is on the disk (best effort). */
void store_fsync_dir(const char *path);
void store_entry_free(run_entry *e);

/* ---- uploads (upload.c) -------------------------------------------------- */

upload *upload_begin(conn *c, const char *name);
/* Body bytes; returns false (and sets the response) when the body is refused. */
bool upload_feed(upload *u, const char *data, size_t len);
/* The request ended: hands the last bytes and the verification to the pool. */
void upload_finish(upload *u);
/* The connection is gone: the upload is dropped and its directory removed. */
void upload_abort(upload *u);
size_t upload_staged(const upload *u);
/* The socket buffer libuv read has been fed: inside a large file, the upload takes the socket over (splice). */
void upload_read_done(upload *u);

/* ---- diffs (diffs.c) ------------------------------------------------------ */

void diffs_post(conn *c, const char *body, size_t len);
void diffs_get(conn *c, const char *rest);
void diffs_conn_gone(conn *c);
/* true while the diff the connection waits for has not begun to be computed */
bool diffs_waiting_to_start(const conn *c);
/* Frees the jobs left when the loop has ended (queued ones whose clients were closed). */
void diffs_free(server *s);

/* ---- connections and responses (http.c) -------------------------------- */

typedef enum conn_state {
    CS_HEADERS,     /* reading a request's headers */
    CS_BODY,        /* reading its body */
    CS_WAIT,        /* the pool is working on it; reading paused */
    CS_DRAIN,       /* a response was sent with Connection: close: discarding what comes */
    CS_CLOSING,
} conn_state;

struct conn {
    server *srv;
    uv_stream_t *stream;
    union { uv_tcp_t tcp; uv_pipe_t pipe; } h;
    uv_timer_t timer;
    http_parser parser;
    conn_state state;
    bool reading;
    bool responded;          /* the current request has its response (or it is being written) */
    bool close_after;        /* close once written */
    bool eof;
    bool kept_alive;         /* a request has been answered on it: the next one is awaited for the idle time */
    char nonce[33];          /* the UI page's script nonce, for its CSP header */
    int writes;              /* writes in flight */
    size_t write_queue_seen; /* bytes that waited in libuv's write queue when the idle timer was last armed */
    int refs;                /* handles open + work items holding the conn */
    conn *prev, *next;
    /* request */
    char url[MAX_URL + 1];
    size_t url_len;
    bool url_overflow;
    char hfield[32];
    size_t hfield_len;
    bool hfield_overflow;
    int hkind;               /* which header value is being read */
    char auth[MF_SERVE_TOKEN_MAX + 16];
    size_t auth_len;
    bool auth_overflow;
    int n_auth;              /* Authorization headers of the request */
    bool expect_continue;
    int n_headers;
    int route;               /* set at headers complete */
    char arg[MAX_URL + 1];   /* the route's argument (a run name, a diff path) */
    mf_buf body;             /* small bodies (POST /api/diffs) */
    upload *up;
    diff_job *waiting;       /* the diff this request waits for */
    conn *wait_next;
    double started;
    size_t got;              /* bytes of the current request received while reading its headers */
    /* the socket buffer being parsed (on_read only): an upload may adopt it instead of copying from it */
    char *rbuf;
    size_t rbuf_len, rbuf_cap;
    bool rbuf_kept;
    /* bytes received after a paused request, fed once it is answered */
    mf_buf leftover;
};

struct server {
    uv_loop_t *loop;
    mf_serve_opts o;
    char root[4096];
    char token[MF_SERVE_TOKEN_MAX + 1];
    bool has_token;
    char read_token[MF_SERVE_TOKEN_MAX + 1];
    bool has_read_token;
    uv_tcp_t listener;
    bool listening;
    uv_signal_t sigint, sigterm;
    http_parser_settings settings;
    conn *conns;
    int n_conns;
    int n_uploads;
    uint64_t seq;            /* unique temporary names */
    /* store */
    run_entry **runs;
    size_t n_runs, cap_runs;
    char *list_cache;
    size_t list_len;
    /* diffs */
    diff_job *jobs;          /* diffs looked up, queued or being computed, newest first */
    bool diff_computing;     /* one diff is computed at a time (diffs.c) */
    uv_mutex_t replace_lock; /* one upload at a time replaces a damaged stored copy (upload.c, pool threads) */
    bool stopping;
    int lock_fd;
    /* the buffer on_read is parsing: an upload freed meanwhile leaves it to on_read */
    char *feeding;
    bool feeding_released;
    /* spare UPLOAD_READ buffers, kept so that reading an upload touches no fresh memory */
    char *spare[48];
    int n_spare;
};

/* Sends a complete response (body copied). */
void conn_respond(conn *c, int status, const char *ctype, const void *body, size_t len);
/* {"error": msg} with the status. */
void conn_error(conn *c, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void conn_json(conn *c, int status, json_t *j);   /* takes j */
/* The pool answered a paused request: continue with what the client sent next. */
void conn_resume(conn *c);
void conn_ref(conn *c);
void conn_unref(conn *c);
void conn_close(conn *c);
bool conn_alive(const conn *c);
/* A socket buffer an upload adopted (UPLOAD_READ bytes) goes back for reuse; the loop thread only. */
void server_rbuf_put(server *s, char *buf);
void server_rbufs_free(server *s);
void conn_stop_reading(conn *c);
void conn_start_reading(conn *c);
/* An upload's staged bytes went to the pool: read the body again (with its idle timer). */
void conn_resume_body(conn *c);
/* Whether the next n body bytes may bypass http-parser: a Content-Length body with more than n bytes left. */
bool conn_body_spliceable(const conn *c, uint64_t n);
/* n body bytes were read past http-parser (spliced into a file): its count of what is left drops by n, and the
 * idle timer starts again. */
void conn_body_spliced(conn *c, uint64_t n);

/* Sets up the parser settings and the listener-independent state. */
void server_init(server *s, uv_loop_t *loop, const mf_serve_opts *o);
/* Adopts an accepted or opened stream as a connection (the fuzz target feeds a socketpair). */
conn *server_adopt_pipe(server *s, int fd);

/* The UI page (ui.c). */
extern const char mf_serve_ui_html[];

#endif
