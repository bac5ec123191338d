/* Figures of a diff, drawn with cairo: one drawing code, three outputs. */
#include "mf_viz.h"

#include <cairo.h>
#include <cairo-pdf.h>
#include <cairo-svg.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* the module interface this module was built for (mf_core.h) */
MF_MODULE_ABI_DEFINE;

/* ---- colours ------------------------------------------------------------------ */

typedef struct rgb { double r, g, b; } rgb;

static rgb hex(unsigned v) { return (rgb){((v >> 16) & 255) / 255.0, ((v >> 8) & 255) / 255.0, (v & 255) / 255.0}; }

/* viridis, nine anchors, linear in between */
static rgb viridis(double t) {
    static const unsigned a[9] = {0x440154, 0x472d7b, 0x3b528b, 0x2c728e, 0x21918c, 0x28ae80, 0x5ec962, 0xaddc30, 0xfde725};
    t = t < 0 ? 0 : t > 1 ? 1 : t;
    double x = t * 8;
    int i = (int)x;
    if (i >= 8) return hex(a[8]);
    double f = x - i;
    rgb p = hex(a[i]), q = hex(a[i + 1]);
    return (rgb){p.r + f * (q.r - p.r), p.g + f * (q.g - p.g), p.b + f * (q.b - p.b)};
}

/* Okabe-Ito categories */
static const unsigned C_PRIMARY = 0xD55E00, C_INHERITED = 0x0072B2, C_EMPTY = 0xEEEEEE, C_ZERO = 0xF4F4F4,
                      C_TEXT = 0x222222, C_GRID = 0xBBBBBB;

static void set(cairo_t *cr, rgb c) { cairo_set_source_rgb(cr, c.r, c.g, c.b); }

/* ---- text ---------------------------------------------------------------------- */

static void font(cairo_t *cr, double size, bool bold) {
    cairo_select_font_face(cr, "DejaVu Sans", CAIRO_FONT_SLANT_NORMAL, bold ? CAIRO_FONT_WEIGHT_BOLD : CAIRO_FONT_WEIGHT_NORMAL);
    cairo_set_font_size(cr, size);
}

/* Text anchored at (x, y): ax, ay in {0 left/top, 0.5 centre, 1 right/bottom}; angle in radians. */
static void text(cairo_t *cr, double x, double y, double ax, double ay, double angle, const char *s) {
    cairo_text_extents_t e;
    cairo_text_extents(cr, s, &e);
    cairo_save(cr);
    cairo_translate(cr, x, y);
    cairo_rotate(cr, angle);
    cairo_move_to(cr, -e.x_advance * ax, e.height * (1 - ay) - e.height * 0.1);
    cairo_show_text(cr, s);
    cairo_restore(cr);
}

