/* The job's ranks as the rest of moeflip sees them (mf_dist.h): one process unless an MPI launcher started
 * several, and then the MPI module (dist/mpi.c) carries the bytes. Transfers of any size are cut here into
 * MPI's int-counted pieces. */
#include "mf_dist.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

static int dist_rank = 0, dist_size = 1, dist_local_rank = 0, dist_local_size = 1;
static bool joined;

#define CHUNK (1 << 30)   /* bytes per MPI call */

static struct {
    int (*init)(int *, int *, int *, int *, char *, size_t);
    void (*finalize)(void);
    void (*barrier)(void);
    void (*allgather_u64)(uint64_t, uint64_t *);
    void (*allgatherv)(const void *, int, void *, const int *, const int *);
    void (*gather_u64)(uint64_t, uint64_t *, int);
    void (*gatherv)(const void *, int, void *, const int *, const int *, int);
    void (*bcast)(void *, int, int);
    void (*isend)(int, int, void *, int);
    void (*waitall)(void);
    int (*probe)(int, int *, int *, int *);
    void (*recv)(int, int, void *, int);
    void (*abort)(int);
} mpi;

static const char *env(const char *name) {
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

bool mf_dist_launched(void) {
    return env("OMPI_COMM_WORLD_SIZE") || env("PMIX_RANK") || env("PMI_RANK") || env("PMI_SIZE") || env("PMI_FD");
}

/* What the launcher's environment says of this process's place, -1 where it says nothing. */
static long env_int(const char *const *names) {
    for (; *names; names++) {
        const char *v = env(*names);
        char *end;
        long x = v ? strtol(v, &end, 10) : -1;
        if (v && !*end && x >= 0) return x;
    }
    return -1;
}

static long launched_size(void) {
    static const char *const names[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS", NULL};
    return env_int(names);
}

static long launched_rank(void) {
    static const char *const names[] = {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID", NULL};
    return env_int(names);
}

int mf_dist_init(mf_error *err) {
    if (!mf_dist_launched()) return MF_OK;
    const long size = launched_size(), rank = launched_rank();
    if (size == 1) return MF_OK;   /* a job of one: nothing to share, nothing to load */
#ifndef MF_HAVE_MPI
    if (size > 1 || rank > 0) {
        char of[32] = "several";
        if (size > 1) snprintf(of, sizeof of, "%ld", size);
        return mf_fail(err, MF_EUNSUPPORTED, "an MPI launcher started this process as rank %ld of %s, but this moeflip was "
                       "built without MPI (none was found when it was configured, or -DMOEFLIP_MPI=OFF): run it as one "
                       "process, or rebuild it with libopenmpi-dev installed", rank < 0 ? 0 : rank, of);
    }
    return MF_OK;
#else
    (void)rank;
    void *h;
    const mf_module_fn fns[] = {
        {"mf_mpi_init", (void **)&mpi.init},       {"mf_mpi_finalize", (void **)&mpi.finalize},
        {"mf_mpi_barrier", (void **)&mpi.barrier}, {"mf_mpi_allgather_u64", (void **)&mpi.allgather_u64},
        {"mf_mpi_allgatherv", (void **)&mpi.allgatherv}, {"mf_mpi_bcast", (void **)&mpi.bcast},
        {"mf_mpi_gather_u64", (void **)&mpi.gather_u64}, {"mf_mpi_gatherv", (void **)&mpi.gatherv},
        {"mf_mpi_isend", (void **)&mpi.isend},     {"mf_mpi_waitall", (void **)&mpi.waitall},
        {"mf_mpi_probe", (void **)&mpi.probe},     {"mf_mpi_recv", (void **)&mpi.recv},
        {"mf_mpi_abort", (void **)&mpi.abort},
    };
    if (mf_module_load(&h, "libmoeflip_mpi.so", fns, sizeof fns / sizeof fns[0], err))
        return mf_fail_wrap(err, "started by an MPI launcher, but cannot load the MPI module");
    char msg[512] = "";
    if (mpi.init(&dist_rank, &dist_size, &dist_local_rank, &dist_local_size, msg, sizeof msg))
        return mf_fail(err, MF_EIO, "started by an MPI launcher, but MPI did not start: %s", msg);
    joined = true;
    return MF_OK;
#endif
}

void mf_dist_finalize(void) {
    if (joined) mpi.finalize();
    joined = false;
}

int mf_dist_rank(void) { return dist_rank; }
int mf_dist_size(void) { return dist_size; }
int mf_dist_local_rank(void) { return dist_local_rank; }
int mf_dist_local_size(void) { return dist_local_size; }

void mf_dist_barrier(void) {
    if (joined) mpi.barrier();
}

void mf_dist_block(size_t count, int r, int size, size_t *first, size_t *len) {
    const size_t q = count / (size_t)size, extra = count % (size_t)size, ur = (size_t)r;
    *first = ur * q + (ur < extra ? ur : extra);
    *len = q + (ur < extra);
}

/* n bytes at data from root to every rank, in pieces MPI can count */
static void bcast_bytes(uint8_t *data, size_t n, int root) {
    for (size_t at = 0; at < n; at += CHUNK) mpi.bcast(data + at, (int)(n - at < CHUNK ? n - at : CHUNK), root);
}

void mf_dist_allgather(const void *mine, size_t n, uint8_t **all, size_t **off) {
    const int size = dist_size;
    *off = mf_xcalloc((size_t)size + 1, sizeof **off);
    if (!joined) {
        *all = mf_xmalloc(n ? n : 1);
        if (n) memcpy(*all, mine, n);
        (*off)[1] = n;
        return;
    }
    uint64_t *sizes = mf_xcalloc((size_t)size, sizeof *sizes);
    mpi.allgather_u64((uint64_t)n, sizes);
    bool small = true;
    for (int r = 0; r < size; r++) {
        (*off)[r + 1] = (*off)[r] + (size_t)sizes[r];
        small = small && sizes[r] <= INT_MAX;
    }
    const size_t total = (*off)[size];
    *all = mf_xmalloc(total ? total : 1);
    if (small && total <= INT_MAX) {
        int *counts = mf_xcalloc((size_t)size, sizeof *counts), *displs = mf_xcalloc((size_t)size, sizeof *displs);
        for (int r = 0; r < size; r++) {
            counts[r] = (int)sizes[r];
            displs[r] = (int)(*off)[r];
        }
        mpi.allgatherv(mine, (int)n, *all, counts, displs);
        free(counts);
        free(displs);
    } else {
        /* more than MPI counts in one call: each rank's bytes in turn, in pieces */
        memcpy(*all + (*off)[dist_rank], mine, n);
        for (int r = 0; r < size; r++) bcast_bytes(*all + (*off)[r], (size_t)sizes[r], r);
    }
    free(sizes);
}

void mf_dist_gather(const void *mine, size_t n, int root, uint8_t **all, size_t **off) {
    *all = NULL;
    *off = NULL;
    if (!joined) {
        mf_dist_allgather(mine, n, all, off);
        return;
    }
    const int size = dist_size;
    uint64_t *sizes = mf_xcalloc((size_t)size, sizeof *sizes);
    mpi.gather_u64((uint64_t)n, sizes, root);
    size_t total = 0;
    bool small = n <= INT_MAX;
    if (dist_rank == root) {
        *off = mf_xcalloc((size_t)size + 1, sizeof **off);
        for (int r = 0; r < size; r++) {
            (*off)[r + 1] = (*off)[r] + (size_t)sizes[r];
            small = small && sizes[r] <= INT_MAX;
        }
        total = (*off)[size];
        small = small && total <= INT_MAX;
    }
    /* whether one call can carry it is the root's to know: it tells the others */
    uint8_t one_call = small;
    mpi.bcast(&one_call, 1, root);
    if (dist_rank == root) *all = mf_xmalloc(total ? total : 1);
    if (one_call) {
        int *counts = NULL, *displs = NULL;
        if (dist_rank == root) {
            counts = mf_xcalloc((size_t)size, sizeof *counts);
            displs = mf_xcalloc((size_t)size, sizeof *displs);
            for (int r = 0; r < size; r++) {
                counts[r] = (int)sizes[r];
                displs[r] = (int)(*off)[r];
            }
        }
        mpi.gatherv(mine, (int)n, *all, counts, displs, root);
        free(counts);
        free(displs);
    } else {
        /* too much for one call: everyone's bytes to everyone, and the others drop them */
        uint8_t *every;
        size_t *every_off;
        mf_dist_allgather(mine, n, &every, &every_off);
        if (dist_rank == root) memcpy(*all, every, total);
        free(every);
        free(every_off);
    }
    free(sizes);
}

void mf_dist_bcast(void **data, size_t *n, int root) {
    if (!joined) return;
    uint64_t *sizes = mf_xcalloc((size_t)dist_size, sizeof *sizes);
    mpi.allgather_u64(dist_rank == root ? (uint64_t)*n : 0, sizes);
    const size_t len = (size_t)sizes[root];
    free(sizes);
    if (dist_rank != root) {
        *data = mf_xmalloc(len + 1);
        ((uint8_t *)*data)[len] = 0;
        *n = len;
    }
    bcast_bytes(*data, len, root);
}

int mf_dist_agree(int rc, mf_error *err) {
    if (!joined) return rc;
    /* each rank's code and message, side by side */
    struct outcome {
        int32_t code;
        char msg[sizeof err->msg];
    } mine = {rc, ""};
    if (rc) memcpy(mine.msg, err->msg, sizeof mine.msg);
    uint8_t *all;
    size_t *off;
    mf_dist_allgather(&mine, sizeof mine, &all, &off);
    int result = MF_OK;
    for (int r = 0; r < dist_size && result == MF_OK; r++) {
        struct outcome o;
        memcpy(&o, all + off[r], sizeof o);
        if (o.code == MF_OK) continue;
        o.msg[sizeof o.msg - 1] = 0;
        result = o.code;
        if (r == 0) mf_fail(err, o.code, "%s", o.msg);
        else mf_fail(err, o.code, "rank %d of %d: %s", r, dist_size, o.msg);
    }
    free(all);
    free(off);
    return result;
}

void mf_dist_send(int dest, int tag, const void *data, size_t n) {
    if (!joined) return;
    if (n > INT_MAX) {   /* what the ranks tell each other is a few KB: this is a defect, not an input */
        fprintf(stderr, "moeflip: a %zu-byte message between ranks is more than MPI sends at once\n", n);
        mpi.abort(1);
    }
    void *copy = mf_xmalloc(n ? n : 1);
    if (n) memcpy(copy, data, n);
    mpi.isend(dest, tag, copy, (int)n);
}

bool mf_dist_recv(bool wait, int *src, int *tag, void **data, size_t *n) {
    if (!joined) return false;
    int s, t, len;
    if (!mpi.probe(wait, &s, &t, &len)) return false;
    uint8_t *buf = mf_xmalloc((size_t)len + 1);
    mpi.recv(s, t, buf, len);
    buf[len] = 0;
    *src = s;
    *tag = t;
    *data = buf;
    *n = (size_t)len;
    return true;
}

void mf_dist_flush(void) {
    if (joined) mpi.waitall();
}
