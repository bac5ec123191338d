/* report.html: one self-contained page per set of diffs: summary tables with
 * intervals, per-layer tables, the figures as inline SVG (data URIs, so the
 * glyph ids of several figures cannot collide) with an SVG overlay whose cells
 * carry hover text, and the runs' metadata. No scripts, fonts or network. */
#include "mf_viz.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static void esc(mf_buf *o, const char *s) {
    for (; s && *s; s++) {
        switch (*s) {
        case '<': mf_buf_puts(o, "&lt;"); break;
        case '>': mf_buf_puts(o, "&gt;"); break;
        case '&': mf_buf_puts(o, "&amp;"); break;
        case '"': mf_buf_puts(o, "&quot;"); break;
        default: mf_buf_put(o, s, 1);
        }
    }
}

static void base64(mf_buf *o, const unsigned char *d, size_t n) {
    static const char t[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    char q[4];
    for (size_t i = 0; i < n; i += 3) {
        unsigned v = (unsigned)d[i] << 16 | (i + 1 < n ? (unsigned)d[i + 1] << 8 : 0) | (i + 2 < n ? d[i + 2] : 0);
        q[0] = t[v >> 18 & 63];
        q[1] = t[v >> 12 & 63];
        q[2] = i + 1 < n ? t[v >> 6 & 63] : '=';
        q[3] = i + 2 < n ? t[v & 63] : '=';
        mf_buf_put(o, q, 4);
    }
}

static const char *str(json_t *o, const char *k) {
    const char *s = json_string_value(json_object_get(o, k));
    return s ? s : "";
}

static void value_cell(mf_buf *o, json_t *m) {
    json_t *v = json_object_get(m, "value"), *ci = json_object_get(m, "ci95");
    if (!json_is_number(v)) {
        mf_buf_puts(o, "<td>&ndash;</td>");
        return;
    }
    mf_buf_printf(o, "<td title=\"95%% interval over resampled sequences\">%.4g", json_number_value(v));
    if (json_is_number(json_array_get(ci, 0)))   /* on a line of its own: the columns stay narrow */
        mf_buf_printf(o, "<br><span class=ci>[%.3g, %.3g]</span>", json_number_value(json_array_get(ci, 0)),
                json_number_value(json_array_get(ci, 1)));
    mf_buf_puts(o, "</td>");
}

static const char *metric_names[] = {
    "forward_kl", "raw_logit_mse", "prob_mse", "top1_pct", "ord5_pct", "set5_pct", "equal_bits_pct",
    "router_set_equal_pct", "router_ord_equal_pct", "router_positions_all_layers_equal_pct", "router_logit_mse",
    "flipped_slots_pct", "primary_flips_pct", "inherited_flips_pct", "tie_slots_pct", "expert_overlap_pct",
    "gate_weight_mse", "shared_gate_mse", "forward_kl_given_0_flips", "forward_kl_given_1_flip",
    "forward_kl_given_2plus_flips", "top1_pct_given_0_flips", "top1_pct_given_1_flip", "top1_pct_given_2plus_flips",
};

static void figure(mf_buf *o, const char *diff_text, int target, mf_heat_kind kind, int *fig_no) {
    char *svg = NULL;
    size_t len = 0;
    mf_figure fig;
    mf_error err = {0};
    if (mf_heatmap_svg(diff_text, target, kind, NULL, &svg, &len, &fig, &err)) {
        mf_buf_printf(o, "<p class=note>%s: ", mf_heat_kind_name(kind));
        esc(o, err.msg);
        mf_buf_puts(o, "</p>");
        return;
    }
    (*fig_no)++;
    mf_buf_printf(o, "<figure id=fig%d><div class=fig style=\"width:%dpx;height:%dpx\">", *fig_no, fig.width, fig.height);
    mf_buf_printf(o, "<img width=%d height=%d alt=\"", fig.width, fig.height);   /* cairo sizes SVG in pt: pin the pixels */
    mf_buf_puts(o, mf_heat_kind_name(kind));
    mf_buf_puts(o, "\" src=\"data:image/svg+xml;base64,");
    base64(o, (const unsigned char *)svg, len);
    mf_buf_printf(o, "\"><svg class=hover viewBox=\"0 0 %d %d\" width=%d height=%d>", fig.width, fig.height, fig.width, fig.height);
    for (size_t i = 0; i < fig.n_cells; i++) {
        const mf_cell *c = &fig.cells[i];
        mf_buf_printf(o, "<rect x=%.1f y=%.1f width=%.1f height=%.1f><title>", c->x, c->y, c->w, c->h);
        esc(o, c->text);
        mf_buf_puts(o, "</title></rect>");
    }
    mf_buf_printf(o, "</svg></div><figcaption>Figure %d: %s (hover a cell for its numbers).</figcaption></figure>\n", *fig_no,
            mf_heat_kind_name(kind));
    free(svg);
    mf_figure_free(&fig);
}

/* A run's setting in full, "numerics × precision", as text: the canonical profile says exactly what ran. */
static void setting(mf_buf *o, json_t *run) {
    esc(o, str(run, "numerics"));
    mf_buf_puts(o, " &times; ");
    esc(o, str(run, "precision"));
}

/* The profile's name, e.g. "emu:cdna3" for "emu:cdna3:mfma_f32_32x32x8_bf16:acc=1:split=1:reduce=seq" (numerics.md:
 * the canonical spelling writes everything out after it), or the whole profile ("native", "fp64"). */
static size_t profile_name_length(const char *numerics) {
    const char *colon = strchr(numerics, ':');
    if (colon && !strncmp(numerics, "emu:", 4)) colon = strchr(numerics + 4, ':');
    return colon ? (size_t)(colon - numerics) : strlen(numerics);
}

/* Whether two runs' short settings (profile name and precision) read the same. */
static bool same_short_setting(json_t *a, json_t *b) {
    const char *na = str(a, "numerics"), *nb = str(b, "numerics");
    const size_t la = profile_name_length(na), lb = profile_name_length(nb);
    return la == lb && !strncmp(na, nb, la) && !strcmp(str(a, "precision"), str(b, "precision"));
}

/* ---- routing replay ----------------------------------------------------------------
 * A target traced with --replay dispatched the reference's experts: it is labelled so wherever it is named, the
 * twins that replay only some layers (the points of a curve) are left out of the tables of targets, and the
 * attribution (diff.json's "attribution") has its own table and figure. */

/* Whether a run replayed another's routing, and whether in every MoE layer. */
static bool is_replay(json_t *run) { return json_is_object(json_object_get(run, "replay")); }
static bool is_partial_replay(json_t *run) {
    return is_replay(run) && !json_is_true(json_object_get(json_object_get(run, "replay"), "all_layers"));
}

static void replay_label(mf_buf *o, json_t *run) {
    json_t *rp = json_object_get(run, "replay");
    if (!json_is_object(rp)) return;
    mf_buf_puts(o, " <span class=replay title=\"routing replay: this run dispatched the experts of ");
    esc(o, str(rp, "source"));
    mf_buf_puts(o, " (");
    esc(o, str(rp, "source_numerics"));
    mf_buf_puts(o, " &times; ");
    esc(o, str(rp, "source_precision"));
    mf_buf_puts(o, ") at every position, its router's own choice recorded but not used\">replays ");
    esc(o, str(rp, "source_precision"));
    mf_buf_puts(o, " routing");
    if (!json_is_true(json_object_get(rp, "all_layers"))) {
        mf_buf_puts(o, ", layers ");
        size_t i;
        json_t *l;
        json_array_foreach(json_object_get(rp, "layers"), i, l) mf_buf_printf(o, i ? ",%lld" : "%lld", (long long)json_integer_value(l));
    }
    if (!strcmp(str(rp, "weights"), "source")) mf_buf_puts(o, ", its weights");
    mf_buf_puts(o, "</span>");
}

static void short_setting(mf_buf *o, json_t *run, json_t *others);

/* A share of the target's error in a cell: "32.8% [24.0, 41.4]". */
static void share_cell(mf_buf *o, json_t *m) {
    json_t *v = json_object_get(m, "value"), *ci = json_object_get(m, "ci95");
    if (!json_is_number(v)) {
        mf_buf_puts(o, "<td>&ndash;</td>");
        return;
    }
    mf_buf_printf(o, "<td><b>%.1f%%</b>", json_number_value(v));
    if (json_is_number(json_array_get(ci, 0)))
        mf_buf_printf(o, "<br><span class=ci>[%.1f, %.1f]</span>", json_number_value(json_array_get(ci, 0)),
                json_number_value(json_array_get(ci, 1)));
    mf_buf_puts(o, "</td>");
}

static json_t *twin_entry(json_t *attr, long long twin) {
    size_t i;
    json_t *t;
    json_array_foreach(json_object_get(attr, "twins"), i, t) if (json_integer_value(json_object_get(t, "twin")) == twin) return t;
    return NULL;
}

static void figure(mf_buf *o, const char *diff_text, int target, mf_heat_kind kind, int *fig_no);

/* The attribution of one diff: per target with a twin that replays every layer, the error with and without the
 * flips and the share they cause; then each target's curve. */
static void attribution_section(mf_buf *o, const char *text, json_t *d, int *fig_no) {
    json_t *attr = json_object_get(d, "attribution"), *targets = json_object_get(d, "targets");
    if (!json_array_size(attr)) return;
    mf_buf_puts(o, "<h3>Routing replay: how much of the output error the expert flips cause</h3>\n<p class=meta>Each target's "
             "replayed twin runs its arithmetic but dispatches the reference's experts: its error is the arithmetic's "
             "alone. The share the flips cause is 100 &times; (target's error &minus; twin's) / target's, over the "
             "same positions, with 95% intervals over the same resampled sequences.</p>\n<table class=summary><thead><tr>"
             "<th>target</th><th>output KL, target</th><th>output KL, routed as the reference</th><th>KL the flips "
             "cause</th><th>raw logit MSE they cause</th><th>probability MSE they cause</th><th>top-1 disagreement they "
             "cause</th><th title=\"slots of the twin where its own router's top-k (of its recorded logits) is not what "
             "it dispatched\">twin's router would flip</th></tr></thead><tbody>\n");
    size_t i;
    json_t *e;
    json_array_foreach(attr, i, e) {
        json_t *tw = twin_entry(e, json_integer_value(json_object_get(e, "overall")));
        json_t *t = json_array_get(targets, (size_t)json_integer_value(json_object_get(e, "target")) - 1);
        if (!tw || !t) continue;
        mf_buf_puts(o, "<tr><th>");
        short_setting(o, t, targets);
        mf_buf_puts(o, "</th>");
        value_cell(o, json_object_get(json_object_get(tw, "target_error"), "forward_kl"));
        value_cell(o, json_object_get(json_object_get(tw, "twin_error"), "forward_kl"));
        share_cell(o, json_object_get(tw, "kl_from_flips_pct"));
        share_cell(o, json_object_get(tw, "raw_logit_mse_from_flips_pct"));
        share_cell(o, json_object_get(tw, "prob_mse_from_flips_pct"));
        share_cell(o, json_object_get(tw, "top1_disagreement_from_flips_pct"));
        json_t *rd = json_object_get(tw, "twin_router_disagrees_pct");
        if (json_is_number(rd)) mf_buf_printf(o, "<td>%.2f%%</td></tr>\n", json_number_value(rd));
        else mf_buf_puts(o, "<td>&ndash;</td></tr>\n");
    }
    mf_buf_puts(o, "</tbody></table>\n");
    json_array_foreach(attr, i, e)
        if (json_array_size(json_object_get(e, "curve")) > 1)
            figure(o, text, (int)json_integer_value(json_object_get(e, "target")) - 1, MF_HEAT_REPLAY_CURVE, fig_no);
}

/* A run's setting as a short label, "emu:cdna3 × bf16", with the full one on hover. Where another run of the diff
 * (others, may be NULL) has the same short label, the run's own label (its "run") follows in brackets. */
static void short_setting(mf_buf *o, json_t *run, json_t *others) {
    const char *numerics = str(run, "numerics");
    mf_buf_puts(o, "<span class=setting title=\"");
    setting(o, run);
    mf_buf_puts(o, "\">");
    char name[256];
    snprintf(name, sizeof name, "%.*s", (int)profile_name_length(numerics), numerics);
    esc(o, name);
    mf_buf_puts(o, " &times; ");
    esc(o, str(run, "precision"));
    bool twin = false;
    size_t i;
    json_t *x;
    /* a replayed twin shares its target's setting: its replay label tells them apart */
    json_array_foreach(others, i, x) twin |= x != run && !is_replay(x) && !is_replay(run) && same_short_setting(x, run);
    if (twin) {
        mf_buf_puts(o, " <span class=ci>(");
        esc(o, str(run, "run"));
        mf_buf_puts(o, ")</span>");
    }
    replay_label(o, run);
    mf_buf_puts(o, "</span>");
}

/* A metric's value and interval in the headline: "2.00% [1.56, 2.41]", or a dash where the diff lacks it. */
static void headline_cell(mf_buf *o, json_t *m, const char *fmt_value, const char *unit) {
    json_t *v = json_object_get(m, "value"), *ci = json_object_get(m, "ci95");
    if (!json_is_number(v)) {
        mf_buf_puts(o, "<td>&ndash;</td>");
        return;
    }
    mf_buf_puts(o, "<td><b>");
    mf_buf_printf(o, fmt_value, json_number_value(v));
    mf_buf_puts(o, unit);
    mf_buf_puts(o, "</b>");
    if (json_is_number(json_array_get(ci, 0)))
        mf_buf_printf(o, " <span class=ci>[%.3g, %.3g]</span>", json_number_value(json_array_get(ci, 0)),
                json_number_value(json_array_get(ci, 1)));
    mf_buf_puts(o, "</td>");
}

/* What a reader came for, first: every comparison of every diff on one line each, with its flips, the error they
 * make in the output and the agreement of the top token. */
static void headline(mf_buf *o, json_t **docs, int n) {
    mf_buf_puts(o, "<section class=headline><table class=headline><thead><tr><th>target</th><th>against</th>"
             "<th title=\"flipped_slots_pct: (layer, position) slots whose set of dispatched experts differs\">expert choices "
             "that flip</th><th title=\"forward_kl: KL(P_reference || P_target) of the output distributions\">output KL, "
             "nats per token</th><th title=\"top1_pct: positions whose largest logit is the same token\">same top-1 "
             "token</th>");
    bool any_attribution = false;
    for (int k = 0; k < n; k++) any_attribution |= json_array_size(json_object_get(docs[k], "attribution")) > 0;
    if (any_attribution)
        mf_buf_puts(o, "<th title=\"kl_from_flips_pct: 100 x (KL of the target - KL of its twin that routes as the reference) / "
                 "KL of the target\">output KL the flips cause</th>");
    mf_buf_puts(o, "<th>sequences</th></tr></thead><tbody>\n");
    long long resamples = -1;
    bool one_plan = true;
    for (int k = 0; k < n; k++) {
        json_t *d = docs[k], *ref = json_object_get(d, "reference"), *targets = json_object_get(d, "targets");
        const long long b = (long long)json_integer_value(json_object_get(json_object_get(d, "bootstrap"), "resamples"));
        one_plan &= resamples < 0 || resamples == b;
        resamples = b;
        size_t i;
        json_t *t;
        json_array_foreach(targets, i, t) {
            if (is_replay(t)) continue;   /* its share is on its target's line */
            json_t *m = json_object_get(t, "metrics");
            mf_buf_puts(o, "<tr><th>");
            short_setting(o, t, targets);
            mf_buf_puts(o, "</th><td>");
            short_setting(o, ref, NULL);
            mf_buf_puts(o, "</td>");
            headline_cell(o, json_object_get(m, "flipped_slots_pct"), "%.2f", "%");
            headline_cell(o, json_object_get(m, "forward_kl"), "%.3g", "");
            headline_cell(o, json_object_get(m, "top1_pct"), "%.2f", "%");
            if (any_attribution) {
                json_t *share = NULL;
                size_t a;
                json_t *e;
                json_array_foreach(json_object_get(d, "attribution"), a, e)
                    if (json_integer_value(json_object_get(e, "target")) == (json_int_t)i + 1)
                        share = json_object_get(twin_entry(e, json_integer_value(json_object_get(e, "overall"))), "kl_from_flips_pct");
                headline_cell(o, share, "%.1f", "%");
            }
            mf_buf_printf(o, "<td>%lld</td></tr>\n", (long long)json_integer_value(json_object_get(d, "sequences")));
        }
    }
    mf_buf_puts(o, "</tbody></table>\n<p class=meta>");
    if (one_plan && resamples > 0)
        mf_buf_printf(o, "Brackets: 95%% bootstrap intervals over %lld resamples of whole sequences. ", resamples);
    else if (one_plan)
        mf_buf_puts(o, "No intervals (no bootstrap resamples). ");
    else
        mf_buf_puts(o, "Brackets: 95% bootstrap intervals over resampled sequences (resamples per diff below). ");
    mf_buf_puts(o, "Hover a setting for its full numerics profile. Every metric, per layer and per target, and the figures "
             "follow.</p></section>\n");
}

/* A run's row in the metadata table: every string in it comes from a manifest, which whoever made the run wrote,
 * and is escaped like all such text in the report. */
static void run_cells(mf_buf *o, json_t *run) {
    static const char *keys[] = {"run", "numerics", "precision", "device_name", "tool"};
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
        mf_buf_puts(o, "<td>");
        esc(o, str(run, keys[k]));
        mf_buf_puts(o, "</td>");
    }
    mf_buf_puts(o, "</tr>");
}

