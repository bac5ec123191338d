/* The collector's HTTP side: tokens, hostile names, limits (413, 429),
 * malformed requests, slow and stalled clients and kept-alive connections,
 * and upload bodies as they can arrive: spliced in pieces, cut off, chunked. */
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

Test(http, token_file_readable_by_others_refuses_to_start) {
    const char *d = temp_dir();
    const char *tok = token_file(d);
    chmod(tok, 0644);
    char err[2048], root[600];
    snprintf(root, sizeof root, "%s/root", d);
    int rc = run_moeflip(err, sizeof err, "serve --root '%s' --listen 127.0.0.1:0 --token-file '%s'", root, tok);
    cr_assert_eq(rc, 1);
    cr_assert(strstr(err, "group or others") && strstr(err, "chmod 600"), "%s", err);
    cr_assert_null(strstr(err, TEST_TOKEN), "the token is never printed");
    cr_assert_eq(strchr(err, '\n'), err + strlen(err) - 1, "one line: %s", err);
    chmod(tok, 0640);
    cr_assert_eq(run_moeflip(err, sizeof err, "serve --root '%s' --listen 127.0.0.1:0 --token-file '%s'", root, tok), 1);
}

Test(http, writes_need_the_token_401_and_reads_token) {
    const char *d = temp_dir();
    const char *run = make_run(d, "r", "hf/olmoe", "--precision fp64");
    char root[600], extra[1400], rtok_dir[600];
    snprintf(root, sizeof root, "%s/root", d);
    snprintf(rtok_dir, sizeof rtok_dir, "%s/rt", d);
    mkdir(rtok_dir, 0700);
    /* a read token different from the write token */
    char rtok[700];
    snprintf(rtok, sizeof rtok, "%s/token", rtok_dir);
    FILE *fp = fopen(rtok, "w");
    fputs("reader-secret-42\n", fp);
    fclose(fp);
    chmod(rtok, 0600);
    snprintf(extra, sizeof extra, "--token-file '%s' --read-token-file '%s'", token_file(d), rtok);
    test_server s;
    server_start(&s, root, extra);
    http_resp r;
    put_run(s.port, "r", run, NULL, &r);
    cr_assert_eq(r.status, 401, "no token: %d %s", r.status, r.body);
    cr_assert(strstr(r.head, "WWW-Authenticate: Bearer"));
    http_free(&r);
    put_run(s.port, "r", run, "Authorization: Bearer test-token-0123456788\r\n", &r);
    cr_assert_eq(r.status, 401, "wrong token: %d", r.status);
    http_free(&r);
    put_run(s.port, "r", run, "Authorization: Bearer test-token-0123456789x\r\n", &r);
    cr_assert_eq(r.status, 401, "longer token: %d", r.status);
    http_free(&r);
    put_run(s.port, "r", run, "Authorization: Bearer reader-secret-42\r\n", &r);
    cr_assert_eq(r.status, 401, "the read token does not write: %d", r.status);
    http_free(&r);
    put_run(s.port, "r", run, "Authorization: Basic dGVzdA==\r\n", &r);
    cr_assert_eq(r.status, 401);
    http_free(&r);
    put_run(s.port, "r", run, AUTH, &r);
    cr_assert_eq(r.status, 201, "%d %s", r.status, r.body);
    http_free(&r);
    /* reads: 401 without a token, 200 with either */
    http_request(s.port, "GET", "/api/runs", NULL, NULL, 0, &r);
    cr_assert_eq(r.status, 401);
    http_free(&r);
    http_request(s.port, "GET", "/api/runs/r/manifest.json", "Authorization: Bearer nope-nope-nope\r\n", NULL, 0, &r);
    cr_assert_eq(r.status, 401);
    http_free(&r);
    char *names = list_names(s.port, "Authorization: Bearer reader-secret-42\r\n");
    cr_assert_str_eq(names, "r");
    free(names);
    names = list_names(s.port, AUTH);
    cr_assert_str_eq(names, "r");
    free(names);
    /* the page itself holds no data and loads without a token */
    http_request(s.port, "GET", "/", NULL, NULL, 0, &r);
    cr_assert_eq(r.status, 200);
    cr_assert(strstr(r.body, "<title>moeflip runs</title>"));
    http_free(&r);
    /* push with a wrong token: exit 1, one line naming the 401, no retries needed */
    char out[2048], bad_dir[700];
    snprintf(bad_dir, sizeof bad_dir, "%s/bad", d);
    mkdir(bad_dir, 0700);
    fp = fopen(strcat(bad_dir, "/token"), "w");
    fputs("not-the-token-at-all\n", fp);
    fclose(fp);
    chmod(bad_dir, 0600);
    cr_assert_eq(run_moeflip(out, sizeof out, "push -q '%s' --name r2 --to http://127.0.0.1:%d --token-file '%s'", run, s.port, bad_dir), 1);
    cr_assert(strstr(out, "401"), "%s", out);
    cr_assert_null(strstr(out, "not-the-token-at-all"));
    FILE *ef = fopen(s.err_path, "r");
    char log[16384];
    size_t ln = fread(log, 1, sizeof log - 1, ef);
    log[ln] = 0;
    fclose(ef);
    cr_assert_null(strstr(log, TEST_TOKEN), "the server log holds the token");
    cr_assert_null(strstr(log, "reader-secret-42"), "the server log holds the read token");
    server_stop(&s, SIGKILL);
}

