/* libFuzzer target: one input is everything a client sends on one connection
 * (then it half-closes). It goes through the real request path: a socketpair
 * adopted as a connection on the server's loop, http-parser, routing, auth,
 * the upload body format and, for bodies that parse, the pool's writing,
 * verification and storing. The first byte picks how the bytes are cut into
 * writes, so the parser sees requests split at every place.
 *
 * Built with clang -fsanitize=fuzzer,address,undefined (tests/CMakeLists.txt);
 * the corpus is serve/fuzz/corpus. Uploads use the token below. */
#include "serve_int.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

int store_open(server *s, mf_error *err);
int store_remove_tree(const char *path);

static server *srv;
static uv_loop_t loop;
static char root[64];

static void cleanup(void) {
    if (root[0]) store_remove_tree(root);
}

static void setup(void) {
    mf_serve_opts o;
    mf_serve_opts_default(&o);
    o.quiet = true;
    o.max_run_bytes = 1 << 20;
    o.max_uploads = 4;
    o.header_timeout_ms = 2000;
    o.idle_timeout_ms = 2000;
    o.diff_bootstrap = 0;
    snprintf(root, sizeof root, "/tmp/moeflip-fuzz-XXXXXX");
    if (!mkdtemp(root)) abort();
    atexit(cleanup);
    o.root = root;
    uv_loop_init(&loop);
    srv = mf_xcalloc(1, sizeof *srv);
    server_init(srv, &loop, &o);
    snprintf(srv->root, sizeof srv->root, "%s", root);
    snprintf(srv->token, sizeof srv->token, "fuzz-token-0123456789");
    srv->has_token = true;
    mf_error err = {0};
    if (store_open(srv, &err)) {
        fprintf(stderr, "fuzz: %s\n", err.msg);
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!srv) setup();
    if (size == 0) return 0;
    const size_t cut = 1 + (size_t)(data[0] % 64) * (data[0] >= 128 ? 97 : 1);   /* bytes per write */
    data++;
    size--;
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) abort();
    fcntl(sv[1], F_SETFL, O_NONBLOCK);
    if (!server_adopt_pipe(srv, sv[0])) abort();
    size_t off = 0;
    bool closed = false;
    char sink[65536];
    for (int spins = 0; spins < 100000; spins++) {
        bool sent = false;
        if (off < size) {
            size_t n = size - off < cut ? size - off : cut;
            ssize_t w = send(sv[1], data + off, n, MSG_NOSIGNAL);
            if (w > 0) off += (size_t)w, sent = true;
            else if (w < 0 && errno != EAGAIN) off = size;   /* the server closed */
        } else if (!closed) {
            shutdown(sv[1], SHUT_WR);
            closed = true;
        }
        while (read(sv[1], sink, sizeof sink) > 0) {
        }
        if (closed && srv->n_conns == 0 && srv->n_uploads == 0 && !srv->jobs) break;
        /* while the socket takes bytes the loop only looks; when it is full (the server stopped reading, e.g.
         * while its pool writes) or all is sent, the loop waits for an event, so the spin count does not run out
         * on a slow machine */
        uv_run(&loop, sent ? UV_RUN_NOWAIT : UV_RUN_ONCE);
    }
    if (srv->n_conns || srv->n_uploads || srv->jobs) {
        fprintf(stderr, "fuzz: a connection was not finished after its client half-closed\n");
        abort();
    }
    close(sv[1]);
    return 0;
}
