/* Gradient reduction and Hybrid ZeRO stages 0-3 over sharding groups: see data_parallel.h. */
#include "strategies/data_parallel.h"

#include <limits.h>
#include <math.h>
#include <string.h>

#include "core/common.h"
#include "optim/adamw.h"

void grad_sync_init(GradSync *g, MPI_Comm comm, Comm *stats, size_t total, int zero, int group) {
    memset(g, 0, sizeof *g);
    g->world = comm;
    g->shard_comm = g->cross_comm = MPI_COMM_NULL;
    g->stats = stats;
    g->zero = zero;
    g->total = total;
    MPI_Comm_rank(comm, &g->world_rank);
    MPI_Comm_size(comm, &g->world_size);
    if (zero < 0 || zero > 3) die_collective("--zero %d is not a ZeRO stage: use 0, 1, 2 or 3", zero);
    if (group < 0 || group > g->world_size || (group > 0 && g->world_size % group != 0))
        die_collective("--zero-group %d does not divide the %d ranks: use a divisor of %d", group, g->world_size,
                       g->world_size);
    if (group > 0 && zero == 0)
        die_collective("--zero-group %d shards nothing under --zero 0: use --zero 1, 2 or 3", group);
    g->group = group > 0 ? group : g->world_size;
    g->n_groups = g->world_size / g->group;
    g->rank = 0;
    g->size = 1;
    g->shard_begin = 0;
    g->shard_end = total;
    if (zero == 0 || g->world_size == 1) return;
    if (total > (size_t)INT_MAX)
        die_collective("the model has %zu parameters, more than MPI's int counts allow in one collective: use --zero 0",
                       total);
    /* groups of g consecutive world ranks; the cross communicator joins equal group ranks */
    MPI_Comm_split(comm, g->world_rank / g->group, g->world_rank, &g->shard_comm);
    MPI_Comm_split(comm, g->world_rank % g->group, g->world_rank, &g->cross_comm);
    MPI_Comm_rank(g->shard_comm, &g->rank);
    MPI_Comm_size(g->shard_comm, &g->size);
    g->counts = xmalloc(sizeof(int) * (size_t)g->size);
    g->displs = xmalloc(sizeof(int) * (size_t)g->size);
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
    if (g->model && g->model->hooks == &g->hooks) g->model->hooks = NULL;
    if (g->shard_comm != MPI_COMM_NULL) MPI_Comm_free(&g->shard_comm);
    if (g->cross_comm != MPI_COMM_NULL) MPI_Comm_free(&g->cross_comm);
    xfree(g->counts);
    xfree(g->displs);
    xfree(g->shard_buf);
    xfree(g->unit_begin);
    xfree(g->unit_end);
    xfree(g->unit_counts);
    xfree(g->reqs);
    memset(g, 0, sizeof *g);
}

/* ---------------------------------------------------------------- units and hooks */

static size_t min_sz(size_t a, size_t b) { return a < b ? a : b; }
static size_t max_sz(size_t a, size_t b) { return a > b ? a : b; }

/* This rank's part of unit u: [*b, *e) (empty when b == e). */
static void unit_own(const GradSync *g, int u, size_t *b, size_t *e) {
    *b = max_sz(g->unit_begin[u], g->shard_begin);
    *e = min_sz(g->unit_end[u], g->shard_end);
    if (*e < *b) *e = *b;
}

/* ZeRO-3: the unit's parameters outside this rank's shard are destroyed after use, so that a
 * use without its all-gather shows as NaN instead of silently reading stale values. */
static void unit_release(GradSync *g, int u) {
    size_t ob, oe;
    unit_own(g, u, &ob, &oe);
    float *p = g->model->params;
    for (size_t i = g->unit_begin[u]; i < ob; i++) p[i] = NAN;
    for (size_t i = oe; i < g->unit_end[u]; i++) p[i] = NAN;
}

