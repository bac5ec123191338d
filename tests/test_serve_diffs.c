/* Diffs on request (serve/diffs.c): `moeflip serve` as a child process on an
 * ephemeral loopback port holding traces of the OLMoE fixture. Each test
 * proves one behaviour: the served diff.json is `moeflip diff`'s, the files a
 * diff lists are there, a diff asked again comes from the cache (also after a
 * restart), bad requests get their status, queued diffs wait without taking
 * the pool, abandoned ones are not computed. */
#include "test_serve_util.h"
#include "mf_serve.h"

#include <criterion/criterion.h>
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* A server in DIR holding the runs "ref" and "hopper" (an fp64 trace of the OLMoE fixture and an emu:hopper bf16 one),
 * traced into DIR/ref and DIR/hopper. */
static void serve_ref_and_hopper(test_server *s, const char *d, char root[600], char extra[700]) {
    const char *ref = make_run(d, "ref", "hf/olmoe", "--precision fp64");
    const char *hop = make_run(d, "hopper", "hf/olmoe", "--numerics emu:hopper --precision bf16");
    server_start_in(s, d, "", root, extra);
    http_resp r;
    put_run(s->port, "ref", ref, AUTH, &r);
    cr_assert_eq(r.status, 201, "%d %s", r.status, r.body);
    http_free(&r);
    put_run(s->port, "hopper", hop, AUTH, &r);
    cr_assert_eq(r.status, 201, "%d %s", r.status, r.body);
    http_free(&r);
}

static const char ref_vs_hopper[] = "{\"reference\": \"ref\", \"targets\": [\"hopper\"], \"bootstrap\": 100}";

/* POSTs a diff request that must succeed; its meta.json, parsed. */
static json_t *post_diff(int port, const char *req) {
    http_resp r;
    http_request(port, "POST", "/api/diffs", "Content-Type: application/json\r\n", req, strlen(req), &r);
    cr_assert_eq(r.status, 200, "%d %s", r.status, r.body);
    json_t *meta = json_loadb(r.body, r.body_len, 0, NULL);
    cr_assert(meta, "the answer is not JSON: %s", r.body);
    http_free(&r);
    return meta;
}

/* GETs a URL that must be there; the response (http_free it). */
static void get_ok(int port, const char *url, http_resp *r) {
    cr_assert(url, "no URL");
    http_request(port, "GET", url, NULL, NULL, 0, r);
    cr_assert_eq(r->status, 200, "GET %s: %d %s", url, r->status, r->body);
}

static const char *file_url(json_t *meta, const char *key) {
    return json_string_value(json_object_get(json_object_get(meta, "files"), key));
}

/* The diff.json of a served diff is the one `moeflip diff` writes of the same runs with the same options, byte for
 * byte: here the runs are traced into directories named as they are pushed, and `moeflip diff` is given those
 * directories, so the labels agree too (the server names runs by their names, moeflip diff by the paths it is
 * given). The third run repeats the reference's configuration: both take it as the noise floor. */
