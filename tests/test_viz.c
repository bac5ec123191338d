/* Figures, the report and the main job, looked at the way a user would:
 * PNGs with real content, figures that fit their cells at real model sizes,
 * and a report that headless Chromium opens and renders with its tables and
 * images. */
#include <cairo.h>
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "mf_viz.h"
#include "testutil.h"

/* A diff.json shaped like a real model's: L layers, E experts, a few flips. */
static char *fake_diff(int L, int E, int T) {
    json_t *ref = json_pack("{s:s,s:s,s:{s:s,s:i}}", "numerics", "fp64", "precision", "fp64", "model", "architecture",
                            "qwen2_moe", "n_experts", E);
    json_t *layers = json_array(), *experts = json_array(), *flips = json_array(), *tok = json_array(), *cnt = json_array(),
           *kl = json_array();
    for (int l = 0; l < L; l++) {
        json_t *dr = json_array(), *ad = json_array();
        for (int e = 0; e < E; e++) {
            json_array_append_new(dr, json_integer((l * 7 + e * 3) % 11 == 0 ? 1 + (l + e) % 5 : 0));
            json_array_append_new(ad, json_integer((l * 5 + e) % 13 == 0 ? 1 + e % 4 : 0));
        }
        json_array_append_new(experts, json_pack("{s:i,s:o,s:o}", "layer", l, "dropped", dr, "added", ad));
        json_t *bins = json_array();
        for (int b = 1; b < 30; b += 3)
            json_array_append_new(bins, json_pack("{s:f,s:f,s:i,s:i}", "margin_lo", 1e-6 * (b * b), "margin_hi",
                                                  1e-6 * ((b + 1) * (b + 1)), "slots", 20, "flips", b < 10 ? 10 - b : 0));
        json_array_append_new(layers, json_pack("{s:i,s:i,s:f,s:o}", "layer", l, "slots", T, "sigma", 1e-4 * (l + 1),
                                                "margin_bins", bins));
        json_array_append_new(flips, json_pack("[iib]", l, (l * 3) % T, l % 2));
    }
    for (int p = 0; p < T; p++) {
        json_array_append_new(tok, json_integer(1000 + p));
        json_array_append_new(cnt, json_integer(p % 3));
        json_array_append_new(kl, json_real(1e-5 * (1 + p % 3) * (1 + p % 7)));
    }
    json_t *seq = json_pack("{s:s,s:o,s:o,s:o,s:o}", "id", "s0", "tokens", tok, "flipped_slots", cnt, "kl", kl, "flips", flips);
    json_t *t = json_pack("{s:s,s:s,s:o,s:o,s:o,s:[o]}", "numerics", "emu:cdna3", "precision", "bf16", "layers", layers,
                          "experts", experts, "metrics", json_object(), "sequences", seq);
    json_t *root = json_pack("{s:s,s:o,s:[o],s:i,s:{s:i,s:i}}", "format", "moeflip-diff", "reference", ref, "targets", t,
                             "sequences", 1, "bootstrap", "resamples", 0, "seed", 1);
    char *s = json_dumps(root, 0);
    json_decref(root);
    return s;
}

/* Every cell of the figure lies inside it: nothing is cropped. */
static void check_fits(const char *diff, mf_heat_kind k, int min_cells) {
    char *svg;
    size_t len;
    mf_figure f;
    mf_error err = {0};
    cr_assert_eq(mf_heatmap_svg(diff, 0, k, NULL, &svg, &len, &f, &err), MF_OK, "%s", err.msg);
    cr_assert_geq((int)f.n_cells, min_cells);
    for (size_t i = 0; i < f.n_cells; i++)
        cr_assert(f.cells[i].x >= 0 && f.cells[i].y >= 0 && f.cells[i].x + f.cells[i].w <= f.width + 0.01 &&
                      f.cells[i].y + f.cells[i].h <= f.height + 0.01,
                  "%s: cell %zu (%s) outside the %dx%d figure", mf_heat_kind_name(k), i, f.cells[i].text, f.width, f.height);
    cr_assert(strstr(svg, "<svg"));
    free(svg);
    mf_figure_free(&f);
}

Test(viz, real_model_sizes_fit) {
    char *a = fake_diff(24, 60, 200), *b = fake_diff(48, 128, 64), *c = fake_diff(16, 64, 512);
    check_fits(a, MF_HEAT_LAYER_EXPERT, 2 * 24 * 60);   /* Qwen1.5-MoE: 60 experts must not crop */
    check_fits(b, MF_HEAT_LAYER_EXPERT, 2 * 48 * 128);  /* Qwen3-30B-A3B */
    check_fits(c, MF_HEAT_LAYER_EXPERT, 2 * 16 * 64);   /* OLMoE */
    check_fits(a, MF_HEAT_LAYER_POSITION, 24 * 200);
    check_fits(c, MF_HEAT_LAYER_POSITION, 16 * 512);
    check_fits(a, MF_HEAT_MARGIN, 24);
    check_fits(a, MF_HEAT_FLIPS_KL, 1);
    free(a);
    free(b);
    free(c);
}

