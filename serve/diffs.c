/* Diffs on request: POST /api/diffs {"reference": NAME, "targets": [NAME...],
 * "bootstrap": N} computes diff.json, report.html and every heatmap of every
 * target in the thread pool, into ROOT/.tmp, then renames the directory to
 * ROOT/diffs/<id>. The id is a digest of the runs' manifests and the options,
 * so a repeated request is answered from the cache; requests for a diff being
 * computed wait for it.
 *
 * A job first looks for its meta.json in the pool (a cached diff is answered
 * at once, whatever else is computing); one that is not there joins a queue
 * on the loop, and one diff is computed at a time. The queue is the loop's,
 * not a lock's: a job waiting for its turn holds no pool thread, so uploads
 * and file reads are never stuck behind diffs. A queued job whose clients
 * have all gone (closed, or only closed their side: http.c) is dropped
 * before it starts. */
#include "serve_int.h"
#include "mf_diff.h"
#include "mf_viz.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MAX_TARGETS 16
#define MAX_BOOTSTRAP_DRAWS 20000000u   /* resamples x sequences of one diff (80 MB of plan) */

static const char *kinds[] = {"layer-expert", "layer-position", "margin", "flips-kl"};
#define N_KINDS 4

struct diff_job {
    server *s;
    char id[33];
    char ref[MF_SERVE_NAME_MAX + 1];
    char ref_dir[4200];
    char targets[MAX_TARGETS][MF_SERVE_NAME_MAX + 1];
    char target_dirs[MAX_TARGETS][4200];
    int nt;
    int bootstrap;
    size_t ref_sequences;     /* the reference's, as stored */
    conn *waiters;
    bool queued;              /* not in the cache: waits for its turn to be computed */
    /* result */
    int status;               /* 200, or an error status */
    char msg[1200];
    char *meta;               /* meta.json text */
    uv_work_t work;
    diff_job *next;
};

/* ---- the pool ---------------------------------------------------------------- */

static int compute(diff_job *j, const char *dir, mf_error *err) {
    /* the bootstrap's plan holds resamples x sequences indices, and every metric is pooled over each draw */
    if ((uint64_t)j->bootstrap * j->ref_sequences > MAX_BOOTSTRAP_DRAWS)
        return mf_fail(err, MF_EINVAL, "%s has %zu sequences: %d bootstrap resamples of them are more than this server computes "
                       "(resamples x sequences at most %u); ask for fewer", j->ref, j->ref_sequences, j->bootstrap, MAX_BOOTSTRAP_DRAWS);
    const char *dirs[MAX_TARGETS], *names[MAX_TARGETS];
    for (int i = 0; i < j->nt; i++) {
        dirs[i] = j->target_dirs[i];
        names[i] = j->targets[i];
    }
    char path[4400], out[4400];
    snprintf(path, sizeof path, "%s/diff.json", dir);
    /* The diff `moeflip diff` makes of the same runs with the same options, the runs named by their names (not by
     * the server's directories). A pushed manifest names directories of the machine it came from: no file is read
     * from them here (token texts), where `moeflip diff` reads the reference's tokenizer.json. */
    const mf_diff_request q = {
        .reference = j->ref_dir,
        .targets = dirs,
        .n_targets = j->nt,
        .reference_label = j->ref,
        .target_labels = names,
        .floor = MF_DIFF_FLOOR_REPEAT,
        .bootstrap = j->bootstrap,
        .seed = MF_DIFF_SEED,
        .model_tokenizer = false,
        .json_path = path,
    };
    int rc = mf_diff_runs(&q, err);
    char *text = NULL;
    size_t text_len;
    if (!rc) rc = mf_read_file(path, &text, &text_len, err);   /* for the heatmaps */
    snprintf(out, sizeof out, "%s/report.html", dir);
    if (!rc) rc = mf_report_write(path, out, err);
    json_t *files = json_object(), *heat = json_array();
    char base[128];
    snprintf(base, sizeof base, "/api/diffs/%s/", j->id);
    for (int t = 0; t < j->nt && !rc; t++) {
        json_t *row = json_object();
        for (int k = 0; k < N_KINDS; k++) {
            char fn[64];
            snprintf(fn, sizeof fn, "t%d-%s.png", t, kinds[k]);
            snprintf(out, sizeof out, "%s/%s", dir, fn);
            mf_error e2 = {0};
            mf_heat_kind hk;
            mf_heat_kind_parse(kinds[k], &hk);
            if (mf_heatmap_file(text, t, hk, NULL, out, &e2) == MF_OK) {
                char url[256];
                snprintf(url, sizeof url, "%sheatmaps/%s", base, fn);
                json_object_set_new(row, kinds[k], json_string(url));
            }
        }
        json_array_append_new(heat, json_pack("{sssO}", "target", j->targets[t], "figures", row));
        json_decref(row);
    }
    free(text);
    if (rc) {
        json_decref(files);
        json_decref(heat);
        return rc;
    }
    char when[32];
    time_t now = time(NULL);
    struct tm tmv;
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&now, &tmv));
    json_t *tnames = json_array();
    for (int i = 0; i < j->nt; i++) json_array_append_new(tnames, json_string(j->targets[i]));
    char u1[256], u2[256];
    snprintf(u1, sizeof u1, "%sdiff.json", base);
    snprintf(u2, sizeof u2, "%sreport.html", base);
    json_object_set_new(files, "diff", json_string(u1));
    json_object_set_new(files, "report", json_string(u2));
    json_object_set_new(files, "heatmaps", heat);
    json_t *meta = json_pack("{sssssosiss so}", "id", j->id, "reference", j->ref, "targets", tnames, "bootstrap", j->bootstrap,
                             "created", when, "files", files);
    char *mt = json_dumps(meta, JSON_COMPACT);
    json_decref(meta);
    snprintf(path, sizeof path, "%s/meta.json", dir);
    rc = mf_write_file_atomic(path, mt, strlen(mt), err);
    free(mt);
    return rc;
}

