/* The main job: trace a reference and targets of one model on one prompt
 * file, diff every target against the reference and the two vendors against
 * each other at the same precision, draw every figure, write one report.
 *
 * In a job of several ranks (mf_dist.h) every trace and every diff is shared by
 * the ranks; rank 0 alone writes the default model, the figures and the report,
 * and prints the headline. */
#include "mf_job.h"
#include "mf_diff.h"
#include "mf_dist.h"
#include "mf_models.h"
#include "mf_trace.h"
#include "mf_viz.h"

#include <math.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

typedef struct config {
    char numerics[128], precision[64], name[200];
    bool ok;
    char run[8400];
    /* a replayed twin: the reference's routing, in every MoE layer or (replay_layers) those up to one */
    bool replay;
    char replay_layers[32];
} config;

/* "NUMERICS@PRECISION" (numerics may contain ':'); "fp64" alone is the reference */
static int parse_config(const char *spec, config *c, mf_error *err) {
    memset(c, 0, sizeof *c);
    const char *at = strchr(spec, '@');
    if (!at) {
        if (!strcmp(spec, "fp64")) {
            snprintf(c->numerics, sizeof c->numerics, "fp64");
            snprintf(c->precision, sizeof c->precision, "fp64");
        } else {
            return mf_fail(err, MF_EINVAL, "\"%s\": a configuration is NUMERICS@PRECISION, e.g. emu:cdna3@bf16", spec);
        }
    } else {
        snprintf(c->numerics, sizeof c->numerics, "%.*s", (int)(at - spec), spec);
        snprintf(c->precision, sizeof c->precision, "%s", at + 1);
    }
    snprintf(c->name, sizeof c->name, "%s@%s", c->numerics, c->precision);
    for (char *p = c->name; *p; p++)
        if (*p == ':' || *p == '/' || *p == '+') *p = '_';
    mf_trace_opts o = {.precision = c->precision, .numerics = c->numerics, .silent = true};
    mf_precision prec;
    mf_numerics num;
    return mf_trace_check(&o, &prec, &num, err);
}

/* Diffs ref against targets into path; floor, a repeat, may be NULL. */
static int diff_runs(config *ref, config **targets, int n, config *floor, int bootstrap, const char *path, mf_error *err) {
    const char **dirs = mf_xcalloc((size_t)n + 1, sizeof *dirs);
    for (int i = 0; i < n; i++) dirs[i] = targets[i]->run;
    const mf_diff_request q = {
        .reference = ref->run,
        .targets = dirs,
        .n_targets = n,
        .floor = floor ? MF_DIFF_FLOOR_RUN : MF_DIFF_FLOOR_NONE,
        .floor_run = floor ? floor->run : NULL,
        .bootstrap = bootstrap,
        .seed = MF_DIFF_SEED,
        .model_tokenizer = true,   /* the sweep traced these runs itself */
        .json_path = path,
    };
    const int rc = mf_diff_runs(&q, err);
    free(dirs);
    return rc;
}

/* Traces configuration c into its run (resuming what is there); a twin replays the reference's routing. */
static int trace_config(config *c, const char *model, const char *input, int threads, int generate,
                        const char *reference_run, mf_error *err) {
    mf_trace_opts to = {.model_dir = model, .input = input, .out = c->run, .precision = c->precision,
                        .numerics = c->numerics, .record = "logits", .threads = threads, .resume = true,
                        .label = c->name, .silent = true, .replay = c->replay ? reference_run : NULL,
                        .replay_layers = c->replay && c->replay_layers[0] ? c->replay_layers : NULL,
                        .generate = generate};
    return mf_trace(&to, err);
}

/* The replayed twins of the targets that traced (trace --replay of the reference): for each, one that replays
 * every MoE layer, and one through each MoE layer before the last for the curve (the last is the first twin). */
static int make_twins(config **ok, int nok, const char *model, const char *runs, config **out, int *n_twins, mf_error *err) {
    char path[4300];
    mf_config cfg;
    *n_twins = 0;
    *out = NULL;
    snprintf(path, sizeof path, "%s/config.json", model);
    int rc = mf_config_load(&cfg, path, err);
    if (rc) return rc;
    config *tw = *out = mf_xcalloc((size_t)nok * ((size_t)cfg.n_moe_layers + 1) + 1, sizeof *tw);
    for (int i = 0; i < nok; i++) {
        config *c = &tw[(*n_twins)++];
        *c = *ok[i];
        c->ok = false;
        c->replay = true;
        snprintf(c->name + strlen(c->name), sizeof c->name - strlen(c->name), "-replay");
        snprintf(c->run, sizeof c->run, "%s/%s", runs, c->name);
        for (int l = 0, mi = 0; l < cfg.n_layers; l++) {
            if (!cfg.layer_is_moe[l] || ++mi == cfg.n_moe_layers) continue;
            c = &tw[(*n_twins)++];
            *c = *ok[i];
            c->ok = false;
            c->replay = true;
            snprintf(c->replay_layers, sizeof c->replay_layers, "0-%d", l);
            snprintf(c->name + strlen(c->name), sizeof c->name - strlen(c->name), "-replay-through-%d", l);
            snprintf(c->run, sizeof c->run, "%s/%s", runs, c->name);
        }
    }
    return MF_OK;
}