Test(http, hostile_names_400) {
    const char *d = temp_dir();
    const char *run = make_run(d, "r", "hf/olmoe", "--precision fp64");
    char root[600], extra[700];
    test_server s;
    server_start_in(&s, d, "", root, extra);
    const char *names[] = {"..", "../x", "..%2fx", "%2e%2e", "a/b", ".hidden", "-rf", "a..b", "a%20b", "a%00b", "%c3%a9",
                           "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        http_resp r;
        put_run(s.port, names[i], run, AUTH, &r);
        cr_assert_eq(r.status, 400, "name %s: %d %s", names[i], r.status, r.body);
        cr_assert(strstr(r.body, "invalid run name"), "%s", r.body);
        http_free(&r);
    }
    /* nothing was written anywhere */
    char p[700];
    snprintf(p, sizeof p, "%s/runs", root);
    cr_assert_eq(dir_entries(p), 0);
    cr_assert_eq(dir_entries(root), 4, "root holds only .lock, .tmp, runs, diffs");
    /* push refuses a bad name before connecting */
    char out[2048];
    cr_assert_eq(run_moeflip(out, sizeof out, "push -q '%s' --name ../x --to http://127.0.0.1:%d", run, s.port), 1);
    cr_assert(strstr(out, "not a valid run name"), "%s", out);
    server_stop(&s, SIGKILL);
}

