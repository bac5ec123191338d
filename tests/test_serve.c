/* The collector service: `moeflip serve` as a child process on an ephemeral
 * loopback port, driven by raw sockets and by `moeflip push`. */
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

#define AUTH "Authorization: Bearer " TEST_TOKEN "\r\n"

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static void put_run(int port, const char *name, const char *dir, const char *headers, http_resp *r) {
    size_t len;
    char *body = run_body(dir, &len), path[256];
    snprintf(path, sizeof path, "/api/runs/%s", name);
    http_request(port, "PUT", path, headers, body, len, r);
    free(body);
}

/* The stored directory of a run opens with mf_run_open (manifest and every shard digest). */
static void assert_stored_verifies(const char *root, const char *name, const char *orig_dir) {
    char hex[200], dir[1024], a[1200], b[1200];
    name_hex(name, hex);
    snprintf(dir, sizeof dir, "%s/runs/%s", root, hex);
    mf_run *r;
    mf_error e = {0};
    cr_assert_eq(mf_run_open(&r, dir, &e), MF_OK, "stored run %s does not verify: %s", name, e.msg);
    mf_run_close(r);
    char *x, *y;
    size_t xl, yl;
    snprintf(a, sizeof a, "%s/manifest.json", dir);
    snprintf(b, sizeof b, "%s/manifest.json", orig_dir);
    cr_assert_eq(mf_read_file(a, &x, &xl, &e), MF_OK);
    cr_assert_eq(mf_read_file(b, &y, &yl, &e), MF_OK);
    cr_assert(xl == yl && !memcmp(x, y, xl), "stored manifest of %s differs from the pushed one", name);
    free(x);
    free(y);
}

Test(serve, name_rules) {
    cr_assert(mf_serve_name_valid("olmoe-h200_bf16.v2", 18));
    cr_assert(mf_serve_name_valid("a", 1));
    const char *bad[] = {"", "..", "../x", "a/b", ".hidden", "-x", "a..b", "a b", "a%2fb", "a\\b", "\xc3\xa9t\xc3\xa9"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) cr_assert_not(mf_serve_name_valid(bad[i], strlen(bad[i])), "%s", bad[i]);
    char longname[80];
    memset(longname, 'a', 65);
    longname[65] = 0;
    cr_assert_not(mf_serve_name_valid(longname, 65));
    cr_assert(mf_serve_name_valid(longname, 64));
}

