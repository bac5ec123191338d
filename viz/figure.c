/* What the figures share without drawing anything: kinds, cells, and the
 * entry points that load the drawing module (libmoeflip_draw.so: heatmap.c
 * and cairo with its dozen libraries, which a trace or a diff never loads). */
#include "mf_viz.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static const char *const kind_names[] = {"layer-expert", "layer-position", "margin", "flips-kl", "replay-curve"};
#define N_KINDS (int)(sizeof kind_names / sizeof kind_names[0])

int mf_heat_kind_parse(const char *s, mf_heat_kind *out) {
    for (int i = 0; i < N_KINDS; i++)
        if (!strcmp(s, kind_names[i])) {
            *out = (mf_heat_kind)i;
            return MF_OK;
        }
    return MF_EINVAL;
}

const char *mf_heat_kind_name(mf_heat_kind k) { return (int)k >= 0 && (int)k < N_KINDS ? kind_names[k] : "?"; }

void mf_figure_free(mf_figure *f) {
    free(f->cells);
    memset(f, 0, sizeof *f);
}

typedef int (*draw_file_fn)(const char *, int, mf_heat_kind, const char *, const char *, mf_error *);
typedef int (*draw_svg_fn)(const char *, int, mf_heat_kind, const char *, char **, size_t *, mf_figure *, mf_error *);

static struct {
    draw_file_fn file;
    draw_svg_fn svg;
    mf_error err;   /* why the module did not load */
} draw;
static pthread_once_t draw_once = PTHREAD_ONCE_INIT;

/* Once per process (the module stays loaded); pthread_once, because the collector draws in its thread pool. */
static void load_draw_once(void) {
    void *m;
    const mf_module_fn fns[] = {{"mf_draw_heatmap_file", (void **)&draw.file}, {"mf_draw_heatmap_svg", (void **)&draw.svg}};
    if (mf_module_load(&m, "libmoeflip_draw.so", fns, 2, &draw.err)) draw.file = NULL, draw.svg = NULL;
}

static int load_draw(mf_error *err) {
    pthread_once(&draw_once, load_draw_once);
    if (draw.file && draw.svg) return MF_OK;
    return mf_fail(err, draw.err.code ? draw.err.code : MF_EIO, "cannot load the drawing module: %s", draw.err.msg);
}

int mf_heatmap_file(const char *diff_json, int target, mf_heat_kind kind, const char *seq, const char *path,
                    mf_error *err) {
    int rc = load_draw(err);
    return rc ? rc : draw.file(diff_json, target, kind, seq, path, err);
}

int mf_heatmap_svg(const char *diff_json, int target, mf_heat_kind kind, const char *seq, char **svg, size_t *len,
                   mf_figure *fig, mf_error *err) {
    int rc = load_draw(err);
    return rc ? rc : draw.svg(diff_json, target, kind, seq, svg, len, fig, err);
}
