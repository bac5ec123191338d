/* The run directory: writer (with resume) and reader. */
#include "mf_rundir.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <math.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define FORMAT_NAME "moeflip-run"
#define FORMAT_VERSION 1
/* A shard is written when any of these is reached. */
#define SHARD_MAX_BYTES (64u << 20)
#define SHARD_MAX_SEQS 16
#define SHARD_MAX_SECONDS 10.0

int mf_record_parse(const char *s, mf_record *out) {
    static const char *names[] = {"routing", "topk", "logits", "full"};
    for (int i = 0; i < 4; i++)
        if (strcmp(s, names[i]) == 0) {
            *out = (mf_record)i;
            return MF_OK;
        }
    return MF_EINVAL;
}

const char *mf_record_name(mf_record r) {
    static const char *names[] = {"routing", "topk", "logits", "full"};
    return (unsigned)r < 4 ? names[r] : "?";
}

mf_record mf_record_default(int vocab) { return vocab <= 32768 ? MF_RECORD_LOGITS : MF_RECORD_TOPK; }

/* ---- writer ------------------------------------------------------------ */

struct mf_run_writer {
    char *dir;
    json_t *manifest;
    json_t *sequences, *shards;   /* borrowed from manifest */
    mf_run_info info;
    char **done;                  /* sorted ids of finished sequences */
    size_t n_done, cap_done;
    mf_st_writer *pending;
    json_t *pending_seqs;
    int pending_count;
    double last_flush;
    int next_shard, shard_stride;   /* the next shard's number, and how far each one moves it */
    /* a rank's writer in a job of several (mf_run_part_create): it writes shards but not the manifest, and keeps
     * their entries here until mf_run_writer_take_report hands them over to rank 0 */
    bool part;
    json_t *report_shards, *report_seqs;
};

static bool shard_name_valid(const char *n);
static bool is_hex32(const char *s);

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static void done_insert(mf_run_writer *w, const char *id) {
    if (w->n_done == w->cap_done) {
        w->cap_done = w->cap_done ? 2 * w->cap_done : 64;
        w->done = mf_xrealloc(w->done, w->cap_done * sizeof *w->done);
    }
    size_t lo = 0, hi = w->n_done;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (strcmp(w->done[mid], id) < 0) lo = mid + 1;
        else hi = mid;
    }
    memmove(w->done + lo + 1, w->done + lo, (w->n_done - lo) * sizeof *w->done);
    w->done[lo] = mf_xstrdup(id);
    w->n_done++;
}

bool mf_run_writer_has(const mf_run_writer *w, const char *id) {
    return w->n_done && bsearch(&id, w->done, w->n_done, sizeof *w->done, cmp_str) != NULL;
}

size_t mf_run_writer_done(const mf_run_writer *w) { return w->n_done; }

static void cpu_name(char *out, size_t cap) {
    snprintf(out, cap, "cpu");
    FILE *fp = fopen("/proc/cpuinfo", "r");
    if (!fp) return;
    char line[512];
    while (fgets(line, sizeof line, fp)) {
        if (strncmp(line, "model name", 10) == 0) {
            char *c = strchr(line, ':');
            if (c) {
                c++;
                while (*c == ' ') c++;
                c[strcspn(c, "\n")] = 0;
                snprintf(out, cap, "%s", c);
            }
            break;
        }
    }
    fclose(fp);
}

static json_t *build_manifest(const mf_run_info *in) {
    const mf_model *m = in->model;
    const mf_config *c = m ? &m->cfg : in->cfg;
    json_t *man = json_object();
    json_object_set_new(man, "format", json_string(FORMAT_NAME));
    json_object_set_new(man, "format_version", json_integer(FORMAT_VERSION));
    json_object_set_new(man, "tool", json_string("moeflip " MF_VERSION));
    char when[64];
    time_t now = time(NULL);
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    json_object_set_new(man, "created", json_string(when));

    json_t *model = json_object();
    json_object_set_new(model, "dir", json_string(in->model_dir));
    json_object_set_new(model, "architecture", json_string(c->model_type));
    json_object_set_new(model, "config_digest", json_string(c->digest));
    json_object_set_new(model, "weights_digest", json_string(m ? m->ckpt->weights_digest : in->weights_digest));
    json_object_set_new(model, "parameters", json_integer(m ? (json_int_t)m->n_params : 0));
    json_object_set_new(model, "n_layers", json_integer(c->n_layers));
    json_object_set_new(model, "hidden", json_integer(c->hidden));
    json_object_set_new(model, "vocab", json_integer(c->vocab));
    json_object_set_new(model, "n_experts", json_integer(c->n_experts));
    json_object_set_new(model, "top_k", json_integer(c->top_k));
    json_object_set_new(model, "has_shared_expert", json_boolean(c->has_shared_expert));
    json_t *ml = json_array();
    for (int l = 0; l < c->n_layers; l++)
        if (c->n_moe_layers && c->layer_is_moe[l]) json_array_append_new(ml, json_integer(l));
    json_object_set_new(model, "moe_layers", ml);
    json_object_set_new(man, "model", model);

    json_t *dev = json_object();
    char name[256];
    cpu_name(name, sizeof name);
    json_object_set_new(dev, "kind", json_string(in->device));
    json_object_set_new(dev, "name", json_string(in->device_name ? in->device_name : m ? name : "unknown (imported)"));
    json_object_set_new(dev, "threads", json_integer(in->threads));
    json_object_set_new(dev, "kernel", json_string(in->device_name ? "runtime/gpu" : m ? mf_gemm_kernel_name() : "unknown"));
    if (in->ranks > 1) json_object_set_new(dev, "ranks", json_integer(in->ranks));
    json_object_set_new(man, "device", dev);

    json_object_set_new(man, "numerics", json_string(in->numerics));
    if (in->numerics_validation) json_object_set_new(man, "numerics_validation", json_string(in->numerics_validation));
    if (in->fp8_products) json_object_set_new(man, "fp8_products", json_string(in->fp8_products));
    json_t *prec = json_object();
    json_object_set_new(prec, "name", json_string(in->prec->name));
    json_object_set_new(prec, "activations", json_string(mf_dtype_name(in->prec->act)));
    json_object_set_new(prec, "weights", json_string(mf_dtype_name(in->prec->weights)));
    json_object_set_new(prec, "opmath", json_string(mf_dtype_name(in->prec->opmath)));
    json_object_set_new(prec, "matmul_compute", json_string(mf_dtype_name(in->prec->compute)));
    json_object_set_new(prec, "semantics", json_string(in->capture ? "unknown (an engine's capture)"
                                                                   : "transformers 5.17 (v5): eager attention, grouped_mm expert combine"));
    json_object_set_new(man, "precision", prec);

    json_t *router = json_object();
    static const char *const rules[] = {[MF_ROUTE_SOFTMAX_TOPK] = "softmax_topk",
                                        [MF_ROUTE_SOFTMAX_TOPK_RENORM] = "softmax_topk_renorm",
                                        [MF_ROUTE_SIGMOID_GROUP] = "sigmoid_bias_group_topk",
                                        [MF_ROUTE_SOFTMAX_GREEDY] = "softmax_greedy",
                                        [MF_ROUTE_TOPK_SOFTMAX] = "topk_softmax"};
    json_object_set_new(router, "rule", json_string(rules[c->route_rule]));
    json_object_set_new(router, "norm_topk_prob", json_boolean(c->norm_topk_prob));
    if (c->route_rule == MF_ROUTE_SIGMOID_GROUP || c->route_rule == MF_ROUTE_SOFTMAX_GREEDY) {
        /* the grouped routers: which groups an expert belongs to (e / (n_experts / n_group)), how many stay */
        json_object_set_new(router, "n_group", json_integer(c->group_limited || c->route_rule == MF_ROUTE_SIGMOID_GROUP
                                                                ? c->n_group : 1));
        json_object_set_new(router, "topk_group", json_integer(c->group_limited || c->route_rule == MF_ROUTE_SIGMOID_GROUP
                                                                   ? c->topk_group : 1));
        json_object_set_new(router, "routed_scaling_factor", json_real(c->routed_scaling));
        json_object_set_new(router, "n_shared_experts", json_integer(c->n_shared_experts));
    }
    json_object_set_new(router, "tie_break", json_string("larger score first; equal scores: lower expert index"));
    json_object_set_new(router, "experts", json_string(in->experts_recorded ? "as the engine recorded them (ids only)"
                                                       : in->imported_from ? "derived from the recorded router logits"
                                                                           : "as dispatched"));
    json_object_set_new(man, "router", router);

    json_object_set_new(man, "record", json_string(mf_record_name(in->record)));
    json_t *input = json_object();
    json_object_set_new(input, "path", json_string(in->input_path));
    json_object_set_new(input, "digest", json_string(in->prompts->digest));
    json_object_set_new(input, "n_sequences", json_integer((json_int_t)in->prompts->n));
    json_object_set_new(man, "input", input);
    if (in->imported_from) json_object_set_new(man, "imported_from", json_string(in->imported_from));
    if (in->capture) json_object_set(man, "capture", in->capture);
    if (in->generation) {
        /* how the prompts were continued: what a reader needs to say which answers may be compared */
        json_t *g = json_object(), *eos = json_array();
        json_object_set_new(g, "strategy", json_string(in->generation->forced ? "teacher-forced" : "greedy"));
        json_object_set_new(g, "max_new_tokens", json_integer(in->generation->max_new_tokens));
        for (int i = 0; i < in->generation->n_eos; i++) json_array_append_new(eos, json_integer(in->generation->eos[i]));
        json_object_set_new(g, "eos_token_id", eos);
        json_object_set_new(g, "eos_from", json_string(in->generation->eos_source));
        /* greedy tokens come one step at a time against the cache; forced ones in one pass over the sequence */
        json_object_set_new(g, "path", json_string(in->generation->forced ? "prefill" : "decode"));
        if (in->generation->forced) json_object_set_new(g, "forced_from", json_string(in->input_path));
        json_object_set_new(man, "generation", g);
    }
    if (in->replay_json) json_object_set_new(man, "replay", json_loads(in->replay_json, 0, NULL));   /* trace/replay.c */
    json_object_set_new(man, "sequences", json_array());
    json_object_set_new(man, "shards", json_array());
    json_object_set_new(man, "complete", json_false());
    return man;
}

