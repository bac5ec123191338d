/* moeflip viz: heatmaps of flipped experts and the self-contained HTML
 * report, both drawn from a diff.json.
 *
 * One drawing code (cairo) renders every figure to PNG, SVG or PDF, chosen by
 * the output file's extension. Colour maps are perceptually uniform and
 * colour-blind safe: viridis for amounts, a blue-white-red diverging map, and
 * the Okabe-Ito colours for categories. */
#ifndef MF_VIZ_H
#define MF_VIZ_H

#include "mf_core.h"

typedef enum mf_heat_kind {
    MF_HEAT_LAYER_EXPERT,    /* per layer x expert: tokens dropped and added */
    MF_HEAT_LAYER_POSITION,  /* one sequence: flipped slots per layer x position, primary vs inherited */
    MF_HEAT_MARGIN,          /* flip probability against the reference margin, per layer, with the fit */
    MF_HEAT_FLIPS_KL,        /* per-position KL against flipped-slot count */
    MF_HEAT_REPLAY_CURVE,    /* routing replay: the share of the output error the flips cause, replaying the
                              * reference's routing through each layer (diff.json's attribution curve) */
} mf_heat_kind;

int mf_heat_kind_parse(const char *s, mf_heat_kind *out);
const char *mf_heat_kind_name(mf_heat_kind k);

/* A cell of a figure, for the report's hover: rectangle in figure pixels and its text. */
typedef struct mf_cell {
    float x, y, w, h;
    char text[160];
} mf_cell;

typedef struct mf_figure {
    int width, height;
    mf_cell *cells;
    size_t n_cells, cap_cells;
} mf_figure;

void mf_figure_free(mf_figure *f);

/* Draws figure `kind` of target `target` (0-based) of the diff in `diff_json`
 * (text) to `path` (.png, .svg or .pdf). seq: the sequence for
 * layer-position (NULL: the one with the most flips). */
int mf_heatmap_file(const char *diff_json, int target, mf_heat_kind kind, const char *seq, const char *path,
                    mf_error *err);
/* The same as an SVG document in memory, plus the cells for hover text. */
int mf_heatmap_svg(const char *diff_json, int target, mf_heat_kind kind, const char *seq, char **svg, size_t *len,
                   mf_figure *fig, mf_error *err);

/* report.html: one self-contained file (no network, scripts or fonts from
 * outside): summary with intervals, per-layer tables, the figures inline as
 * SVG with hover text, the runs' metadata. */
int mf_report_write(const char *diff_json_path, const char *out_path, mf_error *err);
/* One report with a section per diff. */
int mf_report_write_many(const char **diff_json_paths, int n, const char *out_path, mf_error *err);

#endif