/* A row of one metric of each target's sub-object (responses or answers); "path" is key or key/sub. */
static bool any_target_has(json_t *targets, const char *obj) {
    size_t i;
    json_t *t;
    json_array_foreach(targets, i, t) if (json_object_get(t, obj)) return true;
    return false;
}

static void obj_metric_row(mf_buf *o, json_t *targets, const char *obj, const char *key, const char *sub, const char *label) {
    mf_buf_printf(o, "<tr><th>%s</th>", label);
    size_t i;
    json_t *t;
    json_array_foreach(targets, i, t) {
        if (is_partial_replay(t)) continue;
        json_t *m = json_object_get(json_object_get(t, obj), key);
        if (sub) m = json_object_get(m, sub);
        value_cell(o, m);
    }
    mf_buf_puts(o, "</tr>\n");
}

/* A response's text, newlines kept visible; absent text (no tokenizer) as a dash. */
static void text_span(mf_buf *o, json_t *e, const char *key, const char *cls) {
    const char *s = json_string_value(json_object_get(e, key));
    if (!s) return;
    mf_buf_printf(o, "<span class=%s>", cls);
    esc(o, s);
    mf_buf_puts(o, "</span>");
}

/* A heading and the head of a metrics x targets table (a curve's partial replays are left out, as in the
 * summary table). */