/* A PNG with real content: many non-white pixels and more than a handful of colours. */
static void check_png(const char *path) {
    cairo_surface_t *s = cairo_image_surface_create_from_png(path);
    cr_assert_eq(cairo_surface_status(s), CAIRO_STATUS_SUCCESS, "%s is not a PNG", path);
    const int w = cairo_image_surface_get_width(s), h = cairo_image_surface_get_height(s), st = cairo_image_surface_get_stride(s);
    const unsigned char *px = cairo_image_surface_get_data(s);
    long ink = 0;
    uint32_t colours[64];
    int nc = 0;
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++) {
            uint32_t v;
            memcpy(&v, px + (size_t)y * st + 4 * (size_t)x, 4);
            if ((v & 0xffffff) != 0xffffff) ink++;
            bool seen = false;
            for (int i = 0; i < nc && !seen; i++) seen = colours[i] == v;
            if (!seen && nc < 64) colours[nc++] = v;
        }
    cairo_surface_destroy(s);
    cr_assert_gt(w, 400);
    cr_assert_gt(ink, (long)w * h / 100, "%s is nearly blank", path);
    cr_assert_geq(nc, 8, "%s has %d colours", path, nc);
}

Test(viz, heatmap_command_writes_png_svg_pdf) {
    const char *d = temp_dir();
    char ref[4200], tgt[4200], diff[4200], out[4300], err[2048];
    snprintf(ref, sizeof ref, "%s/ref", d);
    snprintf(tgt, sizeof tgt, "%s/tgt", d);
    snprintf(diff, sizeof diff, "%s/diff.json", d);
    cr_assert_eq(run_moeflip(err, sizeof err, "trace --model %s --input %s --out %s --precision fp64 -q", fixture("hf/qwen3_moe"),
                             fixture("hf/qwen3_moe/tokens.jsonl"), ref), 0, "%s", err);
    cr_assert_eq(run_moeflip(err, sizeof err, "trace --model %s --input %s --out %s --numerics emu:cdna3 -q", fixture("hf/qwen3_moe"),
                             fixture("hf/qwen3_moe/tokens.jsonl"), tgt), 0, "%s", err);
    cr_assert_eq(run_moeflip(err, sizeof err, "diff %s %s -o %s -q --bootstrap 200", ref, tgt, diff), 0, "%s", err);
    static const char *kinds[] = {"layer-expert", "layer-position", "margin", "flips-kl"};
    for (int k = 0; k < 4; k++) {
        snprintf(out, sizeof out, "%s/%s.png", d, kinds[k]);
        cr_assert_eq(run_moeflip(err, sizeof err, "heatmap %s --kind %s -o %s", diff, kinds[k], out), 0, "%s", err);
        check_png(out);
    }
    snprintf(out, sizeof out, "%s/m.svg", d);
    cr_assert_eq(run_moeflip(err, sizeof err, "heatmap %s --kind layer-expert -o %s", diff, out), 0, "%s", err);
    char *t;
    size_t n;
    mf_error e = {0};
    cr_assert_eq(mf_read_file(out, &t, &n, &e), MF_OK);
    cr_assert(strstr(t, "<svg") != NULL);
    free(t);
    snprintf(out, sizeof out, "%s/m.pdf", d);
    cr_assert_eq(run_moeflip(err, sizeof err, "heatmap %s --kind margin -o %s", diff, out), 0, "%s", err);
    cr_assert_eq(mf_read_file(out, &t, &n, &e), MF_OK);
    cr_assert(n > 1000 && !memcmp(t, "%PDF", 4));
    free(t);
    cr_assert_eq(run_moeflip(err, sizeof err, "heatmap %s --kind nope -o x.png", diff), 2);
    /* an unknown extension is bad usage (2), found before any work, with the one-line message of usage errors */
    cr_assert_eq(run_moeflip(err, sizeof err, "heatmap %s --kind margin -o %s/x.gif", diff, d), 2);
    cr_assert(strstr(err, "the extension must be .png, .svg or .pdf") && strchr(err, '\n') == err + strlen(err) - 1, "%s", err);
    snprintf(out, sizeof out, "%s/x.gif", d);
    cr_assert(!mf_path_exists(out));
}