Test(serve, token_file_readable_by_others_refuses_to_start) {
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

Test(serve, push_list_manifest_again_and_restart, .timeout = 120) {
    const char *d = temp_dir();
    const char *run = make_run(d, "olmoe-fp64", "hf/olmoe", "--precision fp64");
    char root[600], out[4096];
    snprintf(root, sizeof root, "%s/root", d);
    test_server s;
    int st;
    const char *tok = token_file(d);
    char extra[700];
    snprintf(extra, sizeof extra, "--token-file '%s'", tok);
    server_start(&s, root, extra);
    /* moeflip push: exit 0 only with the server's verification; the same run again is harmless */
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "push -q '%s' --to http://127.0.0.1:%d --token-file '%s'", run, s.port, tok);
    cr_assert_eq(run_moeflip(out, sizeof out, "%s", cmd), 0, "%s", out);
    snprintf(cmd, sizeof cmd, "push '%s' --to http://127.0.0.1:%d --token-file '%s' > '%s/push2.txt'", run, s.port, tok, d);
    cr_assert_eq(run_moeflip(out, sizeof out, "%s", cmd), 0, "%s", out);
    char p[700], *t;
    size_t n;
    mf_error e = {0};
    snprintf(p, sizeof p, "%s/push2.txt", d);
    cr_assert_eq(mf_read_file(p, &t, &n, &e), MF_OK);
    cr_assert(strstr(t, "verified by the server (it already held this run)"), "%s", t);
    free(t);
    char *names = list_names(s.port, NULL);
    cr_assert_str_eq(names, "olmoe-fp64");
    free(names);
    /* the list shows the metadata */
    http_resp r;
    http_request(s.port, "GET", "/api/runs", NULL, NULL, 0, &r);
    json_t *j = json_loads(r.body, 0, NULL), *e0 = json_array_get(json_object_get(j, "runs"), 0);
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(e0, "model"), "architecture")), "olmoe");
    cr_assert_str_eq(json_string_value(json_object_get(e0, "precision")), "fp64");
    cr_assert_str_eq(json_string_value(json_object_get(e0, "numerics")), "fp64");
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(e0, "device"), "kind")), "cpu");
    cr_assert_eq(json_integer_value(json_object_get(e0, "sequences")), 3);
    cr_assert(json_is_true(json_object_get(e0, "complete")));
    json_decref(j);
    http_free(&r);
    /* the manifest, byte for byte */
    http_request(s.port, "GET", "/api/runs/olmoe-fp64/manifest.json", NULL, NULL, 0, &r);
    cr_assert_eq(r.status, 200);
    snprintf(p, sizeof p, "%s/manifest.json", run);
    cr_assert_eq(mf_read_file(p, &t, &n, &e), MF_OK);
    cr_assert(r.body_len == n && !memcmp(r.body, t, n), "the served manifest differs");
    free(t);
    http_free(&r);
    http_request(s.port, "GET", "/api/runs/nope", NULL, NULL, 0, &r);
    cr_assert_eq(r.status, 404);
    http_free(&r);
    /* SIGTERM: a clean stop (exit 0); the store is rebuilt from disk */
    st = server_stop(&s, SIGTERM);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "serve did not stop cleanly: %d", st);
    server_start(&s, root, extra);
    names = list_names(s.port, NULL);
    cr_assert_str_eq(names, "olmoe-fp64");
    free(names);
    assert_stored_verifies(root, "olmoe-fp64", run);
    /* a second server on the same root is refused */
    cr_assert_eq(run_moeflip(out, sizeof out, "serve --root '%s' --listen 127.0.0.1:0", root), 1);
    cr_assert(strstr(out, "in use by another moeflip serve"), "%s", out);
    server_stop(&s, SIGKILL);
}