Test(diffs, served_diff_json_equals_moeflip_diffs) {
    const char *d = temp_dir();
    char root[600], extra[700];
    test_server s;
    serve_ref_and_hopper(&s, d, root, extra);
    const char *repeat = make_run(d, "repeat", "hf/olmoe", "--precision fp64");
    http_resp r;
    put_run(s.port, "repeat", repeat, AUTH, &r);
    cr_assert_eq(r.status, 201, "%d %s", r.status, r.body);
    http_free(&r);
    json_t *meta = post_diff(s.port, "{\"reference\": \"ref\", \"targets\": [\"hopper\", \"repeat\"], \"bootstrap\": 200}");
    get_ok(s.port, file_url(meta, "diff"), &r);
    json_decref(meta);
    /* moeflip diff in DIR, the runs given as ref, hopper and repeat */
    char cwd[4096], local[700], err[2048];
    cr_assert(getcwd(cwd, sizeof cwd));
    cr_assert_eq(chdir(d), 0);
    snprintf(local, sizeof local, "%s/local.json", d);
    const int rc = run_moeflip(err, sizeof err, "diff -q ref hopper repeat -o '%s' --bootstrap 200", local);
    cr_assert_eq(chdir(cwd), 0);
    cr_assert_eq(rc, 0, "%s", err);
    size_t n;
    char *mine = slurp(local, &n);
    cr_assert(r.body_len == n && !memcmp(r.body, mine, n), "the served diff.json (%zu bytes) differs from moeflip diff's (%zu)",
              r.body_len, n);
    /* and it is a diff with its floor: the repeat, and the first target's excess over it */
    json_t *doc = json_loadb(mine, n, 0, NULL);
    cr_assert(doc);
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(doc, "floor"), "run")), "repeat");
    cr_assert(json_object_get(json_object_get(json_array_get(json_object_get(doc, "targets"), 0), "floor"), "excess"),
              "no floor.excess for the first target");
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(doc, "reference"), "run")), "ref");
    json_decref(doc);
    free(mine);
    http_free(&r);
    server_stop(&s, SIGKILL);
}

/* The answer of a diff (its meta.json) names it and every file it has; GET /api/diffs/ID gives it again. */
Test(diffs, meta_names_the_diff_and_its_files) {
    char root[600], extra[700];
    test_server s;
    serve_ref_and_hopper(&s, temp_dir(), root, extra);
    json_t *meta = post_diff(s.port, ref_vs_hopper);
    const char *id = json_string_value(json_object_get(meta, "id"));
    cr_assert(id && strlen(id) == 32, "id %s", id ? id : "(none)");
    cr_assert_str_eq(json_string_value(json_object_get(meta, "reference")), "ref");
    cr_assert_str_eq(json_string_value(json_array_get(json_object_get(meta, "targets"), 0)), "hopper");
    cr_assert_eq(json_integer_value(json_object_get(meta, "bootstrap")), 100);
    char want[200];
    snprintf(want, sizeof want, "/api/diffs/%s/diff.json", id);
    cr_assert_str_eq(file_url(meta, "diff"), want);
    snprintf(want, sizeof want, "/api/diffs/%s/report.html", id);
    cr_assert_str_eq(file_url(meta, "report"), want);
    json_t *heat = json_array_get(json_object_get(json_object_get(meta, "files"), "heatmaps"), 0);
    cr_assert_str_eq(json_string_value(json_object_get(heat, "target")), "hopper");
    static const char *kinds[] = {"layer-expert", "layer-position", "margin", "flips-kl"};
    for (int k = 0; k < 4; k++) {
        snprintf(want, sizeof want, "/api/diffs/%s/heatmaps/t0-%s.png", id, kinds[k]);
        cr_assert_str_eq(json_string_value(json_object_get(json_object_get(heat, "figures"), kinds[k])), want);
    }
    char gp[200];
    snprintf(gp, sizeof gp, "/api/diffs/%s", id);
    http_resp r;
    get_ok(s.port, gp, &r);
    json_t *again = json_loadb(r.body, r.body_len, 0, NULL);
    cr_assert(json_equal(again, meta), "GET %s: %s", gp, r.body);
    json_decref(again);
    http_free(&r);
    json_decref(meta);
    server_stop(&s, SIGKILL);
}

/* Every heatmap a diff lists is a PNG of real size. */
Test(diffs, every_heatmap_is_a_png) {
    char root[600], extra[700];
    test_server s;
    serve_ref_and_hopper(&s, temp_dir(), root, extra);
    json_t *meta = post_diff(s.port, ref_vs_hopper);
    json_t *figures = json_object_get(json_array_get(json_object_get(json_object_get(meta, "files"), "heatmaps"), 0), "figures");
    const char *key;
    json_t *url;
    int figs = 0;
    json_object_foreach(figures, key, url) {
        http_resp r;
        get_ok(s.port, json_string_value(url), &r);
        cr_assert(strstr(r.head, "Content-Type: image/png"), "%s: %s", key, r.head);
        cr_assert(r.body_len > 1000 && !memcmp(r.body, "\x89PNG\r\n\x1a\n", 8), "%s is not a PNG", key);
        const uint32_t w = ((uint32_t)(unsigned char)r.body[16] << 24) | ((uint32_t)(unsigned char)r.body[17] << 16) |
                           ((uint32_t)(unsigned char)r.body[18] << 8) | (unsigned char)r.body[19];
        cr_assert_gt(w, 100, "%s is %u pixels wide", key, w);
        http_free(&r);
        figs++;
    }
    cr_assert_eq(figs, 4);
    json_decref(meta);
    server_stop(&s, SIGKILL);
}

