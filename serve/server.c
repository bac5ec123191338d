/* mf_serve: options, tokens, the store, the listener, signals, shutdown. */
#include "serve_int.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>

int server_listen(server *s, mf_error *err);
int store_open(server *s, mf_error *err);
void store_free(server *s);

void mf_serve_opts_default(mf_serve_opts *o) {
    memset(o, 0, sizeof *o);
    o->listen = "127.0.0.1:8750";
    o->max_run_bytes = 8ull << 30;
    o->max_uploads = 8;
    o->max_connections = 512;
    o->header_timeout_ms = 10000;
    o->idle_timeout_ms = 30000;
    o->diff_bootstrap = 1000;
}

static void close_walk(uv_handle_t *h, void *arg) {
    (void)arg;
    if (!uv_is_closing(h)) uv_close(h, NULL);
}

static void on_signal(uv_signal_t *h, int signum) {
    server *s = h->data;
    server_log(s, "stopping (signal %d)", signum);
    s->stopping = true;
    if (s->listening) {
        uv_close((uv_handle_t *)&s->listener, NULL);
        s->listening = false;
    }
    for (conn *c = s->conns; c; c = c->next) conn_close(c);
    uv_close((uv_handle_t *)&s->sigint, NULL);
    uv_close((uv_handle_t *)&s->sigterm, NULL);
}

int mf_serve(const mf_serve_opts *o, mf_error *err) {
    if (!o->root) return mf_fail(err, MF_EINVAL, "serve needs --root DIR");
    if (o->max_uploads < 1 || o->max_connections < 1 || o->header_timeout_ms < 1 || o->idle_timeout_ms < 1)
        return mf_fail(err, MF_EINVAL, "limits and timeouts must be positive");
    /* the pool runs uploads and diffs side by side; 4 is libuv's default */
    if (!getenv("UV_THREADPOOL_SIZE")) setenv("UV_THREADPOOL_SIZE", "4", 0);
    signal(SIGPIPE, SIG_IGN);
    server *s = mf_xcalloc(1, sizeof *s);
    uv_loop_t loop;
    uv_loop_init(&loop);
    server_init(s, &loop, o);
    snprintf(s->root, sizeof s->root, "%s", o->root);
    int rc = MF_OK;
    if (o->token_file) {
        if ((rc = mf_serve_read_token(o->token_file, s->token, sizeof s->token, err))) goto out;
        s->has_token = true;
    }
    if (o->read_token_file) {
        if ((rc = mf_serve_read_token(o->read_token_file, s->read_token, sizeof s->read_token, err))) goto out;
        s->has_read_token = true;
    }
    if ((rc = store_open(s, err))) goto out;
    if ((rc = server_listen(s, err))) goto out;
    struct sockaddr_storage addr;
    int alen = sizeof addr;
    char host[128] = "?";
    int port = 0;
    uv_tcp_getsockname(&s->listener, (struct sockaddr *)&addr, &alen);
    if (addr.ss_family == AF_INET6) {
        uv_ip6_name((struct sockaddr_in6 *)&addr, host, sizeof host);
        port = ntohs(((struct sockaddr_in6 *)&addr)->sin6_port);
    } else {
        uv_ip4_name((struct sockaddr_in *)&addr, host, sizeof host);
        port = ntohs(((struct sockaddr_in *)&addr)->sin_port);
    }
    uv_signal_init(&loop, &s->sigint);
    uv_signal_init(&loop, &s->sigterm);
    s->sigint.data = s->sigterm.data = s;
    uv_signal_start(&s->sigint, on_signal, SIGINT);
    uv_signal_start(&s->sigterm, on_signal, SIGTERM);
    const bool loopback = !strcmp(host, "127.0.0.1") || !strcmp(host, "::1");
    printf("moeflip serve: listening on http://%s%s%s:%d (root %s, %zu runs, uploads %s, reads %s)\n", addr.ss_family == AF_INET6 ? "[" : "",
           host, addr.ss_family == AF_INET6 ? "]" : "", port, s->root, s->n_runs, s->has_token ? "need the token" : "off",
           s->has_read_token ? "need a token" : "open");
    fflush(stdout);
    if (!loopback && !s->has_read_token)
        server_log(s, "warning: listening beyond loopback with open reads: anyone who reaches %s can read every run", host);
    uv_run(&loop, UV_RUN_DEFAULT);
out:
    if (s->listening) uv_close((uv_handle_t *)&s->listener, NULL);
    for (conn *c = s->conns; c; c = c->next) conn_close(c);
    uv_run(&loop, UV_RUN_DEFAULT);   /* let closes and pool work finish */
    diffs_free(s);
    store_free(s);
    server_rbufs_free(s);
    uv_mutex_destroy(&s->replace_lock);
    if (uv_loop_close(&loop) != 0) {
        uv_walk(&loop, close_walk, NULL);
        uv_run(&loop, UV_RUN_DEFAULT);
        uv_loop_close(&loop);
    }
    explicit_bzero(s->token, sizeof s->token);
    explicit_bzero(s->read_token, sizeof s->read_token);
    free(s);
    return rc;
}
