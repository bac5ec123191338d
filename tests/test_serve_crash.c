/* The collector under failures: fifty concurrent pushes with random
 * disconnects, then a SIGKILL with uploads in flight and a restart; push
 * processes killed at random moments; push retrying until a server is up.
 * Exactly the completed pushes are stored, and nothing partial is. */
#include "test_serve_util.h"
#include "mf_serve.h"
#include "mf_trace.h"

#include <criterion/criterion.h>
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ---- 50 concurrent pushes, random disconnects, then a crash and a restart ---- */
typedef struct pusher {
    int port;
    char name[32];
    const char *body;
    size_t len;
    size_t cut;          /* disconnect after this many body bytes; len: complete */
    bool rst;            /* disconnect with a reset instead of a close */
    int head_cut;        /* > 0: disconnect after this many bytes of the request's headers */
    int status;          /* final answer */
    int tries;
} pusher;

static void *push_thread(void *arg) {
    pusher *p = arg;
    for (p->tries = 1; p->tries <= 200; p->tries++) {
        int fd = http_connect(p->port);
        if (fd < 0) {
            sleep_ms(20);
            continue;
        }
        char head[512];
        int hl = snprintf(head, sizeof head, "PUT /api/runs/%s HTTP/1.1\r\nHost: x\r\n" AUTH "Content-Length: %zu\r\n\r\n", p->name, p->len);
        if (p->head_cut > 0 && p->head_cut < hl) {
            send_all(fd, head, (size_t)p->head_cut);
            close(fd);
            p->status = -1;
            return NULL;
        }
        send_all(fd, head, (size_t)hl);
        const size_t upto = p->cut < p->len ? p->cut : p->len;
        bool ok = true;
        for (size_t off = 0; off < upto && ok; off += 16384) {
            size_t c = upto - off < 16384 ? upto - off : 16384;
            ok = send_all(fd, p->body + off, c);
        }
        if (p->cut < p->len) {
            if (p->rst) {
                struct linger lg = {1, 0};
                setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
            }
            close(fd);
            p->status = -1;
            return NULL;
        }
        http_resp r;
        http_read(fd, &r);
        close(fd);
        p->status = r.status;
        http_free(&r);
        if (p->status != 429 && p->status != 0) return NULL;
        sleep_ms(10 + (int)(p->tries % 7) * 5);
    }
    return NULL;
}

