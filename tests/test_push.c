/* `moeflip push` against a scripted server: the exact request it writes,
 * checked byte for byte against a body built here from the run's files (a
 * wrongly assembled body, e.g. from the read callback's ramp, fails it), and
 * what push does when the server does not say 100 Continue, resets the
 * connection mid-body, refuses before the body, answers with something that
 * is not HTTP, stops taking the body, or takes long to answer a whole one. */
#include "test_serve_util.h"

#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

typedef enum fake_act {
    FAKE_OK,                /* 100 Continue when asked, the whole body, 201 verified */
    FAKE_OK_NO_CONTINUE,    /* the same without ever saying 100 Continue */
    FAKE_HANG_UP,           /* 100 Continue, 64 KiB of the body, then a reset */
    FAKE_REFUSE,            /* 413 at once; what comes in the next 300 ms is counted as body */
    FAKE_NOT_HTTP,          /* the whole body, then an answer that is not HTTP */
    FAKE_SLOW_ANSWER,       /* the whole body, then 12 s of silence (verifying, fsyncing), then 201 verified */
    FAKE_STALL,             /* 100 Continue, 64 KiB of the body, then nothing: the connection held open, unread */
    FAKE_STALL_AT_END,      /* 100 Continue, all but the last 3 MB, then nothing (small receive buffer: the rest
                             * waits in push's send queue, all of it handed to the kernel) */
} fake_act;

typedef struct fake_server {
    int listener;
    int port;
    fake_act acts[4];       /* what to do on each connection; the last one repeats */
    int n_acts;
    int conns;              /* connections taken */
    char head[8192];        /* the last request's head */
    char *body;             /* the last request's body bytes read */
    size_t body_len;
    int held[4];            /* connections of FAKE_STALL, open until fake_stop */
    int n_held;
    bool stop;
    pthread_t thread;
} fake_server;

static const char ok_answer_body[] = "{\"name\": \"r\", \"stored\": \"new\", \"verified\": true}";

static void answer(int fd, const char *status, const char *body) {
    char a[1024];
    int n = snprintf(a, sizeof a, "HTTP/1.1 %s\r\nContent-Type: application/json\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n%s",
                     status, strlen(body), body);
    send_all(fd, a, (size_t)n);
}

/* Reads up to want body bytes into f->body; false when the client went first. */
static bool read_body(fake_server *f, int fd, size_t want) {
    while (f->body_len < want) {
        ssize_t r = recv(fd, f->body + f->body_len, want - f->body_len, 0);
        if (r <= 0) return false;
        f->body_len += (size_t)r;
    }
    return true;
}

/* false when the connection is to be held open */
static bool serve_one(fake_server *f, int fd, fake_act act) {
    struct timeval tv = {20, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    /* the head, byte by byte up to the blank line, so no body byte is taken with it */
    size_t h = 0;
    while (h + 1 < sizeof f->head && !(h >= 4 && !memcmp(f->head + h - 4, "\r\n\r\n", 4))) {
        if (recv(fd, f->head + h, 1, 0) != 1) return true;
        h++;
    }
    f->head[h] = 0;
    const char *cl = strcasestr(f->head, "\r\nContent-Length:");
    size_t length = cl ? strtoull(cl + 17, NULL, 10) : 0;
    bool expect = strcasestr(f->head, "\r\nExpect: 100-continue\r\n") != NULL;
    free(f->body);
    f->body = malloc(length + 1);
    f->body_len = 0;
    static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
    switch (act) {
    case FAKE_OK:
    case FAKE_OK_NO_CONTINUE:
        if (expect && act == FAKE_OK) send_all(fd, cont, sizeof cont - 1);
        if (read_body(f, fd, length)) answer(fd, "201 Created", ok_answer_body);
        break;
    case FAKE_HANG_UP: {
        if (expect) send_all(fd, cont, sizeof cont - 1);
        read_body(f, fd, length < 65536 ? length : 65536);
        struct linger lg = {1, 0};   /* close with a reset, as a crashed server's kernel would */
        setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
        break;
    }
    case FAKE_REFUSE: {
        answer(fd, "413 Payload Too Large", "{\"error\": \"the run is larger than this server takes\"}");
        struct timeval brief = {0, 300000};   /* what the client sends after the refusal: nothing, if it waited as asked */
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &brief, sizeof brief);
        read_body(f, fd, length);
        break;
    }
    case FAKE_NOT_HTTP:
        if (expect) send_all(fd, cont, sizeof cont - 1);
        if (read_body(f, fd, length)) send_all(fd, "SURPRISE 42\r\n\r\n", 15);
        break;
    case FAKE_SLOW_ANSWER: {
        if (expect) send_all(fd, cont, sizeof cont - 1);
        if (!read_body(f, fd, length)) break;
        struct timespec ts = {12, 0};   /* longer than libcurl's low-speed check averages over, plus the stall time */
        nanosleep(&ts, NULL);
        answer(fd, "201 Created", ok_answer_body);
        break;
    }
    case FAKE_STALL:
        if (expect) send_all(fd, cont, sizeof cont - 1);
        read_body(f, fd, length < 65536 ? length : 65536);
        return false;
    case FAKE_STALL_AT_END:
        if (expect) send_all(fd, cont, sizeof cont - 1);
        read_body(f, fd, length > 3000000 ? length - 3000000 : 0);
        return false;
    }
    return true;
}

