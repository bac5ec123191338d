/* moeflip serve: the collector service and its push client (issue 8).
 *
 * `moeflip serve` keeps runs pushed from machines of several vendors under a
 * root directory, computes diffs of them on request and serves diff.json, the
 * heatmaps, report.html and a web UI. It runs on one libuv event loop; every
 * disk-heavy or CPU-heavy step (writing and hashing an upload, verifying it,
 * diffing, drawing, reading result files) runs in libuv's thread pool, so the
 * loop never blocks. HTTP is parsed by http-parser.
 *
 * Root layout: ROOT/runs/<hex of the run name>/ (a verified run directory),
 * ROOT/diffs/<id>/ (meta.json, diff.json, report.html, heatmaps), ROOT/.tmp/
 * (uploads and diffs being made; emptied at start). A run appears under runs/
 * only by one rename of a complete, verified directory.
 *
 * `moeflip push` streams a run directory to a server with libcurl in one
 * request (the body format is in push.c and the README), retrying transient
 * failures, and succeeds only when the server answers that it verified the run. */
#ifndef MF_SERVE_H
#define MF_SERVE_H

#include "mf_core.h"

#define MF_SERVE_NAME_MAX 64
#define MF_SERVE_TOKEN_MAX 255

/* A run name: 1..64 characters of [A-Za-z0-9._-], starting with a letter or
 * digit, no "..". Names are only ever compared and hex-encoded, never used as
 * paths. */
bool mf_serve_name_valid(const char *name, size_t len);

/* Reads a token file: refuses one that group or others may read (or write),
 * strips one trailing newline, requires 8..255 printable characters. */
int mf_serve_read_token(const char *path, char *token, size_t cap, mf_error *err);

typedef struct mf_serve_opts {
    const char *root;
    const char *listen;            /* "HOST:PORT" (port 0: any free one) [127.0.0.1:8750] */
    const char *token_file;        /* writes need this bearer token; NULL: the server takes no uploads */
    const char *read_token_file;   /* NULL: reads are open */
    uint64_t max_run_bytes;        /* largest upload body [8 GiB] */
    int max_uploads;               /* concurrent uploads, more get 429 [8] */
    int max_connections;           /* more are closed at once [512] */
    int header_timeout_ms;         /* a request's headers must arrive within this [10000] */
    int idle_timeout_ms;           /* a body, a write or a kept-alive connection stalled this long is closed [30000] */
    int diff_bootstrap;            /* resamples for diffs that do not ask [1000] */
    bool quiet;                    /* no request log */
} mf_serve_opts;

void mf_serve_opts_default(mf_serve_opts *o);

/* Opens the store (verifying every stored run), listens, prints
 * "moeflip serve: listening on http://HOST:PORT ..." on stdout, and serves
 * until SIGINT or SIGTERM. */
int mf_serve(const mf_serve_opts *o, mf_error *err);

typedef struct mf_push_opts {
    const char *run_dir;
    const char *url;               /* the server's base URL, http://HOST:PORT */
    const char *name;              /* NULL: the run directory's base name */
    const char *token_file;        /* NULL: no Authorization header */
    int retries;                   /* transient failures retried this often [5] */
    int stall_s;                   /* an attempt whose body moves no byte this long is retried [60]; 0: the default */
    bool progress;                 /* a progress bar on a terminal */
} mf_push_opts;

typedef struct mf_push_result {
    char name[MF_SERVE_NAME_MAX + 1];
    uint64_t bytes;                /* body bytes sent in the successful attempt */
    bool existed;                  /* the server already held this exact run */
    int attempts;
    double seconds;                /* from the first attempt's start to the verified answer (retries included) */
} mf_push_result;

/* Streams a run to the server; MF_OK only when the server verified it. */
int mf_push(const mf_push_opts *o, mf_push_result *res, mf_error *err);

#endif
