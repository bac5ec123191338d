/* libFuzzer target: one input is everything a client sends on one connection.
 * It goes through the real request path: a socketpair adopted as a connection
 * on the server's loop, http-parser, routing, auth, the upload body format
 * and, for bodies that parse, the pool's writing, verification and storing,
 * and diffs of the two runs the store starts with.
 *
 * The first byte of an input says how it is sent: its low six bits and its top
 * bit how many bytes go in each write (so the parser sees requests split at
 * every place), and bit 6 when the client closes its side: clear, as soon as
 * all is sent (requests cut short, answers to a closed side); set, once the
 * server has answered everything and waits for the next request (so diffs are
 * computed and their answers written). Header and idle timeouts are 100 ms, so
 * inputs that stop mid-request reach the timeouts.
 *
 * Built with clang -fsanitize=fuzzer,address,undefined and small upload sizes
 * (tests/CMakeLists.txt); the corpus is tests/fuzz/corpus/serve. Uploads use the
 * token below. MOEFLIP_FUZZ_RUNS names a directory holding runs "fa" and "fb"
 * (the ctest fixture traces them) that the store is started with; without it
 * the store starts empty. */
#include "serve_int.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

static server *srv;
static uv_loop_t loop;
static char root[64];

static void cleanup(void) {
    if (root[0]) store_remove_tree(root);
}

/* Copies DIR/name/{manifest.json,part-00000.safetensors} into the store's directory for name. */
static void seed_run(const char *dir, const char *name) {
    char to[4300], from[4300], src[4400], dst[4400];
    store_dir_of(srv, name, to, sizeof to);
    snprintf(from, sizeof from, "%s/%s", dir, name);
    mf_error err = {0};
    if (mf_mkdir_p(to, &err)) abort();
    static const char *files[] = {"manifest.json", "part-00000.safetensors"};
    for (int i = 0; i < 2; i++) {
        char *text;
        size_t len;
        snprintf(src, sizeof src, "%s/%s", from, files[i]);
        snprintf(dst, sizeof dst, "%s/%s", to, files[i]);
        if (mf_read_file(src, &text, &len, &err) || mf_write_file_atomic(dst, text, len, &err)) {
            fprintf(stderr, "fuzz: %s\n", err.msg);
            abort();
        }
        free(text);
    }
}

static void setup(void) {
    mf_serve_opts o;
    mf_serve_opts_default(&o);
    o.quiet = true;
    o.max_run_bytes = 1 << 20;
    o.max_uploads = 4;
    o.header_timeout_ms = 100;
    o.idle_timeout_ms = 100;
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
    const char *runs = getenv("MOEFLIP_FUZZ_RUNS");
    if (runs && *runs) {
        seed_run(runs, "fa");
        seed_run(runs, "fb");
    }
    mf_error err = {0};
    if (store_open(srv, &err)) {
        fprintf(stderr, "fuzz: %s\n", err.msg);
        abort();
    }
}

/* The server has read and answered all it was sent (fd: its end) and waits for the next request, or has closed. */
static bool server_idle(int fd) {
    if (srv->jobs || srv->n_uploads) return false;
    const conn *c = srv->conns;
    if (!c) return true;
    if (c->state != CS_HEADERS || c->got || c->writes || c->leftover.n) return false;
    int unread = 0;   /* the connection is open, so fd is still its descriptor */
    return ioctl(fd, FIONREAD, &unread) != 0 || unread == 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!srv) setup();
    if (size == 0) return 0;
    const size_t cut = 1 + (size_t)(data[0] % 64) * (data[0] >= 128 ? 97 : 1);   /* bytes per write */
    const bool close_when_answered = data[0] & 64;
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
        } else if (!closed && (!close_when_answered || server_idle(sv[0]))) {
            shutdown(sv[1], SHUT_WR);
            closed = true;
        }
        ssize_t got;
        while ((got = read(sv[1], sink, sizeof sink)) > 0) {
        }
        if (got == 0 && !closed) {   /* the server has closed its side: so does the client (what comes now is dropped) */
            shutdown(sv[1], SHUT_WR);
            closed = true;
            off = size;
        }
        if (closed && srv->n_conns == 0 && srv->n_uploads == 0 && !srv->jobs) break;
        /* while the socket takes bytes the loop only looks; when it is full (the server stopped reading, e.g.
         * while its pool writes) or all is sent, the loop waits for an event (a read, the pool, a timer), so
         * the spin count does not run out on a slow machine */
        uv_run(&loop, sent ? UV_RUN_NOWAIT : UV_RUN_ONCE);
    }
    if (srv->n_conns || srv->n_uploads || srv->jobs) {
        fprintf(stderr, "fuzz: a connection was not finished after its client half-closed\n");
        abort();
    }
    close(sv[1]);
    return 0;
}
