/* Logging, progress bars, clocks, random numbers, allocation. */
#include "mf_core.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <dlfcn.h>
#include <stdio.h>
#include <unistd.h>

static bool log_quiet;

void mf_log_set_quiet(bool quiet) { log_quiet = quiet; }

void mf_log(const char *fmt, ...) {
    if (log_quiet) return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

double mf_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void mf_progress_begin(mf_progress *p, const char *label, uint64_t total) {
    p->enabled = !log_quiet && isatty(STDERR_FILENO);
    p->start = mf_now();
    p->last_draw = 0;
    p->total = total;
    p->label = label;
}

void mf_progress_update(mf_progress *p, uint64_t done, const char *detail) {
    if (!p->enabled) return;
    double now = mf_now();
    if (done < p->total && now - p->last_draw < 0.1) return;   /* redraw at most 10 times a second */
    p->last_draw = now;
    const int width = 30;
    int filled = p->total ? (int)((double)done / (double)p->total * width) : width;
    char bar[64];
    for (int i = 0; i < width; i++) bar[i] = i < filled ? '#' : '.';
    bar[width] = 0;
    double el = now - p->start;
    fprintf(stderr, "\r%s [%s] %llu/%llu %5.1fs %s\033[K", p->label, bar, (unsigned long long)done,
            (unsigned long long)p->total, el, detail ? detail : "");
    fflush(stderr);
}

void mf_progress_end(mf_progress *p) {
    if (!p->enabled) return;
    fputs("\r\033[K", stderr);
    fflush(stderr);
}

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void mf_rng_seed(mf_rng *r, uint64_t seed) {
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&seed);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t mf_rng_next(mf_rng *r) {
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double mf_rng_uniform(mf_rng *r) { return (double)(mf_rng_next(r) >> 11) * 0x1.0p-53; }

double mf_rng_normal(mf_rng *r) {
    double u1 = mf_rng_uniform(r), u2 = mf_rng_uniform(r);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

/* An allocation the memory check did not foresee failed: one line, exit 1,
 * from whichever thread it happened on (no crash, no core; files being
 * written are temporaries that readers never take for finished ones). */
static _Noreturn void out_of_memory(size_t n) {
    fprintf(stderr, "moeflip: out of memory: an allocation of %zu bytes failed\n", n);
    fflush(stderr);
    _exit(1);
}

void *mf_xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) out_of_memory(n);
    return p;
}

void *mf_xrealloc(void *p, size_t n) {
    void *q = realloc(p, n ? n : 1);
    if (!q) out_of_memory(n);
    return q;
}

void *mf_xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) out_of_memory(n * size);
    return p;
}

char *mf_xstrdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = mf_xmalloc(n);
    memcpy(d, s, n);
    return d;
}

/* The module's path: the first of the places it is looked for that holds it (empty when none does). */
#define MODULE_PATH_MAX 4200
static void module_path(const char *file, char path[MODULE_PATH_MAX]) {
    char dirs[4][4096] = {{0}};
    const char *env = getenv("MOEFLIP_MODULE_DIR");
    if (env) snprintf(dirs[0], sizeof dirs[0], "%s", env);
    ssize_t n = readlink("/proc/self/exe", dirs[1], sizeof dirs[1] - 1);
    if (n > 0) {   /* the program's directory, and its parent (tests/ inside a build) */
        dirs[1][n] = 0;
        char *slash = strrchr(dirs[1], '/');
        if (slash) *slash = 0;
        snprintf(dirs[2], sizeof dirs[2], "%s", dirs[1]);
        slash = strrchr(dirs[2], '/');
        if (slash) *slash = 0;
        else dirs[2][0] = 0;
    }
#ifdef MF_MODULE_DIR
    snprintf(dirs[3], sizeof dirs[3], "%s", MF_MODULE_DIR);
#endif
    path[0] = 0;
    for (int i = 0; i < 4; i++) {
        if (!dirs[i][0] || strlen(dirs[i]) + strlen(file) + 2 > MODULE_PATH_MAX) continue;
        snprintf(path, MODULE_PATH_MAX, "%.4096s/%.64s", dirs[i], file);
        if (access(path, F_OK) == 0) return;
    }
    path[0] = 0;
}

int mf_module_load(void **module, const char *file, const mf_module_fn *fns, size_t n_fns, mf_error *err) {
    *module = NULL;
    char path[MODULE_PATH_MAX];
    module_path(file, path);
    if (!path[0])
        return mf_fail(err, MF_EIO, "%s: not found in $MOEFLIP_MODULE_DIR, next to the program or in its build directory",
                       file);
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) return mf_fail(err, MF_EIO, "%s: %s", path, dlerror());
    const unsigned *abi = dlsym(h, "mf_module_abi");
    if (!abi || *abi != MF_MODULE_ABI) {
        char built[32];
        if (abi) snprintf(built, sizeof built, "%u", *abi);
        dlclose(h);
        return mf_fail(err, MF_EMISMATCH, "%s: a stale module: built for module interface %s, this program needs %u (rebuild it)",
                       path, abi ? built : "(none: older than versioned modules)", (unsigned)MF_MODULE_ABI);
    }
    for (size_t i = 0; i < n_fns; i++) {
        *fns[i].slot = dlsym(h, fns[i].name);
        if (!*fns[i].slot) {
            dlclose(h);
            return mf_fail(err, MF_EIO, "%s: lacks %s", path, fns[i].name);
        }
    }
    *module = h;
    return MF_OK;
}

void mf_module_close(void *module) {
    if (module) dlclose(module);
}

void mf_buf_reserve(mf_buf *b, size_t more) {
    if (b->s && b->n + more + 1 <= b->cap) return;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->n + more + 1) cap *= 2;
    b->s = mf_xrealloc(b->s, cap);
    b->cap = cap;
}

void mf_buf_put(mf_buf *b, const void *data, size_t n) {
    mf_buf_reserve(b, n);
    if (n) memcpy(b->s + b->n, data, n);
    b->n += n;
    b->s[b->n] = 0;
}

void mf_buf_puts(mf_buf *b, const char *str) { mf_buf_put(b, str, strlen(str)); }

void mf_buf_putc(mf_buf *b, char c) { mf_buf_put(b, &c, 1); }

void mf_buf_printf(mf_buf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char small[256];
    const int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof small) {
        mf_buf_put(b, small, (size_t)n);
        return;
    }
    mf_buf_reserve(b, (size_t)n);
    va_start(ap, fmt);
    vsnprintf(b->s + b->n, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->n += (size_t)n;
}

char *mf_buf_take(mf_buf *b, size_t *len) {
    mf_buf_reserve(b, 0);
    char *s = b->s;
    s[b->n] = 0;
    if (len) *len = b->n;
    memset(b, 0, sizeof *b);
    return s;
}

void mf_buf_free(mf_buf *b) {
    free(b->s);
    memset(b, 0, sizeof *b);
}