static void metric_table_head(mf_buf *o, const char *heading, json_t *targets) {
    mf_buf_printf(o, "<h3>%s</h3>\n<table class=summary><thead><tr><th>metric</th>", heading);
    size_t i;
    json_t *t;
    json_array_foreach(targets, i, t) {
        if (is_partial_replay(t)) continue;
        mf_buf_puts(o, "<th>");
        short_setting(o, t, targets);
        mf_buf_puts(o, "</th>");
    }
    mf_buf_puts(o, "</tr></thead><tbody>\n");
}

/* The generated responses: the token-agreement metrics per target, then for each target its responses beside
 * the reference's, the part both generated alike in plain text and each one's rest marked from the first token
 * where they part. The sequences that part come first; at most 12 are shown. */
static void responses_part(mf_buf *o, json_t *targets) {
    if (!any_target_has(targets, "responses")) return;
    metric_table_head(o, "Generated responses", targets);
    size_t i;
    json_t *t;
    obj_metric_row(o, targets, "responses", "response_equal_pct", NULL, "response_equal_pct");
    obj_metric_row(o, targets, "responses", "first_divergence_median", NULL, "first_divergence_median");
    obj_metric_row(o, targets, "responses", "generated_token_agreement_pct", NULL, "generated_token_agreement_pct");
    mf_buf_puts(o, "</tbody></table>\n");
    json_array_foreach(targets, i, t) {
        json_t *seqs = json_object_get(json_object_get(t, "responses"), "per_sequence");
        if (!json_array_size(seqs) || !json_object_get(json_array_get(seqs, 0), "prompt_text")) continue;
        mf_buf_printf(o, "<details%s><summary>Target %zu: ", i == 0 ? " open" : "", i + 1);
        short_setting(o, t, targets);
        mf_buf_puts(o, ", its responses beside the reference's (first differing token on, marked)</summary>\n"
                 "<table class=texts><thead><tr><th>sequence</th><th>prompt</th><th>reference</th><th>target</th>"
                 "<th>first divergence</th></tr></thead><tbody>\n");
        int shown = 0;
        for (int pass = 0; pass < 2 && shown < 12; pass++) {
            size_t j;
            json_t *e;
            json_array_foreach(seqs, j, e) {
                const bool equal = json_is_true(json_object_get(e, "equal"));
                if (equal != (pass == 1) || shown >= 12) continue;
                shown++;
                mf_buf_puts(o, "<tr><td>");
                esc(o, str(e, "id"));
                mf_buf_puts(o, "</td><td>");
                text_span(o, e, "prompt_text", "prompt");
                mf_buf_puts(o, "</td><td>");
                text_span(o, e, "common_text", "same");
                text_span(o, e, "reference_rest", "parted");
                mf_buf_puts(o, "</td><td>");
                text_span(o, e, "common_text", "same");
                text_span(o, e, "target_rest", "parted");
                if (equal) mf_buf_puts(o, "</td><td>none</td></tr>\n");
                else mf_buf_printf(o, "</td><td>token %lld</td></tr>\n", (long long)json_integer_value(json_object_get(e, "first_divergence")));
            }
        }
        mf_buf_printf(o, "</tbody></table><p class=meta>%d of %zu sequences shown.</p></details>\n", shown, json_array_size(seqs));
    }
}