Test(http, oversized_bodies_413) {
    const char *d = temp_dir();
    const char *run = make_run(d, "r", "hf/olmoe", "--precision fp64");
    char root[600], extra[700];
    test_server s;
    server_start_in(&s, d, "--max-run-bytes 50000", root, extra);
    http_resp r;
    /* Content-Length over the limit: refused at the headers, whole body sent anyway */
    put_run(s.port, "big", run, AUTH, &r);
    cr_assert_eq(r.status, 413, "%d %s", r.status, r.body);
    http_free(&r);
    /* with Expect: 100-continue the client learns it before sending */
    int fd = http_connect(s.port);
    char head[512];
    int hl = snprintf(head, sizeof head, "PUT /api/runs/big HTTP/1.1\r\nHost: x\r\n" AUTH "Expect: 100-continue\r\nContent-Length: 60000\r\n\r\n");
    cr_assert(send_all(fd, head, (size_t)hl));
    http_read(fd, &r);
    cr_assert_eq(r.status, 413);
    http_free(&r);
    close(fd);
    /* chunked: no length up front, refused once the limit is passed */
    size_t len;
    char *body = run_body(run, &len);
    fd = http_connect(s.port);
    hl = snprintf(head, sizeof head, "PUT /api/runs/big HTTP/1.1\r\nHost: x\r\n" AUTH "Transfer-Encoding: chunked\r\n\r\n");
    cr_assert(send_all(fd, head, (size_t)hl));
    for (size_t off = 0; off < len; off += 8192) {
        size_t c = len - off < 8192 ? len - off : 8192;
        char ch[32];
        int cl = snprintf(ch, sizeof ch, "%zx\r\n", c);
        if (!send_all(fd, ch, (size_t)cl) || !send_all(fd, body + off, c) || !send_all(fd, "\r\n", 2)) break;
    }
    send_all(fd, "0\r\n\r\n", 5);
    http_read(fd, &r);
    cr_assert_eq(r.status, 413, "chunked: %d %s", r.status, r.body);
    http_free(&r);
    close(fd);
    free(body);
    /* a diff request body over 64 KiB */
    char *big = malloc(70000);
    memset(big, ' ', 70000);
    http_request(s.port, "POST", "/api/diffs", NULL, big, 70000, &r);
    cr_assert_eq(r.status, 413);
    http_free(&r);
    free(big);
    char *names = list_names(s.port, NULL);
    cr_assert_str_eq(names, "");
    free(names);
    cr_assert(server_alive(&s));
    server_stop(&s, SIGKILL);
}

Test(http, concurrent_upload_limit_429) {
    const char *d = temp_dir();
    const char *run = make_run(d, "r", "hf/olmoe", "--precision fp64");
    char root[600], extra[700];
    test_server s;
    server_start_in(&s, d, "--max-uploads 2", root, extra);
    size_t len;
    char *body = run_body(run, &len);
    int a = open_upload(s.port, "a", body, len, 1000), b = open_upload(s.port, "b", body, len, 1000);
    sleep_ms(100);
    http_resp r;
    put_run(s.port, "c", run, AUTH, &r);
    cr_assert_eq(r.status, 429, "%d %s", r.status, r.body);
    cr_assert(strstr(r.head, "Retry-After: 1"));
    http_free(&r);
    /* the two finish; then there is room again */
    cr_assert(send_all(a, body + 1000, len - 1000));
    cr_assert(send_all(b, body + 1000, len - 1000));
    http_read(a, &r);
    cr_assert_eq(r.status, 201, "%d %s", r.status, r.body);
    http_free(&r);
    http_read(b, &r);
    cr_assert_eq(r.status, 201);
    http_free(&r);
    close(a);
    close(b);
    put_run(s.port, "c", run, AUTH, &r);
    cr_assert_eq(r.status, 201);
    http_free(&r);
    /* moeflip push retries a 429 until it gets in */
    a = open_upload(s.port, "x", body, len, 10);
    b = open_upload(s.port, "y", body, len, 10);
    char out[2048], cmd[2048];
    snprintf(cmd, sizeof cmd, "push -q '%s' --name z --to http://127.0.0.1:%d --token-file '%s/token' --retries 8 2>'%s/push.err'", run,
             s.port, d, d);
    pid_t pid = fork();
    if (pid == 0) {
        close(a);   /* the child must not hold the two uploads open */
        close(b);
        _exit(run_moeflip(NULL, 0, "%s", cmd));
    }
    sleep_ms(600);
    close(a);   /* gone mid-upload: their slots free up */
    close(b);
    int st;
    waitpid(pid, &st, 0);
    char pe[700], *pt = NULL;
    size_t pn;
    mf_error e = {0};
    snprintf(pe, sizeof pe, "%s/push.err", d);
    mf_read_file(pe, &pt, &pn, &e);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "push did not get in after the 429s: %s", pt ? pt : "");
    free(pt);
    char *names = list_names(s.port, NULL);
    cr_assert_str_eq(names, "a,b,c,z");
    free(names);
    free(body);
    (void)out;
    server_stop(&s, SIGKILL);
}