/* The number NNNNN of "part-NNNNN.safetensors" (a name mf_run_open checked), -1 for anything else. */
static int shard_number(const char *file) {
    if (!file || !shard_name_valid(file)) return -1;
    return atoi(file + 5);
}

static int write_manifest(mf_run_writer *w, mf_error *err) {
    char path[4096];
    mf_path_join(path, sizeof path, w->dir, "manifest.json");
    char *text = json_dumps(w->manifest, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
    if (!text) return mf_fail(err, MF_ENOMEM, "%s: cannot encode manifest", path);
    size_t n = strlen(text);
    text[n] = '\n';   /* json_dumps leaves room only for the NUL; replace it */
    int rc = mf_write_file_atomic(path, text, n + 1, err);
    free(text);
    return rc;
}

/* Leftovers of a killed writer: temporaries, and shards the manifest never named. */
static void remove_strays(const char *dir, json_t *shards) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char path[4096];
    while ((e = readdir(d))) {
        bool stray = strstr(e->d_name, ".tmp.") != NULL;
        if (!stray && strncmp(e->d_name, "part-", 5) == 0) {
            stray = true;
            size_t i;
            json_t *s;
            json_array_foreach(shards, i, s) if (strcmp(json_string_value(json_object_get(s, "file")), e->d_name) == 0)
                stray = false;
        }
        if (stray && mf_path_join(path, sizeof path, dir, e->d_name)) unlink(path);
    }
    closedir(d);
}

static int check_same(const char *dir, json_t *old, json_t *fresh, const char *obj, const char *key, mf_error *err) {
    json_t *a = obj ? json_object_get(json_object_get(old, obj), key) : json_object_get(old, key);
    json_t *b = obj ? json_object_get(json_object_get(fresh, obj), key) : json_object_get(fresh, key);
    if ((a || b) && !json_equal(a, b)) {   /* jansson's json_equal is false for two absent values */
        char *sa = a ? json_dumps(a, JSON_ENCODE_ANY) : NULL, *sb = b ? json_dumps(b, JSON_ENCODE_ANY) : NULL;
        mf_fail(err, MF_EMISMATCH, "%s: cannot resume: the run has %s%s%s = %s, this command has %s", dir, obj ? obj : "",
                obj ? "." : "", key, sa ? sa : "nothing", sb ? sb : "nothing");
        free(sa);
        free(sb);
        return MF_EMISMATCH;
    }
    return MF_OK;
}

/* A file a run directory (or one being built) may hold: the manifest, shards, and temporaries of the two. */
static bool run_file_name(const char *n) {
    return !strcmp(n, "manifest.json") || !strncmp(n, "manifest.json.tmp.", 18) || !strncmp(n, "part-", 5);
}

bool mf_run_remove_dir(const char *d) {
    DIR *dd = opendir(d);
    if (!dd) return false;
    struct dirent *e;
    bool only_run_files = true;
    while ((e = readdir(dd)) && only_run_files)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") && !run_file_name(e->d_name)) only_run_files = false;
    if (only_run_files) {
        rewinddir(dd);
        char path[4400];
        while ((e = readdir(dd)))
            if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") && mf_path_join(path, sizeof path, d, e->d_name)) unlink(path);
    }
    closedir(dd);
    return only_run_files && rmdir(d) == 0;
}

void mf_run_remove_stale(const char *dir) {
    char parent[4096], base[4096];
    snprintf(parent, sizeof parent, "%s", dir);
    size_t n = strlen(parent);
    while (n > 1 && parent[n - 1] == '/') parent[--n] = 0;
    char *slash = strrchr(parent, '/');
    if (slash) {
        snprintf(base, sizeof base, "%s", slash + 1);
        if (slash == parent) parent[1] = 0;
        else *slash = 0;
    } else {
        snprintf(base, sizeof base, "%s", parent);
        snprintf(parent, sizeof parent, ".");
    }
    const size_t bl = strlen(base);
    DIR *d = opendir(parent);
    if (!d || !bl) {
        if (d) closedir(d);
        return;
    }
    struct dirent *e;
    while ((e = readdir(d))) {
        /* <base>.tmp.<pid>: a run being built by that process; it is gone if the process is */
        if (strncmp(e->d_name, base, bl) != 0 || strncmp(e->d_name + bl, ".tmp.", 5) != 0) continue;
        const char *num = e->d_name + bl + 5;
        char *end;
        errno = 0;
        long pid = strtol(num, &end, 10);
        if (!*num || *end || errno || pid <= 0 || pid == (long)getpid()) continue;
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue;   /* alive, or not ours to judge */
        char path[8300];
        snprintf(path, sizeof path, "%s/%s", parent, e->d_name);
        if (mf_is_dir(path)) mf_run_remove_dir(path);
    }
    closedir(d);
}

/* A new run directory appears with its manifest already in it: it is built
 * under a temporary name and renamed into place, so a run killed at any
 * moment is either absent or a valid (empty) run. What a writer killed before
 * the rename left (<dir>.tmp.<pid> of a process that is gone) is removed. */
static int create_run_dir(const char *dir, const mf_run_info *info, mf_error *err) {
    char tmp[4096], path[4200], parent[4096];
    if (mf_is_dir(dir)) {
        DIR *d = opendir(dir);
        struct dirent *e;
        bool empty = true;
        while (d && (e = readdir(d)))
            if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) empty = false;
        if (d) closedir(d);
        if (!empty) return mf_fail(err, MF_EINVAL, "%s: exists and is not a run directory (no manifest.json)", dir);
    } else if (mf_path_exists(dir)) {
        return mf_fail(err, MF_EINVAL, "%s: exists and is not a directory", dir);
    }
    snprintf(parent, sizeof parent, "%s", dir);
    char *slash = strrchr(parent, '/');
    if (slash && slash != parent) {
        *slash = 0;
        int rc = mf_mkdir_p(parent, err);
        if (rc) return rc;
    }
    mf_run_remove_stale(dir);
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", dir, (long)getpid());
    int made = mkdir(tmp, 0777);
    if (made != 0 && errno == EEXIST) {
        /* the remains of a writer killed here with our pid (pids repeat, as
         * in a restarted container): no live process but us owns this name */
        DIR *d = opendir(tmp);
        struct dirent *e;
        while (d && (e = readdir(d)))
            if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") && mf_path_join(path, sizeof path, tmp, e->d_name))
                unlink(path);
        if (d) closedir(d);
        rmdir(tmp);
        made = mkdir(tmp, 0777);
    }
    if (made != 0) return mf_fail(err, MF_EIO, "%s: cannot create run directory: %s", dir, strerror(errno));
    json_t *man = build_manifest(info);
    char *text = json_dumps(man, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
    json_decref(man);
    snprintf(path, sizeof path, "%s/manifest.json", tmp);
    int rc = mf_write_file_atomic(path, text, strlen(text), err);
    free(text);
    if (!rc && rename(tmp, dir) != 0)
        rc = mf_fail(err, MF_EIO, "%s: cannot create run directory: %s", dir, strerror(errno));
    if (rc) {
        unlink(path);
        rmdir(tmp);
    }
    return rc;
}