static void textf(cairo_t *cr, double x, double y, double ax, double ay, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
static void textf(cairo_t *cr, double x, double y, double ax, double ay, const char *fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    text(cr, x, y, ax, ay, 0, buf);
}

/* ---- the data a figure needs, read from diff.json ------------------------------- */

typedef struct fig_data {
    mf_heat_kind kind;
    char title[256], subtitle[256];
    int L, E, T;
    int *layers;
    double *a, *b;            /* layer-expert: dropped, added [L][E]; layer-position: state [L][T] */
    int *tokens;              /* layer-position */
    char **token_text;        /* layer-position, when the diff carries text (NULL: ids) */
    char seq[128];
    json_t *layer_objs;       /* margin: layers[] */
    json_t *seq_obj;          /* flips-kl: all sequences */
    json_t *curve;            /* replay-curve: the target's attribution curve */
} fig_data;

static const char *str(json_t *o, const char *k) {
    const char *s = json_string_value(json_object_get(o, k));
    return s ? s : "?";
}

static int load(const char *text_json, int target, mf_heat_kind kind, const char *seq, fig_data *d, json_t **root,
                mf_error *err) {
    memset(d, 0, sizeof *d);
    d->kind = kind;
    json_error_t je;
    *root = json_loads(text_json, 0, &je);
    if (!*root) return mf_fail(err, MF_EFORMAT, "diff.json: %s", je.text);
    json_t *targets = json_object_get(*root, "targets"), *ref = json_object_get(*root, "reference");
    if (!json_is_array(targets) || target < 0 || (size_t)target >= json_array_size(targets))
        return mf_fail(err, MF_EINVAL, "diff.json has %zu targets; no target %d", json_array_size(targets), target + 1);
    json_t *t = json_array_get(targets, (size_t)target);
    snprintf(d->subtitle, sizeof d->subtitle, "reference %s x %s  ->  target %s x %s", str(ref, "numerics"),
             str(ref, "precision"), str(t, "numerics"), str(t, "precision"));
    const char *arch = json_string_value(json_object_get(json_object_get(ref, "model"), "architecture"));
    json_t *experts = json_object_get(t, "experts"), *layers = json_object_get(t, "layers");
    d->L = (int)json_array_size(layers);
    d->E = (int)json_integer_value(json_object_get(json_object_get(ref, "model"), "n_experts"));
    d->layers = calloc((size_t)d->L + 1, sizeof(int));
    for (int l = 0; l < d->L; l++) d->layers[l] = (int)json_integer_value(json_object_get(json_array_get(layers, (size_t)l), "layer"));
    switch (kind) {
    case MF_HEAT_LAYER_EXPERT:
        if (!d->L) return mf_fail(err, MF_EINVAL, "diff.json: a dense model has no experts to draw");
        snprintf(d->title, sizeof d->title, "%s: tokens per layer and expert that flipped", arch ? arch : "model");
        d->a = calloc((size_t)d->L * d->E + 1, sizeof(double));
        d->b = calloc((size_t)d->L * d->E + 1, sizeof(double));
        for (int l = 0; l < d->L; l++) {
            json_t *x = json_array_get(experts, (size_t)l);
            for (int e = 0; e < d->E; e++) {
                d->a[(size_t)l * d->E + e] = (double)json_integer_value(json_array_get(json_object_get(x, "dropped"), (size_t)e));
                d->b[(size_t)l * d->E + e] = (double)json_integer_value(json_array_get(json_object_get(x, "added"), (size_t)e));
            }
        }
        break;
    case MF_HEAT_LAYER_POSITION: {
        json_t *seqs = json_object_get(t, "sequences"), *s = NULL;
        size_t i;
        json_t *v;
        int best = -1;
        json_array_foreach(seqs, i, v) {
            if (seq && !strcmp(str(v, "id"), seq)) s = v;
            if (!seq && (int)json_array_size(json_object_get(v, "flips")) > best) {
                best = (int)json_array_size(json_object_get(v, "flips"));
                s = v;
            }
        }
        if (!s) return mf_fail(err, MF_EINVAL, "diff.json: no sequence %s", seq ? seq : "at all");
        snprintf(d->seq, sizeof d->seq, "%s", str(s, "id"));
        snprintf(d->title, sizeof d->title, "%s: flipped expert choices in sequence %s", arch ? arch : "model", d->seq);
        json_t *tok = json_object_get(s, "tokens");
        d->T = (int)json_array_size(tok);
        d->tokens = calloc((size_t)d->T + 1, sizeof(int));
        for (int p = 0; p < d->T; p++) d->tokens[p] = (int)json_integer_value(json_array_get(tok, (size_t)p));
        json_t *txt = json_object_get(s, "token_text");
        if (json_is_array(txt) && (int)json_array_size(txt) == d->T) {
            d->token_text = calloc((size_t)d->T, sizeof(char *));
            for (int p = 0; p < d->T; p++) {
                const char *x = json_string_value(json_array_get(txt, (size_t)p));
                d->token_text[p] = strdup(x ? x : "");
            }
        }
        d->a = calloc((size_t)d->L * d->T + 1, sizeof(double));
        json_array_foreach(json_object_get(s, "flips"), i, v) {
            int layer = (int)json_integer_value(json_array_get(v, 0)), p = (int)json_integer_value(json_array_get(v, 1));
            for (int l = 0; l < d->L; l++)
                if (d->layers[l] == layer && p >= 0 && p < d->T)
                    d->a[(size_t)l * d->T + p] = json_is_true(json_array_get(v, 2)) ? 2 : 1;
        }
        break;
    }
    case MF_HEAT_MARGIN:
        if (!d->L) return mf_fail(err, MF_EINVAL, "diff.json: a dense model has no router margins");
        snprintf(d->title, sizeof d->title, "%s: flip probability against the reference's router margin", arch ? arch : "model");
        d->layer_objs = layers;
        break;
    case MF_HEAT_FLIPS_KL:
        snprintf(d->title, sizeof d->title, "%s: output error against flipped expert choices per position", arch ? arch : "model");
        d->seq_obj = json_object_get(t, "sequences");
        break;
    case MF_HEAT_REPLAY_CURVE: {
        size_t i;
        json_t *e, *mine = NULL;
        json_array_foreach(json_object_get(*root, "attribution"), i, e)
            if (json_integer_value(json_object_get(e, "target")) == target + 1) mine = e;
        d->curve = json_object_get(mine, "curve");
        if (!json_array_size(d->curve))
            return mf_fail(err, MF_EINVAL, "diff.json: target %d has no replayed twin (a target of its numerics and "
                           "precision traced with --replay of the reference)", target + 1);
        snprintf(d->title, sizeof d->title, "%s: share of the output error that the expert flips cause", arch ? arch : "model");
        break;
    }
    }
    return MF_OK;
}

static void data_free(fig_data *d) {
    for (int p = 0; d->token_text && p < d->T; p++) free(d->token_text[p]);
    free(d->token_text);
    free(d->layers);
    free(d->a);
    free(d->b);
    free(d->tokens);
}

static void cell(mf_figure *f, double x, double y, double w, double h, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
static void cell(mf_figure *f, double x, double y, double w, double h, const char *fmt, ...) {
    if (!f) return;
    if (f->n_cells == f->cap_cells) {
        f->cap_cells = f->cap_cells ? 2 * f->cap_cells : 256;
        f->cells = mf_xrealloc(f->cells, f->cap_cells * sizeof *f->cells);
    }
    mf_cell *c = &f->cells[f->n_cells++];
    c->x = (float)x;
    c->y = (float)y;
    c->w = (float)w;
    c->h = (float)h;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->text, sizeof c->text, fmt, ap);
    va_end(ap);
}

static double clampd(double x, double lo, double hi) { return x < lo ? lo : x > hi ? hi : x; }

/* Tick spacing: label every `step` cells so labels stay `min_px` apart. */
static int tick_step(double cell_px, double min_px) {
    static const int steps[] = {1, 2, 4, 5, 8, 10, 16, 20, 25, 32, 50, 64, 100, 128, 200, 256, 500, 1000};
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++)
        if (steps[i] * cell_px >= min_px) return steps[i];
    return 1000;
}