Test(crash, fifty_concurrent_pushes_with_disconnects_then_crash_and_restart, .timeout = 120) {
    const char *d = temp_dir();
    const char *runs[2] = {make_run(d, "a", "hf/olmoe", "--precision fp64"), make_run(d, "b", "hf/qwen2_moe", "--precision bf16")};
    char root[600], extra[700];
    test_server s;
    server_start_in(&s, d, "--max-uploads 12 --quiet", root, extra);
    size_t lens[2];
    char *bodies[2] = {run_body(runs[0], &lens[0]), run_body(runs[1], &lens[1])};
    enum { N = 50 };
    pusher ps[N];
    pthread_t th[N];
    mf_rng rng;
    const uint64_t seed = getenv("MOEFLIP_TEST_SEED") ? strtoull(getenv("MOEFLIP_TEST_SEED"), NULL, 10) : (uint64_t)time(NULL);
    mf_rng_seed(&rng, seed);
    for (int i = 0; i < N; i++) {
        pusher *p = &ps[i];
        memset(p, 0, sizeof *p);
        p->port = s.port;
        snprintf(p->name, sizeof p->name, "run-%02d", i);
        p->body = bodies[i % 2];
        p->len = lens[i % 2];
        p->cut = p->len;
        if (mf_rng_uniform(&rng) < 0.4) {   /* disconnects anywhere from right after the headers to one byte short */
            p->cut = (size_t)(mf_rng_uniform(&rng) * (double)p->len);
            p->rst = mf_rng_uniform(&rng) < 0.5;
            if (mf_rng_uniform(&rng) < 0.15) p->head_cut = 1 + (int)(mf_rng_uniform(&rng) * 90);   /* inside the headers */
        }
    }
    for (int i = 0; i < N; i++) pthread_create(&th[i], NULL, push_thread, &ps[i]);
    for (int i = 0; i < N; i++) pthread_join(th[i], NULL);
    cr_assert(server_alive(&s), "the server died under the pushes");
    /* exactly the completed pushes are listed; each stored run verifies */
    char want[N * 8] = "";
    int completed = 0;
    for (int i = 0; i < N; i++) {
        if (ps[i].cut < ps[i].len) continue;
        cr_assert_eq(ps[i].status, 201, "%s: %d after %d tries (MOEFLIP_TEST_SEED=%llu)", ps[i].name, ps[i].status, ps[i].tries,
                     (unsigned long long)seed);
        if (completed++) strcat(want, ",");
        strcat(want, ps[i].name);
    }
    cr_assert_gt(completed, 10);
    char *names = list_names(s.port, NULL);
    cr_assert_str_eq(names, want, "MOEFLIP_TEST_SEED=%llu", (unsigned long long)seed);
    free(names);
    char p[700];
    snprintf(p, sizeof p, "%s/.tmp", root);
    for (int i = 0; i < 200 && dir_entries(p) != 0; i++) sleep_ms(20);
    cr_assert_eq(dir_entries(p), 0, "dropped uploads leave nothing behind");
    /* uploads in flight when the server is killed */
    int held[6];
    for (int i = 0; i < 6; i++) {
        char nm[32];
        snprintf(nm, sizeof nm, "inflight-%d", i);
        held[i] = open_upload(s.port, nm, bodies[i % 2], lens[i % 2], lens[i % 2] - 1 - (size_t)i * 1000);
    }
    sleep_ms(200);
    int st = server_stop(&s, SIGKILL);
    cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "the server had exited before the kill: %d", st);
    for (int i = 0; i < 6; i++) close(held[i]);
    server_start(&s, root, extra);
    names = list_names(s.port, NULL);
    cr_assert_str_eq(names, want, "after the restart");
    free(names);
    cr_assert_eq(dir_entries(p), 0, "the restart drops what was being uploaded");
    snprintf(p, sizeof p, "%s/runs", root);
    cr_assert_eq(dir_entries(p), completed, "no partial run directory");
    for (int i = 0; i < N; i++)
        if (ps[i].cut == ps[i].len) assert_stored_verifies(root, ps[i].name, runs[i % 2]);
    /* the same run again is harmless; different content under a taken name is a conflict */
    http_resp r;
    put_run(s.port, ps[0].cut == ps[0].len ? "run-00" : "fresh", runs[0], AUTH, &r);
    cr_assert(r.status == 200 || r.status == 201, "%d %s", r.status, r.body);
    http_free(&r);
    put_run(s.port, "run-00", runs[1], AUTH, &r);
    cr_assert_eq(r.status, ps[0].cut == ps[0].len ? 409 : 201, "%d %s", r.status, r.body);
    http_free(&r);
    cr_assert(server_alive(&s));
    server_stop(&s, SIGKILL);
    free(bodies[0]);
    free(bodies[1]);
}

/* Real `moeflip push` processes killed at random moments: a push that exited 0 is stored and verifies;
 * one that was killed is either absent or complete and verified; nothing partial. */
