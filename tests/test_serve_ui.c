/* The web UI in headless Chromium: the page loads the run list, picks a
 * reference and a target (?ref=&targets= ticks them and presses Compare, the
 * button a user presses), and shows the heatmaps the server drew. */
#include "test_serve_util.h"

#include <criterion/criterion.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#define FLAGS                                                                                                         \
    "--headless --no-sandbox --disable-gpu --disable-background-networking --disable-component-update --disable-sync " \
    "--no-first-run --hide-scrollbars --virtual-time-budget=60000"

static int count(const char *s, const char *what) {
    int n = 0;
    for (const char *p = s; (p = strstr(p, what)); p++) n++;
    return n;
}

Test(serve_ui, load_pick_and_see_the_heatmaps_in_chromium, .timeout = 240) {
    const char *d = temp_dir();
    const char *ref = make_run(d, "ref", "hf/olmoe", "--precision fp64");
    const char *hop = make_run(d, "hopper", "hf/olmoe", "--numerics emu:hopper --precision bf16");
    char root[600], extra[700];
    snprintf(root, sizeof root, "%s/root", d);
    snprintf(extra, sizeof extra, "--token-file '%s' --bootstrap 100", token_file(d));
    test_server s;
    server_start(&s, root, extra);
    const char *names[] = {"ref", "hopper"}, *dirs[] = {ref, hop};
    for (int i = 0; i < 2; i++) {
        http_resp r;
        put_run(s.port, names[i], dirs[i], AUTH, &r);
        cr_assert_eq(r.status, 201, "%d %s", r.status, r.body);
        http_free(&r);
    }
    /* the page is self-contained */
    http_resp r;
    http_request(s.port, "GET", "/", NULL, NULL, 0, &r);
    cr_assert_eq(r.status, 200);
    cr_assert(strstr(r.head, "Content-Type: text/html"));
    cr_assert(strstr(r.head, "Content-Security-Policy: default-src 'none';"), "the browser is told to load nothing from elsewhere");
    cr_assert_null(strstr(r.body, "http://"), "no external resources");
    cr_assert_null(strstr(r.body, "https://"), "no external resources");
    cr_assert_null(strstr(r.body, "<link"), "no external stylesheets");
    cr_assert_null(strstr(r.body, " src="), "no external scripts or images");
    /* its one script runs by the nonce of this answer, and no other script would: not even an inline one */
    const char *np = strstr(r.head, "script-src 'nonce-");
    cr_assert(np, "the policy names no script nonce: %s", r.head);
    char nonce[64] = "", tag[128];
    cr_assert_eq(sscanf(np, "script-src 'nonce-%63[0-9a-f]'", nonce), 1);
    cr_assert_eq(strlen(nonce), 32);
    cr_assert_null(strstr(r.head, "script-src 'unsafe-inline'"));
    snprintf(tag, sizeof tag, "<script nonce=\"%s\">", nonce);
    cr_assert(strstr(r.body, tag), "the page's script does not carry the header's nonce");
    cr_assert_eq(count(r.body, "<script"), 1);
    http_free(&r);
    http_request(s.port, "GET", "/", NULL, NULL, 0, &r);
    cr_assert(strstr(r.head, "script-src 'nonce-") && !strstr(r.head, nonce), "the nonce is the same for two answers");
    http_free(&r);
    if (system("command -v chromium > /dev/null 2>&1") != 0) {
        server_stop(&s, SIGKILL);
        cr_skip_test("chromium is not installed");
    }
    char cmd[4096], path[700];
    snprintf(cmd, sizeof cmd, "cd '%s' && timeout 120 chromium " FLAGS " --user-data-dir='%s/chr' --dump-dom "
             "'http://127.0.0.1:%d/?ref=ref&targets=hopper' > dom.html 2>/dev/null", d, d, s.port);
    cr_assert_eq(system(cmd), 0, "chromium --dump-dom failed");
    snprintf(path, sizeof path, "%s/dom.html", d);
    char *dom;
    size_t n;
    mf_error e = {0};
    cr_assert_eq(mf_read_file(path, &dom, &n, &e), MF_OK);
    /* loaded: both runs listed with their metadata; picked: the reference and the target marked */
    cr_assert(strstr(dom, "data-state=\"shown\""), "the page did not reach the report: %.3000s", dom);
    cr_assert(strstr(dom, "<tr data-name=\"ref\" class=\"ref\">"), "the reference row is not marked");
    cr_assert(strstr(dom, "<tr data-name=\"hopper\" class=\"tgt\">"), "the target row is not marked");
    cr_assert(strstr(dom, "<td class=\"num\">emu:hopper"), "the numerics column");
    cr_assert(strstr(dom, "<td>bf16</td>") && strstr(dom, "<td>fp64</td>"), "the precision column");
    cr_assert(strstr(dom, "olmoe (397,120 params)"), "the model column");
    cr_assert(strstr(dom, "1 target(s) against ref"), "the status line");
    /* seen: the four heatmaps of the target decoded by the browser, with their sizes */
    cr_assert_eq(count(dom, "<img class=\"heatmap\" data-target=\"hopper\""), 4);
    int loaded = 0;
    for (const char *p = dom; (p = strstr(p, "data-loaded=\"")); p++) {
        int w = 0, h = 0;
        if (sscanf(p, "data-loaded=\"%dx%d\"", &w, &h) == 2) {
            cr_assert(w > 300 && h > 100, "a heatmap of %dx%d", w, h);
            loaded++;
        }
    }
    cr_assert_eq(loaded, 4, "%d heatmaps loaded", loaded);
    cr_assert(strstr(dom, "id=\"reportframe\"") && strstr(dom, "srcdoc=\"&lt;!DOCTYPE html"), "the report is in the page");
    free(dom);
    snprintf(cmd, sizeof cmd, "cd '%s' && timeout 120 chromium " FLAGS " --user-data-dir='%s/chr2' --window-size=1400,1300 "
             "--screenshot=shot.png 'http://127.0.0.1:%d/?ref=ref&targets=hopper' > /dev/null 2>&1", d, d, s.port);
    cr_assert_eq(system(cmd), 0, "chromium --screenshot failed");
    snprintf(path, sizeof path, "%s/shot.png", d);
    char *png;
    cr_assert_eq(mf_read_file(path, &png, &n, &e), MF_OK);
    cr_assert(n > 20000 && !memcmp(png, "\x89PNG", 4), "a screenshot of %zu bytes", n);
    free(png);
    cr_assert(server_alive(&s));
    server_stop(&s, SIGKILL);
}