/* ---- layout and drawing ------------------------------------------------------------- */

enum { LEFT = 90, TOP = 78, BOTTOM = 72, BAR = 90 };

typedef struct geom {
    double cw, ch, pw, ph, gap;
} geom;

static void layout(const fig_data *d, mf_figure *f, geom *g) {
    switch (d->kind) {
    case MF_HEAT_LAYER_EXPERT:
        g->cw = clampd(560.0 / d->E, 3, 22);
        g->ch = clampd(520.0 / d->L, 5, 22);
        g->pw = g->cw * d->E;
        g->ph = g->ch * d->L;
        g->gap = 70;
        f->width = (int)(LEFT + 2 * g->pw + g->gap + BAR + 30);
        f->height = (int)(TOP + g->ph + BOTTOM + 10);
        break;
    case MF_HEAT_LAYER_POSITION:
        g->cw = clampd(1100.0 / d->T, 2, 22);
        g->ch = clampd(520.0 / d->L, 5, 22);
        g->pw = g->cw * d->T;
        g->ph = g->ch * d->L;
        f->width = (int)(LEFT + g->pw + 340);   /* room for the legend */
        f->height = (int)(TOP + g->ph + BOTTOM + 30);
        break;
    default:
        g->pw = 720;
        g->ph = 420;
        f->width = (int)(LEFT + g->pw + 190);
        f->height = (int)(TOP + g->ph + BOTTOM + 10);
        break;
    }
    if (f->width < 640) f->width = 640;
}

static void titles(cairo_t *cr, const fig_data *d) {
    set(cr, hex(C_TEXT));
    font(cr, 16, true);
    text(cr, 16, 14, 0, 0, 0, d->title);
    font(cr, 12, false);
    text(cr, 16, 40, 0, 0, 0, d->subtitle);
}

static void colorbar(cairo_t *cr, double x, double y, double h, double vmax, const char *label) {
    const int n = 64;
    for (int i = 0; i < n; i++) {
        set(cr, viridis((double)i / (n - 1)));
        cairo_rectangle(cr, x, y + h - (i + 1) * h / n, 16, h / n + 0.5);
        cairo_fill(cr);
    }
    set(cr, hex(C_TEXT));
    font(cr, 11, false);
    textf(cr, x + 22, y, 0, 0.5, "%.0f", vmax);
    textf(cr, x + 22, y + h, 0, 0.5, "%s", vmax >= 2 ? "1" : "0");
    text(cr, x + 8, y + h + 16, 0.5, 0, 0, label);
}