/* The report is HTML with its tables, names the runs by their names and no directory of the server. */
Test(diffs, report_names_the_runs_and_no_server_directory) {
    char root[600], extra[700];
    test_server s;
    serve_ref_and_hopper(&s, temp_dir(), root, extra);
    json_t *meta = post_diff(s.port, ref_vs_hopper);
    http_resp r;
    get_ok(s.port, file_url(meta, "report"), &r);
    cr_assert(strstr(r.head, "Content-Type: text/html"), "%s", r.head);
    cr_assert(strstr(r.body, "<table"));
    cr_assert(strstr(r.body, "<td>hopper</td>") && strstr(r.body, "<td>ref</td>"), "the runs' rows do not name them");
    cr_assert_null(strstr(r.body, root), "the report names a server directory");
    cr_assert_null(strstr(r.body, "/.tmp/"), "the report names the server's temporary directory");
    http_free(&r);
    json_decref(meta);
    server_stop(&s, SIGKILL);
}

/* Marks the stored meta.json of a diff: an answer that carries the marker was read from the cache; a diff computed
 * again writes its meta.json anew, without it. */
static void mark_cached_meta(const char *root, const char *id, const char *marker) {
    char path[900];
    snprintf(path, sizeof path, "%s/diffs/%s/meta.json", root, id);
    json_t *m = json_load_file(path, 0, NULL);
    cr_assert(m, "no meta.json at %s", path);
    json_object_set_new(m, "test_marker", json_string(marker));
    cr_assert_eq(json_dump_file(m, path, JSON_COMPACT), 0);
    json_decref(m);
}

/* The same diff asked again is answered from the cache: the same id, and the meta.json stored the first time. */
Test(diffs, asked_again_is_answered_from_the_cache) {
    char root[600], extra[700];
    test_server s;
    serve_ref_and_hopper(&s, temp_dir(), root, extra);
    json_t *meta = post_diff(s.port, ref_vs_hopper);
    char id[40];
    snprintf(id, sizeof id, "%s", json_string_value(json_object_get(meta, "id")));
    json_decref(meta);
    mark_cached_meta(root, id, "cached-1");
    meta = post_diff(s.port, ref_vs_hopper);
    cr_assert_str_eq(json_string_value(json_object_get(meta, "id")), id);
    cr_assert_str_eq(json_string_value(json_object_get(meta, "test_marker")) ?: "(none)", "cached-1",
                     "the diff was computed again");
    json_decref(meta);
    /* another number of resamples is another diff */
    meta = post_diff(s.port, "{\"reference\": \"ref\", \"targets\": [\"hopper\"], \"bootstrap\": 50}");
    cr_assert_str_neq(json_string_value(json_object_get(meta, "id")), id);
    cr_assert_null(json_object_get(meta, "test_marker"));
    json_decref(meta);
    server_stop(&s, SIGKILL);
}