/* Every string a manifest brings into the report (run names, numerics, precision, device, tool, architecture,
 * digests) is text, not markup: whoever made a run cannot put a script into the report of whoever compares it. */
Test(viz, report_escapes_what_runs_say) {
    static const char hostile[] = "<img src=x onerror=alert(1)>\"><script>alert(2)</script>";
    char *text = fake_diff(3, 8, 6);
    json_t *d = json_loads(text, 0, NULL);
    free(text);
    json_t *runs[2] = {json_object_get(d, "reference"), json_array_get(json_object_get(d, "targets"), 0)};
    static const char *keys[] = {"run", "numerics", "precision", "device_name", "tool"};
    for (int r = 0; r < 2; r++)
        for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) json_object_set_new(runs[r], keys[k], json_string(hostile));
    json_t *model = json_object_get(runs[0], "model");
    json_object_set_new(model, "architecture", json_string(hostile));
    json_object_set_new(model, "config_digest", json_string(hostile));
    json_object_set_new(model, "weights_digest", json_string(hostile));
    const char *dir = temp_dir();
    char path[4200], out[4200];
    snprintf(path, sizeof path, "%s/diff.json", dir);
    snprintf(out, sizeof out, "%s/report.html", dir);
    cr_assert_eq(json_dump_file(d, path, 0), 0);
    json_decref(d);
    mf_error e = {0};
    cr_assert_eq(mf_report_write(path, out, &e), MF_OK, "%s", e.msg);
    char *html;
    size_t n;
    cr_assert_eq(mf_read_file(out, &html, &n, &e), MF_OK);
    cr_assert_null(strstr(html, "<img src=x"), "a manifest's text went into the report as markup");
    cr_assert_null(strstr(html, "<script"), "a manifest's text went into the report as markup");
    int escaped = 0;
    for (const char *p = html; (p = strstr(p, "&lt;img src=x onerror=alert(1)&gt;&quot;&gt;&lt;script&gt;")); p++) escaped++;
    /* the section's heading and line (3), the two runs' rows (10), the model line (3) */
    cr_assert_geq(escaped, 16, "the hostile text appears escaped %d times", escaped);
    cr_assert(strstr(html, "<meta http-equiv=Content-Security-Policy content=\"default-src 'none';"), "no CSP of its own");
    free(html);
}

/* The report opens with what a reader came for: the headline table (each target's flips, KL and top-1 agreement
 * against its reference, with intervals) before the full tables, targets labelled by their profile's name with the
 * canonical profile on hover; two targets of one profile name are told apart by their runs. */
Test(viz, report_opens_with_the_headline_and_short_labels) {
    const char *d = temp_dir();
    const char *ref = make_run(d, "ref", "hf/olmoe", "--precision fp64");
    const char *a = make_run(d, "acc1", "hf/olmoe", "--numerics emu:cdna3 --precision bf16");
    const char *b = make_run(d, "acc2", "hf/olmoe", "--numerics emu:cdna3:acc=2 --precision bf16");
    const char *h = make_run(d, "hop", "hf/olmoe", "--numerics emu:hopper --precision bf16");
    char diff[700], out[700], err[2048];
    snprintf(diff, sizeof diff, "%s/diff.json", d);
    snprintf(out, sizeof out, "%s/report.html", d);
    cr_assert_eq(run_moeflip(err, sizeof err, "diff -q '%s' '%s' '%s' '%s' -o '%s' --bootstrap 100", ref, h, a, b, diff), 0, "%s", err);
    cr_assert_eq(run_moeflip(err, sizeof err, "report '%s' -o '%s'", diff, out), 0, "%s", err);
    char *html = slurp(out, NULL);
    json_t *doc = json_load_file(diff, 0, NULL);
    cr_assert(doc);
    const char *headline = strstr(html, "<table class=headline>"), *summary = strstr(html, "<table class=summary>");
    cr_assert(headline && summary && headline < summary, "the headline does not come first");
    cr_assert(headline == strstr(html, "<table"), "a table comes before the headline");
    /* the hopper target: its short label, the full profile on hover, and its numbers as diff.json has them */
    json_t *t0 = json_array_get(json_object_get(doc, "targets"), 0);
    char label[600], flips[64];
    snprintf(label, sizeof label, "<span class=setting title=\"%s &times; bf16\">emu:hopper &times; bf16</span>",
             json_string_value(json_object_get(t0, "numerics")));
    const char *row = strstr(headline, label);
    cr_assert(row && row < summary, "no headline row labelled %s", label);
    const double v = json_number_value(json_object_get(json_object_get(json_object_get(t0, "metrics"), "flipped_slots_pct"), "value"));
    snprintf(flips, sizeof flips, "<b>%.2f%%</b>", v);
    const char *cell = strstr(row, flips), *row_end = strstr(row, "</tr>");
    cr_assert(cell && cell < row_end, "the headline row lacks %s", flips);
    cr_assert(strstr(json_string_value(json_object_get(t0, "numerics")), "wgmma"), "the canonical profile is the long one");
    /* both emu:cdna3 targets carry their runs' labels; the hopper one, alone of its name, does not */
    char twin[1200];
    snprintf(twin, sizeof twin, "emu:cdna3 &times; bf16 <span class=ci>(%s)</span>", a);
    cr_assert(strstr(headline, twin), "no label %s", twin);
    snprintf(twin, sizeof twin, "emu:cdna3 &times; bf16 <span class=ci>(%s)</span>", b);
    cr_assert(strstr(headline, twin), "no label %s", twin);
    cr_assert(strstr(label, "<span class=ci>") == NULL && strstr(row, "emu:hopper &times; bf16</span></th>"));
    json_decref(doc);
    free(html);
}