static void draw_layer_expert(cairo_t *cr, const fig_data *d, const geom *g, mf_figure *f) {
    double vmax = 1;
    for (int i = 0; i < d->L * d->E; i++) vmax = fmax(vmax, fmax(d->a[i], d->b[i]));
    const char *names[2] = {"dropped: the reference chose it, the target did not", "added: the target chose it instead"};
    for (int panel = 0; panel < 2; panel++) {
        const double x0 = LEFT + panel * (g->pw + g->gap), y0 = TOP;
        const double *v = panel ? d->b : d->a;
        set(cr, hex(C_TEXT));
        font(cr, 12, true);
        text(cr, x0, y0 - 8, 0, 1, 0, names[panel]);
        for (int l = 0; l < d->L; l++)
            for (int e = 0; e < d->E; e++) {
                double x = v[(size_t)l * d->E + e];
                /* a square-root scale: single flips stay visible next to busy experts */
                set(cr, x > 0 ? viridis(0.15 + 0.85 * sqrt(x / vmax)) : hex(C_ZERO));
                cairo_rectangle(cr, x0 + e * g->cw, y0 + l * g->ch, g->cw - (g->cw > 5 ? 0.5 : 0), g->ch - (g->ch > 5 ? 0.5 : 0));
                cairo_fill(cr);
                cell(f, x0 + e * g->cw, y0 + l * g->ch, g->cw, g->ch, "layer %d, expert %d: %s by %.0f tokens",
                     d->layers[l], e, panel ? "added" : "dropped", x);
            }
        set(cr, hex(C_TEXT));
        font(cr, 10, false);
        const int es = tick_step(g->cw, 26), ls = tick_step(g->ch, 14);
        for (int e = 0; e < d->E; e += es) textf(cr, x0 + (e + 0.5) * g->cw, y0 + g->ph + 6, 0.5, 0, "%d", e);
        for (int l = 0; l < d->L; l += ls) textf(cr, x0 - 6, y0 + (l + 0.5) * g->ch, 1, 0.5, "%d", d->layers[l]);
        font(cr, 12, false);
        text(cr, x0 + g->pw / 2, y0 + g->ph + 26, 0.5, 0, 0, "expert");
        if (panel == 0) text(cr, 22, y0 + g->ph / 2, 0.5, 0.5, -M_PI / 2, "layer");
    }
    colorbar(cr, LEFT + 2 * g->pw + g->gap + 20, TOP, fmin(g->ph, 300), vmax, "tokens (sqrt scale)");
}

static void draw_layer_position(cairo_t *cr, const fig_data *d, const geom *g, mf_figure *f) {
    const double x0 = LEFT, y0 = TOP;
    for (int l = 0; l < d->L; l++)
        for (int p = 0; p < d->T; p++) {
            double v = d->a[(size_t)l * d->T + p];
            set(cr, hex(v == 1 ? C_PRIMARY : v == 2 ? C_INHERITED : C_EMPTY));
            cairo_rectangle(cr, x0 + p * g->cw, y0 + l * g->ch, g->cw - (g->cw > 4 ? 0.5 : 0), g->ch - (g->ch > 5 ? 0.5 : 0));
            cairo_fill(cr);
            cell(f, x0 + p * g->cw, y0 + l * g->ch, g->cw, g->ch, "layer %d, position %d (token %d%s%s%s): %s", d->layers[l], p,
                 d->tokens[p], d->token_text ? " \"" : "", d->token_text ? d->token_text[p] : "", d->token_text ? "\"" : "",
                 v == 1 ? "primary flip" : v == 2 ? "inherited flip" : "same experts");
        }
    set(cr, hex(C_TEXT));
    font(cr, 9, false);
    const int ps = tick_step(g->cw, 14), ls = tick_step(g->ch, 14);
    for (int p = 0; p < d->T; p += ps) {
        char b[64];
        if (d->token_text) {   /* at most 24 bytes, cut at a character boundary */
            size_t n = strlen(d->token_text[p]);
            if (n > 24) {
                n = 24;
                while (n > 0 && ((unsigned char)d->token_text[p][n] & 0xc0) == 0x80) n--;
            }
            memcpy(b, d->token_text[p], n);
            b[n] = 0;
        }
        else snprintf(b, sizeof b, "%d", d->tokens[p]);
        text(cr, x0 + (p + 0.5) * g->cw, y0 + g->ph + 6, 1, 0.5, -M_PI / 2.5, b);
    }
    font(cr, 10, false);
    for (int l = 0; l < d->L; l += ls) textf(cr, x0 - 6, y0 + (l + 0.5) * g->ch, 1, 0.5, "%d", d->layers[l]);
    font(cr, 12, false);
    text(cr, x0 + g->pw / 2, y0 + g->ph + 62, 0.5, 0, 0, d->token_text ? "position (token)" : "position (token id)");
    text(cr, 22, y0 + g->ph / 2, 0.5, 0.5, -M_PI / 2, "layer");
    const struct { unsigned c; const char *s; } legend[3] = {
        {C_PRIMARY, "primary flip"}, {C_INHERITED, "inherited (an earlier layer flipped at or before)"}, {C_EMPTY, "same experts"}};
    const double lx = x0 + g->pw + 20;
    for (int i = 0; i < 3; i++) {
        set(cr, hex(legend[i].c));
        cairo_rectangle(cr, lx, y0 + i * 22, 14, 14);
        cairo_fill(cr);
        set(cr, hex(C_TEXT));
        font(cr, 11, false);
        text(cr, lx + 20, y0 + i * 22 + 7, 0, 0.5, 0, legend[i].s);
    }
}

static double phi(double x) { return 0.5 * erfc(-x / sqrt(2.0)); }

static void axes(cairo_t *cr, double x0, double y0, double w, double h) {
    set(cr, hex(C_GRID));
    cairo_set_line_width(cr, 1);
    cairo_rectangle(cr, x0, y0, w, h);
    cairo_stroke(cr);
}