/* The share of target t's output KL that its flips cause (diff.json's attribution, its overall twin), or NaN. */
static double kl_share(const char *diff_path, int target, double ci[2]) {
    json_t *d = json_load_file(diff_path, 0, NULL), *e;
    size_t i;
    double v = NAN;
    ci[0] = ci[1] = NAN;
    json_array_foreach(json_object_get(d, "attribution"), i, e) {
        if (json_integer_value(json_object_get(e, "target")) != target + 1) continue;
        size_t j;
        json_t *tw;
        json_array_foreach(json_object_get(e, "twins"), j, tw) {
            if (!json_equal(json_object_get(tw, "twin"), json_object_get(e, "overall"))) continue;
            json_t *m = json_object_get(tw, "kl_from_flips_pct");
            if (json_is_number(json_object_get(m, "value"))) v = json_number_value(json_object_get(m, "value"));
            if (json_is_number(json_array_get(json_object_get(m, "ci95"), 0))) {
                ci[0] = json_number_value(json_array_get(json_object_get(m, "ci95"), 0));
                ci[1] = json_number_value(json_array_get(json_object_get(m, "ci95"), 1));
            }
        }
    }
    json_decref(d);
    return v;
}

static double metric(const char *diff_path, int target, const char *name, double ci[2]) {
    json_t *d = json_load_file(diff_path, 0, NULL);
    json_t *m = json_object_get(json_object_get(json_array_get(json_object_get(d, "targets"), (size_t)target), "metrics"), name);
    double v = json_is_number(json_object_get(m, "value")) ? json_number_value(json_object_get(m, "value")) : NAN;
    if (ci) {
        ci[0] = json_number_value(json_array_get(json_object_get(m, "ci95"), 0));
        ci[1] = json_number_value(json_array_get(json_object_get(m, "ci95"), 1));
    }
    json_decref(d);
    return v;
}

/* targets[target].obj.key(.sub).value of a loaded diff.json, NaN where it is absent or null. */
static double sub_metric(json_t *d, int target, const char *obj, const char *key, const char *sub) {
    json_t *m = json_object_get(json_object_get(json_array_get(json_object_get(d, "targets"), (size_t)target), obj), key);
    if (sub) m = json_object_get(m, sub);
    return json_is_number(json_object_get(m, "value")) ? json_number_value(json_object_get(m, "value")) : NAN;
}

/* The headline of the responses and answers of target t of a diff (a, b: the two runs' names). */
static void print_text_headline(const char *diff_path, int t, const char *a, const char *b) {
    json_t *d = json_load_file(diff_path, 0, NULL);
    json_t *tj = json_array_get(json_object_get(d, "targets"), (size_t)t);
    const long long n = json_integer_value(json_object_get(json_object_get(tj, "responses"), "sequences"));
    const long long items = json_integer_value(json_object_get(json_object_get(tj, "answers"), "items"));
    if (n > 0)
        printf("  %s and %s generate the same response for %.0f%% of %lld prompts (first divergence at token %.3g, "
               "median)\n", a, b, sub_metric(d, t, "responses", "response_equal_pct", NULL), n,
               sub_metric(d, t, "responses", "first_divergence_median", NULL));
    if (items > 0)
        printf("  they pick the same answer on %.0f%% of %lld multiple-choice items (accuracy %.0f%% and %.0f%%)\n",
               sub_metric(d, t, "answers", "answer_agreement_pct", NULL), items,
               sub_metric(d, t, "answers", "accuracy_pct", "reference"), sub_metric(d, t, "answers", "accuracy_pct", "target"));
    json_decref(d);
}

static void draw_all(const char *diff_path, int n_targets, const char *fig_dir, const char *prefix) {
    char *text;
    size_t len;
    mf_error err = {0};
    if (mf_read_file(diff_path, &text, &len, &err)) return;
    for (int t = 0; t < n_targets; t++)
        for (int k = 0; k < 4; k++) {
            char path[4400];
            snprintf(path, sizeof path, "%s/%s-t%d-%s.png", fig_dir, prefix, t + 1, mf_heat_kind_name((mf_heat_kind)k));
            if (mf_heatmap_file(text, t, (mf_heat_kind)k, NULL, path, &err)) mf_log("moeflip: %s", err.msg);
        }
    free(text);
}