static void diff_dirs(const diff_job *j, char *final, size_t fl, char *meta, size_t ml) {
    snprintf(final, fl, "%s/diffs/%s", j->s->root, j->id);
    snprintf(meta, ml, "%s/diffs/%s/meta.json", j->s->root, j->id);
}

/* pool: the diff made before, if it was */
static void lookup_cb(uv_work_t *w) {
    diff_job *j = w->data;
    char final[4300], mp[4400];
    diff_dirs(j, final, sizeof final, mp, sizeof mp);
    mf_error err = {0};
    size_t len;
    if (mf_read_file(mp, &j->meta, &len, &err) == MF_OK) j->status = 200;
}

/* pool: one diff at a time (start_next) */
static void compute_cb(uv_work_t *w) {
    diff_job *j = w->data;
    server *s = j->s;
    char final[4300], mp[4400], tmp[4300];
    diff_dirs(j, final, sizeof final, mp, sizeof mp);
    mf_error err = {0};
    size_t len;
    snprintf(tmp, sizeof tmp, "%s/.tmp/diff-%s", s->root, j->id);
    if (mf_path_exists(tmp)) store_remove_tree(tmp);
    if (mkdir(tmp, 0755) != 0) {
        j->status = 500;
        snprintf(j->msg, sizeof j->msg, "cannot make a directory for the diff: %s", strerror(errno));
    } else if (compute(j, tmp, &err) != MF_OK) {
        j->status = err.code == MF_EMISMATCH || err.code == MF_EFORMAT || err.code == MF_EINVAL ? 422 : 500;
        snprintf(j->msg, sizeof j->msg, "diff of %s failed: %s", j->ref, err.msg);
        store_remove_tree(tmp);
    } else if (store_sync_dir(tmp) != 0 || rename(tmp, final) != 0) {   /* a cached diff is whole, also after a power cut */
        j->status = 500;
        snprintf(j->msg, sizeof j->msg, "cannot store the diff: %s", strerror(errno));
        store_remove_tree(tmp);
    } else {
        char diffs[4300];
        snprintf(diffs, sizeof diffs, "%s/diffs", s->root);
        store_fsync_dir(diffs);
        if (mf_read_file(mp, &j->meta, &len, &err) == MF_OK) {
            j->status = 200;
        } else {
            j->status = 500;
            snprintf(j->msg, sizeof j->msg, "%s", err.msg);
        }
    }
    /* the messages name runs, not directories */
    char *p;
    while ((p = strstr(j->msg, s->root))) memmove(p, p + strlen(s->root), strlen(p + strlen(s->root)) + 1);
}

static void unlink_job(server *s, diff_job *j) {
    for (diff_job **pp = &s->jobs; *pp; pp = &(*pp)->next)
        if (*pp == j) {
            *pp = j->next;
            break;
        }
}