static void draw_margin(cairo_t *cr, const fig_data *d, const geom *g, mf_figure *f) {
    const double x0 = LEFT, y0 = TOP, w = g->pw, h = g->ph;
    const double lo = -6.5, hi = 2.5;   /* log10 margin range; ties drawn at the left edge */
#define MX(m) (x0 + 30 + ((m) > 0 ? (log10(m) - lo) / (hi - lo) * (w - 30) : -22))
#define MY(p) (y0 + h - (p) * h)
    axes(cr, x0, y0, w, h);
    set(cr, hex(C_TEXT));
    font(cr, 10, false);
    for (int k = -6; k <= 2; k++) {
        textf(cr, MX(pow(10, k)), y0 + h + 6, 0.5, 0, "1e%d", k);
        set(cr, hex(0xE6E6E6));
        cairo_move_to(cr, MX(pow(10, k)), y0);
        cairo_line_to(cr, MX(pow(10, k)), y0 + h);
        cairo_stroke(cr);
        set(cr, hex(C_TEXT));
    }
    text(cr, x0 + 8, y0 + h + 6, 0.5, 0, 0, "tie");
    for (int k = 0; k <= 4; k++) textf(cr, x0 - 6, MY(k / 4.0), 1, 0.5, "%.2f", k / 4.0);
    font(cr, 12, false);
    text(cr, x0 + w / 2, y0 + h + 26, 0.5, 0, 0, "reference margin: k-th minus (k+1)-th router logit");
    text(cr, 24, y0 + h / 2, 0.5, 0.5, -M_PI / 2, "P(expert set flips)");
    const int L = d->L;
    for (int l = 0; l < L; l++) {
        json_t *lo_ = json_array_get(d->layer_objs, (size_t)l);
        rgb col = viridis(L > 1 ? 0.9 * l / (L - 1) : 0.3);
        double sigma = json_number_value(json_object_get(lo_, "sigma"));
        bool has_sigma = json_is_number(json_object_get(lo_, "sigma")) && sigma > 0;
        if (has_sigma) {   /* the fitted curve */
            set(cr, col);
            cairo_set_line_width(cr, 1.5);
            for (int i = 0; i <= 200; i++) {
                double m = pow(10, lo + (hi - lo) * i / 200.0);
                double x = MX(m), y = MY(phi(-m / sigma));
                if (i) cairo_line_to(cr, x, y);
                else cairo_move_to(cr, x, y);
            }
            cairo_stroke(cr);
        }
        size_t i;
        json_t *b;
        json_array_foreach(json_object_get(lo_, "margin_bins"), i, b) {
            double mlo = json_number_value(json_object_get(b, "margin_lo"));
            json_t *mh = json_object_get(b, "margin_hi");
            double mhi = json_is_number(mh) ? json_number_value(mh) : 300;
            double slots = json_number_value(json_object_get(b, "slots")), flips = json_number_value(json_object_get(b, "flips"));
            double m = mlo > 0 ? sqrt(mlo * mhi) : 0, p = slots > 0 ? flips / slots : 0;
            double x = MX(m), y = MY(p), r = 2 + 1.5 * log10(1 + slots);
            set(cr, col);
            cairo_arc(cr, x, y, r, 0, 2 * M_PI);
            cairo_fill(cr);
            cell(f, x - r, y - r, 2 * r, 2 * r, "layer %d, margin %.3g..%.3g: %.0f of %.0f slots flipped", d->layers[l], mlo, mhi,
                 flips, slots);
        }
        /* legend */
        set(cr, col);
        cairo_rectangle(cr, x0 + w + 20, y0 + l * 18 * (L > 24 ? 24.0 / L : 1), 12, 10);
        cairo_fill(cr);
        if (L <= 24 || l % (L / 24 + 1) == 0) {
            set(cr, hex(C_TEXT));
            font(cr, 10, false);
            if (has_sigma)
                textf(cr, x0 + w + 38, y0 + l * 18 * (L > 24 ? 24.0 / L : 1) + 5, 0, 0.5, "layer %d, sigma %.2g", d->layers[l], sigma);
            else
                textf(cr, x0 + w + 38, y0 + l * 18 * (L > 24 ? 24.0 / L : 1) + 5, 0, 0.5, "layer %d, no flips", d->layers[l]);
        }
    }
    set(cr, hex(C_TEXT));
    font(cr, 10, false);
    text(cr, x0 + w + 20, y0 + h + 26, 0, 0, 0, "lines: P = Phi(-margin / sigma)");
#undef MX
#undef MY
}