Test(http, malformed_http_gets_an_error_response) {
    const char *d = temp_dir();
    char root[600], extra[700];
    test_server s;
    server_start_in(&s, d, "", root, extra);
    static const struct {
        const char *head, *body;   /* body: Content-Length is added */
        int status;
    } cases[] = {
        {"GARBAGE\r\n\r\n", NULL, 400},
        {"GET / HTTP/1.1\r\nContent-Length: -5\r\n\r\n", NULL, 400},
        {"GET / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n", NULL, 400},
        {"GET / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nZZ\r\n", NULL, 400},
        {"GET /\x01 HTTP/1.1\r\n\r\n", NULL, 400},
        {"GET / HTTP/1.1\r\nBad Header\r\n\r\n", NULL, 400},
        {"GET / HTTP/1.1\r\nHost: x", NULL, 400},   /* the connection ends inside the headers */
        {"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", NULL, 400},   /* TLS to a plain port */
        {"GET /nothing-here HTTP/1.1\r\n\r\n", NULL, 404},
        {"DELETE /api/runs/x HTTP/1.1\r\n\r\n", NULL, 405},
        {"PUT /api/runs/x HTTP/1.1\r\n" AUTH "\r\n", NULL, 411},
        {"PUT /api/runs/x HTTP/1.1\r\n" AUTH, "not a run", 400},
        {"PUT /api/runs/x HTTP/1.1\r\n" AUTH, "moeflip-run 1\nfile 3 a/b\nabcend\n", 400},
        {"PUT /api/runs/x HTTP/1.1\r\n" AUTH, "moeflip-run 1\nfile 3 manifest.json\nabcfile 1 manifest.json\na", 400},
        {"PUT /api/runs/x HTTP/1.1\r\n" AUTH, "moeflip-run 1\nend\n", 422},
        {"PUT /api/runs/x HTTP/1.1\r\n" AUTH, "moeflip-run 1\nfile 3 manifest.json\nabcend\n", 422},
        {"PUT /api/runs/x HTTP/1.1\r\n" AUTH, "moeflip-run 1\nfile 99 manifest.json\nab", 400},
        {"PUT /api/runs/x HTTP/1.1\r\n" AUTH, "moeflip-run 1\nend\nmore", 400},
        {"POST /api/diffs HTTP/1.1\r\n", "{{{{{", 400},
        {"POST /api/diffs HTTP/1.1\r\n", "{\"reference\": \"../etc\", \"targets\": [\"a\"]}", 400},
        {"GET /api/diffs/../../etc/passwd HTTP/1.1\r\n\r\n", NULL, 404},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int fd = http_connect(s.port);
        cr_assert(fd >= 0);
        char req[1024];
        if (cases[i].body)
            snprintf(req, sizeof req, "%sContent-Length: %zu\r\n\r\n%s", cases[i].head, strlen(cases[i].body), cases[i].body);
        else
            snprintf(req, sizeof req, "%s", cases[i].head);
        send_all(fd, req, strlen(req));
        shutdown(fd, SHUT_WR);
        http_resp r;
        http_read(fd, &r);
        close(fd);
        cr_assert_eq(r.status, cases[i].status, "case %zu: %d (want %d) %s", i, r.status, cases[i].status, r.body);
        cr_assert(strstr(r.body, "\"error\""), "case %zu: %s", i, r.body);
        http_free(&r);
    }
    /* headers past http-parser's limit, and random bytes */
    char *huge = malloc(200000);
    int n = sprintf(huge, "GET / HTTP/1.1\r\nX: ");
    memset(huge + n, 'a', 150000);
    strcpy(huge + n + 150000, "\r\n\r\n");
    int fd = http_connect(s.port);
    send_all(fd, huge, strlen(huge));
    http_resp r;
    http_read(fd, &r);
    close(fd);
    cr_assert_eq(r.status, 400);
    http_free(&r);
    free(huge);
    mf_rng rng;
    mf_rng_seed(&rng, 7);
    for (int k = 0; k < 30; k++) {
        unsigned char junk[600];
        for (size_t i = 0; i < sizeof junk; i++) junk[i] = (unsigned char)mf_rng_next(&rng);
        fd = http_connect(s.port);
        send_all(fd, junk, sizeof junk);
        shutdown(fd, SHUT_WR);
        http_read(fd, &r);
        close(fd);
        cr_assert_eq(r.status, 400, "junk %d: %d", k, r.status);
        http_free(&r);
    }
    /* pipelined requests on one connection are answered in order */
    fd = http_connect(s.port);
    const char *two = "GET /api/health HTTP/1.1\r\n\r\nGET /api/nothing HTTP/1.1\r\nConnection: close\r\n\r\n";
    send_all(fd, two, strlen(two));
    char both[4096];
    size_t got = 0;
    for (ssize_t k; got < sizeof both - 1 && (k = recv(fd, both + got, sizeof both - 1 - got, 0)) > 0;) got += (size_t)k;
    both[got] = 0;
    close(fd);
    char *first = strstr(both, "HTTP/1.1 200 OK"), *second = strstr(both, "HTTP/1.1 404 Not Found");
    cr_assert(first && second && first < second, "pipelined answers: %s", both);
    cr_assert(server_alive(&s), "the server died");
    char p[700];
    snprintf(p, sizeof p, "%s/runs", root);
    cr_assert_eq(dir_entries(p), 0);
    server_stop(&s, SIGKILL);
}

