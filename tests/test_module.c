/* The module loader (core/util.c): a module built for another module interface, or before modules said theirs,
 * is refused with one line naming its file and both versions, by the loader and by a command; the modules of this
 * build load; the program exports its mf_* symbols to modules and nothing else, and modules export only theirs. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mf_viz.h"
#include "testutil.h"

static int load_draw_from(const char *dir, mf_error *err) {
    void *m, *file_fn, *svg_fn;
    const mf_module_fn fns[] = {{"mf_draw_heatmap_file", &file_fn}, {"mf_draw_heatmap_svg", &svg_fn}};
    if (dir) setenv("MOEFLIP_MODULE_DIR", dir, 1);
    else unsetenv("MOEFLIP_MODULE_DIR");
    const int rc = mf_module_load(&m, "libmoeflip_draw.so", fns, 2, err);
    unsetenv("MOEFLIP_MODULE_DIR");
    if (!rc) {
        cr_assert(m && file_fn && svg_fn);
        mf_module_close(m);
    }
    return rc;
}

/* This build's drawing module loads: through viz/ (which this program then holds, with the functions the module
 * takes from it), the error is the diff's, not the module's; and through the loader itself. */
Test(module, this_builds_modules_load) {
    mf_error err = {0};
    char *svg = NULL;
    size_t len;
    mf_figure fig;
    cr_assert_neq(mf_heatmap_svg("{}", 0, MF_HEAT_LAYER_EXPERT, NULL, &svg, &len, &fig, &err), MF_OK);
    cr_assert(err.msg[0] && !strstr(err.msg, "cannot load"), "%s", err.msg);
    err = (mf_error){0};
    cr_assert_eq(load_draw_from(NULL, &err), MF_OK, "%s", err.msg);
}

Test(module, a_stale_module_is_refused_naming_its_file_and_both_versions) {
    mf_error err = {0};
    cr_assert_eq(load_draw_from(MF_STALE_MODULE_DIR, &err), MF_EMISMATCH, "%s", err.msg);
    char want[600], versions[200];
    snprintf(want, sizeof want, "%s/libmoeflip_draw.so: a stale module", MF_STALE_MODULE_DIR);
    snprintf(versions, sizeof versions, "built for module interface %u, this program needs %u", MF_MODULE_ABI + 1,
             MF_MODULE_ABI);
    cr_assert(strstr(err.msg, want) && strstr(err.msg, versions), "%s", err.msg);
    cr_assert_null(strchr(err.msg, '\n'), "one line: %s", err.msg);
}

Test(module, a_module_without_a_version_is_refused) {
    mf_error err = {0};
    cr_assert_eq(load_draw_from(MF_UNVERSIONED_MODULE_DIR, &err), MF_EMISMATCH, "%s", err.msg);
    char want[600];
    snprintf(want, sizeof want, "%s/libmoeflip_draw.so: a stale module: built for module interface (none", MF_UNVERSIONED_MODULE_DIR);
    cr_assert(strstr(err.msg, want), "%s", err.msg);
}

Test(module, a_missing_module_is_named) {
    void *m;
    mf_error err = {0};
    cr_assert_eq(mf_module_load(&m, "libmoeflip_none.so", NULL, 0, &err), MF_EIO);
    cr_assert(strstr(err.msg, "libmoeflip_none.so: not found"), "%s", err.msg);
}

/* The command: one line on stderr naming the file and both versions, exit status 1, and no picture (the drawing
 * module is loaded before the diff is read). */
Test(module, the_command_refuses_a_stale_module_in_one_line) {
    const char *d = temp_dir();
    write_text(d, "diff.json", "{}");
    char err[2048];
    setenv("MOEFLIP_MODULE_DIR", MF_STALE_MODULE_DIR, 1);
    const int stale_rc = run_moeflip(err, sizeof err, "heatmap '%s/diff.json' --kind layer-expert -o '%s/h.png'", d, d);
    unsetenv("MOEFLIP_MODULE_DIR");
    cr_assert_eq(stale_rc, 1, "%s", err);
    const size_t n = strlen(err);
    cr_assert(n > 0 && err[n - 1] == '\n' && strchr(err, '\n') == err + n - 1, "not one line: [%s]", err);
    char versions[200];
    snprintf(versions, sizeof versions, "built for module interface %u, this program needs %u", MF_MODULE_ABI + 1,
             MF_MODULE_ABI);
    cr_assert(!strncmp(err, "moeflip: cannot load the drawing module: ", 41) && strstr(err, MF_STALE_MODULE_DIR) &&
                  strstr(err, versions),
              "%s", err);
    char png[4300];
    snprintf(png, sizeof png, "%s/h.png", d);
    cr_assert_not(mf_path_exists(png), "a picture was drawn");
}

/* Defined symbols of a program or module (nm -D), but the C library's copy-relocated data (name@GLIBC...). */
static int check_exports(const char *file, int *mf) {
    char cmd[4300];
    snprintf(cmd, sizeof cmd, "nm -D --defined-only '%s'", file);
    FILE *p = popen(cmd, "r");
    cr_assert(p, "%s", cmd);
    char line[1024];
    int others = 0, lines = 0;
    *mf = 0;
    while (fgets(line, sizeof line, p)) {
        char addr[64], kind[8], name[900];
        lines++;
        if (sscanf(line, "%63s %7s %899s", addr, kind, name) != 3 || strchr(name, '@')) continue;
        /* a sanitizer build's runtime exports its own options from the program */
        if (!strncmp(name, "__asan", 6) || !strncmp(name, "__ubsan", 7) || !strncmp(name, "__lsan", 6) ||
            !strncmp(name, "__sanitizer", 11))
            continue;
        if (!strncmp(name, "mf_", 3)) (*mf)++;
        else {
            cr_log_error("%s exports %s", file, name);
            others++;
        }
    }
    cr_assert_eq(pclose(p), 0, "%s failed", cmd);
    cr_assert_gt(lines, 0, "%s printed nothing", cmd);
    return others;
}

Test(module, the_program_exports_its_mf_symbols_only) {
    int mf;
    cr_assert_eq(check_exports(MF_TEST_BIN, &mf), 0, "the program exports symbols beside mf_* (see the log)");
    cr_assert_gt(mf, 100, "the program exports %d mf_* symbols: the modules need the library's", mf);
}

Test(module, modules_export_their_mf_symbols_only) {
    static const char *const modules[] = {"libmoeflip_draw.so", "libmoeflip_push.so", "libmoeflip_cuda.so", "libmoeflip_hip.so"};
    int checked = 0;
    for (int i = 0; i < 4; i++) {
        char path[4300];
        snprintf(path, sizeof path, "%s/%s", MF_BUILD_DIR, modules[i]);
        if (!mf_path_exists(path)) {
            cr_assert(i >= 2, "%s was not built", path);   /* the GPU backends are built where their toolkits are */
            continue;
        }
        int mf;
        cr_assert_eq(check_exports(path, &mf), 0, "%s exports symbols beside mf_* (see the log)", modules[i]);
        cr_assert_geq(mf, 2, "%s: its entry points and mf_module_abi", modules[i]);
        checked++;
    }
    cr_assert_geq(checked, 2);
}