static void *fake_main(void *arg) {
    fake_server *f = arg;
    while (!__atomic_load_n(&f->stop, __ATOMIC_ACQUIRE)) {
        struct pollfd pf = {.fd = f->listener, .events = POLLIN};
        if (poll(&pf, 1, 50) != 1) continue;
        int fd = accept(f->listener, NULL, NULL);
        if (fd < 0) continue;
        int k = f->conns < f->n_acts ? f->conns : f->n_acts - 1;
        const bool done = serve_one(f, fd, f->acts[k]);
        __atomic_add_fetch(&f->conns, 1, __ATOMIC_RELEASE);
        if (!done && f->n_held < 4) f->held[f->n_held++] = fd;
        else close(fd);
    }
    return NULL;
}

static void fake_start(fake_server *f, const fake_act *acts, int n) {
    memset(f, 0, sizeof *f);
    memcpy(f->acts, acts, (size_t)n * sizeof *acts);
    f->n_acts = n;
    f->listener = socket(AF_INET, SOCK_STREAM, 0);
    const int small = 65536;   /* taken by accepted connections: a window that shuts soon when not read */
    for (int i = 0; i < n; i++)
        if (acts[i] == FAKE_STALL_AT_END) setsockopt(f->listener, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_assert_eq(bind(f->listener, (struct sockaddr *)&a, sizeof a), 0);
    cr_assert_eq(listen(f->listener, 8), 0);
    socklen_t al = sizeof a;
    getsockname(f->listener, (struct sockaddr *)&a, &al);
    f->port = ntohs(a.sin_port);
    pthread_create(&f->thread, NULL, fake_main, f);
}

static void fake_stop(fake_server *f) {
    __atomic_store_n(&f->stop, true, __ATOMIC_RELEASE);
    pthread_join(f->thread, NULL);
    close(f->listener);
    for (int i = 0; i < f->n_held; i++) close(f->held[i]);
}

/* A run of about 12 MB (3 prompts of 512 tokens with full logits, from a synthetic small OLMoE): larger than
 * what loopback's socket buffers hold, so a server can hang up while the body is still being sent. */
static const char *big_run(const char *d) {
    char err[2048], path[600];
    cr_assert_eq(run_moeflip(err, sizeof err, "synth --arch olmoe --size small --seed 5 -o '%s/model'", d), 0, "%s", err);
    snprintf(path, sizeof path, "%s/prompts.jsonl", d);
    FILE *fp = fopen(path, "w");
    cr_assert(fp);
    for (int p = 0; p < 3; p++) {
        fprintf(fp, "{\"id\": \"p%d\", \"tokens\": [", p);
        for (int t = 0; t < 512; t++) fprintf(fp, "%s%d", t ? ", " : "", (p * 7919 + t * 104729) % 4096);
        fprintf(fp, "]}\n");
    }
    fclose(fp);
    static char run[600];
    snprintf(run, sizeof run, "%s/big", d);
    cr_assert_eq(run_moeflip(err, sizeof err, "trace -q --model '%s/model' --input '%s' --out '%s' --record logits --precision bf16", d, path, run),
                 0, "%s", err);
    return run;
}

/* Runs `moeflip push -q RUN --to http://127.0.0.1:PORT` + opts against a fake server acting acts[] on its
 * connections (f: what it saw, stopped); returns push's exit status, its stderr in out. */
static int push_to_fake(fake_server *f, const fake_act *acts, int n_acts, const char *run, const char *opts, char *out, size_t cap) {
    fake_start(f, acts, n_acts);
    int rc = run_moeflip(out, cap, "push -q '%s' --to http://127.0.0.1:%d%s", run, f->port, opts);
    fake_stop(f);
    return rc;
}

/* The last request's body is the run's files as built here. */
static void assert_body_is_run(const fake_server *f, const char *run) {
    size_t want_len;
    char *want = run_body(run, &want_len);
    cr_assert_eq(f->body_len, want_len);
    cr_assert(!memcmp(f->body, want, want_len), "the body differs from the run's files");
    free(want);
}

/* The request: PUT to the URL's path, Host, the bearer token, the content type and length, Expect: 100-continue,
 * and a body equal to the one built here from the run's files. */
Test(push, writes_the_run_as_one_request) {
    const char *d = temp_dir();
    const char *run = make_run(d, "r", "hf/olmoe", "--precision fp64 --record logits");
    char opts[700], out[2048];
    snprintf(opts, sizeof opts, "/prefix/ --token-file '%s'", token_file(d));   /* the URL's path goes on after the port */
    fake_server f;
    cr_assert_eq(push_to_fake(&f, (fake_act[]){FAKE_OK}, 1, run, opts, out, sizeof out), 0, "%s", out);
    cr_assert_eq(f.conns, 1);
    assert_body_is_run(&f, run);
    char line[256];
    snprintf(line, sizeof line, "\r\nHost: 127.0.0.1:%d\r\n", f.port);
    cr_assert(!strncmp(f.head, "PUT /prefix/api/runs/r HTTP/1.1\r\n", 33), "%s", f.head);
    cr_assert(strstr(f.head, line), "%s", f.head);
    cr_assert(strstr(f.head, "\r\nAuthorization: Bearer " TEST_TOKEN "\r\n"), "%s", f.head);
    cr_assert(strstr(f.head, "\r\nContent-Type: application/x-moeflip-run\r\n"), "%s", f.head);
    cr_assert(strcasestr(f.head, "\r\nExpect: 100-continue\r\n"), "%s", f.head);
    snprintf(line, sizeof line, "\r\nContent-Length: %zu\r\n", f.body_len);
    cr_assert(strstr(f.head, line), "%s", f.head);
    free(f.body);
}

/* A server that never says 100 Continue still gets the body (after libcurl's wait of about a second). */
Test(push, body_goes_without_100_continue) {
    const char *run = make_run(temp_dir(), "r", "hf/olmoe", "--precision fp64");
    fake_server f;
    char out[2048];
    cr_assert_eq(push_to_fake(&f, (fake_act[]){FAKE_OK_NO_CONTINUE}, 1, run, "", out, sizeof out), 0, "%s", out);
    cr_assert_eq(f.conns, 1);
    assert_body_is_run(&f, run);
    free(f.body);
}

/* A server that resets the connection mid-body: the push is sent again, whole, on a new connection. */
Test(push, hang_up_mid_body_is_retried) {
    const char *run = big_run(temp_dir());
    fake_server f;
    char out[2048];
    cr_assert_eq(push_to_fake(&f, (fake_act[]){FAKE_HANG_UP, FAKE_OK}, 2, run, " --retries 2", out, sizeof out), 0, "%s", out);
    cr_assert_gt(f.body_len, 4u << 20, "the body must be larger than the loopback socket's buffers");
    cr_assert_eq(f.conns, 2);
    assert_body_is_run(&f, run);
    free(f.body);
}

/* A server that refuses the request before its body: push reports the answer, sends no body, and does not retry
 * a 413. */
Test(push, refusal_before_the_body) {
    const char *run = make_run(temp_dir(), "r", "hf/olmoe", "--precision fp64");
    fake_server f;
    char out[2048];
    cr_assert_eq(push_to_fake(&f, (fake_act[]){FAKE_REFUSE}, 1, run, " --retries 3", out, sizeof out), 1);
    cr_assert_str_eq(out, "moeflip: push r: the server answered 413: the run is larger than this server takes\n");
    cr_assert_eq(f.conns, 1);
    cr_assert(strcasestr(f.head, "\r\nExpect: 100-continue\r\n"), "%s", f.head);
    cr_assert_eq(f.body_len, 0, "%zu body bytes came after the refusal", f.body_len);
    free(f.body);
}

/* An answer that is not HTTP: one line, exit 1, no retry. */
Test(push, answer_that_is_not_http) {
    const char *run = make_run(temp_dir(), "r", "hf/olmoe", "--precision fp64");
    fake_server f;
    char out[2048];
    cr_assert_eq(push_to_fake(&f, (fake_act[]){FAKE_NOT_HTTP}, 1, run, " --retries 3", out, sizeof out), 1);
    cr_assert(strstr(out, "push r to http://127.0.0.1:") && strstr(out, ": the answer is not HTTP ("), "%s", out);
    cr_assert_eq(strchr(out, '\n'), out + strlen(out) - 1, "one line: %s", out);
    cr_assert_eq(f.conns, 1);
    free(f.body);
}

/* A server that has the whole body and takes its time to verify and store it (12 s here, minutes for a large run
 * on a slow disk) is waited for: the stall timeout is for a body that stops moving, not for the answer. */
Test(push, a_slow_answer_is_waited_for, .timeout = 60) {
    const char *run = make_run(temp_dir(), "r", "hf/olmoe", "--precision fp64");
    fake_server f;
    char out[2048];
    const fake_act acts[] = {FAKE_SLOW_ANSWER};
    const double t0 = mf_now();
    int rc = push_to_fake(&f, acts, 1, run, " --stall-timeout 1", out, sizeof out);
    cr_assert_eq(rc, 0, "push failed: %s", out);
    cr_assert_eq(f.conns, 1, "the run was sent %d times", f.conns);
    cr_assert_geq(mf_now() - t0, 11.9);
    assert_body_is_run(&f, run);
    free(f.body);
}

/* A server that acts `stall` on the first connection (taking part of the body, keeping the connection open) and
 * takes the whole body on the second: push gives the attempt up after --stall-timeout and sends the run again,
 * whole, on the new connection. */
static void check_stall_is_sent_again(fake_act stall) {
    const char *run = big_run(temp_dir());
    fake_server f;
    char out[2048];
    const fake_act acts[] = {stall, FAKE_OK};
    const double t0 = mf_now();
    int rc = push_to_fake(&f, acts, 2, run, " --stall-timeout 1", out, sizeof out);
    const double dt = mf_now() - t0;
    cr_assert_eq(rc, 0, "push failed: %s", out);
    cr_assert_eq(f.conns, 2, "%d connections", f.conns);
    cr_assert_lt(dt, 20, "the stall was noticed only after %.1f s", dt);
    assert_body_is_run(&f, run);
    free(f.body);
}

/* The server stops after 64 KiB of the body. */
Test(push, a_stalled_body_is_sent_again, .timeout = 60) { check_stall_is_sent_again(FAKE_STALL); }

/* The server stops with the last 3 MB unread: push has handed every byte to the kernel, so only the socket's send
 * queue shows that the body is not through; still a stall, not a wait for the answer. */
Test(push, a_body_stalled_at_its_end_is_sent_again, .timeout = 60) { check_stall_is_sent_again(FAKE_STALL_AT_END); }