Test(http, slow_and_stalled_clients_time_out, .timeout = 60) {
    const char *d = temp_dir();
    const char *run = make_run(d, "r", "hf/olmoe", "--precision fp64");
    char root[600], extra[700], p[700];
    test_server s;
    server_start_in(&s, d, "--header-timeout 400 --idle-timeout 400", root, extra);
    /* headers trickling in (slowloris): 408 when the header time is up, though bytes keep coming */
    int fd = http_connect(s.port);
    double t0 = mf_now();
    send_all(fd, "GET /api/runs HTTP/1.1\r\n", 24);
    http_resp r = {0};
    bool got = false;
    for (int i = 0; i < 40 && !got; i++) {
        sleep_ms(50);
        if (!send_all(fd, "X-a: b\r\n", 8)) got = true;
    }
    http_read(fd, &r);
    double dt = mf_now() - t0;
    close(fd);
    cr_assert_eq(r.status, 408, "slow headers: %d", r.status);
    cr_assert(dt > 0.35 && dt < 5, "answered after %.2f s", dt);
    http_free(&r);
    /* an upload that stalls half-way: 408, and its bytes are dropped */
    size_t len;
    char *body = run_body(run, &len);
    fd = open_upload(s.port, "stall", body, len, len / 2);
    http_read(fd, &r);
    close(fd);
    cr_assert_eq(r.status, 408, "stalled body: %d", r.status);
    http_free(&r);
    free(body);
    snprintf(p, sizeof p, "%s/.tmp", root);
    for (int i = 0; i < 100 && dir_entries(p) != 0; i++) sleep_ms(20);
    cr_assert_eq(dir_entries(p), 0, "the stalled upload's directory is removed");
    /* an idle connection is closed without a word */
    fd = http_connect(s.port);
    http_read(fd, &r);
    cr_assert_eq(r.status, 0);
    http_free(&r);
    close(fd);
    char *names = list_names(s.port, NULL);
    cr_assert_str_eq(names, "");
    free(names);
    server_stop(&s, SIGKILL);
}

/* On a kept-alive connection the next request may come after up to the idle time, and its header time starts with
 * its first byte, not with the previous answer. */