/* The cache is on disk: after a restart the diff is answered from it, and its files are served. */
Test(diffs, the_cache_survives_a_restart) {
    char root[600], extra[700];
    test_server s;
    serve_ref_and_hopper(&s, temp_dir(), root, extra);
    json_t *meta = post_diff(s.port, ref_vs_hopper);
    char id[40];
    snprintf(id, sizeof id, "%s", json_string_value(json_object_get(meta, "id")));
    mark_cached_meta(root, id, "before-the-restart");
    server_stop(&s, SIGKILL);
    server_start(&s, root, extra);
    http_resp r;
    get_ok(s.port, file_url(meta, "report"), &r);
    http_free(&r);
    get_ok(s.port, file_url(meta, "diff"), &r);
    http_free(&r);
    json_decref(meta);
    meta = post_diff(s.port, ref_vs_hopper);
    cr_assert_str_eq(json_string_value(json_object_get(meta, "test_marker")) ?: "(none)", "before-the-restart",
                     "the diff was computed again after the restart");
    json_decref(meta);
    server_stop(&s, SIGKILL);
}

/* Unknown runs 404, a run of another model 422 (naming both runs, by name), malformed requests 400. */
Test(diffs, bad_requests_get_their_status) {
    const char *d = temp_dir();
    char root[600], extra[700];
    test_server s;
    serve_ref_and_hopper(&s, d, root, extra);
    const char *other = make_run(d, "other", "hf/qwen2_moe", "--precision fp64");
    http_resp r;
    put_run(s.port, "other", other, AUTH, &r);
    cr_assert_eq(r.status, 201, "%d %s", r.status, r.body);
    http_free(&r);
    static const struct { const char *body; int status; const char *says; } bad[] = {
        {"{\"reference\": \"ref\", \"targets\": [\"nope\"]}", 404, "no run named nope"},
        {"{\"reference\": \"nope\", \"targets\": [\"ref\"]}", 404, "no run named nope"},
        {"{\"reference\": \"ref\", \"targets\": [\"other\"]}", 422, "ref and other are runs of different models"},
        {"{\"reference\": \"ref\", \"targets\": []}", 400, "must be a list of 1 to 16 run names"},
        {"{\"reference\": \"ref\", \"targets\": [\"hopper\"], \"bootstrap\": -1}", 400, "must be an integer from 0 to 10000"},
        {"{\"reference\": \"ref\", \"targets\": [\"hopper\"], \"bootstrap\": 10001}", 400, "must be an integer from 0 to 10000"},
        {"[1,2]", 400, "JSON object"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        http_request(s.port, "POST", "/api/diffs", NULL, bad[i].body, strlen(bad[i].body), &r);
        cr_assert_eq(r.status, bad[i].status, "%s: %d %s", bad[i].body, r.status, r.body);
        cr_assert(r.body && strstr(r.body, bad[i].says), "%s: %s", bad[i].body, r.body);
        cr_assert_null(strstr(r.body, root), "%s: the message names a server directory: %s", bad[i].body, r.body);
        http_free(&r);
    }
    server_stop(&s, SIGKILL);
}

/* A diff or a file of one that does not exist is 404, and an id that is not one never reaches the disk. */
Test(diffs, an_unknown_diff_is_404) {
    char root[600], extra[700];
    test_server s;
    server_start_in(&s, temp_dir(), "", root, extra);
    static const char *paths[] = {"/api/diffs/0123456789abcdef0123456789abcdef", "/api/diffs/0123456789abcdef0123456789abcdef/diff.json",
                                  "/api/diffs/0123456789abcdef0123456789abcdef/heatmaps/t0-margin.png", "/api/diffs/..%2f..%2fruns",
                                  "/api/diffs/0123456789ABCDEF0123456789ABCDEF/diff.json"};
    for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++) {
        http_resp r;
        http_request(s.port, "GET", paths[i], NULL, NULL, 0, &r);
        cr_assert_eq(r.status, 404, "%s: %d %s", paths[i], r.status, r.body);
        http_free(&r);
    }
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

/* Diffs asked for and abandoned before their turn (the client closed, as a killed curl or a closed tab does) are
 * not computed: only the one computing and the one still waited for are stored. */
Test(diffs, abandoned_queued_diffs_are_not_computed, .timeout = 240) {
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
Test(diffs, queued_diffs_leave_the_pool_to_cached_diffs_and_uploads, .timeout = 240) {
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