int mf_run_create(mf_run_writer **out, const char *dir, const mf_run_info *info, bool resume, mf_error *err) {
    *out = NULL;
    char path[4096];
    int rc;
    if (!mf_path_join(path, sizeof path, dir, "manifest.json")) return mf_fail(err, MF_EINVAL, "%s: path too long", dir);
    bool exists = mf_path_exists(path);
    if (!exists && (rc = create_run_dir(dir, info, err))) return rc;
    mf_run_writer *w = mf_xcalloc(1, sizeof *w);
    w->dir = mf_xstrdup(dir);
    w->info = *info;
    w->manifest = build_manifest(info);
    if (exists && !resume) {
        rc = mf_fail(err, MF_EINVAL, "%s: a run is already there (use --resume to continue it, or another --out)", dir);
        goto fail;
    }
    if (exists) {
        mf_run *old;
        if ((rc = mf_run_open(&old, dir, err))) goto fail;   /* verifies every shard */
        mf_run_close(old);
        json_error_t jerr;
        json_t *prev = json_load_file(path, 0, &jerr);
        if (!prev) {
            rc = mf_fail(err, MF_EFORMAT, "%s: %s", path, jerr.text);
            goto fail;
        }
        static const char *keys[][2] = {{"model", "architecture"}, {"model", "config_digest"},
                                        {"model", "weights_digest"}, {"precision", "name"},
                                        {NULL, "numerics"},          {NULL, "record"},
                                        {"input", "digest"},         {"device", "kind"},
                                        {NULL, "generation"},        {NULL, "replay"}};
        for (size_t i = 0; i < sizeof keys / sizeof keys[0] && !rc; i++)
            rc = check_same(dir, prev, w->manifest, keys[i][0], keys[i][1], err);
        if (rc) {
            json_decref(prev);
            goto fail;
        }
        /* keep the original identity and history; continue its lists */
        json_decref(w->manifest);
        w->manifest = prev;
        json_object_set_new(w->manifest, "complete", json_false());
        size_t i;
        json_t *s;
        json_array_foreach(json_object_get(prev, "sequences"), i, s) done_insert(w, json_string_value(json_object_get(s, "id")));
    }
    w->sequences = json_object_get(w->manifest, "sequences");
    w->shards = json_object_get(w->manifest, "shards");
    /* past the highest number there: the ranks of a job leave gaps, so the count could name a shard that exists */
    w->next_shard = 0;
    w->shard_stride = 1;
    size_t si;
    json_t *sh;
    json_array_foreach(w->shards, si, sh) {
        const int k = shard_number(json_string_value(json_object_get(sh, "file")));
        if (k >= w->next_shard) w->next_shard = k + 1;
    }
    remove_strays(dir, w->shards);
    if ((rc = write_manifest(w, err))) goto fail;
    w->pending = mf_st_writer_new();
    w->pending_seqs = json_array();
    w->last_flush = mf_now();
    *out = w;
    return MF_OK;
fail:
    mf_run_writer_free(w);
    return rc;
}

/* Sequence ids of the input, sorted, with their places in it: where each sequence goes in the manifest. */
typedef struct id_place {
    const char *id;
    size_t index;
} id_place;

static int cmp_place(const void *a, const void *b) { return strcmp(((const id_place *)a)->id, ((const id_place *)b)->id); }

static id_place *input_places(const mf_prompts *p) {
    id_place *v = mf_xcalloc(p->n + 1, sizeof *v);
    for (size_t i = 0; i < p->n; i++) v[i] = (id_place){p->seq[i].id, i};
    qsort(v, p->n, sizeof *v, cmp_place);
    return v;
}

static const id_place *find_place(const id_place *v, size_t n, const char *id) {
    const id_place key = {id, 0};
    return id ? bsearch(&key, v, n, sizeof *v, cmp_place) : NULL;
}

int mf_run_part_create(mf_run_writer **out, const char *dir, const mf_run_info *info, mf_error *err) {
    *out = NULL;
    if (!mf_is_dir(dir)) return mf_fail(err, MF_EIO, "%s: not a run directory (rank 0 creates it first)", dir);
    mf_run_writer *w = mf_xcalloc(1, sizeof *w);
    w->dir = mf_xstrdup(dir);
    w->info = *info;
    w->part = true;
    w->report_shards = json_array();
    w->report_seqs = json_array();
    w->shard_stride = 1;
    w->pending = mf_st_writer_new();
    w->pending_seqs = json_array();
    w->last_flush = mf_now();
    *out = w;
    return MF_OK;
}

int mf_run_writer_next_shard(const mf_run_writer *w) { return w->next_shard; }

void mf_run_writer_number_shards(mf_run_writer *w, int first, int stride) {
    w->next_shard = first;
    w->shard_stride = stride > 0 ? stride : 1;
}

