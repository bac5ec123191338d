/* The MPI module (libmoeflip_mpi.so): the only code that calls MPI. dist/dist.c loads it when an MPI launcher
 * started the process; its entry points are byte-level and never take more than INT_MAX bytes at once (dist.c
 * cuts larger transfers). MPI's default error handler stays in place: a failing call ends the job. */
#include "mf_core.h"

#include <mpi.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

MF_MODULE_ABI_DEFINE;

/* sends still in flight: their buffers are kept until mf_mpi_waitall */
static MPI_Request *pending;
static void **pending_data;
static int n_pending, cap_pending;

int mf_mpi_init(int *rank, int *size, int *local_rank, int *local_size, char *msg, size_t cap) {
    int provided = 0, rc;
    /* OpenMP threads compute between MPI calls; only the main thread calls MPI */
    if ((rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided)) != MPI_SUCCESS) {
        char text[MPI_MAX_ERROR_STRING];
        int len = 0;
        MPI_Error_string(rc, text, &len);
        snprintf(msg, cap, "MPI_Init_thread: %.*s", len, text);
        return 1;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, rank);
    MPI_Comm_size(MPI_COMM_WORLD, size);
    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    MPI_Comm_rank(node, local_rank);
    MPI_Comm_size(node, local_size);
    MPI_Comm_free(&node);
    return 0;
}

void mf_mpi_finalize(void) { MPI_Finalize(); }

void mf_mpi_barrier(void) { MPI_Barrier(MPI_COMM_WORLD); }

void mf_mpi_allgather_u64(uint64_t mine, uint64_t *all) {
    MPI_Allgather(&mine, 1, MPI_UINT64_T, all, 1, MPI_UINT64_T, MPI_COMM_WORLD);
}

void mf_mpi_allgatherv(const void *mine, int n, void *all, const int *counts, const int *displs) {
    MPI_Allgatherv(mine, n, MPI_BYTE, all, counts, displs, MPI_BYTE, MPI_COMM_WORLD);
}

void mf_mpi_gather_u64(uint64_t mine, uint64_t *all, int root) {
    MPI_Gather(&mine, 1, MPI_UINT64_T, all, 1, MPI_UINT64_T, root, MPI_COMM_WORLD);
}

void mf_mpi_gatherv(const void *mine, int n, void *all, const int *counts, const int *displs, int root) {
    MPI_Gatherv(mine, n, MPI_BYTE, all, counts, displs, MPI_BYTE, root, MPI_COMM_WORLD);
}

void mf_mpi_bcast(void *data, int n, int root) { MPI_Bcast(data, n, MPI_BYTE, root, MPI_COMM_WORLD); }

/* Takes ownership of data (malloc'ed), freed once the send completes. */
void mf_mpi_isend(int dest, int tag, void *data, int n) {
    if (n_pending == cap_pending) {
        cap_pending = cap_pending ? 2 * cap_pending : 16;
        pending = realloc(pending, (size_t)cap_pending * sizeof *pending);
        pending_data = realloc(pending_data, (size_t)cap_pending * sizeof *pending_data);
        if (!pending || !pending_data) MPI_Abort(MPI_COMM_WORLD, 1);
    }
    MPI_Isend(data, n, MPI_BYTE, dest, tag, MPI_COMM_WORLD, &pending[n_pending]);
    pending_data[n_pending++] = data;
    /* sends that completed meanwhile give their buffers back, and the test moves the others along */
    int w = 0;
    for (int i = 0; i < n_pending; i++) {
        int done = 0;
        MPI_Test(&pending[i], &done, MPI_STATUS_IGNORE);
        if (done) {
            free(pending_data[i]);
        } else {
            pending[w] = pending[i];
            pending_data[w++] = pending_data[i];
        }
    }
    n_pending = w;
}

/* A rank that finished its part may wait long for one still working: it polls every millisecond rather than
 * spin in MPI's wait, which would keep a core busy (another rank's, where a node runs more ranks than cores). */
static void nap(void) {
    const struct timespec ms = {0, 1000000};
    nanosleep(&ms, NULL);
}

void mf_mpi_waitall(void) {
    int done = 0;
    while (MPI_Testall(n_pending, pending, &done, MPI_STATUSES_IGNORE), !done) nap();
    for (int i = 0; i < n_pending; i++) free(pending_data[i]);
    n_pending = 0;
}

/* The next message's source, tag and size: 1 when there is one (wait: blocks for it), 0 when none is there. */
int mf_mpi_probe(int wait, int *src, int *tag, int *n) {
    MPI_Status st;
    int flag = 1;
    for (;;) {
        MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &flag, &st);
        if (flag || !wait) break;
        nap();
    }
    if (!flag) return 0;
    *src = st.MPI_SOURCE;
    *tag = st.MPI_TAG;
    MPI_Get_count(&st, MPI_BYTE, n);
    return 1;
}

void mf_mpi_recv(int src, int tag, void *data, int n) {
    MPI_Recv(data, n, MPI_BYTE, src, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
}

void mf_mpi_abort(int code) { MPI_Abort(MPI_COMM_WORLD, code); }