Test(http, kept_alive_connection_times_each_request_from_its_first_byte, .timeout = 60) {
    const char *d = temp_dir();
    char root[600], extra[700];
    test_server s;
    server_start_in(&s, d, "--header-timeout 600 --idle-timeout 2500", root, extra);
    static const char req[] = "GET /api/health HTTP/1.1\r\nHost: x\r\n\r\n";
    int fd = http_connect(s.port);
    http_resp r;
    cr_assert(send_all(fd, req, sizeof req - 1));
    http_read(fd, &r);
    cr_assert_eq(r.status, 200);
    http_free(&r);
    /* 0.5 s of quiet, then headers over 0.3 s: 0.8 s after the answer, but 0.3 s after the request began */
    sleep_ms(500);
    cr_assert(send_all(fd, req, 26));
    sleep_ms(300);
    cr_assert(send_all(fd, req + 26, sizeof req - 1 - 26));
    http_read(fd, &r);
    cr_assert_eq(r.status, 200, "a request begun 0.5 s after the last answer, headers in 0.3 s: %d", r.status);
    http_free(&r);
    /* 1.2 s of quiet, twice the header time: the connection is still open */
    sleep_ms(1200);
    cr_assert(send_all(fd, req, sizeof req - 1));
    http_read(fd, &r);
    cr_assert_eq(r.status, 200, "a request 1.2 s after the last answer, idle time 2.5 s: %d", r.status);
    http_free(&r);
    /* headers that trickle on a kept-alive connection: 408 when the header time since their first byte is up */
    double t0 = mf_now();
    cr_assert(send_all(fd, req, 26));
    for (int i = 0; i < 30 && send_all(fd, "X-a: b\r\n", 8); i++) sleep_ms(50);
    http_read(fd, &r);
    const double dt = mf_now() - t0;
    cr_assert_eq(r.status, 408, "trickling headers: %d", r.status);
    cr_assert(dt > 0.55 && dt < 2.4, "answered after %.2f s", dt);
    http_free(&r);
    close(fd);
    /* a kept-alive connection left idle is closed after the idle time, without a word */
    fd = http_connect(s.port);
    cr_assert(send_all(fd, req, sizeof req - 1));
    http_read(fd, &r);
    cr_assert_eq(r.status, 200);
    http_free(&r);
    t0 = mf_now();
    http_read(fd, &r);
    const double idle = mf_now() - t0;
    cr_assert_eq(r.status, 0);
    cr_assert(idle > 2.3 && idle < 6, "the idle connection was closed after %.2f s", idle);
    http_free(&r);
    close(fd);
    cr_assert(server_alive(&s));
    server_stop(&s, SIGKILL);
}

/* ---- file bytes spliced from the socket into the file (serve/upload.c) ---- */
/* Sends n bytes in pieces of `piece`, pausing `pause_ms` every `every` bytes. */
static bool send_pieces(int fd, const char *p, size_t n, size_t piece, size_t every, int pause_ms) {
    for (size_t off = 0, since = 0; off < n;) {
        const size_t c = n - off < piece ? n - off : piece;
        if (!send_all(fd, p + off, c)) return false;
        off += c;
        since += c;
        if (since >= every) {
            sleep_ms(pause_ms);
            since = 0;
        }
    }
    return true;
}

/* A file with 64 KiB or more still to come after a read is spliced into its file in the pool, from what has
 * arrived: these are the ways its bytes can come, stop, or not come. Each ends with the run stored and verifying,
 * or with nothing stored and nothing left under .tmp, and the server alive. */
