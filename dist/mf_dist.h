/* moeflip dist: the processes of one MPI job (mpirun, mpiexec, srun) sharing one trace, diff or sweep.
 *
 * MPI itself is a module, libmoeflip_mpi.so (dist/mpi.c), that mf_dist_init loads only when an MPI launcher
 * started the process as one of several: a plain `moeflip trace` never loads libmpi, and a build without MPI
 * has this same API for one process. trace/, diff/ and job/ call these functions, never MPI.
 *
 * Every collective below (barrier, allgather, gather, bcast, agree) must be called by every rank of the job, in the
 * same order. A failing MPI call ends the whole job (MPI's default error handler), so these return nothing
 * to check; what can fail on one rank and not the others is a moeflip status, which mf_dist_agree shares. */
#ifndef MF_DIST_H
#define MF_DIST_H

#include "mf_core.h"

/* Whether an MPI launcher started this process: OpenMPI's mpirun (OMPI_COMM_WORLD_SIZE), a PMIx launcher
 * (PMIX_RANK: OpenMPI, srun --mpi=pmix), a PMI-1/PMI-2 launcher (PMI_RANK, PMI_SIZE, PMI_FD: MPICH's
 * mpiexec, srun --mpi=pmi2). */
bool mf_dist_launched(void);

/* Joins the job when the process was launched as one of several ranks (loading the MPI module and
 * initialising MPI); otherwise the process is the job's only rank and nothing is loaded. A build without MPI
 * launched as a rank other than 0, or as one of several, fails with one line saying so: each rank would
 * otherwise do the whole work into the same files. */
int mf_dist_init(mf_error *err);
/* Leaves the job (MPI_Finalize); nothing when the process is alone. */
void mf_dist_finalize(void);

int mf_dist_rank(void);          /* 0 .. size-1 */
int mf_dist_size(void);          /* 1 when alone */
int mf_dist_local_rank(void);    /* among the ranks on this node (sharing its memory and GPUs) */
int mf_dist_local_size(void);

void mf_dist_barrier(void);
/* Every rank's n bytes to every rank, concatenated in rank order: *all (malloc'ed; the caller frees it) holds
 * rank r's bytes at [off[r], off[r + 1]) (off: malloc'ed, size + 1 entries). Alone: a copy of mine. */
void mf_dist_allgather(const void *mine, size_t n, uint8_t **all, size_t **off);
/* Every rank's n bytes to rank root alone, as mf_dist_allgather gives them to every rank; on the others *all and
 * *off are NULL. */
void mf_dist_gather(const void *mine, size_t n, int root, uint8_t **all, size_t **off);
/* Rank root's *n bytes at *data to every rank: on the others *data becomes a malloc'ed copy (what it held
 * before is not freed) and *n its size. */
void mf_dist_bcast(void **data, size_t *n, int root);
/* Every rank's outcome: rc (MF_OK or an error, its message in err) from each rank; returns MF_OK on every rank
 * when every rank had MF_OK, else on every rank the code and message of the lowest failing rank (its message
 * prefixed "rank R of N: " unless R is 0). Alone: rc. */
int mf_dist_agree(int rc, mf_error *err);

/* Point to point, for messages that arrive while their receiver works (a trace's shard reports). Messages from
 * one rank to another arrive in the order they were sent. mf_dist_send copies data and returns without waiting
 * for the receiver; mf_dist_flush waits until every message this rank sent was taken. */
void mf_dist_send(int dest, int tag, const void *data, size_t n);
/* The next message for this rank from any rank: with wait, blocks until there is one; without, returns false
 * when none has arrived. *data (malloc'ed, NUL-terminated after its *n bytes) is the caller's to free. */
bool mf_dist_recv(bool wait, int *src, int *tag, void **data, size_t *n);
void mf_dist_flush(void);

/* The block of count items (or draws) that rank r of size works on: [*first, *first + *len), contiguous and
 * in rank order, the first count % size ranks one longer. */
void mf_dist_block(size_t count, int r, int size, size_t *first, size_t *len);

#endif