static void draw_flips_kl(cairo_t *cr, const fig_data *d, const geom *g, mf_figure *f) {
    const double x0 = LEFT, y0 = TOP, w = g->pw, h = g->ph;
    int maxc = 0;
    double kmin = INFINITY, kmax = -INFINITY;
    size_t i, j;
    json_t *s, *v;
    json_array_foreach(d->seq_obj, i, s) {
        json_array_foreach(json_object_get(s, "flipped_slots"), j, v) maxc = (int)fmax(maxc, json_integer_value(v));
        json_array_foreach(json_object_get(s, "kl"), j, v) if (json_is_number(v) && json_number_value(v) > 0) {
            kmin = fmin(kmin, json_number_value(v));
            kmax = fmax(kmax, json_number_value(v));
        }
    }
    axes(cr, x0, y0, w, h);
    set(cr, hex(C_TEXT));
    font(cr, 12, false);
    text(cr, x0 + w / 2, y0 + h + 26, 0.5, 0, 0, "flipped expert choices at the position (layers)");
    text(cr, 24, y0 + h / 2, 0.5, 0.5, -M_PI / 2, "KL(P_ref || P_target), nats (log scale)");
    if (!(kmax > 0)) {
        font(cr, 13, false);
        text(cr, x0 + w / 2, y0 + h / 2, 0.5, 0.5, 0, "no logits recorded in these runs");
        return;
    }
    double llo = floor(log10(kmin)), lhi = ceil(log10(kmax));
    if (lhi <= llo) lhi = llo + 1;
    const int ncat = maxc + 1;
#define KX(c) (x0 + (c + 0.5) * w / ncat)
#define KY(k) (y0 + h - (log10(k) - llo) / (lhi - llo) * h)
    font(cr, 10, false);
    for (int c = 0; c < ncat; c++) textf(cr, KX(c), y0 + h + 6, 0.5, 0, "%d", c);
    for (int k = (int)llo; k <= (int)lhi; k++) textf(cr, x0 - 6, KY(pow(10, k)), 1, 0.5, "1e%d", k);
    double *sum = calloc((size_t)ncat, sizeof(double));
    int *cnt = calloc((size_t)ncat, sizeof(int));
    mf_rng r;
    mf_rng_seed(&r, 1);
    json_array_foreach(d->seq_obj, i, s) {
        json_t *kl = json_object_get(s, "kl"), *fc = json_object_get(s, "flipped_slots");
        json_array_foreach(kl, j, v) {
            if (!json_is_number(v)) continue;
            double k = json_number_value(v);
            int c = (int)json_integer_value(json_array_get(fc, j));
            sum[c] += k;
            cnt[c]++;
            if (!(k > 0)) continue;
            double x = KX(c) + (mf_rng_uniform(&r) - 0.5) * 0.6 * w / ncat, y = KY(k);
            set(cr, viridis(0.35 + 0.5 * c / (ncat > 1 ? ncat - 1 : 1)));
            cairo_arc(cr, x, y, 2.2, 0, 2 * M_PI);
            cairo_fill(cr);
        }
    }
    for (int c = 0; c < ncat; c++) {
        if (!cnt[c] || !(sum[c] > 0)) continue;
        double m = sum[c] / cnt[c];
        set(cr, hex(C_PRIMARY));
        cairo_set_line_width(cr, 3);
        cairo_move_to(cr, KX(c) - 0.35 * w / ncat, KY(m));
        cairo_line_to(cr, KX(c) + 0.35 * w / ncat, KY(m));
        cairo_stroke(cr);
        cell(f, KX(c) - 0.35 * w / ncat, KY(m) - 5, 0.7 * w / ncat, 10, "%d flipped: mean KL %.3g nats over %d positions", c, m,
             cnt[c]);
    }
    set(cr, hex(C_TEXT));
    font(cr, 10, false);
    text(cr, x0 + w + 16, y0 + 10, 0, 0.5, 0, "dots: positions");
    set(cr, hex(C_PRIMARY));
    cairo_rectangle(cr, x0 + w + 16, y0 + 26, 18, 3);
    cairo_fill(cr);
    set(cr, hex(C_TEXT));
    text(cr, x0 + w + 40, y0 + 28, 0, 0.5, 0, "mean KL");
    free(sum);
    free(cnt);
#undef KX
#undef KY
}

/* Routing replay: for each twin that replays the reference's routing through layer l, the share of the
 * target's output error that the flips cause, 100 x (error(target) - error(twin)) / error(target), one line
 * per output metric, with the KL share's interval. */