int mf_sweep(const mf_sweep_opts *o, mf_error *err) {
    const char *out = o->out_dir ? o->out_dir : "moeflip-out";
    char model[4200], input[4300], runs[4200], figs[4200], diff_main[4300], diff_vendor[4300], report[4300];
    int rc = mf_mkdir_p(out, err);
    if (rc) return rc;
    if (o->model_dir) {
        snprintf(model, sizeof model, "%s", o->model_dir);
        if (!o->input) return mf_fail(err, MF_EINVAL, "--input is required with --model");
        snprintf(input, sizeof input, "%s", o->input);
    } else {
        snprintf(model, sizeof model, "%s/model", out);
        if ((rc = mf_dist_agree(mf_dist_rank() == 0 ? mf_default_model_write(model, err) : MF_OK, err))) return rc;
        /* the default's own short set of texts (open prompts and multiple-choice items) keeps the whole sweep
         * about a minute on 2 cores */
        if (o->input) snprintf(input, sizeof input, "%s", o->input);
        else snprintf(input, sizeof input, "%s/%s", model,
                      mf_default_has("sweep-texts.jsonl")     ? "sweep-texts.jsonl"
                      : mf_default_has("sweep-prompts.jsonl") ? "sweep-prompts.jsonl"
                                                              : "prompts.jsonl");
    }
    const int generate = o->generate >= 0 ? o->generate
                         : !o->model_dir && !o->input && mf_default_has("sweep-texts.jsonl") ? MF_SWEEP_DEFAULT_GENERATE
                                                                                              : 0;
    snprintf(runs, sizeof runs, "%s/runs", out);
    snprintf(figs, sizeof figs, "%s/figures", out);
    if ((rc = mf_mkdir_p(runs, err)) || (rc = mf_mkdir_p(figs, err))) return rc;
    /* the configurations */
    config ref, tg[16];
    int nt = 0;
    if ((rc = parse_config(o->reference ? o->reference : "fp64", &ref, err))) return mf_fail_wrap(err, "--reference");
    const char *defaults = "emu:hopper@bf16,emu:cdna3@bf16,emu:cdna3@fp32,emu:cdna3@selective:router";
    char list[2048];
    snprintf(list, sizeof list, "%s", o->targets ? o->targets : defaults);
    char *save = NULL;
    for (char *tok = strtok_r(list, ",", &save); tok && nt < 15; tok = strtok_r(NULL, ",", &save))
        if ((rc = parse_config(tok, &tg[nt++], err))) return mf_fail_wrap(err, "--targets");
    const bool repeat = o->repeat || !o->targets;
    config rep;
    if (repeat && nt) {
        rep = tg[0];
        snprintf(rep.name + strlen(rep.name), sizeof rep.name - strlen(rep.name), "-repeat");
    }
    config *all[18];
    int n_all = 0;
    all[n_all++] = &ref;
    for (int i = 0; i < nt; i++) all[n_all++] = &tg[i];
    if (repeat && nt) all[n_all++] = &rep;
    /* trace each; a failed target is reported, not fatal to the others */
    for (int i = 0; i < n_all; i++) {
        config *c = all[i];
        snprintf(c->run, sizeof c->run, "%s/%s", runs, c->name);
        mf_error e = {0};
        if (trace_config(c, model, input, o->threads, generate, ref.run, &e)) {
            mf_log("moeflip: %s failed: %s", c->name, e.msg);
            if (c == &ref) return mf_fail(err, MF_EINVAL, "the reference %s failed: %s", c->name, e.msg);
            continue;
        }
        c->ok = true;
        mf_log("moeflip: traced %s", c->name);
    }
    /* every target against the reference, the repeat as the noise floor */
    config *ok[16];
    int nok = 0;
    for (int i = 0; i < nt; i++)
        if (tg[i].ok) ok[nok++] = &tg[i];
    if (!nok) return mf_fail(err, MF_EINVAL, "every target failed");
    /* the replayed twins go after the targets in the main diff, which finds them by their manifests */
    int n_twins = 0;
    config *twins = NULL;
    if (o->replay && (rc = make_twins(ok, nok, model, runs, &twins, &n_twins, err))) return rc;
    config **main_targets = mf_xcalloc((size_t)(nok + n_twins) + 1, sizeof *main_targets);
    int n_main = 0;
    for (int i = 0; i < nok; i++) main_targets[n_main++] = ok[i];
    for (int i = 0; i < n_twins; i++) {
        mf_error e = {0};
        if (trace_config(&twins[i], model, input, o->threads, generate, ref.run, &e)) {
            mf_log("moeflip: %s failed: %s", twins[i].name, e.msg);
            continue;
        }
        twins[i].ok = true;
        main_targets[n_main++] = &twins[i];
        mf_log("moeflip: traced %s", twins[i].name);
    }
    snprintf(diff_main, sizeof diff_main, "%s/diff.json", out);
    rc = diff_runs(&ref, main_targets, n_main, repeat && rep.ok ? &rep : NULL, o->bootstrap, diff_main, err);
    free(main_targets);
    free(twins);
    if (rc) return rc;
    const bool lead = mf_dist_rank() == 0;   /* the rank that draws, reports and prints */
    if (lead) draw_all(diff_main, nok, figs, "reference");
    for (int t = 0; t < nok && o->replay && lead; t++) {   /* the replay curves */
        char *text, path[4400];
        size_t len;
        mf_error e = {0};
        if (mf_read_file(diff_main, &text, &len, &e)) break;
        snprintf(path, sizeof path, "%s/reference-t%d-%s.png", figs, t + 1, mf_heat_kind_name(MF_HEAT_REPLAY_CURVE));
        if (mf_heatmap_file(text, t, MF_HEAT_REPLAY_CURVE, NULL, path, &e)) mf_log("moeflip: %s", e.msg);
        free(text);
    }
    /* the two vendors against each other, at the first precision they share: the report opens with it */
    const char *paths[2] = {diff_main, NULL};
    int npaths = 1;
    config *nv = NULL, *amd = NULL;
    for (int i = 0; i < nt && !(nv && amd); i++)
        for (int j = 0; j < nt; j++) {
            if (!tg[i].ok || !tg[j].ok || strcmp(tg[i].precision, tg[j].precision)) continue;
            bool inv = strstr(tg[i].numerics, "hopper") || strstr(tg[i].numerics, "ampere") || strstr(tg[i].numerics, "volta") ||
                       strstr(tg[i].numerics, "blackwell");
            bool jam = strstr(tg[j].numerics, "cdna");
            if (inv && jam) {
                nv = &tg[i];
                amd = &tg[j];
                break;
            }
        }
    if (nv && amd) {
        snprintf(diff_vendor, sizeof diff_vendor, "%s/diff-vendors.json", out);
        config *t1[1] = {amd};
        if (!diff_runs(nv, t1, 1, repeat && rep.ok && nv == &tg[0] ? &rep : NULL, o->bootstrap, diff_vendor, err)) {
            if (lead) draw_all(diff_vendor, 1, figs, "vendors");
            paths[0] = diff_vendor;
            paths[npaths++] = diff_main;
        }
    }
    snprintf(report, sizeof report, "%s/report.html", out);
    if ((rc = mf_dist_agree(lead ? mf_report_write_many(paths, npaths, report, err) : MF_OK, err)) || !lead) return rc;
    /* three headline numbers */
    printf("report: %s\n", report);
    double ci[2];
    if (nv && amd) {
        double v = metric(diff_vendor, 0, "flipped_slots_pct", ci);
        printf("  %s vs %s (%s): %.2f%% of expert choices flip [%.2f, %.2f]\n", nv->numerics, amd->numerics, nv->precision, v,
               ci[0], ci[1]);
        v = metric(diff_vendor, 0, "forward_kl", ci);
        printf("  their output distributions differ by KL %.3g nats per token [%.3g, %.3g]\n", v, ci[0], ci[1]);
        print_text_headline(diff_vendor, 0, nv->numerics, amd->numerics);
    } else {
        print_text_headline(diff_main, 0, ref.name, ok[0]->name);
    }
    for (int i = 0; i < nok && o->replay; i++) {
        double v = kl_share(diff_main, i, ci);
        if (isfinite(v))
            printf("  %s@%s against %s: its expert flips cause %.1f%% of its output KL [%.1f, %.1f]\n", ok[i]->numerics,
                   ok[i]->precision, ref.name, v, ci[0], ci[1]);
    }
    for (int i = 0; i < nok; i++)
        if (strstr(ok[i]->precision, "selective:router")) {
            for (int j = 0; j < nok; j++)
                if (!strcmp(ok[j]->numerics, ok[i]->numerics) && !strcmp(ok[j]->precision, "bf16")) {
                    double a = metric(diff_main, j, "flipped_slots_pct", NULL), b = metric(diff_main, i, "flipped_slots_pct", NULL);
                    printf("  %s against %s: flips %.2f%% in bf16, %.2f%% with the router in fp32\n", ok[i]->numerics, ref.name, a, b);
                }
        }
    return MF_OK;
}