char *mf_run_writer_take_report(mf_run_writer *w) {
    if (!w->part || !json_array_size(w->report_shards)) return NULL;
    json_t *r = json_object();
    json_object_set(r, "shards", w->report_shards);
    json_object_set(r, "sequences", w->report_seqs);
    char *text = json_dumps(r, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(r);
    json_array_clear(w->report_shards);
    json_array_clear(w->report_seqs);
    return text;
}

int mf_run_writer_adopt(mf_run_writer *w, const char *report, size_t len, const char *from, uint64_t *positions,
                        mf_error *err) {
    *positions = 0;
    json_error_t jerr;
    json_t *r = json_loadb(report, len, JSON_REJECT_DUPLICATES, &jerr);
    json_t *shards = json_object_get(r, "shards"), *seqs = json_object_get(r, "sequences");
    int rc = MF_OK;
    if (!json_is_array(shards) || !json_is_array(seqs) || !json_array_size(shards)) {
        rc = mf_fail(err, MF_EFORMAT, "%s: %s's report of its shards is malformed (%s)", w->dir, from,
                     r ? "it needs shards and sequences lists" : jerr.text);
        json_decref(r);
        return rc;
    }
    /* the shards: named as the writer names them, not in the run yet, there with the size reported */
    size_t i;
    json_t *e;
    json_array_foreach(shards, i, e) {
        const char *f = json_string_value(json_object_get(e, "file")), *d = json_string_value(json_object_get(e, "digest"));
        json_t *b = json_object_get(e, "bytes");
        if (!f || !shard_name_valid(f) || !d || !is_hex32(d) || !json_is_integer(b)) {
            rc = mf_fail(err, MF_EFORMAT, "%s: %s reported a malformed shard entry %zu", w->dir, from, i);
            break;
        }
        size_t j;
        json_t *o;
        json_array_foreach(w->shards, j, o) if (!strcmp(json_string_value(json_object_get(o, "file")), f)) {
            rc = mf_fail(err, MF_EFORMAT, "%s: %s reported shard %s, which the run already has", w->dir, from, f);
            break;
        }
        if (rc) break;
        char path[4200];
        struct stat st;
        /* opened, not just stat'ed: on NFS an open revalidates what another client wrote (close-to-open) */
        int fd = mf_path_join(path, sizeof path, w->dir, f) ? open(path, O_RDONLY | O_CLOEXEC) : -1;
        const bool there = fd >= 0 && fstat(fd, &st) == 0;
        if (fd >= 0) close(fd);
        if (!there || (uint64_t)st.st_size != (uint64_t)json_integer_value(b)) {
            rc = mf_fail(err, MF_EIO, "%s: %s reported %s of %lld bytes, but %s", w->dir, from, f,
                         (long long)json_integer_value(b), there ? "its size differs" : "it is not there");
            break;
        }
    }
    /* the sequences: of the input, not done yet, in a shard of the report */
    id_place *places = rc ? NULL : input_places(w->info.prompts);
    json_array_foreach(seqs, i, e) {
        if (rc) break;
        const char *id = json_string_value(json_object_get(e, "id")), *sh = json_string_value(json_object_get(e, "shard"));
        bool in_report = false;
        size_t j;
        json_t *o;
        json_array_foreach(shards, j, o) in_report |= sh && !strcmp(json_string_value(json_object_get(o, "file")), sh);
        if (!find_place(places, w->info.prompts->n, id))
            rc = mf_fail(err, MF_EFORMAT, "%s: %s reported sequence entry %zu, which is not of the input", w->dir, from, i);
        else if (mf_run_writer_has(w, id))
            rc = mf_fail(err, MF_EFORMAT, "%s: %s reported sequence %s, which the run already has", w->dir, from, id);
        else if (!in_report)
            rc = mf_fail(err, MF_EFORMAT, "%s: %s reported sequence %s in a shard it did not report", w->dir, from, id);
        for (size_t k = 0; k < i && !rc; k++)
            if (!strcmp(json_string_value(json_object_get(json_array_get(seqs, k), "id")), id))
                rc = mf_fail(err, MF_EFORMAT, "%s: %s reported sequence %s twice", w->dir, from, id);
    }
    free(places);
    if (!rc) {
        json_array_foreach(shards, i, e) json_array_append(w->shards, e);
        json_array_foreach(seqs, i, e) {
            json_array_append(w->sequences, e);
            done_insert(w, json_string_value(json_object_get(e, "id")));
            const json_int_t length = json_integer_value(json_object_get(e, "length"));
            *positions += length > 0 ? (uint64_t)length : 0;
        }
        rc = write_manifest(w, err);
    }
    json_decref(r);
    return rc;
}

static int flush_shard(mf_run_writer *w, mf_error *err) {
    if (w->pending_count == 0) return MF_OK;
    if (w->next_shard > 99999999)   /* the 8 digits of the format */
        return mf_fail(err, MF_EINVAL, "%s: shard number %d is past the format's 8 digits", w->dir, w->next_shard);
    char name[64], path[4096];
    snprintf(name, sizeof name, "part-%05d.safetensors", w->next_shard);
    if (!mf_path_join(path, sizeof path, w->dir, name)) return mf_fail(err, MF_EINVAL, "%s: path too long", w->dir);
    mf_st_writer_meta(w->pending, "format", FORMAT_NAME);
    int rc = mf_st_writer_write(w->pending, path, err);
    if (rc) return rc;
    char digest[33];
    if ((rc = mf_digest_file(path, digest, err))) return rc;
    mf_mmap m;
    if ((rc = mf_mmap_open(&m, path, err))) return rc;
    size_t bytes = m.size;
    mf_mmap_close(&m);
    json_t *sh = json_object();
    json_object_set_new(sh, "file", json_string(name));
    json_object_set_new(sh, "bytes", json_integer((json_int_t)bytes));
    json_object_set_new(sh, "digest", json_string(digest));
    json_array_append_new(w->part ? w->report_shards : w->shards, sh);
    size_t i;
    json_t *s;
    json_array_foreach(w->pending_seqs, i, s) {
        json_object_set_new(s, "shard", json_string(name));
        json_array_append(w->part ? w->report_seqs : w->sequences, s);
        done_insert(w, json_string_value(json_object_get(s, "id")));
    }
    if (!w->part && (rc = write_manifest(w, err))) return rc;
    w->next_shard += w->shard_stride;
    mf_st_writer_free(w->pending);
    w->pending = mf_st_writer_new();
    json_array_clear(w->pending_seqs);
    w->pending_count = 0;
    w->last_flush = mf_now();
    return MF_OK;
}

/* Converts n doubles to dtype t and adds them as tensor <id>/<field>. */
static void add_tensor(mf_st_writer *st, const char *id, const char *field, mf_dtype t, int ndim, const int64_t *shape,
                       const double *v) {
    size_t n = 1;
    for (int i = 0; i < ndim; i++) n *= (size_t)shape[i];
    void *buf = mf_xmalloc(n * mf_dtype_size(t));
    for (size_t i = 0; i < n; i++) mf_store_from_f64(buf, t, i, v[i]);
    char name[MF_MAX_SEQ_ID + 64];
    snprintf(name, sizeof name, "%s/%s", id, field);
    mf_st_writer_add(st, name, t, ndim, shape, buf);
    free(buf);
}

/* The logits of a result as tensor <id>/logits of dtype t: from its doubles,
 * or as the device handed them over (copied as they are when of t). */
static void add_logits(mf_st_writer *st, const char *id, const mf_seq_result *r, mf_dtype t, const int64_t *shape) {
    if (r->logits || r->logits_raw_dtype != t) {
        const size_t n = (size_t)shape[0] * (size_t)shape[1];
        double *v = r->logits ? r->logits : mf_xmalloc(n * sizeof(double));
        if (!r->logits)
            for (size_t i = 0; i < n; i++) v[i] = mf_load_as_f64(r->logits_raw, r->logits_raw_dtype, i);
        add_tensor(st, id, "logits", t, 2, shape, v);
        if (!r->logits) free(v);
        return;
    }
    char name[MF_MAX_SEQ_ID + 64];
    snprintf(name, sizeof name, "%s/logits", id);
    mf_st_writer_add(st, name, t, 2, shape, r->logits_raw);
}

static void add_topk_logits(mf_st_writer *st, const char *id, const mf_seq_result *r, mf_dtype t) {
    const int T = r->T, V = r->V, K = V < MF_TOPK_LOGITS ? V : MF_TOPK_LOGITS;
    double *vals = mf_xmalloc((size_t)T * K * sizeof(double));
    int32_t *toks = mf_xmalloc((size_t)T * K * sizeof(int32_t));
    double *lse = mf_xmalloc((size_t)T * sizeof(double));
    uint16_t *ids = NULL;
    /* positions are independent: each thread takes whole rows */
#pragma omp parallel for schedule(dynamic, 4) if ((size_t)T * V >= (1u << 20))
    for (int p = 0; p < T; p++) {
        double *wide = r->logits ? NULL : mf_xmalloc((size_t)V * sizeof(double));
        if (wide)
            for (int j = 0; j < V; j++) wide[j] = mf_load_as_f64(r->logits_raw, r->logits_raw_dtype, (size_t)p * V + j);
        const double *row = wide ? wide : r->logits + (size_t)p * V;
        /* simple selection: K passes would be O(KV); use a partial insertion list instead */
        int len = 0;
        for (int j = 0; j < V; j++) {
            int pos = len;
            while (pos > 0 && (row[j] > vals[(size_t)p * K + pos - 1])) pos--;
            if (pos >= K) continue;
            int end = len < K ? len : K - 1;
            for (int q = end; q > pos; q--) {
                vals[(size_t)p * K + q] = vals[(size_t)p * K + q - 1];
                toks[(size_t)p * K + q] = toks[(size_t)p * K + q - 1];
            }
            vals[(size_t)p * K + pos] = row[j];
            toks[(size_t)p * K + pos] = j;
            if (len < K) len++;
        }
        double mx = vals[(size_t)p * K], s = 0;
        for (int j = 0; j < V; j++) s += exp(row[j] - mx);
        lse[p] = mx + log(s);
        free(wide);
    }
    (void)ids;
    int64_t shape[2] = {T, K};
    add_tensor(st, id, "topk_logits", t, 2, shape, vals);
    char name[MF_MAX_SEQ_ID + 64];
    snprintf(name, sizeof name, "%s/topk_tokens", id);
    mf_st_writer_add(st, name, MF_I32, 2, shape, toks);
    add_tensor(st, id, "logsumexp", MF_F64, 1, shape, lse);
    free(vals);
    free(toks);
    free(lse);
}

int mf_run_writer_add(mf_run_writer *w, const mf_prompt *p, const mf_seq_result *r, mf_error *err) {
    const mf_precision *prec = w->info.prec;
    const int T = r->T;
    int64_t shape[3];
    char name[MF_MAX_SEQ_ID + 64];
    shape[0] = T;
    snprintf(name, sizeof name, "%s/tokens", p->id);
    mf_st_writer_add(w->pending, name, MF_I32, 1, shape, p->tokens);
    if (r->n_moe) {
        shape[0] = r->n_moe;
        shape[1] = T;
        shape[2] = r->k;
        snprintf(name, sizeof name, "%s/topk_ids", p->id);
        mf_st_writer_add(w->pending, name, MF_U16, 3, shape, r->topk_ids);
        /* an engine's capture may lack the weights and the scores (the manifest's capture.lacks says so) */
        if (r->topk_w) add_tensor(w->pending, p->id, "topk_w", prec->opmath, 3, shape, r->topk_w);
        shape[2] = r->E;
        if (r->router) add_tensor(w->pending, p->id, "router", mf_precision_widest(prec, MF_PART_ROUTER), 3, shape, r->router);
        if (r->shared_gate)
            add_tensor(w->pending, p->id, "shared_gate", mf_precision_widest(prec, MF_PART_MLP), 2, shape, r->shared_gate);
        if (r->select) add_tensor(w->pending, p->id, "select", prec->opmath, 3, shape, r->select);
        if (r->router_in && w->info.record == MF_RECORD_FULL) {
            shape[2] = r->H;
            add_tensor(w->pending, p->id, "router_in", mf_precision_widest(prec, MF_PART_MLP), 3, shape, r->router_in);
        }
    }
    if (w->info.record == MF_RECORD_LOGITS || w->info.record == MF_RECORD_FULL) {
        shape[0] = T;
        shape[1] = r->V;
        add_logits(w->pending, p->id, r, prec->part[MF_PART_HEAD], shape);
    } else if (w->info.record == MF_RECORD_TOPK) {
        add_topk_logits(w->pending, p->id, r, prec->part[MF_PART_HEAD]);
    }
    json_t *s = json_object();
    json_object_set_new(s, "id", json_string(p->id));
    json_object_set_new(s, "length", json_integer(T));
    if (w->info.generation) json_object_set_new(s, "generated", json_integer(p->generated));
    json_t *choices = mf_choices_json(p);
    if (choices) json_object_set_new(s, "choices", choices);
    json_array_append_new(w->pending_seqs, s);
    w->pending_count++;
    bool due = mf_st_writer_bytes(w->pending) >= SHARD_MAX_BYTES ||
               (w->info.shard_seqs > 0 ? w->pending_count >= w->info.shard_seqs
                                       : (w->pending_count >= SHARD_MAX_SEQS || mf_now() - w->last_flush >= SHARD_MAX_SECONDS));
    return due ? flush_shard(w, err) : MF_OK;
}

typedef struct placed {
    size_t key;
    json_t *entry;
} placed;

static int cmp_placed(const void *a, const void *b) {
    const size_t x = ((const placed *)a)->key, y = ((const placed *)b)->key;
    return (x > y) - (x < y);
}

/* The manifest's sequences in the input's order and its shards by number, as one process writes them: the
 * ranks of a job report theirs as they finish, in no particular order. */
static void sort_manifest(mf_run_writer *w) {
    const mf_prompts *p = w->info.prompts;
    id_place *places = input_places(p);
    json_t *arrays[2] = {w->sequences, w->shards};
    for (int a = 0; a < 2; a++) {
        const size_t n = json_array_size(arrays[a]);
        placed *v = mf_xcalloc(n + 1, sizeof *v);
        for (size_t i = 0; i < n; i++) {
            json_t *e = json_array_get(arrays[a], i);
            size_t key = SIZE_MAX;   /* a sequence not in the input (resume refuses another input): last */
            if (a == 0) {
                const id_place *pl = find_place(places, p->n, json_string_value(json_object_get(e, "id")));
                if (pl) key = pl->index;
            } else {
                const int k = shard_number(json_string_value(json_object_get(e, "file")));
                if (k >= 0) key = (size_t)k;
            }
            v[i] = (placed){key, json_incref(e)};
        }
        /* equal keys keep their order: qsort is not stable, so the index breaks ties */
        for (size_t i = 0; i < n; i++)
            if (v[i].key == SIZE_MAX) v[i].key = SIZE_MAX - n + i;
        qsort(v, n, sizeof *v, cmp_placed);
        json_array_clear(arrays[a]);
        for (size_t i = 0; i < n; i++) json_array_append_new(arrays[a], v[i].entry);
        free(v);
    }
    free(places);
}

int mf_run_writer_close(mf_run_writer *w, mf_error *err) {
    int rc = flush_shard(w, err);
    if (rc || w->part) return rc;
    sort_manifest(w);
    bool complete = true;
    for (size_t i = 0; i < w->info.prompts->n && complete; i++) complete = mf_run_writer_has(w, w->info.prompts->seq[i].id);
    json_object_set_new(w->manifest, "complete", json_boolean(complete));
    return write_manifest(w, err);
}

void mf_run_writer_free(mf_run_writer *w) {
    if (!w) return;
    for (size_t i = 0; i < w->n_done; i++) free(w->done[i]);
    free(w->done);
    json_decref(w->manifest);
    json_decref(w->pending_seqs);
    json_decref(w->report_shards);
    json_decref(w->report_seqs);
    mf_st_writer_free(w->pending);
    free(w->dir);
    free(w);
}

/* ---- reader ------------------------------------------------------------ *
 *
 * One validation that every reader goes through (export, inspect, diff, the
 * collector, push, import's resume): a run is opened whole or refused with the
 * first thing wrong, in this order:
 *   1. the manifest against itself: every field a reader uses present and of
 *      its type and range, moe_layers strictly increasing inside the model,
 *      sequences and shards each listed once, counts that agree;
 *   2. the shards against the manifest: names, sizes and digests;
 *   3. every sequence's tensors against the shapes the manifest declares and
 *      against each other (the record level says which must be there and
 *      which may not), and nothing in a shard that no sequence of it owns;
 *   4. the ids against the model: tokens and top-k token ids in the
 *      vocabulary, expert ids below the expert count. (Not in the unhashed
 *      open, whose caller checks the bytes elsewhere: a damaged byte there is
 *      damage, not a lie, and the collector says so.) */

void mf_run_close(mf_run *r) {
    if (!r) return;
    for (size_t i = 0; i < r->n_seqs; i++) {
        free(r->seqs[i].id);
        mf_run_choices_free(r->seqs[i].choices);
    }
    for (size_t i = 0; i < r->n_shards; i++) {
        free(r->shard_files[i]);
        if (r->shards) mf_st_close(r->shards[i]);
    }
    free(r->seqs);
    free(r->shard_files);
    free(r->shard_bytes);
    free(r->shard_digest);
    free(r->shards);
    free(r->moe_layers);
    free(r->manifest_text);
    free(r->dir);
    free(r);
}

/* An integer field of o in [lo, hi]; where says which object it is in ("model." or ""). */
static int want_int(json_t *o, const char *where, const char *key, long long lo, long long hi, int *out, const char *path,
                    mf_error *err) {
    json_t *v = json_object_get(o, key);
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
        return mf_fail(err, MF_EFORMAT, "%s: %s%s must be an integer from %lld to %lld", path, where, key, lo, hi);
    *out = (int)json_integer_value(v);
    return MF_OK;
}

static int want_str(json_t *o, const char *where, const char *key, const char **out, const char *path, mf_error *err) {
    const char *s = json_string_value(json_object_get(o, key));
    if (!s) return mf_fail(err, MF_EFORMAT, "%s: %s%s must be a string", path, where, key);
    if (out) *out = s;
    return MF_OK;
}

static bool is_hex32(const char *s) {
    if (strlen(s) != 32) return false;
    for (int i = 0; i < 32; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return false;
    return true;
}

/* part-NNNNN.safetensors (5 to 8 digits), as the writer names shards and the collector takes them */
static bool shard_name_valid(const char *n) {
    const size_t l = strlen(n);
    if (l < 5 + 5 + 12 || l > 5 + 8 + 12 || strncmp(n, "part-", 5) != 0 || strcmp(n + l - 12, ".safetensors") != 0) return false;
    for (size_t i = 5; i < l - 12; i++)
        if (n[i] < '0' || n[i] > '9') return false;
    return true;
}

static const char *const lacks_names[] = {"gate_weights", "router_logits", "shared_gates", "logits"};
static const char *const lacks_words[] = {"gate weights", "router logits", "shared-expert gates", "logits"};

const char *mf_lacks_text(unsigned lacks, char *buf, size_t cap) {
    size_t n = 0;
    buf[0] = 0;
    for (int b = 0; b < 4; b++)
        if (lacks & (1u << b)) n += (size_t)snprintf(buf + n, n < cap ? cap - n : 0, "%s%s", n ? ", " : "", lacks_words[b]);
    return buf;
}

/* An imported capture's "capture" object (absent in every other run): its engine and what it lacks, each a name
 * of lacks_names once; a run lacking logits is a routing run. */
static int check_capture(mf_run *r, json_t *cap, mf_record record, const char *path, mf_error *err) {
    r->lacks = 0;
    r->engine[0] = 0;
    if (!cap) return MF_OK;
    const char *engine = json_string_value(json_object_get(cap, "engine"));
    json_t *lacks = json_object_get(cap, "lacks");
    if (!json_is_object(cap) || !engine || strlen(engine) >= sizeof r->engine || !json_is_array(lacks))
        return mf_fail(err, MF_EFORMAT, "%s: capture must be an object with an engine name and a lacks list", path);
    snprintf(r->engine, sizeof r->engine, "%s", engine);
    size_t i;
    json_t *v;
    json_array_foreach(lacks, i, v) {
        const char *s = json_string_value(v);
        int b = 0;
        while (b < 4 && (!s || strcmp(s, lacks_names[b]))) b++;
        if (b == 4 || (r->lacks & (1u << b)))
            return mf_fail(err, MF_EFORMAT, "%s: capture.lacks[%zu] must be one of gate_weights, router_logits, shared_gates, logits, "
                           "each once", path, i);
        r->lacks |= 1u << b;
    }
    if ((r->lacks & MF_LACKS_LOGITS) && record != MF_RECORD_ROUTING)
        return mf_fail(err, MF_EFORMAT, "%s: capture.lacks names logits in a %s run", path, mf_record_name(record));
    return MF_OK;
}

/* 1. The manifest against itself: fills the model facts of r. */
static int check_manifest(mf_run *r, json_t *man, const char *path, mf_error *err) {
    const char *fmt = json_string_value(json_object_get(man, "format"));
    json_t *fv = json_object_get(man, "format_version");
    if (!fmt || strcmp(fmt, FORMAT_NAME) != 0 || !json_is_integer(fv) || json_integer_value(fv) != FORMAT_VERSION)
        return mf_fail(err, MF_EFORMAT, "%s: not a moeflip run manifest (format %s version %lld)", path, fmt ? fmt : "?",
                       json_is_integer(fv) ? (long long)json_integer_value(fv) : -1LL);
    json_t *model = json_object_get(man, "model"), *shards = json_object_get(man, "shards"),
           *seqs = json_object_get(man, "sequences"), *ml = json_object_get(model, "moe_layers");
    if (!json_is_object(model) || !json_is_array(shards) || !json_is_array(seqs) || !json_is_array(ml))
        return mf_fail(err, MF_EFORMAT, "%s: manifest lacks model, shards, sequences or moe_layers", path);
    int rc;
    const char *arch = NULL, *rec = NULL, *prec = NULL;
    if ((rc = want_str(model, "model.", "architecture", &arch, path, err)) ||
        (rc = want_str(model, "model.", "config_digest", NULL, path, err)) ||
        (rc = want_str(model, "model.", "weights_digest", NULL, path, err)) ||
        (rc = want_int(model, "model.", "n_layers", 1, MF_MAX_LAYERS, &r->n_layers, path, err)) ||
        (rc = want_int(model, "model.", "hidden", 1, INT32_MAX, &r->hidden, path, err)) ||
        (rc = want_int(model, "model.", "vocab", 1, INT32_MAX, &r->vocab, path, err)) ||
        (rc = want_int(model, "model.", "n_experts", 0, MF_MAX_EXPERTS, &r->n_experts, path, err)) ||
        (rc = want_int(model, "model.", "top_k", 0, MF_MAX_TOP_K, &r->top_k, path, err)) ||
        (rc = want_str(json_object_get(man, "precision"), "precision.", "name", &prec, path, err)) ||
        (rc = want_str(man, "", "record", &rec, path, err)))
        return rc;
    /* the descriptive fields (numerics, device, dates, ...) are shown, never indexed by: readers take them as they
     * come, a string or nothing */
    int n_input;
    if ((rc = want_int(json_object_get(man, "input"), "input.", "n_sequences", 0, INT32_MAX, &n_input, path, err))) return rc;
    if (!json_is_boolean(json_object_get(model, "has_shared_expert")) || !json_is_boolean(json_object_get(man, "complete")))
        return mf_fail(err, MF_EFORMAT, "%s: model.has_shared_expert and complete must be true or false", path);
    mf_record record;
    if (mf_record_parse(rec, &record))
        return mf_fail(err, MF_EFORMAT, "%s: record \"%s\" is not routing, topk, logits or full", path, rec);
    snprintf(r->arch, sizeof r->arch, "%s", arch);
    snprintf(r->precision, sizeof r->precision, "%s", prec);
    snprintf(r->record, sizeof r->record, "%s", rec);
    r->has_shared = json_is_true(json_object_get(model, "has_shared_expert"));
    /* a grouped router's rule and groups (runs from before them have neither: softmax top-k, no groups) */
    json_t *router = json_object_get(man, "router");
    const char *rule = json_string_value(json_object_get(router, "rule"));
    r->has_select = rule && (!strcmp(rule, "sigmoid_bias_group_topk") || !strcmp(rule, "softmax_greedy") ||
                             !strcmp(rule, "topk_softmax"));
    r->n_group = 1;
    if (json_object_get(router, "n_group") &&
        (rc = want_int(router, "router.", "n_group", 1, MF_MAX_EXPERTS, &r->n_group, path, err)))
        return rc;
    if (r->n_experts > 0 && r->n_experts % r->n_group)
        return mf_fail(err, MF_EFORMAT, "%s: router.n_group %d does not divide the %d experts", path, r->n_group,
                       r->n_experts);
    r->complete = json_is_true(json_object_get(man, "complete"));
    /* a generating run says how far it went; its sequences say which positions it generated */
    r->max_new_tokens = 0;
    json_t *gen = json_object_get(man, "generation");
    if (gen && (rc = want_int(gen, "generation.", "max_new_tokens", 1, MF_MAX_NEW_TOKENS, &r->max_new_tokens, path, err)))
        return rc;
    const char *strategy = json_string_value(json_object_get(gen, "strategy"));
    if (gen && (!strategy || (strcmp(strategy, "greedy") && strcmp(strategy, "teacher-forced"))))
        return mf_fail(err, MF_EFORMAT, "%s: generation.strategy must be \"greedy\" or \"teacher-forced\"", path);
    r->forced = strategy && !strcmp(strategy, "teacher-forced");
    if ((rc = check_capture(r, json_object_get(man, "capture"), record, path, err))) return rc;
    /* the MoE layers: model layer indices, strictly increasing, inside the model */
    if (json_array_size(ml) > (size_t)r->n_layers)
        return mf_fail(err, MF_EFORMAT, "%s: model.moe_layers lists %zu layers of a %d-layer model", path, json_array_size(ml),
                       r->n_layers);
    r->n_moe = (int)json_array_size(ml);
    r->moe_layers = mf_xcalloc((size_t)r->n_moe + 1, sizeof(int));
    for (int i = 0; i < r->n_moe; i++) {
        json_t *v = json_array_get(ml, (size_t)i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= r->n_layers ||
            (i && json_integer_value(v) <= r->moe_layers[i - 1]))
            return mf_fail(err, MF_EFORMAT,
                           "%s: model.moe_layers[%d] must be a layer index from 0 to %d, above the one before it", path, i,
                           r->n_layers - 1);
        r->moe_layers[i] = (int)json_integer_value(v);
    }
    if (r->n_moe && (r->n_experts < 1 || r->top_k < 1 || r->top_k > r->n_experts))
        return mf_fail(err, MF_EFORMAT, "%s: a MoE model needs 0 < top_k <= n_experts (top_k %d, n_experts %d)", path, r->top_k,
                       r->n_experts);
    const size_t n_seqs = json_array_size(seqs);
    if (n_seqs > (size_t)n_input)
        return mf_fail(err, MF_EFORMAT, "%s: %zu sequences listed, but the input has %d", path, n_seqs, n_input);
    if (r->complete && n_seqs != (size_t)n_input)
        return mf_fail(err, MF_EFORMAT, "%s: marked complete with %zu of the input's %d sequences", path, n_seqs, n_input);
    return MF_OK;
}

/* The field table: each field's dtype and shape in the run's own terms: T
 * positions, L MoE layers, K chosen experts, E experts, V vocabulary, H
 * hidden, P min(V, MF_TOPK_LOGITS) top logits. The readers index by these. */
enum { NEED_ROUTING = 1, NEED_LOGITS = 2, NEED_TOPK = 4, OPT_SHARED = 8, OPT_ROUTER_IN = 16, ALWAYS = 32, NEED_SELECT = 64 };
static const struct field_shape {
    const char *field, *dims;
    mf_dtype dtype;   /* the integer fields' one dtype; MF_F64 for any float */
    int when;
} field_shapes[] = {
    {"tokens", "T", MF_I32, ALWAYS},          {"topk_ids", "LTK", MF_U16, NEED_ROUTING},
    {"topk_w", "LTK", MF_F64, NEED_ROUTING},  {"router", "LTE", MF_F64, NEED_ROUTING},
    {"shared_gate", "LT", MF_F64, OPT_SHARED}, {"router_in", "LTH", MF_F64, OPT_ROUTER_IN},
    {"select", "LTE", MF_F64, NEED_SELECT},
    {"logits", "TV", MF_F64, NEED_LOGITS},    {"topk_logits", "TP", MF_F64, NEED_TOPK},
    {"topk_tokens", "TP", MF_I32, NEED_TOPK}, {"logsumexp", "T", MF_F64, NEED_TOPK},
};
#define N_FIELDS (sizeof field_shapes / sizeof field_shapes[0])

static bool is_float(mf_dtype d) { return d == MF_F64 || d == MF_F32 || d == MF_BF16 || d == MF_F16; }

static int64_t dim_of(const mf_run *r, size_t seq, char c) {
    switch (c) {
    case 'T': return r->seqs[seq].length;
    case 'L': return r->n_moe;
    case 'K': return r->top_k;
    case 'E': return r->n_experts;
    case 'V': return r->vocab;
    case 'H': return r->hidden;
    case 'P': return r->vocab < MF_TOPK_LOGITS ? r->vocab : MF_TOPK_LOGITS;
    default: return -1;
    }
}

/* Whether the run's record level and model make field f required (1), allowed (0) or not allowed (-1). */
static int field_rule(const mf_run *r, const struct field_shape *f) {
    mf_record rec = MF_RECORD_ROUTING;
    mf_record_parse(r->record, &rec);
    /* what an imported capture lacks it may not have either: a reader takes a field's absence for the capture's */
    if ((r->lacks & MF_LACKS_GATES) && !strcmp(f->field, "topk_w")) return -1;
    if ((r->lacks & MF_LACKS_ROUTER) && !strcmp(f->field, "router")) return -1;
    switch (f->when) {
    case ALWAYS: return 1;
    case NEED_ROUTING: return r->n_moe ? 1 : -1;
    case OPT_SHARED: return r->n_moe && r->has_shared && !(r->lacks & MF_LACKS_SHARED) ? 0 : -1;
    case OPT_ROUTER_IN: return r->n_moe && rec == MF_RECORD_FULL ? 0 : -1;
    case NEED_SELECT: return r->n_moe && r->has_select && !(r->lacks & MF_LACKS_ROUTER) ? 1 : -1;
    case NEED_LOGITS: return rec == MF_RECORD_LOGITS || rec == MF_RECORD_FULL ? 1 : -1;
    case NEED_TOPK: return rec == MF_RECORD_TOPK ? 1 : -1;
    default: return -1;
    }
}

/* The tensor's dtype and shape against the field's. */
static int check_shape(const mf_run *r, size_t seq, const struct field_shape *fs, const mf_st_tensor *t, mf_error *err) {
    const int ndim = (int)strlen(fs->dims);
    bool ok = t->ndim == ndim && (fs->dtype == MF_F64 ? is_float(t->dtype) : t->dtype == fs->dtype);
    char have_s[160] = "", want_s[160] = "";
    for (int d = 0; d < ndim; d++) {
        const int64_t want = dim_of(r, seq, fs->dims[d]);
        ok = ok && d < t->ndim && t->shape[d] == want;
        snprintf(want_s + strlen(want_s), sizeof want_s - strlen(want_s), d ? ", %c=%lld" : "%c=%lld", fs->dims[d], (long long)want);
    }
    if (ok) return MF_OK;
    for (int d = 0; d < t->ndim; d++)
        snprintf(have_s + strlen(have_s), sizeof have_s - strlen(have_s), d ? ", %lld" : "%lld", (long long)t->shape[d]);
    return mf_fail(err, MF_EFORMAT, "%s, sequence %s: %s is %s [%s]; the manifest implies %s [%s]", r->dir, r->seqs[seq].id,
                   fs->field, mf_dtype_name(t->dtype), have_s, fs->dtype == MF_F64 ? "a float" : mf_dtype_name(fs->dtype), want_s);
}

/* 4. Ids against the model: expert ids index score rows and per-expert tables, token ids the vocabulary. One
 * pass for the extreme values, a second only to say where a bad one is. */
static int check_ids(const mf_run *r, size_t seq, const char *field, const mf_st_tensor *t, mf_error *err) {
    const char *id = r->seqs[seq].id;
    const size_t n = (size_t)mf_st_numel(t);
    if (t->dtype == MF_U16) {
        uint16_t worst = 0, v = 0;
        for (size_t i = 0; i < n; i++) {
            memcpy(&v, t->data + 2 * i, 2);
            worst = v > worst ? v : worst;
        }
        if (worst < r->n_experts) return MF_OK;
        size_t i = 0;
        for (;; i++) {
            memcpy(&v, t->data + 2 * i, 2);
            if (v >= r->n_experts) break;
        }
        const size_t T = (size_t)r->seqs[seq].length, K = (size_t)r->top_k;
        return mf_fail(err, MF_EFORMAT, "%s, sequence %s: topk_ids holds expert %u at layer %d, position %zu (the model has %d experts)",
                       r->dir, id, v, r->moe_layers[i / K / T], i / K % T, r->n_experts);
    }
    int32_t lo = 0, hi = 0, v = 0;
    for (size_t i = 0; i < n; i++) {
        memcpy(&v, t->data + 4 * i, 4);
        lo = v < lo ? v : lo;
        hi = v > hi ? v : hi;
    }
    if (lo >= 0 && hi < r->vocab) return MF_OK;
    size_t i = 0;
    for (;; i++) {
        memcpy(&v, t->data + 4 * i, 4);
        if (v < 0 || v >= r->vocab) break;
    }
    const size_t per = t->ndim == 2 ? (size_t)t->shape[1] : 1;
    return mf_fail(err, MF_EFORMAT, "%s, sequence %s: %s holds token %d at position %zu (the vocabulary is [0, %d))", r->dir, id,
                   field, v, i / per, r->vocab);
}

/* 3 (and 4 with ids). Sequence seq's tensors: each required one there, none that the record or the model
 * excludes, each of its shape; returns in *found how many it has. */
static int check_sequence(const mf_run *r, size_t seq, bool ids, size_t *found, mf_error *err) {
    const mf_st_file *sh = r->shards[r->seqs[seq].shard];
    char name[MF_MAX_SEQ_ID + 64];
    *found = 0;
    for (size_t f = 0; f < N_FIELDS; f++) {
        const struct field_shape *fs = &field_shapes[f];
        snprintf(name, sizeof name, "%s/%s", r->seqs[seq].id, fs->field);
        const mf_st_tensor *t = mf_st_find(sh, name);
        const int rule = field_rule(r, fs);
        if (!t) {
            if (rule == 1)
                return mf_fail(err, MF_EFORMAT, "%s, sequence %s: no %s in %s (a %s run of %s model has one)", r->dir,
                               r->seqs[seq].id, fs->field, r->shard_files[r->seqs[seq].shard], r->record,
                               r->n_moe ? "a MoE" : "a dense");
            continue;
        }
        if (rule < 0)
            return mf_fail(err, MF_EFORMAT, "%s, sequence %s: %s has a %s tensor, which a %s run of %s does not record", r->dir,
                           r->seqs[seq].id, r->shard_files[r->seqs[seq].shard], fs->field, r->record,
                           !r->n_moe ? "a dense model" : fs->when == OPT_SHARED ? "a model without a shared expert" : "this model");
        int rc = check_shape(r, seq, fs, t, err);
        if (!rc && ids && (fs->dtype == MF_U16 || fs->dtype == MF_I32)) rc = check_ids(r, seq, fs->field, t, err);
        if (rc) return rc;
        (*found)++;
    }
    return MF_OK;
}

static int cmp_seq_id(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* hash: check every shard's digest, hashing it unless given (when not NULL) has its digest; !hash: the caller
 * checks them */
static int run_open(mf_run **out, const char *dir, bool hash, const char *(*given)(void *ud, const char *file), void *ud,
                    mf_error *err) {
    *out = NULL;
    char path[4096];
    if (!mf_path_join(path, sizeof path, dir, "manifest.json")) return mf_fail(err, MF_EINVAL, "%s: path too long", dir);
    if (!mf_is_dir(dir)) return mf_fail(err, MF_EIO, "%s: not a run directory", dir);
    mf_run *r = mf_xcalloc(1, sizeof *r);
    r->dir = mf_xstrdup(dir);
    size_t len;
    json_t *man = NULL;
    char **sorted_ids = NULL;
    int rc = mf_read_file(path, &r->manifest_text, &len, err);
    if (rc) goto fail;
    if (strlen(r->manifest_text) != len) {
        rc = mf_fail(err, MF_EFORMAT, "%s: not a valid manifest: it holds a NUL byte", path);
        goto fail;
    }
    json_error_t jerr;
    /* a key given twice is a contradiction, not a choice */
    man = json_loadb(r->manifest_text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!man || !json_is_object(man)) {
        rc = mf_fail(err, MF_EFORMAT, "%s: not a valid manifest: %s", path, man ? "not an object" : jerr.text);
        goto fail;
    }
    if ((rc = check_manifest(r, man, path, err))) goto fail;
    json_t *shards = json_object_get(man, "shards"), *seqs = json_object_get(man, "sequences");
    /* 2. the shards: each once, named as the writer names them, of the size and digest the manifest records */
    r->n_shards = json_array_size(shards);
    r->shard_files = mf_xcalloc(r->n_shards + 1, sizeof(char *));
    r->shard_bytes = mf_xcalloc(r->n_shards + 1, sizeof(uint64_t));
    r->shard_digest = mf_xcalloc(r->n_shards + 1, sizeof *r->shard_digest);
    r->shards = mf_xcalloc(r->n_shards + 1, sizeof(mf_st_file *));
    for (size_t i = 0; i < r->n_shards; i++) {
        json_t *s = json_array_get(shards, i), *b = json_object_get(s, "bytes");
        const char *f = json_string_value(json_object_get(s, "file")), *d = json_string_value(json_object_get(s, "digest"));
        if (!f || !d || !is_hex32(d) || !shard_name_valid(f) || !json_is_integer(b) || json_integer_value(b) < 0) {
            rc = mf_fail(err, MF_EFORMAT,
                         "%s: shard entry %zu is malformed (it needs \"file\": \"part-NNNNN.safetensors\", \"bytes\" >= 0 "
                         "and a 32-digit \"digest\")",
                         path, i);
            goto fail;
        }
        for (size_t j = 0; j < i; j++)
            if (!strcmp(r->shard_files[j], f)) {
                rc = mf_fail(err, MF_EFORMAT, "%s: shard %s is listed twice", path, f);
                goto fail;
            }
        r->shard_files[i] = mf_xstrdup(f);
        r->shard_bytes[i] = (uint64_t)json_integer_value(b);
        memcpy(r->shard_digest[i], d, 33);
        /* verify now: a damaged run is named at once, not half-way through an analysis; the
         * mapping that was hashed is the one the tensors are read from */
        char sp[4096], have[33];
        if (!mf_path_join(sp, sizeof sp, dir, f)) {
            rc = mf_fail(err, MF_EINVAL, "%s: path too long", dir);
            goto fail;
        }
        if (mf_st_open(&r->shards[i], sp, err) != MF_OK) {
            /* unreadable as safetensors: say "damaged" if the bytes differ from the recorded ones */
            mf_error e2 = {0};
            mf_mmap m;
            if ((rc = mf_mmap_open(&m, sp, &e2))) {
                *err = e2;
                goto fail;
            }
            mf_digest_buffer(m.data, m.size, have);
            mf_mmap_close(&m);
            if (strcmp(have, d) != 0)
                rc = mf_fail(err, MF_EDIGEST, "%s: damaged shard: digest %s, the manifest records %s", sp, have, d);
            else
                rc = err->code ? err->code : MF_EFORMAT;
            goto fail;
        }
        const size_t size = r->shards[i]->map.size;
        const char *known = hash && given ? given(ud, f) : NULL;
        if (known) {
            if (strcmp(known, d) != 0) {
                rc = mf_fail(err, MF_EDIGEST, "%s: damaged shard: digest %s (%zu bytes), the manifest records %s (%llu bytes)", sp,
                             known, size, d, (unsigned long long)r->shard_bytes[i]);
                goto fail;
            }
        } else if (hash) {
            mf_digest_buffer(r->shards[i]->map.data, size, have);
            if (strcmp(have, d) != 0) {
                rc = mf_fail(err, MF_EDIGEST, "%s: damaged shard: digest %s, the manifest records %s", sp, have, d);
                goto fail;
            }
        }
        /* the bytes are the recorded ones (or not hashed here): a size that disagrees is the manifest's */
        if (size != r->shard_bytes[i]) {
            rc = mf_fail(err, MF_EFORMAT, "%s: %zu bytes, the manifest records %llu", sp, size,
                         (unsigned long long)r->shard_bytes[i]);
            goto fail;
        }
    }
    /* the sequences: ids valid and listed once, lengths those a prompt file can hold, in a listed shard */
    r->n_seqs = json_array_size(seqs);
    r->seqs = mf_xcalloc(r->n_seqs + 1, sizeof *r->seqs);
    sorted_ids = mf_xcalloc(r->n_seqs + 1, sizeof *sorted_ids);
    size_t *per_shard = mf_xcalloc(r->n_shards + 1, sizeof(size_t));   /* tensors the shard's sequences own */
    for (size_t i = 0; i < r->n_seqs && !rc; i++) {
        json_t *s = json_array_get(seqs, i), *l = json_object_get(s, "length");
        const char *id = json_string_value(json_object_get(s, "id")), *sh = json_string_value(json_object_get(s, "shard"));
        int shard = -1;
        for (size_t j = 0; sh && j < r->n_shards && shard < 0; j++)
            if (strcmp(r->shard_files[j], sh) == 0) shard = (int)j;
        if (!id || !mf_seq_id_valid(id))
            rc = mf_fail(err, MF_EFORMAT, "%s: sequence entry %zu has no valid \"id\" (1 to %d bytes, no '/', '\\' or control characters)",
                         path, i, MF_MAX_SEQ_ID);
        else if (shard < 0)
            rc = mf_fail(err, MF_EFORMAT, "%s: sequence entry %zu (%s) names no known shard", path, i, id);
        else if (!json_is_integer(l) || json_integer_value(l) < 1 || json_integer_value(l) > MF_MAX_SEQ_TOKENS)
            rc = mf_fail(err, MF_EFORMAT, "%s: sequence %s: length must be an integer from 1 to %d", path, id, MF_MAX_SEQ_TOKENS);
        if (rc) break;
        r->seqs[i].id = mf_xstrdup(id);
        r->seqs[i].length = (int)json_integer_value(l);
        r->seqs[i].shard = shard;
        /* a generated sequence keeps at least one prompt token: generation starts from one */
        json_t *g = json_object_get(s, "generated");
        if (g && (!json_is_integer(g) || json_integer_value(g) < 0 || json_integer_value(g) >= r->seqs[i].length)) {
            rc = mf_fail(err, MF_EFORMAT, "%s: sequence %s: generated must be an integer from 0 to %d (its length less one)",
                         path, id, r->seqs[i].length - 1);
            break;
        }
        r->seqs[i].generated = g ? (int)json_integer_value(g) : 0;
        if (r->seqs[i].generated > r->max_new_tokens) {
            rc = mf_fail(err, MF_EFORMAT, "%s: sequence %s: %d tokens generated, more than generation.max_new_tokens (%d)",
                         path, id, r->seqs[i].generated, r->max_new_tokens);
            break;
        }
        json_t *ch = json_object_get(s, "choices");
        if (ch) {
            char where[MF_MAX_SEQ_ID + 4300];
            snprintf(where, sizeof where, "%s: sequence %s", path, id);
            r->seqs[i].choices = mf_xcalloc(1, sizeof *r->seqs[i].choices);
            if ((rc = mf_choices_from_json(r->seqs[i].choices, ch, r->vocab, where, err))) break;
        }
        sorted_ids[i] = r->seqs[i].id;
    }
    if (!rc && r->n_seqs) {
        qsort(sorted_ids, r->n_seqs, sizeof *sorted_ids, cmp_seq_id);
        for (size_t i = 1; i < r->n_seqs && !rc; i++)
            if (!strcmp(sorted_ids[i - 1], sorted_ids[i])) rc = mf_fail(err, MF_EFORMAT, "%s: sequence %s is listed twice", path, sorted_ids[i]);
    }
    /* 3, 4: every sequence's tensors */
    for (size_t i = 0; i < r->n_seqs && !rc; i++) {
        size_t found;
        rc = check_sequence(r, i, hash, &found, err);
        per_shard[r->seqs[i].shard] += found;
    }
    /* nothing else in a shard: a tensor no sequence of it owns (another shard's sequence's, a stray name) is a
     * contradiction the readers would otherwise resolve one way or another. Each (sequence, field) name is in a
     * shard once at most (its header has no duplicate keys), so equal counts mean nothing else is there. */
    for (size_t j = 0; j < r->n_shards && !rc; j++) {
        const mf_st_file *f = r->shards[j];
        if (per_shard[j] == 0) {
            rc = mf_fail(err, MF_EFORMAT, "%s: shard %s holds no listed sequence", path, r->shard_files[j]);
            break;
        }
        for (size_t k = 0; k < f->count && f->count != per_shard[j] && !rc; k++) {
            const char *tn = f->tensors[k].name, *slash = strchr(tn, '/');
            bool owned = false;
            for (size_t i = 0; slash && i < r->n_seqs && !owned; i++) {
                const size_t il = strlen(r->seqs[i].id);
                if (r->seqs[i].shard != (int)j || il != (size_t)(slash - tn) || memcmp(tn, r->seqs[i].id, il)) continue;
                for (size_t q = 0; q < N_FIELDS && !owned; q++) owned = !strcmp(slash + 1, field_shapes[q].field);
            }
            if (!owned)
                rc = mf_fail(err, MF_EFORMAT, "%s/%s: tensor %s belongs to no sequence the manifest places in this shard", dir,
                             r->shard_files[j], tn);
        }
    }
    free(per_shard);
    if (rc) goto fail;
    r->ids_checked = hash;
    free(sorted_ids);
    json_decref(man);
    *out = r;
    return MF_OK;
fail:
    free(sorted_ids);
    json_decref(man);
    mf_run_close(r);
    return rc;
}

int mf_run_open(mf_run **out, const char *dir, mf_error *err) { return run_open(out, dir, true, NULL, NULL, err); }

int mf_run_open_given(mf_run **out, const char *dir, const char *(*given)(void *ud, const char *file), void *ud,
                      mf_error *err) {
    return run_open(out, dir, true, given, ud, err);
}

int mf_run_open_unhashed(mf_run **out, const char *dir, mf_error *err) { return run_open(out, dir, false, NULL, NULL, err); }

int mf_run_tensor(mf_run *r, size_t seq, const char *field, const mf_st_tensor **t, mf_error *err) {
    *t = NULL;
    if (seq >= r->n_seqs) return mf_fail(err, MF_EINVAL, "%s: no sequence %zu", r->dir, seq);
    char name[MF_MAX_SEQ_ID + 64];
    snprintf(name, sizeof name, "%s/%s", r->seqs[seq].id, field);
    const mf_st_tensor *found = mf_st_find(r->shards[r->seqs[seq].shard], name);
    if (!found) return MF_OK;
    /* mf_run_open checked every tensor; a run opened unhashed has its ids checked as they are read */
    int rc = MF_OK;
    for (size_t f = 0; f < N_FIELDS && !rc; f++)
        if (!strcmp(field_shapes[f].field, field)) {
            rc = check_shape(r, seq, &field_shapes[f], found, err);
            if (!rc && !r->ids_checked && (field_shapes[f].dtype == MF_U16 || field_shapes[f].dtype == MF_I32))
                rc = check_ids(r, seq, field, found, err);
        }
    if (rc == MF_OK) *t = found;
    return rc;
}
