/* Helpers of the collector-service tests: a `moeflip serve` child process on
 * an ephemeral loopback port, raw HTTP over sockets, run directories as
 * upload bodies. */
#ifndef MF_SERVE_UTIL_H
#define MF_SERVE_UTIL_H

#include "testutil.h"

#include <sys/types.h>

typedef struct test_server {
    pid_t pid;
    int port;
    char root[512];
    char err_path[600];
} test_server;

#define TEST_TOKEN "test-token-0123456789"
#define AUTH "Authorization: Bearer " TEST_TOKEN "\r\n"   /* the header of a write */

/* A token file (mode 0600) holding TEST_TOKEN, in dir. */
const char *token_file(const char *dir);
/* Starts `moeflip serve --root ROOT --listen 127.0.0.1:0 EXTRA` and reads its port. */
void server_start(test_server *s, const char *root, const char *extra);
/* The usual server of a test: ROOT = DIR/root (into root), writes need TEST_TOKEN's file in DIR, plus
 * the options `more`; the whole option string is left in extra, for restarts with server_start. */
void server_start_in(test_server *s, const char *dir, const char *more, char root[600], char extra[700]);
/* true while the child runs */
bool server_alive(test_server *s);
/* Sends sig and reaps the child; returns its wait status. */
int server_stop(test_server *s, int sig);

typedef struct http_resp {
    int status;           /* 0 when no response came */
    char head[8192];
    char *body;
    size_t body_len;
} http_resp;

int http_connect(int port);
bool send_all(int fd, const void *p, size_t n);
/* Reads one response (Content-Length or until close). */
void http_read(int fd, http_resp *r);
/* One request on a new connection: extra headers end in \r\n each. */
void http_request(int port, const char *method, const char *path, const char *headers, const void *body, size_t len,
                  http_resp *r);
void http_free(http_resp *r);

/* The upload body of a run directory. */
char *run_body(const char *dir, size_t *len);
/* Hex of a run name: its directory under ROOT/runs. */
void name_hex(const char *name, char *out);
/* PUT /api/runs/NAME with the run directory dir as the body, with the extra headers (e.g. AUTH). */
void put_run(int port, const char *name, const char *dir, const char *headers, http_resp *r);
/* Opens an upload of a body of len bytes under name and sends its headers and its first send_n bytes; the socket. */
int open_upload(int port, const char *name, const char *body, size_t len, size_t send_n);
/* The stored copy of run name under ROOT opens with mf_run_open (manifest and every shard digest), and its manifest
 * is orig_dir's byte for byte. */
void assert_stored_verifies(const char *root, const char *name, const char *orig_dir);
/* The names in a list response, sorted, joined by ','. */
char *list_names(int port, const char *auth_header);

#endif