Test(serve, writes_need_the_token_401_and_reads_token) {
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

/* A manifest whose descriptive fields have other types than moeflip writes (a number for the date, an object for
 * the numerics) is stored and listed with those fields null, as the API documents its types. (A field the readers
 * index by, such as model.n_experts, must have its type: tests/test_hostile.c.) */
Test(serve, odd_manifest_fields_are_listed_as_null) {
    const char *d = temp_dir();
    const char *run = make_run(d, "r", "hf/olmoe", "--precision fp64");
    char odd[700], cmd[1500], path[800];
    snprintf(odd, sizeof odd, "%s/odd", d);
    snprintf(cmd, sizeof cmd, "cp -r '%s' '%s'", run, odd);
    cr_assert_eq(system(cmd), 0);
    snprintf(path, sizeof path, "%s/manifest.json", odd);
    json_t *m = json_load_file(path, 0, NULL);
    cr_assert(m);
    json_object_set_new(m, "created", json_integer(20261201));
    json_object_set_new(m, "numerics", json_pack("{si}", "x", 1));
    cr_assert_eq(json_dump_file(m, path, JSON_INDENT(2)), 0);
    json_decref(m);
    char root[600], extra[700];
    test_server s;
    server_start_in(&s, d, "", root, extra);
    http_resp r;
    put_run(s.port, "odd", odd, AUTH, &r);
    cr_assert_eq(r.status, 201, "%d %s", r.status, r.body);
    http_free(&r);
    put_run(s.port, "r", run, AUTH, &r);
    cr_assert_eq(r.status, 201, "%d %s", r.status, r.body);
    http_free(&r);
    http_request(s.port, "GET", "/api/runs", NULL, NULL, 0, &r);
    cr_assert_eq(r.status, 200);
    json_t *l = json_loads(r.body, 0, NULL);
    http_free(&r);
    json_t *o = json_array_get(json_object_get(l, "runs"), 0), *n = json_array_get(json_object_get(l, "runs"), 1);
    cr_assert_str_eq(json_string_value(json_object_get(o, "name")), "odd");
    cr_assert(json_is_null(json_object_get(o, "created")) && json_is_null(json_object_get(o, "numerics")));
    cr_assert_eq(json_integer_value(json_object_get(json_object_get(o, "model"), "top_k")), 4);
    cr_assert_str_eq(json_string_value(json_object_get(n, "numerics")), "fp64");
    cr_assert(json_is_string(json_object_get(n, "created")));
    json_decref(l);
    server_stop(&s, SIGKILL);
}

/* A stored run found damaged when the server starts is left out of the list; pushing the run again replaces the
 * damaged copy (201, "replaced"), not "it is already here" over the damaged bytes. */
Test(serve, damaged_stored_run_is_replaced_by_a_new_push) {
    const char *d = temp_dir();
    const char *run = make_run(d, "r", "hf/olmoe", "--precision fp64");
    char root[600], extra[700], hex[200], shard[1200];
    test_server s;
    server_start_in(&s, d, "", root, extra);
    http_resp r;
    put_run(s.port, "r", run, AUTH, &r);
    cr_assert_eq(r.status, 201, "%d %s", r.status, r.body);
    http_free(&r);
    server_stop(&s, SIGKILL);
    /* one byte of the stored shard's data flipped */
    name_hex("r", hex);
    snprintf(shard, sizeof shard, "%s/runs/%s/part-00000.safetensors", root, hex);
    FILE *f = fopen(shard, "r+b");
    cr_assert(f);
    fseek(f, -3, SEEK_END);
    const int ch = fgetc(f);
    fseek(f, -3, SEEK_END);
    fputc(ch ^ 0x40, f);
    fclose(f);
    server_start(&s, root, extra);
    char *names = list_names(s.port, NULL);
    cr_assert_str_eq(names, "", "the damaged run is listed");
    free(names);
    put_run(s.port, "r", run, AUTH, &r);
    cr_assert_eq(r.status, 201, "pushing over a damaged copy: %d %s", r.status, r.body);
    cr_assert(strstr(r.body, "\"stored\":\"replaced\""), "%s", r.body);
    http_free(&r);
    names = list_names(s.port, NULL);
    cr_assert_str_eq(names, "r");
    free(names);
    assert_stored_verifies(root, "r", run);
    put_run(s.port, "r", run, AUTH, &r);
    cr_assert_eq(r.status, 200, "the same run again: %d %s", r.status, r.body);
    cr_assert(strstr(r.body, "\"stored\":\"existing\""), "%s", r.body);
    http_free(&r);
    /* and after a restart it is there, whole */
    server_stop(&s, SIGKILL);
    server_start(&s, root, extra);
    names = list_names(s.port, NULL);
    cr_assert_str_eq(names, "r");
    free(names);
    server_stop(&s, SIGKILL);
}

Test(serve, hostile_names_400) {
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

Test(serve, oversized_bodies_413) {
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

/* Opens an upload and sends its headers and part of its body. */
static int open_upload(int port, const char *name, const char *body, size_t len, size_t send_n) {
    int fd = http_connect(port);
    cr_assert(fd >= 0);
    char head[512];
    int hl = snprintf(head, sizeof head, "PUT /api/runs/%s HTTP/1.1\r\nHost: x\r\n" AUTH "Content-Length: %zu\r\n\r\n", name, len);
    cr_assert(send_all(fd, head, (size_t)hl));
    if (send_n) cr_assert(send_all(fd, body, send_n));
    return fd;
}

Test(serve, concurrent_upload_limit_429) {
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

Test(serve, malformed_http_gets_an_error_response) {
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

Test(serve, slow_and_stalled_clients_time_out, .timeout = 60) {
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
Test(serve, kept_alive_connection_times_each_request_from_its_first_byte, .timeout = 60) {
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
Test(serve, spliced_files_in_pieces_stalls_disconnects_keepalive_and_chunked, .timeout = 90) {
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
Test(serve, chunked_bodies_in_large_chunks, .timeout = 120) {
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

Test(serve, fifty_concurrent_pushes_with_disconnects_then_crash_and_restart, .timeout = 120) {
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

Test(serve, damaged_upload_is_refused_and_damaged_run_is_not_pushed) {
    const char *d = temp_dir();
    const char *run = make_run(d, "r", "hf/olmoe", "--precision fp64");
    char root[600], extra[700];
    test_server s;
    server_start_in(&s, d, "", root, extra);
    size_t len;
    char *body = run_body(run, &len);
    body[len - 100] ^= 1;   /* a bit of the last shard */
    http_resp r;
    http_request(s.port, "PUT", "/api/runs/damaged", AUTH, body, len, &r);
    cr_assert_eq(r.status, 422, "%d %s", r.status, r.body);
    cr_assert(strstr(r.body, "damaged shard") && strstr(r.body, "damaged/part-00000.safetensors"), "%s", r.body);
    cr_assert_null(strstr(r.body, root), "the message names no server directory: %s", r.body);
    http_free(&r);
    free(body);
    /* a shard the manifest does not name */
    body = run_body(run, &len);
    char *withextra = malloc(len + 64);
    memcpy(withextra, body, len - 4);
    size_t n = len - 4 + (size_t)sprintf(withextra + len - 4, "file 3 part-00009.safetensors\nabcend\n");
    http_request(s.port, "PUT", "/api/runs/extra", AUTH, withextra, n, &r);
    cr_assert_eq(r.status, 422, "%d %s", r.status, r.body);
    cr_assert(strstr(r.body, "not named by its manifest"), "%s", r.body);
    http_free(&r);
    free(withextra);
    free(body);
    char p[700];
    snprintf(p, sizeof p, "%s/runs", root);
    cr_assert_eq(dir_entries(p), 0);
    /* a damaged shard pushed: push sends it, the server refuses it and push says which shard (exit 1) */
    char shard[700], out[2048];
    snprintf(shard, sizeof shard, "%s/part-00000.safetensors", run);
    FILE *fp = fopen(shard, "r+b");
    fseek(fp, -50, SEEK_END);
    fputc('Z', fp);
    fclose(fp);
    cr_assert_eq(run_moeflip(out, sizeof out, "push -q '%s' --to http://127.0.0.1:%d --token-file '%s/token'", run, s.port, d), 1);
    cr_assert(strstr(out, "damaged shard") && strstr(out, "part-00000.safetensors"), "%s", out);
    /* the server hashes the shard as it stores it and refuses it (422, which push reports): nothing is stored */
    http_request(s.port, "GET", "/api/runs", NULL, NULL, 0, &r);
    cr_assert_eq(r.status, 200);
    cr_assert(strstr(r.body, "\"runs\": []") || strstr(r.body, "\"runs\":[]"), "%s", r.body);
    http_free(&r);
    cr_assert_eq(dir_entries(p), 0);
    server_stop(&s, SIGKILL);
}

Test(serve, push_retries_until_the_server_is_up, .timeout = 60) {
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

Test(serve, diff_report_and_heatmaps_cached, .timeout = 120) {
    const char *d = temp_dir();
    const char *ref = make_run(d, "ref", "hf/olmoe", "--precision fp64");
    const char *hop = make_run(d, "hopper", "hf/olmoe", "--numerics emu:hopper --precision bf16");
    const char *other = make_run(d, "other", "hf/qwen2_moe", "--precision fp64");
    char root[600], extra[700];
    test_server s;
    server_start_in(&s, d, "--bootstrap 200", root, extra);
    const char *names[] = {"ref", "hopper", "other"}, *dirs[] = {ref, hop, other};
    http_resp r;
    for (int i = 0; i < 3; i++) {
        put_run(s.port, names[i], dirs[i], AUTH, &r);
        cr_assert_eq(r.status, 201);
        http_free(&r);
    }
    const char *req = "{\"reference\": \"ref\", \"targets\": [\"hopper\"]}";
    http_request(s.port, "POST", "/api/diffs", "Content-Type: application/json\r\n", req, strlen(req), &r);
    cr_assert_eq(r.status, 200, "%d %s", r.status, r.body);
    json_t *meta = json_loads(r.body, 0, NULL);
    http_free(&r);
    const char *id = json_string_value(json_object_get(meta, "id"));
    cr_assert(id && strlen(id) == 32);
    cr_assert_eq(json_integer_value(json_object_get(meta, "bootstrap")), 200);
    json_t *files = json_object_get(meta, "files");
    /* diff.json names the runs by their names and holds the metrics */
    http_request(s.port, "GET", json_string_value(json_object_get(files, "diff")), NULL, NULL, 0, &r);
    cr_assert_eq(r.status, 200);
    json_t *dj = json_loads(r.body, 0, NULL);
    http_free(&r);
    cr_assert_str_eq(json_string_value(json_object_get(dj, "format")), "moeflip-diff");
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(dj, "reference"), "run")), "ref");
    json_t *t0 = json_array_get(json_object_get(dj, "targets"), 0);
    cr_assert_str_eq(json_string_value(json_object_get(t0, "run")), "hopper");
    cr_assert_str_eq(json_string_value(json_object_get(t0, "precision")), "bf16");
    json_t *flip = json_object_get(json_object_get(json_object_get(t0, "metrics"), "flipped_slots_pct"), "value");
    cr_assert(json_is_number(flip) && json_number_value(flip) >= 0 && json_number_value(flip) <= 100);
    cr_assert_eq(json_integer_value(json_object_get(json_object_get(dj, "bootstrap"), "resamples")), 200);
    const double served_flips = json_number_value(flip);
    json_decref(dj);
    /* the same diff from `moeflip diff` on the original runs has the same flips */
    char djp[700];
    snprintf(djp, sizeof djp, "%s/local.json", d);
    char out[2048];
    cr_assert_eq(run_moeflip(out, sizeof out, "diff -q '%s' '%s' -o '%s' --bootstrap 200", ref, hop, djp), 0, "%s", out);
    json_t *local = json_load_file(djp, 0, NULL);
    json_t *lflip = json_object_get(json_object_get(json_object_get(json_array_get(json_object_get(local, "targets"), 0), "metrics"),
                                                    "flipped_slots_pct"), "value");
    cr_assert_float_eq(json_number_value(lflip), served_flips, 0, "flipped slots %% here %.17g, by the server %.17g",
                       json_number_value(lflip), served_flips);
    json_decref(local);
    /* every heatmap is a PNG */
    json_t *heat = json_array_get(json_object_get(files, "heatmaps"), 0);
    cr_assert_str_eq(json_string_value(json_object_get(heat, "target")), "hopper");
    const char *key;
    json_t *url;
    int figs = 0;
    json_object_foreach(json_object_get(heat, "figures"), key, url) {
        http_request(s.port, "GET", json_string_value(url), NULL, NULL, 0, &r);
        cr_assert_eq(r.status, 200, "%s", key);
        cr_assert(strstr(r.head, "Content-Type: image/png"));
        cr_assert(r.body_len > 1000 && !memcmp(r.body, "\x89PNG\r\n\x1a\n", 8), "%s is not a PNG", key);
        uint32_t w = ((uint32_t)(unsigned char)r.body[16] << 24) | ((uint32_t)(unsigned char)r.body[17] << 16) |
                     ((uint32_t)(unsigned char)r.body[18] << 8) | (unsigned char)r.body[19];
        cr_assert_gt(w, 100);
        http_free(&r);
        figs++;
    }
    cr_assert_eq(figs, 4);
    http_request(s.port, "GET", json_string_value(json_object_get(files, "report")), NULL, NULL, 0, &r);
    cr_assert_eq(r.status, 200);
    cr_assert(strstr(r.body, "<table") && strstr(r.body, "hopper"));
    cr_assert_null(strstr(r.body, root), "the report names no server directory");
    http_free(&r);
    /* asked again: the cached one, the same id */
    double t0s = mf_now();
    http_request(s.port, "POST", "/api/diffs", NULL, req, strlen(req), &r);
    cr_assert_eq(r.status, 200);
    json_t *again = json_loads(r.body, 0, NULL);
    cr_assert_str_eq(json_string_value(json_object_get(again, "id")), id);
    cr_assert_lt(mf_now() - t0s, 2.0);
    json_decref(again);
    http_free(&r);
    char gp[200];
    snprintf(gp, sizeof gp, "/api/diffs/%s", id);
    http_request(s.port, "GET", gp, NULL, NULL, 0, &r);
    cr_assert_eq(r.status, 200);
    cr_assert(strstr(r.body, id));
    http_free(&r);
    /* unknown runs 404, another model 422, bad requests 400 */
    const char *bad[][2] = {{"{\"reference\": \"ref\", \"targets\": [\"nope\"]}", "404"},
                            {"{\"reference\": \"ref\", \"targets\": [\"other\"]}", "422"},
                            {"{\"reference\": \"ref\", \"targets\": []}", "400"},
                            {"{\"reference\": \"ref\", \"targets\": [\"hopper\"], \"bootstrap\": -1}", "400"},
                            {"[1,2]", "400"}};
    for (int i = 0; i < 5; i++) {
        http_request(s.port, "POST", "/api/diffs", NULL, bad[i][0], strlen(bad[i][0]), &r);
        cr_assert_eq(r.status, atoi(bad[i][1]), "%s: %d %s", bad[i][0], r.status, r.body);
        http_free(&r);
    }
    http_request(s.port, "GET", "/api/diffs/0123456789abcdef0123456789abcdef/diff.json", NULL, NULL, 0, &r);
    cr_assert_eq(r.status, 404);
    http_free(&r);
    /* the cache survives a restart */
    server_stop(&s, SIGKILL);
    server_start(&s, root, extra);
    http_request(s.port, "GET", json_string_value(json_object_get(files, "report")), NULL, NULL, 0, &r);
    cr_assert_eq(r.status, 200);
    http_free(&r);
    json_decref(meta);
    server_stop(&s, SIGKILL);
}


typedef struct diff_poster {
    int port;
    char body[600];
    int status;
} diff_poster;

static void *post_diff_thread(void *arg) {
    diff_poster *p = arg;
    http_resp r;
    http_request(p->port, "POST", "/api/diffs", "Content-Type: application/json\r\n", p->body, strlen(p->body), &r);
    p->status = r.status;
    http_free(&r);
    return NULL;
}

/* A long diff's request: ref against hopper eight times (each target draws its four heatmaps). */
static void long_diff(diff_poster *p, int port, int bootstrap) {
    *p = (diff_poster){.port = port};
    int n = snprintf(p->body, sizeof p->body, "{\"reference\": \"ref\", \"targets\": [");
    for (int i = 0; i < 8; i++) n += snprintf(p->body + n, sizeof p->body - (size_t)n, "%s\"hopper\"", i ? ", " : "");
    snprintf(p->body + n, sizeof p->body - (size_t)n, "], \"bootstrap\": %d}", bootstrap);
}

/* A server in DIR holding the runs "ref" and "hopper" (an fp64 trace of the OLMoE fixture and an emu:hopper bf16 one). */
static void serve_ref_and_hopper(test_server *s, const char *d, char root[600], char extra[700]) {
    const char *ref = make_run(d, "ref", "hf/olmoe", "--precision fp64");
    const char *hop = make_run(d, "hopper", "hf/olmoe", "--numerics emu:hopper --precision bf16");
    server_start_in(s, d, "", root, extra);
    http_resp r;
    put_run(s->port, "ref", ref, AUTH, &r);
    cr_assert_eq(r.status, 201);
    http_free(&r);
    put_run(s->port, "hopper", hop, AUTH, &r);
    cr_assert_eq(r.status, 201);
    http_free(&r);
}

/* Diffs asked for and abandoned before their turn (the client closed, as a killed curl or a closed tab does) are
 * not computed: only the one computing and the one still waited for are stored. */
Test(serve, abandoned_queued_diffs_are_not_computed, .timeout = 240) {
    char root[600], extra[700], diffs[700];
    test_server s;
    serve_ref_and_hopper(&s, temp_dir(), root, extra);
    http_resp r;
    /* a long diff, computing */
    diff_poster longd;
    long_diff(&longd, s.port, 300);
    pthread_t th;
    pthread_create(&th, NULL, post_diff_thread, &longd);
    sleep_ms(150);
    /* three more asked for, their clients gone at once */
    for (int i = 0; i < 3; i++) {
        char body[200], req[600];
        const int bl = snprintf(body, sizeof body, "{\"reference\": \"ref\", \"targets\": [\"hopper\"], \"bootstrap\": %d}", 401 + i);
        const int rl = snprintf(req, sizeof req, "POST /api/diffs HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", bl, body);
        int fd = http_connect(s.port);
        cr_assert(send_all(fd, req, (size_t)rl));
        sleep_ms(20);
        close(fd);
    }
    pthread_join(th, NULL);
    cr_assert_eq(longd.status, 200);
    /* one more, waited for: in order it comes after the abandoned ones */
    static const char small[] = "{\"reference\": \"ref\", \"targets\": [\"hopper\"], \"bootstrap\": 100}";
    http_request(s.port, "POST", "/api/diffs", NULL, small, strlen(small), &r);
    cr_assert_eq(r.status, 200, "%d %s", r.status, r.body);
    http_free(&r);
    snprintf(diffs, sizeof diffs, "%s/diffs", root);
    cr_assert_eq(dir_entries(diffs), 2, "%d diffs stored: abandoned ones were computed", dir_entries(diffs));
    /* a client that closes its side after asking for a diff that is cached still gets it */
    char req[600];
    const int rl = snprintf(req, sizeof req, "POST /api/diffs HTTP/1.1\r\nHost: x\r\nContent-Length: %zu\r\n\r\n%s", strlen(small), small);
    int fd = http_connect(s.port);
    cr_assert(send_all(fd, req, (size_t)rl));
    shutdown(fd, SHUT_WR);
    http_read(fd, &r);
    close(fd);
    cr_assert_eq(r.status, 200, "a half-closed client of a cached diff: %d", r.status);
    http_free(&r);
    cr_assert(server_alive(&s));
    server_stop(&s, SIGKILL);
}

/* Diffs waiting for their turn hold no pool thread: with four long diffs asked at once (as many as the pool has
 * threads), a diff made before is answered from the cache and an upload is stored at once, not after them. */
Test(serve, queued_diffs_leave_the_pool_to_cached_diffs_and_uploads, .timeout = 240) {
    const char *d = temp_dir();
    const char *late = make_run(d, "late", "hf/olmoe", "--precision fp32");
    char root[600], extra[700];
    test_server s;
    serve_ref_and_hopper(&s, d, root, extra);
    http_resp r;
    static const char small[] = "{\"reference\": \"ref\", \"targets\": [\"hopper\"], \"bootstrap\": 100}";
    http_request(s.port, "POST", "/api/diffs", NULL, small, strlen(small), &r);
    cr_assert_eq(r.status, 200, "%d %s", r.status, r.body);
    http_free(&r);
    /* how long a long diff takes alone here */
    diff_poster alone;
    long_diff(&alone, s.port, 300);
    double t0 = mf_now();
    post_diff_thread(&alone);
    const double one = mf_now() - t0;
    cr_assert_eq(alone.status, 200);
    /* four new long diffs at once */
    diff_poster ps[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        long_diff(&ps[i], s.port, 301 + i);
        pthread_create(&th[i], NULL, post_diff_thread, &ps[i]);
    }
    sleep_ms(100);
    t0 = mf_now();
    http_request(s.port, "POST", "/api/diffs", NULL, small, strlen(small), &r);
    const double cached = mf_now() - t0;
    cr_assert_eq(r.status, 200, "%d %s", r.status, r.body);
    http_free(&r);
    t0 = mf_now();
    put_run(s.port, "late", late, AUTH, &r);
    const double upload = mf_now() - t0;
    cr_assert_eq(r.status, 201, "%d %s", r.status, r.body);
    http_free(&r);
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        cr_assert_eq(ps[i].status, 200, "diff %d: %d", i, ps[i].status);
    }
    cr_assert_lt(cached, one / 2, "a cached diff took %.2f s while four diffs of %.2f s each waited", cached, one);
    cr_assert_lt(upload, one / 2, "an upload took %.2f s while four diffs of %.2f s each waited", upload, one);
    assert_stored_verifies(root, "late", late);
    cr_assert(server_alive(&s));
    const int st = server_stop(&s, SIGTERM);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "status %d", st);
}

/* Real `moeflip push` processes killed at random moments: a push that exited 0 is stored and verifies;
 * one that was killed is either absent or complete and verified; nothing partial. */
Test(serve, push_processes_killed_at_random_moments, .timeout = 120) {
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