static void draw_replay_curve(cairo_t *cr, const fig_data *d, const geom *g, mf_figure *f) {
    const double x0 = LEFT, y0 = TOP, w = g->pw, h = g->ph;
    static const struct { const char *key, *label; unsigned colour; } series[] = {
        {"kl_from_flips_pct", "forward KL", 0xD55E00},
        {"raw_logit_mse_from_flips_pct", "raw logit MSE", 0x0072B2},
        {"prob_mse_from_flips_pct", "probability MSE", 0x009E73},
        {"top1_disagreement_from_flips_pct", "top-1 disagreement", 0xCC79A7},
    };
    const int S = (int)(sizeof series / sizeof series[0]);
    double lo = 0, hi = 100;
    size_t i;
    json_t *pt;
    json_array_foreach(d->curve, i, pt) for (int k = 0; k < S; k++) {
        json_t *m = json_object_get(pt, series[k].key), *ci = json_object_get(m, "ci95");
        double v[3] = {json_number_value(json_object_get(m, "value")), json_number_value(json_array_get(ci, 0)),
                       json_number_value(json_array_get(ci, 1))};
        for (int q = 0; q < (k == 0 ? 3 : 1); q++)   /* the values, and the interval drawn (the KL share's) */
            if (isfinite(v[q])) {
                lo = fmin(lo, v[q]);
                hi = fmax(hi, v[q]);
            }
    }
    lo = floor(lo / 25) * 25;
    hi = ceil(hi / 25) * 25;
    const int L = d->L > 0 ? d->L : 1;
#define RX(li) (x0 + ((li) + 0.5) * w / L)
#define RY(p) (y0 + h - ((p) - lo) / (hi - lo) * h)
    axes(cr, x0, y0, w, h);
    font(cr, 10, false);
    for (double p = lo; p <= hi + 1e-9; p += 25) {
        set(cr, hex(p == 0 || p == 100 ? 0x999999 : 0xE6E6E6));
        cairo_move_to(cr, x0, RY(p));
        cairo_line_to(cr, x0 + w, RY(p));
        cairo_stroke(cr);
        set(cr, hex(C_TEXT));
        textf(cr, x0 - 6, RY(p), 1, 0.5, "%.0f%%", p);
    }
    const int step = tick_step(w / L, 28);
    for (int l = 0; l < L; l += step) textf(cr, RX(l), y0 + h + 6, 0.5, 0, "%d", d->layers ? d->layers[l] : l);
    font(cr, 12, false);
    text(cr, x0 + w / 2, y0 + h + 26, 0.5, 0, 0, "l: the reference's routing replayed in MoE layers 0 to l");
    text(cr, 24, y0 + h / 2, 0.5, 0.5, -M_PI / 2, "share of the target's error the flips cause");
    for (int k = S - 1; k >= 0; k--) {   /* KL last, on top */
        rgb col = hex(series[k].colour);
        bool pen = false;
        double px = 0, py = 0;
        json_array_foreach(d->curve, i, pt) {
            json_t *m = json_object_get(pt, series[k].key);
            const double v = json_number_value(json_object_get(m, "value"));
            const int layer = (int)json_integer_value(json_object_get(pt, "through_layer"));
            int li = -1;
            for (int l = 0; l < d->L; l++)
                if (d->layers[l] == layer) li = l;
            if (li < 0 || !json_is_number(json_object_get(m, "value"))) {
                pen = false;
                continue;
            }
            const double x = RX(li), y = RY(v);
            set(cr, col);
            cairo_set_line_width(cr, k == 0 ? 2.5 : 1.5);
            if (pen) {
                cairo_move_to(cr, px, py);
                cairo_line_to(cr, x, y);
                cairo_stroke(cr);
            }
            json_t *ci = json_object_get(m, "ci95");
            const bool has_ci = json_is_number(json_array_get(ci, 0)) && json_is_number(json_array_get(ci, 1));
            if (k == 0 && has_ci) {   /* the KL share's interval */
                cairo_set_line_width(cr, 1.2);
                cairo_move_to(cr, x, RY(json_number_value(json_array_get(ci, 0))));
                cairo_line_to(cr, x, RY(json_number_value(json_array_get(ci, 1))));
                cairo_stroke(cr);
            }
            cairo_arc(cr, x, y, k == 0 ? 4 : 3, 0, 2 * M_PI);
            cairo_fill(cr);
            if (has_ci)
                cell(f, x - 5, y - 5, 10, 10, "through layer %d: %s %.1f%% of the target's [%.1f, %.1f]", layer, series[k].label,
                     v, json_number_value(json_array_get(ci, 0)), json_number_value(json_array_get(ci, 1)));
            else
                cell(f, x - 5, y - 5, 10, 10, "through layer %d: %s %.1f%% of the target's", layer, series[k].label, v);
            pen = true;
            px = x;
            py = y;
        }
    }
    font(cr, 10, false);
    for (int k = 0; k < S; k++) {
        set(cr, hex(series[k].colour));
        cairo_rectangle(cr, x0 + w + 16, y0 + 4 + k * 20, 18, 3);
        cairo_fill(cr);
        set(cr, hex(C_TEXT));
        text(cr, x0 + w + 40, y0 + 6 + k * 20, 0, 0.5, 0, series[k].label);
    }
    text(cr, x0 + w + 16, y0 + 6 + S * 20 + 8, 0, 0.5, 0, "bars: the KL share's 95% interval");
#undef RX
#undef RY
}