static void choice_text(mf_buf *o, json_t *e, json_t *pick) {
    if (!json_is_integer(pick)) {
        mf_buf_puts(o, "<td>none (NaN scores)</td>");
        return;
    }
    const json_int_t k = json_integer_value(pick);
    mf_buf_printf(o, "<td>%lld", (long long)k);
    const char *s = json_string_value(json_array_get(json_object_get(e, "choices_text"), (size_t)k));
    if (s) {
        mf_buf_puts(o, ": <span class=same>");
        esc(o, s);
        mf_buf_puts(o, "</span>");
    }
    mf_buf_puts(o, "</td>");
}

/* Multiple-choice answers: agreement and accuracy per target, and the items whose pick changed. */
static void answers_part(mf_buf *o, json_t *targets) {
    if (!any_target_has(targets, "answers")) return;
    metric_table_head(o, "Multiple-choice answers", targets);
    size_t i;
    json_t *t;
    obj_metric_row(o, targets, "answers", "answer_agreement_pct", NULL, "answer_agreement_pct");
    obj_metric_row(o, targets, "answers", "accuracy_pct", "reference", "accuracy_pct, reference");
    obj_metric_row(o, targets, "answers", "accuracy_pct", "target", "accuracy_pct, target");
    mf_buf_puts(o, "<tr><th>items changed</th>");
    json_array_foreach(targets, i, t) {
        if (is_partial_replay(t)) continue;
        json_t *a = json_object_get(t, "answers");
        if (a) mf_buf_printf(o, "<td>%zu of %lld</td>", json_array_size(json_object_get(a, "changed")),
                       (long long)json_integer_value(json_object_get(a, "items")));
        else mf_buf_puts(o, "<td>&ndash;</td>");
    }
    mf_buf_puts(o, "</tr></tbody></table>\n");
    json_array_foreach(targets, i, t) {
        json_t *changed = json_object_get(json_object_get(t, "answers"), "changed");
        if (!json_array_size(changed)) continue;
        mf_buf_printf(o, "<details><summary>Target %zu: ", i + 1);
        short_setting(o, t, targets);
        mf_buf_printf(o, ", the %zu items whose answer changed</summary>\n<table class=texts><thead><tr><th>item</th><th>prompt</th>"
                   "<th>answer</th><th>reference's pick</th><th>target's pick</th><th>reference's lead</th></tr></thead><tbody>\n",
                json_array_size(changed));
        size_t j;
        json_t *e;
        json_array_foreach(changed, j, e) {
            mf_buf_puts(o, "<tr><td>");
            esc(o, str(e, "id"));
            mf_buf_puts(o, "</td><td>");
            text_span(o, e, "prompt_text", "prompt");
            mf_buf_puts(o, "</td>");
            json_t *ans = json_object_get(e, "answer");
            if (json_is_integer(ans)) choice_text(o, e, ans);
            else mf_buf_puts(o, "<td>&ndash;</td>");
            choice_text(o, e, json_object_get(e, "reference"));
            choice_text(o, e, json_object_get(e, "target"));
            json_t *lead = json_object_get(e, "reference_margin");
            if (json_is_number(lead)) mf_buf_printf(o, "<td title=\"log-probability of its pick less the best other\">%.3g</td></tr>\n", json_number_value(lead));
            else mf_buf_puts(o, "<td>&ndash;</td></tr>\n");
        }
        mf_buf_puts(o, "</tbody></table></details>\n");
    }
}