/* The job is done: its clients get its answer. */
static void finish(diff_job *j) {
    unlink_job(j->s, j);
    while (j->waiters) {
        conn *c = j->waiters;
        j->waiters = c->wait_next;
        c->waiting = NULL;
        c->wait_next = NULL;
        if (j->status == 200) conn_respond(c, 200, "application/json", j->meta, strlen(j->meta));
        else conn_error(c, j->status, "%s", j->msg);
        conn_unref(c);
    }
    free(j->meta);
    free(j);
}

static void compute_after(uv_work_t *w, int status);

/* Starts the oldest queued diff unless one is being computed; queued jobs nobody waits for any more are dropped. */
static void start_next(server *s) {
    if (s->diff_computing) return;
    for (;;) {
        diff_job *oldest = NULL;
        for (diff_job *j = s->jobs; j; j = j->next)   /* new jobs go in front: the oldest is the last */
            if (j->queued) oldest = j;
        if (!oldest) return;
        oldest->queued = false;
        if (!oldest->waiters) {
            finish(oldest);
            continue;
        }
        s->diff_computing = true;
        if (uv_queue_work(s->loop, &oldest->work, compute_cb, compute_after) != 0) abort();
        return;
    }
}

static void compute_after(uv_work_t *w, int status) {
    (void)status;
    diff_job *j = w->data;
    server *s = j->s;
    s->diff_computing = false;
    finish(j);
    start_next(s);
}

static void lookup_after(uv_work_t *w, int status) {
    (void)status;
    diff_job *j = w->data;
    if (j->status == 200) {
        finish(j);
        return;
    }
    /* not cached: it joins the queue, without the clients that closed their side while it was looked up (http.c
     * drops those that close while it is queued) */
    j->queued = true;
    for (conn *c = j->waiters, *next; c; c = next) {
        next = c->wait_next;
        if (c->eof && c->writes == 0) conn_close(c);   /* takes it off the job (diffs_conn_gone) */
    }
    start_next(j->s);
}

bool diffs_waiting_to_start(const conn *c) { return c->waiting && c->waiting->queued; }

void diffs_free(server *s) {
    while (s->jobs) finish(s->jobs);   /* queued jobs left at the end: nobody waits for them */
}

void diffs_conn_gone(conn *c) {
    diff_job *j = c->waiting;
    if (!j) return;
    for (conn **pp = &j->waiters; *pp; pp = &(*pp)->wait_next)
        if (*pp == c) {
            *pp = c->wait_next;
            break;
        }
    c->waiting = NULL;
    c->wait_next = NULL;
    conn_unref(c);
}

/* ---- requests ------------------------------------------------------------------ */

void diffs_post(conn *c, const char *body, size_t len) {
    server *s = c->srv;
    json_error_t jerr;
    json_t *req = json_loadb(body, len, 0, &jerr);
    if (!json_is_object(req)) {
        json_decref(req);
        conn_error(c, 400, "the body must be a JSON object {\"reference\": NAME, \"targets\": [NAME, ...]}");
        return;
    }
    diff_job *j = mf_xcalloc(1, sizeof *j);
    j->s = s;
    j->bootstrap = s->o.diff_bootstrap;
    const char *ref = json_string_value(json_object_get(req, "reference"));
    json_t *targets = json_object_get(req, "targets"), *boot = json_object_get(req, "bootstrap");
    int status = 0;
    char msg[300] = "";
    if (!ref || !mf_serve_name_valid(ref, strlen(ref))) status = 400, snprintf(msg, sizeof msg, "\"reference\" must be a run name");
    else if (!json_is_array(targets) || json_array_size(targets) < 1 || json_array_size(targets) > MAX_TARGETS)
        status = 400, snprintf(msg, sizeof msg, "\"targets\" must be a list of 1 to %d run names", MAX_TARGETS);
    else if (boot && (!json_is_integer(boot) || json_integer_value(boot) < 0 || json_integer_value(boot) > 10000))
        status = 400, snprintf(msg, sizeof msg, "\"bootstrap\" must be an integer from 0 to 10000");
    if (!status) {
        if (boot) j->bootstrap = (int)json_integer_value(boot);
        j->nt = (int)json_array_size(targets);
        run_entry *e = store_find(s, ref);
        if (!e) status = 404, snprintf(msg, sizeof msg, "no run named %s", ref);
        char key[8192];
        int kl = 0;
        if (e) {
            snprintf(j->ref, sizeof j->ref, "%s", ref);
            store_dir_of(s, ref, j->ref_dir, sizeof j->ref_dir);
            j->ref_sequences = (size_t)json_integer_value(json_object_get(e->summary, "sequences"));
            /* version 2: served diffs have a noise floor; a diff cached without one is made again */
            kl = snprintf(key, sizeof key, "moeflip-diff 2|%d|%s|%s", j->bootstrap, ref,
                          json_string_value(json_object_get(e->summary, "digest")));
        }
        for (int i = 0; i < j->nt && !status; i++) {
            const char *t = json_string_value(json_array_get(targets, (size_t)i));
            run_entry *te = t && mf_serve_name_valid(t, strlen(t)) ? store_find(s, t) : NULL;
            if (!t || !mf_serve_name_valid(t, strlen(t))) status = 400, snprintf(msg, sizeof msg, "\"targets\" must hold run names");
            else if (!te) status = 404, snprintf(msg, sizeof msg, "no run named %s", t);
            else {
                snprintf(j->targets[i], sizeof j->targets[i], "%s", t);
                store_dir_of(s, t, j->target_dirs[i], sizeof j->target_dirs[i]);
                kl += snprintf(key + kl, sizeof key - (size_t)kl, "|%s|%s", t, json_string_value(json_object_get(te->summary, "digest")));
            }
        }
        if (!status) mf_digest_buffer(key, (size_t)kl, j->id);
    }
    json_decref(req);
    if (status) {
        free(j);
        conn_error(c, status, "%s", msg);
        return;
    }
    /* join a diff being computed */
    diff_job *same = NULL;
    for (diff_job *o = s->jobs; o && !same; o = o->next)
        if (!strcmp(o->id, j->id)) same = o;
    if (same) {
        free(j);
        j = same;
    } else {
        j->next = s->jobs;
        s->jobs = j;
        j->work.data = j;
        if (uv_queue_work(s->loop, &j->work, lookup_cb, lookup_after) != 0) abort();
    }
    c->waiting = j;
    c->wait_next = j->waiters;
    j->waiters = c;
    conn_ref(c);
}

