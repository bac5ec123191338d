/* A diff shared by the ranks of a job (mpirun moeflip diff, the sweep under mpirun): each rank accumulates a block
 * of the reference's sequences, then every rank gets every rank's accumulators and merges them in rank order.
 *
 * What travels is the whole state, not reduced totals: the bootstrap resamples whole sequences, so every case's
 * sums are needed (and the positions, flips and slots that diff.json, the attribution and the CSVs list). The
 * blocks are contiguous and merged in rank order, so the merged accumulator holds its cases, positions, flips and
 * slots in the order one process adds them, and the per-layer and per-expert counts are integer sums: diff.json
 * comes out byte for byte as one process writes it.
 *
 * The bytes are the structures as this build lays them out (every rank runs the same moeflip): the header names
 * the sizes, and a rank whose state does not fit them is refused, not read. */
#include "diff_int.h"
#include "mf_dist.h"

#include <stdlib.h>
#include <string.h>

#define STATE_MAGIC "mfdacc1"

typedef struct state_head {
    char magic[8];
    uint32_t case_size, pos_size, flip_size, slot_size;
    int32_t L, E, K, V;
    uint64_t n_cases, n_pos, n_flips, n_slots;
    uint8_t keep_slots, generated;
    uint32_t ref_lacks, tgt_lacks;
    char ref_engine[16], tgt_engine[16];
} state_head;

void diff_share_block(const mf_run *ref, int rank, int size, size_t *first, size_t *count) {
    /* by positions, which the work goes with: rank r starts at the first sequence that ends past r/size of them */
    uint64_t total = 0;
    for (size_t i = 0; i < ref->n_seqs; i++) total += (uint64_t)ref->seqs[i].length;
    size_t bound[2];
    for (int e = 0; e < 2; e++) {
        const uint64_t target = total * (uint64_t)(rank + e) / (uint64_t)size;
        uint64_t cum = 0;
        size_t i = 0;
        while (i < ref->n_seqs && (cum < target || (e == 1 && rank + 1 == size))) cum += (uint64_t)ref->seqs[i++].length;
        bound[e] = rank + e == 0 ? 0 : i;
    }
    *first = bound[0];
    *count = bound[1] - bound[0];
}

static void put(mf_buf *b, const void *p, size_t n) { mf_buf_put(b, p, n); }

static void put_i64s(mf_buf *b, const int64_t *v, size_t n) { put(b, v, n * sizeof *v); }

void diff_acc_pack(const mf_diff_acc *a, mf_buf *b) {
    state_head h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, STATE_MAGIC, sizeof STATE_MAGIC);
    h.case_size = sizeof(mf_case);
    h.pos_size = sizeof(mf_position);
    h.flip_size = sizeof(mf_flip);
    h.slot_size = sizeof(mf_slot);
    h.L = a->L;
    h.E = a->E;
    h.K = a->K;
    h.V = a->V;
    h.n_cases = a->n_cases;
    h.n_pos = a->n_pos;
    h.n_flips = a->n_flips;
    h.n_slots = a->n_slots;
    h.keep_slots = a->keep_slots;
    h.generated = a->generated;
    h.ref_lacks = a->ref_lacks;
    h.tgt_lacks = a->tgt_lacks;
    memcpy(h.ref_engine, a->ref_engine, sizeof h.ref_engine);
    memcpy(h.tgt_engine, a->tgt_engine, sizeof h.tgt_engine);
    put(b, &h, sizeof h);
    const size_t L = (size_t)a->L, E = (size_t)a->E;
    put_i64s(b, a->flips, L);
    put_i64s(b, a->primary, L);
    put_i64s(b, a->inherited, L);
    put_i64s(b, a->ties, L);
    put_i64s(b, a->margin_slots, L * MF_MARGIN_BINS);
    put_i64s(b, a->margin_flips, L * MF_MARGIN_BINS);
    put_i64s(b, a->dropped, L * E);
    put_i64s(b, a->added, L * E);
    put_i64s(b, a->transitions, E * E);
    for (size_t i = 0; i < a->n_cases; i++) {
        mf_case c = a->cases[i];
        const uint32_t id_len = (uint32_t)strlen(c.id);
        c.id = NULL;   /* the pointers are the receiver's to make */
        c.layer_slots = c.layer_set_equal = c.layer_ord_equal = NULL;
        put(b, &c, sizeof c);
        put(b, &id_len, sizeof id_len);
        put(b, a->cases[i].id, id_len);
        put_i64s(b, a->cases[i].layer_slots, L);
        put_i64s(b, a->cases[i].layer_set_equal, L);
        put_i64s(b, a->cases[i].layer_ord_equal, L);
    }
    for (size_t i = 0; i < a->n_pos; i++) {
        mf_position p = a->pos[i];
        p.seq = NULL;
        put(b, &p, sizeof p);
    }
    for (size_t i = 0; i < a->n_flips; i++) {
        mf_flip f = a->flip_list[i];
        f.seq = NULL;
        put(b, &f, sizeof f);
    }
    /* slots come in the order of their cases: each is given its case's index */
    size_t c = 0;
    for (size_t i = 0; i < a->n_slots; i++) {
        mf_slot sl = a->slots[i];
        while (c < a->n_cases && a->cases[c].id != sl.seq) c++;
        const uint64_t ci = c;
        sl.seq = NULL;
        put(b, &ci, sizeof ci);
        put(b, &sl, sizeof sl);
    }
}

