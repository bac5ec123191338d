/* libFuzzer target: one input is a run directory: its manifest and its shards,
 * separated by lines "--shard--" (piece 0: manifest.json; piece i: file
 * part-0000<i-1>.safetensors). In the manifest, "@D<i>@" and "@B<i>@" stand
 * for shard i's digest and size, recomputed for every input, so that mutated
 * shards pass the digest check and reach the checks behind it, as a run whose
 * writer lies does.
 *
 * The run is opened (mf_run_open, and unhashed as push does); a run that opens
 * is read by every reader: export in both formats, every tensor of every
 * sequence, and a diff of the run against itself with diff.json, positions and
 * slots written. Any of them may refuse (one message); none may crash, read
 * outside a tensor, or leak. */
#include "fuzz_util.h"
#include "mf_diff.h"
#include "mf_rundir.h"

#define SEP "\n--shard--\n"
#define MAX_SHARDS 4

/* text with @D<i>@ and @B<i>@ replaced (malloc'ed) */
static char *fill(const char *text, size_t n, char digests[][33], const size_t *sizes, int shards, size_t *out_n) {
    size_t cap = n + 64 * (size_t)MAX_SHARDS * 8 + 1, o = 0;
    char *out = mf_xmalloc(cap);
    for (size_t i = 0; i < n;) {
        if (text[i] == '@' && i + 3 < n && (text[i + 1] == 'D' || text[i + 1] == 'B') && text[i + 2] >= '0' &&
            text[i + 2] < '0' + shards && text[i + 3] == '@') {
            const int k = text[i + 2] - '0';
            char v[40];
            if (text[i + 1] == 'D') snprintf(v, sizeof v, "%s", digests[k]);
            else snprintf(v, sizeof v, "%zu", sizes[k]);
            const size_t vl = strlen(v);
            if (o + vl + 1 > cap) out = mf_xrealloc(out, cap = 2 * cap + vl);
            memcpy(out + o, v, vl);
            o += vl;
            i += 4;
            continue;
        }
        if (o + 2 > cap) out = mf_xrealloc(out, cap *= 2);
        out[o++] = text[i++];
    }
    out[o] = 0;
    *out_n = o;
    return out;
}

static void read_everything(mf_run *r) {
    static const char *fields[] = {"tokens", "topk_ids", "topk_w", "router", "shared_gate", "router_in",
                                   "logits", "topk_logits", "topk_tokens", "logsumexp", "nonsense"};
    volatile double sink = 0;
    for (size_t s = 0; s < r->n_seqs; s++)
        for (size_t f = 0; f < sizeof fields / sizeof fields[0]; f++) {
            const mf_st_tensor *t;
            mf_error e = {0};
            const int rc = mf_run_tensor(r, s, fields[f], &t, &e);
            fuzz_check_refusal(rc, &e);
            if (rc || !t) continue;
            const size_t n = (size_t)mf_st_numel(t);
            if (n) sink += t->data[0] + t->data[t->nbytes - 1];
        }
    (void)sink;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *dir = fuzz_scratch();
    char run[256], path[320];
    snprintf(run, sizeof run, "%s/run", dir);
    fuzz_remove_flat(run);
    if (mkdir(run, 0755) != 0) abort();
    /* split into the manifest and shards */
    const char *pieces[MAX_SHARDS + 1];
    size_t lens[MAX_SHARDS + 1];
    int np = 0;
    const char *p = (const char *)data, *end = p + size;
    while (np < MAX_SHARDS + 1) {
        const char *sep = np < MAX_SHARDS ? memmem(p, (size_t)(end - p), SEP, strlen(SEP)) : NULL;
        pieces[np] = p;
        lens[np] = sep ? (size_t)(sep - p) : (size_t)(end - p);
        np++;
        if (!sep) break;
        p = sep + strlen(SEP);
    }
    const int shards = np - 1;
    char digests[MAX_SHARDS][33];
    size_t sizes[MAX_SHARDS];
    for (int i = 0; i < shards; i++) {
        snprintf(path, sizeof path, "%s/part-%05d.safetensors", run, i);
        fuzz_write(path, pieces[i + 1], lens[i + 1]);
        mf_digest_buffer(pieces[i + 1], lens[i + 1], digests[i]);
        sizes[i] = lens[i + 1];
    }
    size_t mn;
    char *man = fill(pieces[0], lens[0], digests, sizes, shards, &mn);
    snprintf(path, sizeof path, "%s/manifest.json", run);
    fuzz_write(path, man, mn);
    free(man);

    mf_run *r = NULL;
    mf_error e = {0};
    int rc = mf_run_open_unhashed(&r, run, &e);
    fuzz_check_refusal(rc, &e);
    if (!rc) {
        read_everything(r);
        mf_run_close(r);
    }
    e = (mf_error){0};
    rc = mf_run_open(&r, run, &e);
    fuzz_check_refusal(rc, &e);
    if (rc) return 0;
    read_everything(r);
    FILE *null = fopen("/dev/null", "w");
    if (!null) abort();
    for (int fmt = 0; fmt < 2; fmt++) {
        e = (mf_error){0};
        fuzz_check_refusal(mf_run_export(r, fmt ? MF_EXPORT_CSV : MF_EXPORT_JSONL, null, &e), &e);
    }
    fclose(null);
    /* the run against itself */
    mf_diff_acc a;
    mf_diff_acc_init(&a, r);
    a.keep_slots = true;
    e = (mf_error){0};
    rc = mf_diff_acc_add_runs(&a, r, r, &e);
    fuzz_check_refusal(rc, &e);
    if (!rc) {
        mf_diff_acc *accs[1] = {&a};
        mf_run *ts[1] = {r};
        mf_diff_opts o = {3, 1, false};
        char out[320];
        snprintf(out, sizeof out, "%s/diff.json", dir);
        e = (mf_error){0};
        fuzz_check_refusal(mf_diff_write_json(out, r, ts, accs, 1, NULL, NULL, &o, &e), &e);
        snprintf(out, sizeof out, "%s/positions.csv", dir);
        fuzz_check_refusal(mf_diff_write_positions(out, accs, 1, &e), &e);
        snprintf(out, sizeof out, "%s/slots.csv", dir);
        fuzz_check_refusal(mf_diff_write_slots(out, accs, 1, &e), &e);
    }
    mf_diff_acc_free(&a);
    mf_run_close(r);
    return 0;
}