static void section(mf_buf *o, const char *text, json_t *d, int *fig_no) {
    json_t *ref = json_object_get(d, "reference"), *targets = json_object_get(d, "targets");
    json_t *model = json_object_get(ref, "model");
    mf_buf_puts(o, "<section><h2>Against ");
    short_setting(o, ref, NULL);
    /* the runs as diff.json names them (the collector: by the names they were pushed under), not the file */
    mf_buf_puts(o, "</h2>\n<p class=meta>reference run <code>");
    esc(o, str(ref, "run"));
    mf_buf_puts(o, "</code> (");
    setting(o, ref);
    mf_buf_puts(o, "); ");
    esc(o, str(model, "architecture"));
    mf_buf_printf(o, ", %lld sequences", (long long)json_integer_value(json_object_get(d, "sequences")));
    json_t *bs = json_object_get(d, "bootstrap");
    mf_buf_printf(o, "; intervals: %lld resamples of whole sequences (seed %lld).</p>\n",
            (long long)json_integer_value(json_object_get(bs, "resamples")), (long long)json_integer_value(json_object_get(bs, "seed")));
    /* metrics that are defined and came out not a number are null in diff.json, and said so here */
    json_t *warnings = json_object_get(d, "warnings");
    if (json_array_size(warnings)) {
        mf_buf_puts(o, "<p class=meta><b>Warnings</b> (shown as &ndash; below):</p>\n<ul>");
        size_t wi;
        json_t *w;
        json_array_foreach(warnings, wi, w) {
            mf_buf_puts(o, "<li>");
            esc(o, json_is_string(w) ? json_string_value(w) : "?");
            mf_buf_puts(o, "</li>");
        }
        mf_buf_puts(o, "</ul>\n");
    }
    /* summary: metrics x targets */
    mf_buf_puts(o, "<table class=summary><thead><tr><th>metric</th>");
    size_t i;
    json_t *t;
    json_array_foreach(targets, i, t) {
        if (is_partial_replay(t)) continue;   /* a point of a curve: in the attribution below */
        mf_buf_puts(o, "<th>");
        short_setting(o, t, targets);
        mf_buf_puts(o, "</th>");
    }
    mf_buf_puts(o, "</tr></thead><tbody>\n");
    for (size_t m = 0; m < sizeof metric_names / sizeof metric_names[0]; m++) {
        bool any = false;
        json_array_foreach(targets, i, t) any |= json_object_get(json_object_get(t, "metrics"), metric_names[m]) != NULL;
        if (!any) continue;
        mf_buf_printf(o, "<tr><th>%s</th>", metric_names[m]);
        json_array_foreach(targets, i, t)
            if (!is_partial_replay(t)) value_cell(o, json_object_get(json_object_get(t, "metrics"), metric_names[m]));
        mf_buf_puts(o, "</tr>\n");
    }
    mf_buf_puts(o, "</tbody></table>\n");
    responses_part(o, targets);
    answers_part(o, targets);
    attribution_section(o, text, d, fig_no);
    json_array_foreach(targets, i, t) {
        if (is_replay(t)) continue;   /* it dispatched the reference's experts: nothing flips to draw */
        mf_buf_printf(o, "<h3>Target %zu: ", i + 1);
        short_setting(o, t, targets);
        mf_buf_puts(o, "</h3>\n<table class=layers><thead><tr><th>layer</th><th>slots</th><th>same expert set, %</th>"
                 "<th>same order, %</th><th>flips</th><th>primary</th><th>inherited</th><th>ties</th><th>sigma</th></tr></thead><tbody>");
        size_t l;
        json_t *lo;
        json_array_foreach(json_object_get(t, "layers"), l, lo) {
            mf_buf_printf(o, "<tr><td>%lld</td><td>%lld</td>", (long long)json_integer_value(json_object_get(lo, "layer")),
                    (long long)json_integer_value(json_object_get(lo, "slots")));
            value_cell(o, json_object_get(lo, "set_equal_pct"));
            value_cell(o, json_object_get(lo, "ord_equal_pct"));
            mf_buf_printf(o, "<td>%lld</td><td>%lld</td><td>%lld</td><td>%lld</td>", (long long)json_integer_value(json_object_get(lo, "flips")),
                    (long long)json_integer_value(json_object_get(lo, "primary")),
                    (long long)json_integer_value(json_object_get(lo, "inherited")),
                    (long long)json_integer_value(json_object_get(lo, "ties")));
            json_t *sg = json_object_get(lo, "sigma");
            if (json_is_number(sg)) mf_buf_printf(o, "<td>%.3g</td></tr>", json_number_value(sg));
            else mf_buf_puts(o, "<td>&ndash;</td></tr>");
        }
        mf_buf_puts(o, "</tbody></table>\n");
        for (int k = 0; k < 4; k++) figure(o, text, (int)i, (mf_heat_kind)k, fig_no);
    }
    /* metadata */
    mf_buf_puts(o, "<details><summary>Runs</summary><table class=meta><tr><th>role</th><th>run</th><th>numerics</th><th>precision</th>"
             "<th>device</th><th>tool</th></tr>");
    mf_buf_puts(o, "<tr><td>reference</td>");
    run_cells(o, ref);
    json_array_foreach(targets, i, t) {
        mf_buf_printf(o, "<tr><td>target %zu</td>", i + 1);
        run_cells(o, t);
    }
    mf_buf_puts(o, "</table><p class=meta>model ");
    esc(o, str(model, "architecture"));
    mf_buf_puts(o, ", config digest ");
    esc(o, str(model, "config_digest"));
    mf_buf_puts(o, ", weights digest ");
    esc(o, str(model, "weights_digest"));
    mf_buf_puts(o, "</p></details></section>\n");
}