static void draw(cairo_t *cr, const fig_data *d, const geom *g, mf_figure *f) {
    set(cr, hex(0xFFFFFF));
    cairo_paint(cr);
    titles(cr, d);
    switch (d->kind) {
    case MF_HEAT_LAYER_EXPERT: draw_layer_expert(cr, d, g, f); break;
    case MF_HEAT_LAYER_POSITION: draw_layer_position(cr, d, g, f); break;
    case MF_HEAT_MARGIN: draw_margin(cr, d, g, f); break;
    case MF_HEAT_FLIPS_KL: draw_flips_kl(cr, d, g, f); break;
    case MF_HEAT_REPLAY_CURVE: draw_replay_curve(cr, d, g, f); break;
    }
}

/* ---- outputs --------------------------------------------------------------------------- */

static const char *ext_of(const char *path) {
    const char *dot = strrchr(path, '.');
    return dot ? dot + 1 : "";
}

/* Reads the figure's data; on failure everything is released. */
static int load_or_free(const char *diff_json, int target, mf_heat_kind kind, const char *seq, fig_data *d,
                        json_t **root, mf_error *err) {
    *root = NULL;
    int rc = load(diff_json, target, kind, seq, d, root, err);
    if (rc) {
        data_free(d);
        json_decref(*root);
    }
    return rc;
}

int mf_draw_heatmap_file(const char *diff_json, int target, mf_heat_kind kind, const char *seq, const char *path,
                    mf_error *err) {
    const char *ext = ext_of(path);
    if (strcmp(ext, "png") && strcmp(ext, "svg") && strcmp(ext, "pdf"))
        return mf_fail(err, MF_EINVAL, "%s: the extension must be .png, .svg or .pdf", path);
    fig_data d;
    json_t *root;
    int rc = load_or_free(diff_json, target, kind, seq, &d, &root, err);
    if (rc) return rc;
    mf_figure f = {0};
    geom g = {0};
    layout(&d, &f, &g);
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp.%s", path, ext);   /* written aside, renamed when complete */
    cairo_surface_t *s;
    if (!strcmp(ext, "png")) s = cairo_image_surface_create(CAIRO_FORMAT_ARGB32, f.width, f.height);
    else if (!strcmp(ext, "svg")) s = cairo_svg_surface_create(tmp, f.width, f.height);
    else s = cairo_pdf_surface_create(tmp, f.width, f.height);
    cairo_t *cr = cairo_create(s);
    draw(cr, &d, &g, NULL);
    cairo_destroy(cr);
    cairo_surface_flush(s);
    cairo_status_t st = !strcmp(ext, "png") ? cairo_surface_write_to_png(s, tmp) : cairo_surface_status(s);
    cairo_surface_finish(s);
    if (st == CAIRO_STATUS_SUCCESS) st = cairo_surface_status(s);
    cairo_surface_destroy(s);
    data_free(&d);
    json_decref(root);
    mf_figure_free(&f);
    if (st != CAIRO_STATUS_SUCCESS) {
        remove(tmp);
        return mf_fail(err, MF_EIO, "%s: cannot draw: %s", path, cairo_status_to_string(st));
    }
    if (rename(tmp, path) != 0) {
        remove(tmp);
        return mf_fail(err, MF_EIO, "%s: cannot write", path);
    }
    return MF_OK;
}

static cairo_status_t to_mem(void *closure, const unsigned char *data, unsigned int length) {
    mf_buf_put(closure, data, length);
    return CAIRO_STATUS_SUCCESS;
}

int mf_draw_heatmap_svg(const char *diff_json, int target, mf_heat_kind kind, const char *seq, char **svg, size_t *len,
                   mf_figure *fig, mf_error *err) {
    fig_data d;
    json_t *root;
    int rc = load_or_free(diff_json, target, kind, seq, &d, &root, err);
    if (rc) return rc;
    memset(fig, 0, sizeof *fig);
    geom g = {0};
    layout(&d, fig, &g);
    mf_buf m = {0};
    cairo_surface_t *s = cairo_svg_surface_create_for_stream(to_mem, &m, fig->width, fig->height);
    cairo_t *cr = cairo_create(s);
    draw(cr, &d, &g, fig);
    cairo_destroy(cr);
    cairo_surface_finish(s);
    cairo_status_t st = cairo_surface_status(s);
    cairo_surface_destroy(s);
    data_free(&d);
    json_decref(root);
    if (st != CAIRO_STATUS_SUCCESS || !m.s) {
        free(m.s);
        return mf_fail(err, MF_EIO, "cannot draw %s: %s", mf_heat_kind_name(kind), cairo_status_to_string(st));
    }
    *svg = m.s;
    *len = m.n;
    return MF_OK;
}