Test(http, spliced_files_in_pieces_stalls_disconnects_keepalive_and_chunked, .timeout = 90) {
    const char *d = temp_dir();
    const char *one = make_run(d, "one", "hf/olmoe", "--precision fp64");                    /* one 245 KB shard */
    const char *three = make_run(d, "three", "hf/olmoe", "--precision fp64 --shard-seqs 1");  /* 75, 47, 122 KB */
    char root[600], extra[700], tmp[700], head[512];
    test_server s;
    server_start_in(&s, d, "--idle-timeout 700", root, extra);
    snprintf(tmp, sizeof tmp, "%s/.tmp", root);
    size_t l1, l3;
    char *b1 = run_body(one, &l1), *b3 = run_body(three, &l3);
    http_resp r;
    /* the body in 1000-byte pieces with pauses: many splices of a few KB; a 47 KB shard in between goes the
     * ordinary way */
    int fd = open_upload(s.port, "pieces", b3, l3, 0);
    cr_assert(send_pieces(fd, b3, l3, 1000, 16000, 3));
    http_read(fd, &r);
    close(fd);
    cr_assert_eq(r.status, 201, "%d %s", r.status, r.body);
    http_free(&r);
    assert_stored_verifies(root, "pieces", three);
    /* headers and the whole body in one send: the first body bytes arrive with the headers */
    fd = http_connect(s.port);
    int hl = snprintf(head, sizeof head, "PUT /api/runs/together HTTP/1.1\r\nHost: x\r\n" AUTH "Content-Length: %zu\r\n\r\n", l1);
    char *all = malloc((size_t)hl + l1);
    memcpy(all, head, (size_t)hl);
    memcpy(all + hl, b1, l1);
    cr_assert(send_all(fd, all, (size_t)hl + l1));
    free(all);
    http_read(fd, &r);
    cr_assert_eq(r.status, 201, "%d %s", r.status, r.body);
    http_free(&r);
    /* a second upload on the same connection: http-parser counted the spliced bytes of the first */
    hl = snprintf(head, sizeof head, "PUT /api/runs/again HTTP/1.1\r\nHost: x\r\n" AUTH "Content-Length: %zu\r\n\r\n", l3);
    cr_assert(send_all(fd, head, (size_t)hl));
    cr_assert(send_pieces(fd, b3, l3, 8192, 65536, 2));
    http_read(fd, &r);
    close(fd);
    cr_assert_eq(r.status, 201, "%d %s", r.status, r.body);
    http_free(&r);
    assert_stored_verifies(root, "together", one);
    assert_stored_verifies(root, "again", three);
    /* a client that stalls inside a spliced file: 408 after the idle timeout, the bytes are dropped */
    fd = open_upload(s.port, "stalled", b1, l1, 30000);
    sleep_ms(100);   /* the server has read the first piece and splices the rest of the shard */
    cr_assert(send_pieces(fd, b1 + 30000, 40000, 4000, 8000, 20));
    double t0 = mf_now();
    http_read(fd, &r);
    double dt = mf_now() - t0;
    close(fd);
    cr_assert_eq(r.status, 408, "stalled inside a spliced file: %d %s", r.status, r.body);
    cr_assert(dt > 0.4 && dt < 5, "answered after %.2f s", dt);
    http_free(&r);
    /* clients that go away inside a spliced file, with a close or a reset, early or one byte short */
    const size_t cuts[4] = {70000, 150000, l1 - 5, 70000};
    for (int i = 0; i < 4; i++) {
        char nm[32];
        snprintf(nm, sizeof nm, "gone-%d", i);
        fd = open_upload(s.port, nm, b1, l1, 20000);
        sleep_ms(50);
        cr_assert(send_pieces(fd, b1 + 20000, cuts[i] - 20000, 16384, 32768, 5));
        if (i % 2) {
            struct linger lg = {1, 0};
            setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
        }
        if (i == 3) shutdown(fd, SHUT_WR);   /* half-closed: the server sees the end of the body early */
        else close(fd);
        if (i == 3) {
            http_read(fd, &r);
            close(fd);
            http_free(&r);
        }
    }
    for (int i = 0; i < 200 && dir_entries(tmp) != 0; i++) sleep_ms(20);
    cr_assert_eq(dir_entries(tmp), 0, "dropped uploads leave nothing under .tmp");
    /* a chunked body is not spliced (its framing is http-parser's): stored the ordinary way */
    fd = http_connect(s.port);
    hl = snprintf(head, sizeof head, "PUT /api/runs/chunked HTTP/1.1\r\nHost: x\r\n" AUTH "Transfer-Encoding: chunked\r\n\r\n");
    cr_assert(send_all(fd, head, (size_t)hl));
    for (size_t off = 0; off < l1; off += 10000) {
        const size_t c = l1 - off < 10000 ? l1 - off : 10000;
        char ch[32];
        int cl = snprintf(ch, sizeof ch, "%zx\r\n", c);
        cr_assert(send_all(fd, ch, (size_t)cl) && send_all(fd, b1 + off, c) && send_all(fd, "\r\n", 2));
    }
    cr_assert(send_all(fd, "0\r\n\r\n", 5));
    http_read(fd, &r);
    close(fd);
    cr_assert_eq(r.status, 201, "%d %s", r.status, r.body);
    http_free(&r);
    assert_stored_verifies(root, "chunked", one);
    char *names = list_names(s.port, NULL);
    cr_assert_str_eq(names, "again,chunked,pieces,together");
    free(names);
    cr_assert(server_alive(&s));
    /* and after a restart, the same */
    server_stop(&s, SIGKILL);
    server_start(&s, root, extra);
    names = list_names(s.port, NULL);
    cr_assert_str_eq(names, "again,chunked,pieces,together");
    free(names);
    server_stop(&s, SIGKILL);
    free(b1);
    free(b3);
}