static const char *css =
    "body{font-family:'DejaVu Sans',system-ui,sans-serif;margin:24px;color:#222;max-width:1500px}"
    "h1{font-size:22px}h2{font-size:18px;margin-top:32px;border-bottom:1px solid #ccc}h3{font-size:15px;margin-top:24px}"
    "table{border-collapse:collapse;margin:8px 0;font-size:13px}th,td{border:1px solid #ddd;padding:3px 8px;text-align:right}"
    "th{background:#f4f4f4}table.summary th:first-child{text-align:left}.ci{color:#777;font-size:11px}"
    ".meta{color:#555;font-size:12px}code{font-size:12px}figure{margin:16px 0}.fig{position:relative}"
    ".fig img,.fig svg{position:absolute;left:0;top:0}.hover rect{fill:transparent}.hover rect:hover{fill:rgba(0,0,0,.12)}"
    "figcaption{font-size:12px;color:#555}.note{color:#a00}"
    "table.headline{font-size:15px}table.headline th,table.headline td{padding:6px 12px}table.headline th,table.headline td:nth-child(2){text-align:left}"
    ".setting{white-space:nowrap}table.summary th,table.layers th{white-space:normal}"
    ".replay{color:#fff;background:#0072B2;border-radius:3px;padding:0 4px;font-size:11px;white-space:nowrap}"
    "table.texts td{text-align:left;vertical-align:top;max-width:420px;white-space:pre-wrap;font-size:12px}"
    ".prompt{color:#777}.parted{background:#fde2c8}summary{cursor:pointer;margin:8px 0}";

