/* Gradient reduction and ZeRO-1 sharding over all ranks: see data_parallel.h. */
#include "strategies/data_parallel.h"

#include <limits.h>
#include <string.h>

#include "core/common.h"
#include "optim/adamw.h"

void grad_sync_init(GradSync *g, MPI_Comm comm, Comm *stats, size_t total, int zero) {
    memset(g, 0, sizeof *g);
    g->comm = comm;
    g->stats = stats;
    g->zero = zero;
    g->total = total;
    MPI_Comm_rank(comm, &g->rank);
    MPI_Comm_size(comm, &g->size);
    g->shard_begin = 0;
    g->shard_end = total;
    if (zero == 0 || g->size == 1) return;
    g->counts = xmalloc(sizeof(int) * (size_t)g->size);
    g->displs = xmalloc(sizeof(int) * (size_t)g->size);
    if (total > (size_t)INT_MAX)
        die("the model has %zu parameters, more than MPI's int counts allow in one collective: use --zero 0", total);
    for (int r = 0; r < g->size; r++) {
        size_t b = total * (size_t)r / (size_t)g->size, e = total * (size_t)(r + 1) / (size_t)g->size;
        g->counts[r] = (int)(e - b);
        g->displs[r] = (int)b;
    }
    g->shard_begin = (size_t)g->displs[g->rank];
    g->shard_end = g->shard_begin + (size_t)g->counts[g->rank];
    g->shard_buf = xmalloc(sizeof(float) * (g->shard_end - g->shard_begin + 1));
}

void grad_sync_free(GradSync *g) {
    xfree(g->counts);
    xfree(g->displs);
    xfree(g->shard_buf);
    memset(g, 0, sizeof *g);
}

double grad_sync_reduce(GradSync *g, float *grads) {
    double local;
    if (g->size == 1) return grad_norm_sq(grads, g->total);
    if (!g->zero || !g->counts) {
        comm_allreduce(g->stats, COMM_GRAD_REDUCE, MPI_IN_PLACE, grads, g->total, MPI_FLOAT, MPI_SUM, g->comm);
        return grad_norm_sq(grads, g->total);
    }
    comm_reduce_scatter(g->stats, COMM_GRAD_REDUCE, grads, g->shard_buf, g->counts, MPI_FLOAT, MPI_SUM, g->comm);
    size_t n = g->shard_end - g->shard_begin;
    memcpy(grads + g->shard_begin, g->shard_buf, sizeof(float) * n);
    local = grad_norm_sq(grads + g->shard_begin, n);
    double global = 0;
    comm_allreduce(g->stats, COMM_GRAD_REDUCE, &local, &global, 1, MPI_DOUBLE, MPI_SUM, g->comm);
    return global;
}

void grad_sync_gather_params(GradSync *g, float *params) {
    if (!g->zero || !g->counts) return;
    comm_allgatherv(g->stats, COMM_PARAM_GATHER, MPI_IN_PLACE, g->counts[g->rank], params, g->counts, g->displs,
                    MPI_FLOAT, g->comm);
}

void grad_sync_gather_to_root(GradSync *g, const float *shard, float *full) {
    if (!g->zero || !g->counts) { /* every rank holds all of it; only the root has a destination */
        if (g->rank == 0 && full != shard) memcpy(full, shard, sizeof(float) * g->total);
        return;
    }
    comm_gatherv(g->stats, COMM_PARAM_GATHER, shard, g->counts[g->rank], full, g->counts, g->displs, MPI_FLOAT, 0,
                 g->comm);
}
