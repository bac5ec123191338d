/* The collector's run store: `moeflip serve` as a child process on an
 * ephemeral loopback port, driven by raw sockets and by `moeflip push`: run
 * names, what is stored and listed, the same run again, damaged runs on disk
 * and in uploads, the store rebuilt at a restart. */
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

Test(store, name_rules) {
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

Test(store, push_list_manifest_again_and_restart, .timeout = 120) {
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

/* A manifest whose descriptive fields have other types than moeflip writes (a number for the date, an object for
 * the numerics) is stored and listed with those fields null, as the API documents its types. (A field the readers
 * index by, such as model.n_experts, must have its type: tests/test_hostile.c.) */
Test(store, odd_manifest_fields_are_listed_as_null) {
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
Test(store, damaged_stored_run_is_replaced_by_a_new_push) {
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

Test(store, damaged_upload_is_refused_and_damaged_run_is_not_pushed) {
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