/* A reader of a rank's state that cannot run past its end. */
typedef struct reader {
    const uint8_t *p;
    size_t n, at;
    bool bad;
} reader;

static void take(reader *r, void *out, size_t n) {
    if (r->bad || n > r->n - r->at) {
        r->bad = true;
        memset(out, 0, n);
        return;
    }
    memcpy(out, r->p + r->at, n);
    r->at += n;
}

int diff_acc_unpack(mf_diff_acc *a, const mf_run *ref, const uint8_t *data, size_t n, const char *from, mf_error *err) {
    mf_diff_acc_init(a, ref);
    reader r = {data, n, 0, false};
    state_head h;
    take(&r, &h, sizeof h);
    h.magic[7] = 0;
    if (r.bad || strcmp(h.magic, STATE_MAGIC) || h.case_size != sizeof(mf_case) || h.pos_size != sizeof(mf_position) ||
        h.flip_size != sizeof(mf_flip) || h.slot_size != sizeof(mf_slot))
        return mf_fail(err, MF_EFORMAT, "%s's diff state is not this build's (the ranks must run the same moeflip)", from);
    if (h.L != a->L || h.E != a->E || h.K != a->K || h.V != a->V)
        return mf_fail(err, MF_EMISMATCH, "%s's diff state is of another model (L %d, E %d, k %d, V %d; here %d, %d, %d, %d)",
                       from, h.L, h.E, h.K, h.V, a->L, a->E, a->K, a->V);
    const size_t L = (size_t)a->L, E = (size_t)a->E;
    /* counts past what the bytes could hold are refused before anything is allocated for them */
    if (h.n_cases > n / sizeof(mf_case) || h.n_pos > n / sizeof(mf_position) || h.n_flips > n / sizeof(mf_flip) ||
        h.n_slots > n / sizeof(mf_slot))
        return mf_fail(err, MF_EFORMAT, "%s's diff state is cut short", from);
    a->keep_slots = h.keep_slots;
    a->generated = h.generated;
    a->ref_lacks = h.ref_lacks;
    a->tgt_lacks = h.tgt_lacks;
    memcpy(a->ref_engine, h.ref_engine, sizeof a->ref_engine);
    memcpy(a->tgt_engine, h.tgt_engine, sizeof a->tgt_engine);
    a->ref_engine[sizeof a->ref_engine - 1] = a->tgt_engine[sizeof a->tgt_engine - 1] = 0;
    take(&r, a->flips, L * sizeof(int64_t));
    take(&r, a->primary, L * sizeof(int64_t));
    take(&r, a->inherited, L * sizeof(int64_t));
    take(&r, a->ties, L * sizeof(int64_t));
    take(&r, a->margin_slots, L * MF_MARGIN_BINS * sizeof(int64_t));
    take(&r, a->margin_flips, L * MF_MARGIN_BINS * sizeof(int64_t));
    take(&r, a->dropped, L * E * sizeof(int64_t));
    take(&r, a->added, L * E * sizeof(int64_t));
    take(&r, a->transitions, E * E * sizeof(int64_t));
    a->cases = mf_xcalloc(h.n_cases + 1, sizeof *a->cases);
    a->cap_cases = h.n_cases + 1;
    for (size_t i = 0; i < h.n_cases && !r.bad; i++) {
        mf_case *c = &a->cases[i];
        uint32_t id_len = 0;
        take(&r, c, sizeof *c);
        take(&r, &id_len, sizeof id_len);
        c->id = NULL;
        c->layer_slots = c->layer_set_equal = c->layer_ord_equal = NULL;
        a->n_cases = i + 1;   /* what the free below must free, from here on */
        if (r.bad || id_len > MF_MAX_SEQ_ID || id_len > r.n - r.at) {
            r.bad = true;
            break;
        }
        c->id = mf_xcalloc(id_len + 1, 1);
        take(&r, c->id, id_len);
        c->layer_slots = mf_xcalloc(L + 1, sizeof(int64_t));
        c->layer_set_equal = mf_xcalloc(L + 1, sizeof(int64_t));
        c->layer_ord_equal = mf_xcalloc(L + 1, sizeof(int64_t));
        take(&r, c->layer_slots, L * sizeof(int64_t));
        take(&r, c->layer_set_equal, L * sizeof(int64_t));
        take(&r, c->layer_ord_equal, L * sizeof(int64_t));
        if (c->pos_count < 0 || c->flip_count < 0 || c->pos_first > h.n_pos || (size_t)c->pos_count > h.n_pos - c->pos_first ||
            c->flip_first > h.n_flips || (size_t)c->flip_count > h.n_flips - c->flip_first)
            r.bad = true;
    }
    a->pos = mf_xcalloc(h.n_pos + 1, sizeof *a->pos);
    a->cap_pos = h.n_pos + 1;
    a->n_pos = h.n_pos;
    take(&r, a->pos, h.n_pos * sizeof *a->pos);
    a->flip_list = mf_xcalloc(h.n_flips + 1, sizeof *a->flip_list);
    a->cap_flips = h.n_flips + 1;
    a->n_flips = h.n_flips;
    take(&r, a->flip_list, h.n_flips * sizeof *a->flip_list);
    a->slots = mf_xcalloc(h.n_slots + 1, sizeof *a->slots);
    a->cap_slots = h.n_slots + 1;
    for (size_t i = 0; i < h.n_slots && !r.bad; i++) {
        uint64_t ci = 0;
        take(&r, &ci, sizeof ci);
        take(&r, &a->slots[i], sizeof a->slots[i]);
        a->slots[i].seq = NULL;
        a->n_slots = i + 1;
        if (ci >= a->n_cases) r.bad = true;
        else a->slots[i].seq = a->cases[ci].id;
    }
    if (r.bad || r.at != r.n) return mf_fail(err, MF_EFORMAT, "%s's diff state is malformed", from);
    /* each position and flip names its case, by the case's runs of them (the sender's pointers mean nothing here) */
    for (size_t i = 0; i < a->n_pos; i++) a->pos[i].seq = NULL;
    for (size_t i = 0; i < a->n_flips; i++) a->flip_list[i].seq = NULL;
    for (size_t i = 0; i < a->n_cases; i++) {
        const mf_case *c = &a->cases[i];
        for (int j = 0; j < c->pos_count; j++) a->pos[c->pos_first + (size_t)j].seq = c->id;
        for (int j = 0; j < c->flip_count; j++) a->flip_list[c->flip_first + (size_t)j].seq = c->id;
    }
    for (size_t i = 0; i < a->n_pos; i++)
        if (!a->pos[i].seq) return mf_fail(err, MF_EFORMAT, "%s's diff state has a position of no sequence", from);
    for (size_t i = 0; i < a->n_flips; i++)
        if (!a->flip_list[i].seq) return mf_fail(err, MF_EFORMAT, "%s's diff state has a flip of no sequence", from);
    return MF_OK;
}

