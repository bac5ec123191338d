#include "testutil.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

const char *fixture(const char *rel) {
    static char buf[8][4096];
    static int next;
    char *b = buf[next++ % 8];
    snprintf(b, 4096, "%s/%s", MF_TEST_FIXTURES, rel);
    return b;
}

static char *dirs[256];
static int ndirs;

static void cleanup(void) {
    for (int i = 0; i < ndirs; i++) {
        char cmd[4200];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dirs[i]);
        if (system(cmd)) { /* best effort */ }
        free(dirs[i]);
    }
    ndirs = 0;
}

const char *temp_dir(void) {
    char tmpl[] = "/tmp/moeflip-test-XXXXXX";
    char *d = mkdtemp(tmpl);
    cr_assert(d, "mkdtemp failed");
    if (ndirs == 0) atexit(cleanup);
    cr_assert(ndirs < 256);
    dirs[ndirs] = strdup(d);
    return dirs[ndirs++];
}

int run_moeflip(char *err_out, size_t cap, const char *fmt, ...) {
    char args[8192], cmd[16384];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    const char *errfile = "/dev/null";
    char ef[4200];
    if (err_out) {
        snprintf(ef, sizeof ef, "%s/stderr.txt", temp_dir());
        errfile = ef;
    }
    snprintf(cmd, sizeof cmd, "%s %s 2>%s", MF_TEST_BIN, args, errfile);
    int st = system(cmd);
    if (err_out) {
        FILE *fp = fopen(errfile, "r");
        size_t n = fp ? fread(err_out, 1, cap - 1, fp) : 0;
        err_out[n] = 0;
        if (fp) fclose(fp);
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* The reference files are kept xz-compressed in the repository (they are most of its size and compress to about
 * half): PATH.xz stands for PATH when PATH itself is absent. It is decoded once per process into a temporary file,
 * which later reads of the same PATH reuse. */
static const char *plain_reference(const char *path) {
    static char from[16][4096], to[16][4200];
    static int used;
    if (access(path, F_OK) == 0) return path;
    for (int i = 0; i < used; i++)
        if (!strcmp(from[i], path)) return to[i];
    char xz[4200];
    snprintf(xz, sizeof xz, "%s.xz", path);
    char *plain;
    size_t len;
    mf_error err = {0};
    cr_assert_eq(mf_read_file(xz, &plain, &len, &err), MF_OK, "%s: absent, and %s", path, err.msg);
    int slot = used < 16 ? used++ : 15;
    snprintf(from[slot], sizeof from[slot], "%s", path);
    snprintf(to[slot], sizeof to[slot], "%s/reference.safetensors", temp_dir());
    FILE *fp = fopen(to[slot], "wb");
    cr_assert(fp && fwrite(plain, 1, len, fp) == len && fclose(fp) == 0, "cannot write %s", to[slot]);
    free(plain);
    return to[slot];
}

double *read_tensor(const char *path, const char *name, size_t *n) {
    mf_st_file *f;
    mf_error err = {0};
    path = plain_reference(path);
    cr_assert_eq(mf_st_open(&f, path, &err), MF_OK, "%s", err.msg);
    const mf_st_tensor *t = mf_st_find(f, name);
    cr_assert(t, "%s: no tensor %s", path, name);
    size_t cnt = (size_t)mf_st_numel(t);
    double *v = malloc(cnt * sizeof(double) + 1);
    for (size_t i = 0; i < cnt; i++) {
        if (t->dtype == MF_I32) {
            int32_t x;
            memcpy(&x, t->data + 4 * i, 4);
            v[i] = x;
        } else {
            v[i] = mf_load_as_f64(t->data, t->dtype, i);
        }
    }
    *n = cnt;
    mf_st_close(f);
    return v;
}

const char *copy_fixture_dir(const char *case_name) {
    const char *d = temp_dir();
    char cmd[9000];
    snprintf(cmd, sizeof cmd, "cp -r '%s'/. '%s'/", fixture(case_name), d);
    cr_assert_eq(system(cmd), 0);
    return d;
}

const char *sampled_prompts(const char *path, int n) {
    if (!MF_TEST_SANITIZED) return path;
    static char out[4][4300];
    static int next;
    char *o = out[next++ % 4];
    snprintf(o, sizeof out[0], "%s/sampled.jsonl", temp_dir());
    FILE *in = fopen(path, "r"), *w = fopen(o, "w");
    cr_assert(in && w, "cannot copy %s to %s", path, o);
    char line[1 << 16];
    for (int i = 0; i < n && fgets(line, sizeof line, in); i++) fputs(line, w);
    fclose(in);
    cr_assert_eq(fclose(w), 0, "cannot write %s", o);
    return o;
}

void write_text(const char *dir, const char *name, const char *text) {
    char p[4200];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *fp = fopen(p, "w");
    cr_assert(fp, "cannot write %s", p);
    cr_assert_geq(fputs(text, fp), 0, "cannot write %s", p);
    cr_assert_eq(fclose(fp), 0, "cannot write %s", p);
}

const char *make_run(const char *dir, const char *name, const char *model, const char *opts) {
    static char out[8][600];
    static int next;
    char *o = out[next++ % 8];
    snprintf(o, 600, "%s/%s", dir, name);
    char m[4200];
    snprintf(m, sizeof m, "%s", fixture(model));
    char err[2048];
    int rc = run_moeflip(err, sizeof err, "trace -q --model '%s' --input '%s/tokens.jsonl' --out '%s' %s", m, m, o, opts);
    cr_assert_eq(rc, 0, "trace failed: %s", err);
    return o;
}

char *slurp(const char *path, size_t *len) {
    char *text;
    size_t n;
    mf_error e = {0};
    cr_assert_eq(mf_read_file(path, &text, &n, &e), MF_OK, "%s", e.msg);
    if (len) *len = n;
    return text;
}

void sleep_ms(double ms) {
    const time_t s = (time_t)(ms / 1000.0);
    struct timespec ts = {s, (long)((ms - 1000.0 * (double)s) * 1e6)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}

int dir_entries_named(const char *path, const char *part) {
    DIR *d = opendir(path);
    if (!d) return -1;
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)))
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..") && (!part || strstr(de->d_name, part))) n++;
    closedir(d);
    return n;
}

int dir_entries(const char *path) { return dir_entries_named(path, NULL); }

json_t *read_jsonl(const char *path) {
    char *text;
    size_t len;
    mf_error err = {0};
    cr_assert_eq(mf_read_file(path, &text, &len, &err), MF_OK, "%s", err.msg);
    json_t *rows = json_array();
    int line = 0;
    char *save = NULL;
    for (char *p = strtok_r(text, "\n", &save); p; p = strtok_r(NULL, "\n", &save)) {
        json_error_t je;
        json_t *o = json_loads(p, 0, &je);
        line++;
        cr_assert(o, "%s:%d: not JSON: %s", path, line, je.text);
        json_array_append_new(rows, o);
    }
    free(text);
    return rows;
}