static void unit_gather(GradSync *g, int u) {
    const int *cnt = g->unit_counts + (size_t)u * (size_t)g->size;
    int *displs = xmalloc(sizeof(int) * (size_t)g->size);
    int d = 0;
    for (int p = 0; p < g->size; p++) displs[p] = d, d += cnt[p];
    comm_allgatherv(g->stats, COMM_PARAM_GATHER, MPI_IN_PLACE, cnt[g->rank], g->model->params + g->unit_begin[u],
                    cnt, displs, MPI_FLOAT, g->shard_comm);
    xfree(displs);
}

/* Posts the reduce-scatter of unit u's gradient into this rank's part of shard_buf. */
static void unit_reduce_post(GradSync *g, int u) {
    size_t ob, oe;
    unit_own(g, u, &ob, &oe);
    const int *cnt = g->unit_counts + (size_t)u * (size_t)g->size;
    comm_ireduce_scatter(g->stats, COMM_GRAD_REDUCE, g->model->grads + g->unit_begin[u],
                         g->shard_buf + (ob - g->shard_begin), cnt, MPI_FLOAT, MPI_SUM, g->shard_comm, &g->reqs[u]);
}

static void zero_hook(void *ctx, LlamaModel *m, LlamaHookPoint point, int layer, int backward) {
    GradSync *g = ctx;
    (void)m;
    int z3 = g->zero == 3, tail = g->n_units - 1, reduce = backward && g->reduce_now;
    switch (point) {
    case LLAMA_HOOK_BEGIN:
        if (z3) { unit_gather(g, 0); unit_gather(g, tail); }
        break;
    case LLAMA_HOOK_BEFORE_FORWARD:
    case LLAMA_HOOK_BEFORE_BACKWARD:
        if (z3) unit_gather(g, 1 + layer);
        break;
    case LLAMA_HOOK_AFTER_FORWARD:
        if (z3) unit_release(g, 1 + layer);
        break;
    case LLAMA_HOOK_AFTER_BACKWARD:
        if (reduce) {
            unit_reduce_post(g, 1 + layer);
            comm_testall(g->stats, COMM_GRAD_REDUCE, g->n_units, g->reqs); /* progress the earlier ones */
        }
        if (z3) unit_release(g, 1 + layer);
        break;
    case LLAMA_HOOK_END:
        if (reduce) {
            unit_reduce_post(g, tail);
            unit_reduce_post(g, 0);
            comm_waitall(g->stats, COMM_GRAD_REDUCE, g->n_units, g->reqs);
            g->reduced = 1;
        }
        if (z3) { unit_release(g, 0); unit_release(g, tail); }
        break;
    }
}

void grad_sync_attach(GradSync *g, LlamaModel *m) {
    if (g->zero < 2 || !g->counts) return;
    const ParamTable *t = &m->table;
    int nL = m->cfg.num_hidden_layers;
    if (t->total != g->total || t->n < 2 + 9 * nL) die("internal: grad_sync_attach: the table does not match");
    g->model = m;
    g->n_units = nL + 2;
    g->unit_begin = xmalloc(sizeof(size_t) * (size_t)g->n_units);
    g->unit_end = xmalloc(sizeof(size_t) * (size_t)g->n_units);
    /* the table's order: embed, 9 tensors per layer, final norm, [lm_head]; each unit's tensors
     * must be contiguous for the unit to be one range */
    g->unit_begin[0] = 0;
    for (int l = 0; l < nL; l++) {
        const ParamTensor *first = &t->t[1 + 9 * l], *last = &t->t[9 + 9 * l];
        g->unit_begin[1 + l] = first->offset;
        g->unit_end[1 + l] = last->offset + last->numel;
    }
    g->unit_end[0] = nL > 0 ? g->unit_begin[1] : t->t[1].offset;
    g->unit_begin[nL + 1] = g->unit_end[0 + nL];
    if (nL == 0) g->unit_begin[1] = g->unit_end[0];
    g->unit_end[nL + 1] = t->total;
    for (int u = 0; u < g->n_units; u++) {
        size_t expect = u == 0 ? 0 : g->unit_end[u - 1];
        if (g->unit_begin[u] != expect || g->unit_end[u] < g->unit_begin[u])
            die("internal: unit %d of the parameter table is not contiguous", u);
    }
    for (int i = 1; i < t->n; i++)
        if (t->t[i].offset != t->t[i - 1].offset + t->t[i - 1].numel)
            die("internal: the parameter table has a gap before %s", t->t[i].name);
    g->unit_counts = xmalloc(sizeof(int) * (size_t)g->n_units * (size_t)g->size);
    for (int u = 0; u < g->n_units; u++)
        for (int p = 0; p < g->size; p++) {
            size_t sb = (size_t)g->displs[p], se = sb + (size_t)g->counts[p];
            size_t b = max_sz(g->unit_begin[u], sb), e = min_sz(g->unit_end[u], se);
            g->unit_counts[(size_t)u * (size_t)g->size + (size_t)p] = e > b ? (int)(e - b) : 0;
        }
    g->reqs = xmalloc(sizeof(MPI_Request) * (size_t)g->n_units);
    for (int u = 0; u < g->n_units; u++) g->reqs[u] = MPI_REQUEST_NULL;
    g->hooks.fn = zero_hook;
    g->hooks.ctx = g;
    m->hooks = &g->hooks;
    if (g->zero == 3)
        for (int u = 0; u < g->n_units; u++) unit_release(g, u);
}