int mf_report_write_many(const char **paths, int n, const char *out_path, mf_error *err) {
    char **texts = mf_xcalloc((size_t)n + 1, sizeof *texts);
    json_t **docs = mf_xcalloc((size_t)n + 1, sizeof *docs);
    int rc = MF_OK;
    for (int i = 0; i < n && !rc; i++) {
        size_t len;
        if ((rc = mf_read_file(paths[i], &texts[i], &len, err))) break;
        json_error_t je;
        docs[i] = json_loads(texts[i], 0, &je);
        if (!docs[i] || strcmp(str(docs[i], "format"), "moeflip-diff"))
            rc = mf_fail(err, MF_EFORMAT, "%s: not a moeflip diff.json", paths[i]);
    }
    mf_buf o = {0};
    if (!rc) {
        /* The report runs no script, and says so to the browser wherever it is opened (from disk, from the collector,
         * as a blob the collector's page made): text from a manifest that got past the escaping could not run. */
        mf_buf_puts(&o, "<!DOCTYPE html>\n<html lang=en><head><meta charset=utf-8><meta http-equiv=Content-Security-Policy "
                  "content=\"default-src 'none'; style-src 'unsafe-inline'; img-src data:\"><title>moeflip report</title><style>");
        mf_buf_puts(&o, css);
        mf_buf_puts(&o, "</style></head><body>\n<h1>moeflip: where expert choices flip, and what it does to the output</h1>\n");
        headline(&o, docs, n);
        mf_buf_puts(&o, "<p class=meta>Each target runs the same model on the same tokens as the reference under other arithmetic "
                  "(vendor numerics profile) or precision. A flip is a (layer, position) whose set of dispatched experts "
                  "differs from the reference's; it is inherited when an earlier layer flipped at that or an earlier "
                  "position, else primary. Intervals are 95% percentile bootstrap intervals over sequences.</p>\n");
        int fig_no = 0;
        for (int i = 0; i < n; i++) section(&o, texts[i], docs[i], &fig_no);
        mf_buf_puts(&o, "<p class=meta>Made by moeflip " MF_VERSION ".</p></body></html>\n");
        rc = mf_write_file_atomic(out_path, o.s, o.n, err);
    }
    for (int i = 0; i < n; i++) {
        json_decref(docs[i]);
        free(texts[i]);
    }
    free(docs);
    free(texts);
    free(o.s);
    return rc;
}

int mf_report_write(const char *diff_json_path, const char *out_path, mf_error *err) {
    return mf_report_write_many(&diff_json_path, 1, out_path, err);
}