/* ---- reading a diff's files ------------------------------------------------------- */

typedef struct read_job {
    uv_work_t work;
    conn *c;
    char path[4400];
    char *data;
    size_t len;
    int rc;
    const char *ctype;
} read_job;

static void read_work(uv_work_t *w) {
    read_job *r = w->data;
    mf_error err = {0};
    r->rc = mf_read_file(r->path, &r->data, &r->len, &err);
}

static void read_after(uv_work_t *w, int status) {
    (void)status;
    read_job *r = w->data;
    if (conn_alive(r->c)) {
        if (r->rc == MF_OK) conn_respond(r->c, 200, r->ctype, r->data, r->len);
        else conn_error(r->c, 404, "no such diff or file");
    }
    conn_unref(r->c);
    free(r->data);
    free(r);
}

static bool is_hex32(const char *s, size_t n) {
    if (n != 32) return false;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return false;
    return true;
}

/* rest: "<id>", "<id>/diff.json", "<id>/report.html", "<id>/heatmaps/t<N>-<kind>.png" */
void diffs_get(conn *c, const char *rest) {
    const char *slash = strchr(rest, '/');
    size_t idl = slash ? (size_t)(slash - rest) : strlen(rest);
    if (!is_hex32(rest, idl)) {
        conn_error(c, 404, "no such diff");
        return;
    }
    const char *file = slash ? slash + 1 : "meta.json", *ctype = NULL;
    if (!strcmp(file, "meta.json") || !strcmp(file, "diff.json")) ctype = "application/json";
    else if (!strcmp(file, "report.html")) ctype = "text/html; charset=utf-8";
    else if (!strncmp(file, "heatmaps/t", 10)) {
        const char *p = file + 10;
        int digits = 0;
        while (p[digits] >= '0' && p[digits] <= '9') digits++;
        if (digits >= 1 && digits <= 2 && p[digits] == '-') {
            for (int k = 0; k < N_KINDS && !ctype; k++) {
                size_t kl = strlen(kinds[k]);
                if (!strncmp(p + digits + 1, kinds[k], kl) && !strcmp(p + digits + 1 + kl, ".png")) {
                    ctype = "image/png";
                    file += 9;   /* the file itself sits in the diff's directory */
                }
            }
        }
    }
    if (!ctype) {
        conn_error(c, 404, "no such file of a diff");
        return;
    }
    read_job *r = mf_xcalloc(1, sizeof *r);
    r->c = c;
    r->ctype = ctype;
    snprintf(r->path, sizeof r->path, "%s/diffs/%.32s/%s", c->srv->root, rest, file);
    r->work.data = r;
    conn_ref(c);
    if (uv_queue_work(c->srv->loop, &r->work, read_work, read_after) != 0) abort();
}