/* What a rank sends: its outcome, then its accumulators. */
typedef struct outcome {
    int32_t rc, stage;   /* stage: where it failed (-1: opening or checking the runs; i: accumulating target i) */
    char msg[sizeof(((mf_error *)0)->msg)];
    uint32_t n_accs;
} outcome;

int diff_gather(mf_diff_acc **accs, int n_accs, const mf_run *ref, int rc, int stage, mf_error *err) {
    const int rank = mf_dist_rank(), size = mf_dist_size();
    mf_buf b = {0};
    outcome mine;
    memset(&mine, 0, sizeof mine);
    mine.rc = rc;
    mine.stage = stage;
    mine.n_accs = rc ? 0 : (uint32_t)n_accs;
    if (rc) snprintf(mine.msg, sizeof mine.msg, "%s", err->msg);
    put(&b, &mine, sizeof mine);
    for (int k = 0; k < n_accs && !rc; k++) {
        const size_t at = b.n;
        uint64_t len = 0;
        put(&b, &len, sizeof len);
        diff_acc_pack(accs[k], &b);
        len = b.n - at - sizeof len;
        memcpy(b.s + at, &len, sizeof len);
    }
    uint8_t *all;
    size_t *off;
    mf_dist_allgather(b.s, b.n, &all, &off);
    mf_buf_free(&b);
    /* a failure anywhere is every rank's: the one of the earliest stage, at the lowest rank (the earliest
     * sequences), as one process meets it first */
    int worst = -1;
    outcome o[2];
    for (int r = 0; r < size; r++) {
        if (off[r + 1] - off[r] < sizeof(outcome)) {
            worst = r;
            break;
        }
        memcpy(&o[0], all + off[r], sizeof o[0]);
        if (o[0].rc == MF_OK) continue;
        if (worst >= 0) memcpy(&o[1], all + off[worst], sizeof o[1]);
        if (worst < 0 || o[0].stage < o[1].stage) worst = r;
    }
    int result = MF_OK;
    if (worst >= 0) {
        outcome w;
        memset(&w, 0, sizeof w);
        if (off[worst + 1] - off[worst] >= sizeof w) memcpy(&w, all + off[worst], sizeof w);
        w.msg[sizeof w.msg - 1] = 0;
        const int code = w.rc ? w.rc : MF_EFORMAT;
        if (!w.rc) result = mf_fail(err, code, "rank %d of %d sent no outcome of its diff", worst, size);
        else if (worst == 0) result = mf_fail(err, code, "%s", w.msg);
        else result = mf_fail(err, code, "rank %d of %d: %s", worst, size, w.msg);
    }
    /* every accumulator, merged over the ranks in rank order */
    for (int k = 0; k < n_accs && result == MF_OK; k++) {
        mf_diff_acc merged;
        mf_diff_acc_init(&merged, ref);
        merged.keep_slots = accs[k]->keep_slots;
        for (int r = 0; r < size && result == MF_OK; r++) {
            if (r == rank) {
                result = mf_diff_merge(&merged, accs[k], err);
                continue;
            }
            /* rank r's k-th accumulator: past its outcome and the ones before it */
            const uint8_t *p = all + off[r] + sizeof(outcome), *end = all + off[r + 1];
            uint64_t len = 0;
            for (int j = 0; j <= k && result == MF_OK; j++) {
                if ((size_t)(end - p) < sizeof len) break;
                memcpy(&len, p, sizeof len);
                p += sizeof len;
                if (len > (uint64_t)(end - p)) break;
                if (j < k) p += len;
            }
            char from[64];
            snprintf(from, sizeof from, "rank %d of %d", r, size);
            if ((size_t)(end - p) < len || len == 0) {
                result = mf_fail(err, MF_EFORMAT, "%s's diff state is cut short", from);
                break;
            }
            mf_diff_acc part;
            result = diff_acc_unpack(&part, ref, p, (size_t)len, from, err);
            if (!result) result = mf_diff_merge(&merged, &part, err);
            mf_diff_acc_free(&part);
        }
        mf_diff_acc_free(accs[k]);
        *accs[k] = merged;
    }
    free(all);
    free(off);
    return result;
}