/* A chunked upload of several MiB in chunks large enough that the server keeps the socket buffer instead of
 * copying it (16 KiB and up), many chunks to one read: a buffer that went to the pool with the bytes of one chunk
 * must not be taken again for the next chunk's (that corrupted the stored bytes and crashed the server). */
Test(http, chunked_bodies_in_large_chunks, .timeout = 120) {
    const char *d = temp_dir();
    /* 4 prompts of 512 tokens with their logits: one 7.3 MB shard */
    char prompts[4 * 512 * 6 + 200] = "", *p = prompts;
    uint32_t x = 12345;
    for (int i = 0; i < 4; i++) {
        p += sprintf(p, "{\"id\": \"p%d\", \"tokens\": [", i);
        for (int t = 0; t < 512; t++) {
            x = x * 1664525u + 1013904223u;
            p += sprintf(p, "%s%u", t ? "," : "", (x >> 8) % 384);   /* the fixture's vocabulary */
        }
        p += sprintf(p, "]}\n");
    }
    write_text(d, "long.jsonl", prompts);
    char run[600], err[2048];
    snprintf(run, sizeof run, "%s/long", d);
    cr_assert_eq(run_moeflip(err, sizeof err, "trace -q --model '%s' --input '%s/long.jsonl' --out '%s' --record logits --precision fp64",
                             fixture("hf/olmoe"), d, run),
                 0, "trace failed: %s", err);
    char root[600], extra[700];
    test_server s;
    server_start_in(&s, d, "", root, extra);
    size_t len;
    char *body = run_body(run, &len);
    cr_assert_gt(len, 6u << 20);
    const size_t chunks[3] = {20000, 65536, 300000};
    for (int k = 0; k < 3; k++) {
        /* the whole request in one buffer, so that one read of the server holds several chunks */
        char *req = malloc(len + len / chunks[k] * 32 + 1024), *q = req;
        char name[32];
        snprintf(name, sizeof name, "chunked-%zu", chunks[k]);
        q += sprintf(q, "PUT /api/runs/%s HTTP/1.1\r\nHost: x\r\n" AUTH "Transfer-Encoding: chunked\r\n\r\n", name);
        for (size_t off = 0; off < len; off += chunks[k]) {
            const size_t c = len - off < chunks[k] ? len - off : chunks[k];
            q += sprintf(q, "%zx\r\n", c);
            memcpy(q, body + off, c);
            q += c;
            q += sprintf(q, "\r\n");
        }
        q += sprintf(q, "0\r\n\r\n");
        int fd = http_connect(s.port);
        cr_assert(send_all(fd, req, (size_t)(q - req)));
        free(req);
        http_resp r;
        http_read(fd, &r);
        close(fd);
        cr_assert_eq(r.status, 201, "chunks of %zu bytes: %d %s", chunks[k], r.status, r.body);
        http_free(&r);
        assert_stored_verifies(root, name, run);
        cr_assert(server_alive(&s), "the server died after chunks of %zu bytes", chunks[k]);
    }
    free(body);
    const int st = server_stop(&s, SIGTERM);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the server did not stop cleanly on SIGTERM (status %d)", st);
}