/* The main job with no arguments in an empty folder, then the report in Chromium. */
Test(viz, sweep_default_and_report_in_chromium, .timeout = 600) {
    const char *d = temp_dir();
    char cmd[9000], err[4096];
    snprintf(cmd, sizeof cmd, "cd '%s' && %s sweep -q > sweep.txt 2> sweep.err", d, MF_TEST_BIN);
    cr_assert_eq(system(cmd), 0, "moeflip sweep failed");
    char path[4300], *t;
    size_t n;
    mf_error e = {0};
    snprintf(path, sizeof path, "%s/moeflip-out/report.html", d);
    cr_assert_eq(mf_read_file(path, &t, &n, &e), MF_OK, "%s", e.msg);
    cr_assert(strstr(t, "<table") && strstr(t, "<img") && strstr(t, "data:image/svg+xml;base64,"));
    /* the default texts are generated on and scored: the responses side by side, the answers' table */
    cr_assert(strstr(t, "<h3>Generated responses</h3>") && strstr(t, "<h3>Multiple-choice answers</h3>"),
              "the report lacks the responses or the answers");
    cr_assert(strstr(t, "In Python, a list comprehension"), "the report does not show the prompts' text");
    cr_assert_null(strstr(t, "http://"), "no external resources");
    cr_assert_null(strstr(t, "https://"), "no external resources");
    cr_assert_null(strstr(t, "<script"), "no scripts");
    free(t);
    snprintf(path, sizeof path, "%s/moeflip-out/figures/reference-t1-layer-expert.png", d);
    check_png(path);
    snprintf(path, sizeof path, "%s/sweep.txt", d);
    cr_assert_eq(mf_read_file(path, &t, &n, &e), MF_OK);
    cr_assert(strstr(t, "report: moeflip-out/report.html"), "%s", t);
    cr_assert(strstr(t, "generate the same response for") && strstr(t, "of 12 multiple-choice items"), "%s", t);
    free(t);
    /* Chromium: the page loads, its DOM has the tables and figures, and a screenshot has content */
    if (system("command -v chromium > /dev/null 2>&1") != 0) cr_skip_test("chromium is not installed");
    const char *flags = "--headless --no-sandbox --disable-gpu --disable-background-networking --disable-component-update "
                        "--disable-sync --no-first-run --hide-scrollbars";
    snprintf(cmd, sizeof cmd, "cd '%s' && timeout 120 chromium %s --user-data-dir='%s/chr' --dump-dom moeflip-out/report.html > dom.html 2>/dev/null",
             d, flags, d);
    cr_assert_eq(system(cmd), 0, "chromium --dump-dom failed");
    snprintf(path, sizeof path, "%s/dom.html", d);
    cr_assert_eq(mf_read_file(path, &t, &n, &e), MF_OK);
    int tables = 0, imgs = 0;
    for (char *p = t; (p = strstr(p, "<table")); p++) tables++;
    for (char *p = t; (p = strstr(p, "<img")); p++) imgs++;
    cr_assert_geq(tables, 3, "%d tables in the rendered page", tables);
    cr_assert_geq(imgs, 8, "%d images in the rendered page", imgs);
    free(t);
    snprintf(cmd, sizeof cmd, "cd '%s' && timeout 120 chromium %s --user-data-dir='%s/chr2' --window-size=1400,2000 --screenshot=shot.png moeflip-out/report.html > /dev/null 2>&1",
             d, flags, d);
    cr_assert_eq(system(cmd), 0, "chromium --screenshot failed");
    snprintf(path, sizeof path, "%s/shot.png", d);
    check_png(path);
    (void)err;
}