Test(crash, push_processes_killed_at_random_moments, .timeout = 120) {
    const char *d = temp_dir();
    const char *run = make_run(d, "big", "hf/qwen2_moe", "--precision fp64 --record full");
    char root[600], extra[700];
    snprintf(root, sizeof root, "%s/root", d);
    const char *tok = token_file(d);
    snprintf(extra, sizeof extra, "--token-file '%s' --quiet", tok);
    test_server s;
    server_start(&s, root, extra);
    enum { N = 12 };
    pid_t pids[N];
    bool killed[N];
    int status[N];
    mf_rng rng;
    const uint64_t seed = getenv("MOEFLIP_TEST_SEED") ? strtoull(getenv("MOEFLIP_TEST_SEED"), NULL, 10) : (uint64_t)time(NULL);
    mf_rng_seed(&rng, seed ^ 0x5eed);
    for (int i = 0; i < N; i++) {
        char name[32], url[64];
        snprintf(name, sizeof name, "p%02d", i);
        snprintf(url, sizeof url, "http://127.0.0.1:%d", s.port);
        pids[i] = fork();
        if (pids[i] == 0) {
            execl(MF_TEST_BIN, MF_TEST_BIN, "push", "-q", run, "--name", name, "--to", url, "--token-file", tok, "--retries", "20",
                  (char *)NULL);
            _exit(127);
        }
    }
    for (int i = 0; i < N; i++) {
        killed[i] = mf_rng_uniform(&rng) < 0.5;
        if (killed[i]) {
            sleep_ms((int)(mf_rng_uniform(&rng) * 30));
            kill(pids[i], SIGKILL);
        }
    }
    int done_ok = 0;
    for (int i = 0; i < N; i++) {
        int st;
        waitpid(pids[i], &st, 0);
        status[i] = st;
        if (WIFEXITED(st)) {
            cr_assert_eq(WEXITSTATUS(st), 0, "push p%02d failed (MOEFLIP_TEST_SEED=%llu)", i, (unsigned long long)seed);
            done_ok++;
        } else {
            cr_assert(killed[i] && WIFSIGNALED(st), "push p%02d ended oddly: %d", i, st);
        }
    }
    cr_assert(server_alive(&s), "the server died");
    char p[700];
    snprintf(p, sizeof p, "%s/.tmp", root);
    for (int i = 0; i < 200 && dir_entries(p) != 0; i++) sleep_ms(20);
    cr_assert_eq(dir_entries(p), 0, "dropped uploads leave nothing behind");
    server_stop(&s, SIGKILL);
    server_start(&s, root, extra);
    char *names = list_names(s.port, NULL);
    int listed = 0;
    for (int i = 0; i < N; i++) {
        char name[32];
        snprintf(name, sizeof name, "p%02d", i);
        const bool present = strstr(names, name) != NULL;
        if (WIFEXITED(status[i])) cr_assert(present, "%s exited 0 but is not stored", name);
        if (present) {
            assert_stored_verifies(root, name, run);
            listed++;
        }
    }
    snprintf(p, sizeof p, "%s/runs", root);
    cr_assert_eq(dir_entries(p), listed, "no partial run directory");
    cr_assert_geq(listed, done_ok);
    free(names);
    server_stop(&s, SIGKILL);
}

Test(crash, push_retries_until_the_server_is_up, .timeout = 60) {
    const char *d = temp_dir();
    const char *run = make_run(d, "r", "hf/olmoe", "--precision fp64");
    /* a free port: bind, read, close */
    int probe = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_assert_eq(bind(probe, (struct sockaddr *)&a, sizeof a), 0);
    socklen_t al = sizeof a;
    getsockname(probe, (struct sockaddr *)&a, &al);
    int port = ntohs(a.sin_port);
    close(probe);
    char out[2048];
    /* nobody there and no retries: exit 1, one line */
    cr_assert_eq(run_moeflip(out, sizeof out, "push -q '%s' --to http://127.0.0.1:%d --retries 0", run, port), 1);
    cr_assert(strstr(out, "Couldn't connect"), "%s", out);
    cr_assert_eq(strchr(out, '\n'), out + strlen(out) - 1, "one line: %s", out);
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "push -q '%s' --to http://127.0.0.1:%d --token-file '%s' --retries 6", run, port, token_file(d));
    pid_t pid = fork();
    if (pid == 0) _exit(run_moeflip(NULL, 0, "%s", cmd));
    sleep_ms(700);
    char root[600], extra[700];
    snprintf(root, sizeof root, "%s/root", d);
    snprintf(extra, sizeof extra, "--token-file '%s/token'", d);
    /* the server comes up on that port */
    char full[2000];
    snprintf(full, sizeof full, "%s --listen 127.0.0.1:%d", extra, port);
    test_server s;
    server_start(&s, root, full);
    int st;
    waitpid(pid, &st, 0);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "push gave up: %d", st);
    char *names = list_names(s.port, NULL);
    cr_assert_str_eq(names, "r");
    free(names);
    server_stop(&s, SIGKILL);
}
