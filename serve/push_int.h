/* The push client's internals, shared by push.c (the request, retries, libcurl's
 * read-callback sender) and push_send.c (the sendfile sender for plain http).
 * Not a public header. */
#ifndef MF_PUSH_INT_H
#define MF_PUSH_INT_H

#include "serve_int.h"

#include <curl/curl.h>

/* One piece of the request body: bytes in memory or a whole file. */
typedef struct push_segment {
    const char *mem;       /* bytes in memory, or */
    char *path;            /* a file */
    uint64_t size;
    char head[128];
} push_segment;

typedef struct push_body {
    push_segment *seg;
    size_t n;
    uint64_t total;
    /* the read callback's position */
    size_t cur;
    uint64_t off;
    int fd;
    size_t ramp;           /* the current attempt's read size while it ramps up to curl's buffer */
    bool failed;           /* a file could not be read: the run is at fault, not the network (msg says why) */
    char msg[600];
    mf_progress prog;
    bool progress;
    char reply[65536];     /* the answer's body, cut at this size */
    size_t reply_len;
} push_body;

/* What one attempt got: a CURLcode for failures on the way (the same codes
 * libcurl gives, so that both senders are retried alike), else the HTTP status
 * of the final answer, its Retry-After seconds and its body in b->reply. */
typedef struct push_outcome {
    CURLcode code;
    long status;
    long retry_after;
} push_outcome;

/* The request's fixed parts, for the sender that writes HTTP itself. */
typedef struct push_request {
    const char *url;              /* the full URL: BASE/api/runs/NAME */
    const char *authorization;    /* "Bearer ..." or NULL */
    const char *content_type;
} push_request;

/* Whether the sendfile sender can carry this URL: plain http with no proxy in
 * libcurl's environment, and not turned off by MOEFLIP_PUSH_SENDFILE=0. */
bool push_send_direct_usable(const char *url);

/* One attempt with the sendfile sender: libcurl connects (CONNECT_ONLY); the
 * request head and the in-memory segments are written with send(2), the
 * shards with sendfile(2) from the page cache, and the answer is read with
 * http-parser. */
push_outcome push_send_direct(const push_request *rq, push_body *b);

#endif
