/* Gradient synchronisation and the sharded optimizer across all dp x sp ranks (LoongTrain §5.1
 * Hybrid ZeRO, stage 1 over both dimensions).
 *
 * Every rank holds all parameters. After backward each rank's gradient covers only its own
 * tokens (and, with dp, its own sequences); the loss scale already divides by the global number
 * of targets, so the full gradient is the SUM over every rank of the world.
 *   zero 0: allreduce of the whole gradient; every rank runs AdamW on all parameters.
 *   zero 1: reduce-scatter, each rank owns the AdamW moments of one contiguous shard of the flat
 *           buffer, updates it, and an all-gather brings every rank the updated parameters.
 * Both give the same update as one process (up to the order of floating-point sums). */
#ifndef SEQPAR_DATA_PARALLEL_H
#define SEQPAR_DATA_PARALLEL_H

#include <mpi.h>
#include <stddef.h>

#include "comm/comm.h"

typedef struct {
    MPI_Comm comm;       /* all ranks that share the parameters (the world) */
    Comm *stats;         /* byte and time accounting (kinds COMM_GRAD_REDUCE, COMM_PARAM_GATHER) */
    int zero;            /* 0 or 1 */
    int rank, size;
    size_t total;        /* elements of the flat buffer */
    size_t shard_begin, shard_end; /* this rank's optimizer range ([0, total) with zero 0) */
    int *counts, *displs;          /* per rank shard sizes and offsets (zero 1) */
    float *shard_buf;              /* (shard size) reduce-scatter destination */
} GradSync;

/* Plans the shards: rank r owns [r * total / size, (r + 1) * total / size). Dies if the flat
 * buffer is too large for MPI's int counts per rank. */
void grad_sync_init(GradSync *g, MPI_Comm comm, Comm *stats, size_t total, int zero);
void grad_sync_free(GradSync *g);

/* Sums grads over every rank: all of it (zero 0) or this rank's shard (zero 1, written into
 * grads[shard_begin, shard_end); the rest of grads is then stale). Returns the squared L2 norm
 * of the full summed gradient (identical on every rank). */
double grad_sync_reduce(GradSync *g, float *grads);

/* zero 1: all-gathers the updated shards so every rank has all parameters; zero 0: nothing. */
void grad_sync_gather_params(GradSync *g, float *params);

/* Gathers a state vector covering [shard_begin, shard_end) on each rank into full (total
 * elements) on rank 0 (zero 1), or copies it on rank 0 (zero 0). `full` is read only on rank 0
 * and may be NULL elsewhere. For saving optimizer moments. */
void grad_sync_gather_to_root(GradSync *g, const float *shard, float *full);

#endif