void grad_sync_microbatch(GradSync *g, int last) {
    g->reduce_now = last;
    if (last) g->reduced = 0;
}

/* ---------------------------------------------------------------- the step's reduction */

double grad_sync_reduce(GradSync *g, float *grads) {
    if (g->world_size == 1) return grad_norm_sq(grads, g->total);
    if (!g->zero || !g->counts) {
        comm_allreduce(g->stats, COMM_GRAD_REDUCE, MPI_IN_PLACE, grads, g->total, MPI_FLOAT, MPI_SUM, g->world);
        return grad_norm_sq(grads, g->total);
    }
    size_t n = g->shard_end - g->shard_begin;
    if (g->zero == 1) {
        comm_reduce_scatter(g->stats, COMM_GRAD_REDUCE, grads, g->shard_buf, g->counts, MPI_FLOAT, MPI_SUM,
                            g->shard_comm);
    } else if (!g->model || !g->reduced) {
        die("internal: --zero %d: the gradient was not reduced in backward (grad_sync_attach and "
            "grad_sync_microbatch not called)", g->zero);
    }
    g->reduced = 0;
    if (g->n_groups > 1) /* the replicas of this shard in the other groups */
        comm_allreduce(g->stats, COMM_GRAD_REDUCE, MPI_IN_PLACE, g->shard_buf, n, MPI_FLOAT, MPI_SUM, g->cross_comm);
    memcpy(grads + g->shard_begin, g->shard_buf, sizeof(float) * n);
    double local = grad_norm_sq(grads + g->shard_begin, n), global = local;
    if (g->size > 1)
        comm_allreduce(g->stats, COMM_GRAD_REDUCE, &local, &global, 1, MPI_DOUBLE, MPI_SUM, g->shard_comm);
    return global;
}

void grad_sync_gather_full(GradSync *g, float *buf) {
    if (!g->zero || !g->counts || g->size == 1) return;
    comm_allgatherv(g->stats, COMM_PARAM_GATHER, MPI_IN_PLACE, g->counts[g->rank], buf, g->counts, g->displs,
                    MPI_FLOAT, g->shard_comm);
}

void grad_sync_gather_params(GradSync *g, float *params) {
    if (g->zero == 3) return; /* parameters stay sharded; each use gathers its unit */
    grad_sync_gather_full(g, params);
}

void grad_sync_gather_to_root(GradSync *g, const float *shard, float *full) {
    if (!g->zero || !g->counts) { /* every rank holds all of it; only the root has a destination */
        if (g->world_rank == 0 && full != shard) memcpy(full, shard, sizeof(float) * g->total);
        return;
    }
    if (g->world_rank / g->group != 0) return; /* group 0 holds world rank 0; the others are replicas */
    if (g->size == 1) {
        memcpy(full, shard, sizeof(float) * g->total);
        return;
    }
    comm_gatherv(g->stats, COMM_PARAM_GATHER, shard, g->counts[g->rank], full, g->counts, g->displs, MPI_FLOAT, 0,
                 g->shard_comm);
}
