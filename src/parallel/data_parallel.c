/* Gradient reduction and Hybrid ZeRO stages 0-3 over sharding groups: see data_parallel.h. */
#include "parallel/data_parallel.h"

#include <math.h>
#include <string.h>

#include "core/common.h"
#include "optim/adamw.h"

char *zero_flags_error(int zero, int group, int world) {
    if (zero < 0 || zero > 3) return xstrdup_printf("--zero %d is not a ZeRO stage: use 0, 1, 2 or 3", zero);
    const int divides = group >= 0 && group <= world && (group == 0 || world % group == 0);
    if (group > 0 && zero == 0 && divides)
        return xstrdup_printf("--zero-group %d shards nothing under --zero 0: use --zero 1, 2 or 3", group);
    if (group > 0 && zero == 0) /* --zero-group 3 on one rank: "a divisor of 1" alone was refused next */
        return xstrdup_printf("--zero-group %d shards nothing under --zero 0 and does not divide the %d ranks: drop it, "
                              "or use --zero 1, 2 or 3 with a --zero-group dividing %d", group, world, world);
    if (!divides)
        return xstrdup_printf("--zero-group %d does not divide the %d ranks: use a divisor of %d", group, world, world);
    return NULL;
}

void grad_sync_init(GradSync *g, MPI_Comm comm, Comm *stats, size_t total, int zero, int group) {
    memset(g, 0, sizeof *g);
    g->world = comm;
    g->shard_comm = g->cross_comm = MPI_COMM_NULL;
    g->stats = stats;
    g->zero = zero;
    g->total = total;
    MPI_Comm_rank(comm, &g->world_rank);
    MPI_Comm_size(comm, &g->world_size);
    char *err = zero_flags_error(zero, group, g->world_size);
    if (err) die_collective("%s", err);
    g->group = group > 0 ? group : g->world_size;
    g->n_groups = g->world_size / g->group;
    g->rank = 0;
    g->size = 1;
    g->shard_begin = 0;
    g->shard_end = total;
    if (zero == 0 || g->world_size == 1) return;
    /* groups of g consecutive world ranks; the cross communicator joins equal group ranks */
    MPI_Comm_split(comm, g->world_rank / g->group, g->world_rank, &g->shard_comm);
    MPI_Comm_split(comm, g->world_rank % g->group, g->world_rank, &g->cross_comm);
    MPI_Comm_rank(g->shard_comm, &g->rank);
    MPI_Comm_size(g->shard_comm, &g->size);
    g->counts = xmalloc(sizeof(size_t) * (size_t)g->size);
    g->displs = xmalloc(sizeof(size_t) * (size_t)g->size);
    for (int r = 0; r < g->size; r++) { /* total x r: no overflow below 2^64 / ranks elements */
        size_t b = total / (size_t)g->size * (size_t)r + total % (size_t)g->size * (size_t)r / (size_t)g->size;
        size_t e = total / (size_t)g->size * (size_t)(r + 1) + total % (size_t)g->size * (size_t)(r + 1) / (size_t)g->size;
        g->counts[r] = e - b;
        g->displs[r] = b;
    }
    g->shard_begin = g->displs[g->rank];
    g->shard_end = g->shard_begin + g->counts[g->rank];
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
    xfree(g->rs);
    xfree(g->unit_displs);
    xfree(g->grad_outer);
    xfree(g->grad_slot[0]);
    xfree(g->grad_slot[1]);
    for (int k = 0; k < 4; k++) xfree(g->acc_tmp[k]);
    xfree(g->acc_whole);
    xfree(g->p_shard);
    for (int i = 0; i < 2; i++) xfree(g->p_layer[i]);
    xfree(g->p_outer);
    optimizer_offload_free(g->offload);
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

static size_t unit_size(const GradSync *g, int u) { return g->unit_end[u] - g->unit_begin[u]; }

/* Points layer l's named tensors (w: one of m->w.layers / m->g.layers) into base, which holds
 * the layer's unit; base NULL unbinds them (a use without the gather then faults). */
static void bind_layer(const GradSync *g, LlamaLayerWeights *w, float *base, int l) {
    llama_bind_layer(w, base, g->unit_begin[1 + l], &g->model->table, &g->model->cfg, l);
}

/* The embedding of w pointed at embed (its unit) and the final norm and head at tail (the tail
 * unit); NULL unbinds (a use then faults). A tied head is the embedding. */
static void bind_outer_at(const GradSync *g, LlamaWeights *w, float *embed, float *tail) {
    const ParamTable *t = &g->model->table;
    const int tu = g->n_units - 1, fi = 1 + (g->n_units - 2) * llama_layer_tensors(&g->model->cfg); /* final norm */
    w->embed = embed;
    w->final_norm = tail ? tail + (t->t[fi].offset - g->unit_begin[tu]) : NULL;
    w->lm_head = g->model->cfg.tie_word_embeddings ? embed
                 : tail                            ? tail + (t->t[fi + 1].offset - g->unit_begin[tu])
                                                   : NULL;
}

/* The embedding, final norm and head of w pointed into base = [embedding unit | tail unit]. */
static void bind_outer(const GradSync *g, LlamaWeights *w, float *base) {
    bind_outer_at(g, w, base, base ? base + unit_size(g, 0) : NULL);
}

/* Floats of grad_outer and p_outer: the two outer units back to back, or the larger of them when
 * they take turns. */
static size_t outer_floats(const GradSync *g) {
    size_t E = unit_size(g, 0), T = unit_size(g, g->n_units - 1);
    return g->outer_turns ? max_sz(E, T) : E + T;
}

/* What a gather of unit u into dst sends: this rank's part of the unit in p_shard, or (the shard
 * in the optimizer offload's file: --offload-master) MPI_IN_PLACE after reading that part into its
 * place in dst. Sets unit_displs for the gather. */
static const void *own_params(GradSync *g, int u, float *dst) {
    const size_t *cnt = g->unit_counts + (size_t)u * (size_t)g->size;
    size_t ob, oe, d = 0;
    unit_own(g, u, &ob, &oe);
    for (int p = 0; p < g->size; p++) g->unit_displs[p] = d, d += cnt[p];
    if (g->p_shard) return g->p_shard + (ob - g->shard_begin);
    optimizer_offload_read(g->offload, 2, ob - g->shard_begin, oe - ob, dst + g->unit_displs[g->rank]);
    return MPI_IN_PLACE;
}

/* All-gathers unit u's parameters (from the shards) into dst (the unit's size). */
static void unit_gather(GradSync *g, int u, float *dst) {
    const size_t *cnt = g->unit_counts + (size_t)u * (size_t)g->size;
    const void *mine = own_params(g, u, dst);
    comm_allgatherv(g->stats, COMM_PARAM_GATHER, mine, cnt[g->rank], dst, cnt, g->unit_displs, MPI_FLOAT,
                    g->shard_comm);
}

/* zero 3: the pass uses layers in the order k = 0 .. pass_len - 1: forward layer k (k < L), then
 * backward layer 2 L - 1 - k. Gather k goes to p_layer[k % 2]. */
static int pass_layer(const GradSync *g, int k) {
    int nL = g->n_units - 2;
    return k < nL ? k : 2 * nL - 1 - k;
}

/* Posts gather k of the pass (nothing past its end); p_layer[k % 2] is free: gather k - 2's
 * layer finished before gather k - 1 was waited for. */
static void gather_post(GradSync *g, int k) {
    if (k >= g->pass_len) return;
    int u = 1 + pass_layer(g, k), b = k % 2;
    const size_t *cnt = g->unit_counts + (size_t)u * (size_t)g->size;
    const void *mine = own_params(g, u, g->p_layer[b]);
    comm_iallgatherv(g->stats, COMM_PARAM_GATHER, mine, cnt[g->rank], g->p_layer[b], cnt, g->unit_displs, MPI_FLOAT,
                     g->shard_comm, &g->gather[b]);
}

/* Layer `layer` starts as use k of the pass: waits for its gather, posts the next one, binds it. */
static void gather_use(GradSync *g, LlamaModel *m, int k, int layer) {
    int b = k % 2;
    comm_gather_wait(g->stats, COMM_PARAM_GATHER, 1, &g->gather[b]);
    gather_post(g, k + 1);
    bind_layer(g, &m->w.layers[layer], g->p_layer[b], layer);
}

/* The temporary (acc_tmp) a later micro-batch's reduce-scatter of unit u lands in. */
static int acc_slot(const GradSync *g, int u) {
    if (u == g->n_units - 1) return 2;
    if (u == 0) return g->outer_turns ? 2 : 3;
    return (u - 1) % 2;
}

/* Adds each later micro-batch's reduce-scatter that is seen complete into shard_buf (the same
 * one addition per element as a whole second shard added at the end). */
static void acc_finish(GradSync *g) {
    for (int k = 0; k < 4; k++) {
        const int u = g->acc_unit[k];
        if (u < 0 || comm_rs_active(&g->rs[u])) continue;
        size_t ob, oe;
        unit_own(g, u, &ob, &oe);
        float *dst = g->shard_buf + (ob - g->shard_begin);
        const float *src = g->acc_whole ? g->acc_whole + (ob - g->shard_begin) : g->acc_tmp[k];
        for (size_t i = 0; i < oe - ob; i++) dst[i] += src[i];
        g->acc_unit[k] = -1;
    }
}

/* Posts the reduce-scatter of unit u's gradient (in src; the rank's own part of it is the landing
 * space of the peers' messages: comm.h) into this rank's part of the shard
 * accumulator (the step's first micro-batch) or of the unit's temporary (the later ones: added
 * by acc_finish; a temporary still awaited by an earlier unit is waited for first). */
static void unit_reduce_post(GradSync *g, int u, float *src) {
    size_t ob, oe;
    unit_own(g, u, &ob, &oe);
    float *dst = g->shard_buf + (ob - g->shard_begin);
    if (g->micro > 0) {
        const int k = acc_slot(g, u);
        if (g->acc_unit[k] >= 0) {
            comm_rs_wait(g->stats, COMM_GRAD_REDUCE, 1, &g->rs[g->acc_unit[k]]);
            acc_finish(g);
        }
        dst = g->acc_whole ? g->acc_whole + (ob - g->shard_begin) : g->acc_tmp[k];
        g->acc_unit[k] = u;
    }
    const size_t *cnt = g->unit_counts + (size_t)u * (size_t)g->size;
    comm_rs_post(g->stats, COMM_GRAD_REDUCE, &g->rs[u], src, dst, cnt, g->shard_comm, u % (COMM_RS_TAGS - 1));
}

static void zero_hook(void *ctx, LlamaModel *m, LlamaHookPoint point, int layer, int backward) {
    GradSync *g = ctx;
    int z3 = g->zero == 3, tail = g->n_units - 1;
    size_t E = unit_size(g, 0);
    switch (point) {
    case LLAMA_HOOK_BEGIN:
        if (z3) { /* the first layer's gather in flight; embedding, final norm and head: whole for the
                     micro-batch, or (turns) the embedding now and the tail after its forward */
            g->pass_len = (backward ? 2 : 1) * (g->n_units - 2);
            gather_post(g, 0);
            /* mapped, not from malloc's heap: a freed unit there (malloc's mmap threshold rises to
               its size) is split by small allocations, and the next pass's unit grows the heap */
            g->p_outer = xzalloc_filled(sizeof(float) * outer_floats(g));
            unit_gather(g, 0, g->p_outer);
            if (g->outer_turns) {
                bind_outer_at(g, &m->w, g->p_outer, NULL);
            } else {
                unit_gather(g, tail, g->p_outer + E);
                bind_outer(g, &m->w, g->p_outer);
            }
        }
        if (backward && g->outer_turns) { /* the tail's gradient first; the embedding's at its backward */
            memset(g->grad_outer, 0, sizeof(float) * unit_size(g, tail));
            bind_outer_at(g, &m->g, NULL, g->grad_outer);
        } else if (backward) {
            memset(g->grad_outer, 0, sizeof(float) * outer_floats(g));
        }
        break;
    case LLAMA_HOOK_AFTER_EMBEDDING:
        if (z3 && g->outer_turns) { /* the embedding is done with: the tail's gather into its place */
            bind_outer_at(g, &m->w, NULL, NULL);
            const size_t *cnt = g->unit_counts + (size_t)tail * (size_t)g->size;
            const void *mine = own_params(g, tail, g->p_outer);
            comm_iallgatherv(g->stats, COMM_PARAM_GATHER, mine, cnt[g->rank], g->p_outer, cnt, g->unit_displs,
                             MPI_FLOAT, g->shard_comm, &g->outer_gather);
        }
        break;
    case LLAMA_HOOK_BEFORE_FORWARD:
        if (z3) gather_use(g, m, layer, layer);
        break;
    case LLAMA_HOOK_AFTER_FORWARD:
        if (z3) {
            bind_layer(g, &m->w.layers[layer], NULL, layer);
            comm_gather_test(g->stats, COMM_PARAM_GATHER, 2, g->gather); /* progress the next layer's */
            if (g->outer_turns) comm_gather_test(g->stats, COMM_PARAM_GATHER, 1, &g->outer_gather); /* and the tail's */
        }
        break;
    case LLAMA_HOOK_BEFORE_HEAD:
        if (z3 && g->outer_turns) {
            comm_gather_wait(g->stats, COMM_PARAM_GATHER, 1, &g->outer_gather);
            bind_outer_at(g, &m->w, NULL, g->p_outer);
        }
        break;
    case LLAMA_HOOK_AFTER_HEAD:
        if (backward && g->outer_turns) { /* the tail's gradient is final: reduced while the layers run */
            unit_reduce_post(g, tail, g->grad_outer);
            bind_outer_at(g, &m->g, NULL, NULL);
        }
        if (z3 && g->outer_turns) bind_outer_at(g, &m->w, NULL, NULL);
        break;
    case LLAMA_HOOK_BEFORE_EMBEDDING_BACKWARD:
        if (g->outer_turns) { /* the buffer is the embedding's once the tail's reduce-scatter is done */
            comm_rs_wait(g->stats, COMM_GRAD_REDUCE, 1, &g->rs[tail]);
            acc_finish(g);
            memset(g->grad_outer, 0, sizeof(float) * E);
            bind_outer_at(g, &m->g, g->grad_outer, NULL);
        }
        break;
    case LLAMA_HOOK_BEFORE_BACKWARD: {
        if (z3) gather_use(g, m, 2 * (g->n_units - 2) - 1 - layer, layer);
        int s = layer % 2; /* the slot's previous reduce-scatter (layer + 2) must be done */
        if (g->slot_unit[s] >= 0) comm_rs_wait(g->stats, COMM_GRAD_REDUCE, 1, &g->rs[g->slot_unit[s]]);
        g->slot_unit[s] = -1;
        acc_finish(g);
        memset(g->grad_slot[s], 0, sizeof(float) * unit_size(g, 1 + layer));
        bind_layer(g, &m->g.layers[layer], g->grad_slot[s], layer);
        break;
    }
    case LLAMA_HOOK_AFTER_BACKWARD: {
        int s = layer % 2;
        unit_reduce_post(g, 1 + layer, g->grad_slot[s]);
        g->slot_unit[s] = 1 + layer;
        bind_layer(g, &m->g.layers[layer], NULL, layer);
        if (z3) {
            bind_layer(g, &m->w.layers[layer], NULL, layer);
            comm_gather_test(g->stats, COMM_PARAM_GATHER, 2, g->gather);
        }
        comm_rs_test(g->stats, COMM_GRAD_REDUCE, g->n_units, g->rs); /* progress the ones in flight */
        acc_finish(g);
        break;
    }
    case LLAMA_HOOK_END:
        if (backward) {
            if (!g->outer_turns) unit_reduce_post(g, tail, g->grad_outer + E);
            unit_reduce_post(g, 0, g->grad_outer);
            comm_rs_wait(g->stats, COMM_GRAD_REDUCE, g->n_units, g->rs);
            if (g->outer_turns) bind_outer_at(g, &m->g, NULL, NULL);
            g->slot_unit[0] = g->slot_unit[1] = -1;
            acc_finish(g); /* every one is complete */
            g->micro++;
            g->reduced = 1;
        }
        if (z3) {
            bind_outer(g, &m->w, NULL);
            xfree(g->p_outer);
            g->p_outer = NULL;
        }
        break;
    }
}

void grad_sync_attach(GradSync *g, LlamaModel *m) {
    if (g->zero < 2 || !g->counts) return;
    const ParamTable *t = &m->table;
    const int nL = m->cfg.num_hidden_layers, per = llama_layer_tensors(&m->cfg);
    if (t->total != g->total || nL < 1 || t->n != 2 + per * nL + !m->cfg.tie_word_embeddings)
        die("internal: grad_sync_attach: the table does not match the model");
    for (int i = 1; i < t->n; i++) /* every tensor follows the previous one: units are ranges */
        if (t->t[i].offset != t->t[i - 1].offset + t->t[i - 1].numel)
            die("internal: the parameter table has a gap before %s", t->t[i].name);
    g->model = m;
    g->n_units = nL + 2;
    g->unit_begin = xmalloc(sizeof(size_t) * (size_t)g->n_units);
    g->unit_end = xmalloc(sizeof(size_t) * (size_t)g->n_units);
    /* the table's order: embed, per tensors per layer, final norm, [lm_head] */
    g->unit_begin[0] = 0;
    g->unit_end[0] = t->t[1].offset;
    size_t max_layer = 0;
    for (int l = 0; l < nL; l++) {
        const ParamTensor *last = &t->t[per + per * l];
        g->unit_begin[1 + l] = t->t[1 + per * l].offset;
        g->unit_end[1 + l] = last->offset + last->numel;
        max_layer = max_sz(max_layer, g->unit_end[1 + l] - g->unit_begin[1 + l]);
    }
    g->unit_begin[nL + 1] = t->t[1 + per * nL].offset;
    g->unit_end[nL + 1] = t->total;
    g->unit_counts = xmalloc(sizeof(size_t) * (size_t)g->n_units * (size_t)g->size);
    g->unit_displs = xmalloc(sizeof(size_t) * (size_t)g->size);
    for (int u = 0; u < g->n_units; u++)
        for (int p = 0; p < g->size; p++) {
            size_t sb = g->displs[p], se = sb + g->counts[p];
            size_t b = max_sz(g->unit_begin[u], sb), e = min_sz(g->unit_end[u], se);
            g->unit_counts[(size_t)u * (size_t)g->size + (size_t)p] = e > b ? e - b : 0;
        }
    g->rs = xcalloc((size_t)g->n_units, sizeof *g->rs); /* none in flight */
    g->slot_unit[0] = g->slot_unit[1] = -1;
    for (int k = 0; k < 4; k++) g->acc_unit[k] = -1;

    /* gradients: the flat buffer goes; the embedding and tail get their own buffer, layers use
     * two slots in turn (one being reduce-scattered while the next is produced) */
    g->outer_turns = !m->cfg.tie_word_embeddings;
    size_t n = g->shard_end - g->shard_begin;
    g->grad_outer = xmalloc(sizeof(float) * outer_floats(g));
    g->grad_slot[0] = xmalloc(sizeof(float) * max_layer);
    g->grad_slot[1] = xmalloc(sizeof(float) * max_layer);
    xfree(m->grads);
    m->grads = NULL;
    if (g->outer_turns) bind_outer_at(g, &m->g, NULL, NULL); /* bound at their turns */
    else bind_outer(g, &m->g, g->grad_outer);
    for (int l = 0; l < nL; l++) bind_layer(g, &m->g.layers[l], NULL, l);
    if (g->zero == 3) { /* parameters: this rank's shard, two gathered layers, the outer units per micro-batch */
        if (g->offload && optimizer_offload_master(g->offload)) { /* the shard to the file (--offload-master) */
            optimizer_offload_write(g->offload, 2, 0, n, m->params + g->shard_begin);
        } else {
            g->p_shard = xmalloc(sizeof(float) * (n + 1));
            memcpy(g->p_shard, m->params + g->shard_begin, sizeof(float) * n);
        }
        for (int i = 0; i < 2; i++) g->p_layer[i] = xmalloc(sizeof(float) * max_layer); /* gathers: none in flight */
        xfree(m->params);
        m->params = NULL;
        bind_outer(g, &m->w, NULL);
        for (int l = 0; l < nL; l++) bind_layer(g, &m->w.layers[l], NULL, l);
    }
    g->hooks.fn = zero_hook;
    g->hooks.ctx = g;
    m->hooks = &g->hooks;
}

void grad_sync_microbatch(GradSync *g, int index) {
    if (index == 0) g->micro = 0, g->reduced = 0;
    if (g->micro == 0 || g->acc_tmp[0] || g->acc_whole || !g->model) return;
    /* a later micro-batch: the temporaries of the units' own parts (acc_slot), made once; or one
     * of the whole shard (each unit's part at its place) where that is not
     * more (a few ranks: one unit can be most of a shard) */
    size_t n[4] = {0, 0, 0, 0}, sum = 0, shard = g->shard_end - g->shard_begin;
    for (int u = 0; u < g->n_units; u++) {
        const int k = acc_slot(g, u);
        n[k] = max_sz(n[k], g->unit_counts[(size_t)u * (size_t)g->size + (size_t)g->rank]);
    }
    n[1] = n[0] = max_sz(n[0], n[1]); /* the layers' two slots alike */
    for (int k = 0; k < 4; k++) sum += k < 3 || !g->outer_turns ? n[k] + 1 : 0;
    if (sum >= shard + 1) {
        g->acc_whole = xmalloc(sizeof(float) * (shard + 1));
        return;
    }
    for (int k = 0; k < 4; k++)
        if (k < 3 || !g->outer_turns) g->acc_tmp[k] = xmalloc(sizeof(float) * (n[k] + 1));
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
        comm_reduce_scatter(g->stats, COMM_GRAD_REDUCE, grads, g->shard_buf, g->counts, g->shard_comm);
    } else if (!g->model || !g->reduced) {
        die("internal: --zero %d: the gradient was not reduced in backward (grad_sync_attach and "
            "grad_sync_microbatch not called)", g->zero);
    }
    g->reduced = 0;
    if (g->n_groups > 1) /* the replicas of this shard in the other groups */
        comm_allreduce(g->stats, COMM_GRAD_REDUCE, MPI_IN_PLACE, g->shard_buf, n, MPI_FLOAT, MPI_SUM, g->cross_comm);
    if (g->zero == 1) memcpy(grads + g->shard_begin, g->shard_buf, sizeof(float) * n);
    double local = grad_norm_sq(g->shard_buf, n), global = local;
    if (g->size > 1)
        comm_allreduce(g->stats, COMM_GRAD_REDUCE, &local, &global, 1, MPI_DOUBLE, MPI_SUM, g->shard_comm);
    return global;
}

void grad_sync_update(GradSync *g, AdamW *opt, LlamaModel *m, float lr, float grad_scale) {
    float *params = m->params;
    size_t params_base = 0, grads_base = 0;
    const float *grads = m->grads;
    if (g->zero >= 2 && g->model) {
        grads = g->shard_buf;
        grads_base = g->shard_begin;
        if (g->p_shard) params = g->p_shard, params_base = g->shard_begin;
    }
    if (g->offload)
        optimizer_offload_update(g->offload, opt, &m->table, params, params_base, grads, grads_base, lr, grad_scale);
    else
        adamw_update_at(opt, &m->table, params, params_base, grads, grads_base, lr, grad_scale);
    if (g->zero >= 1 && g->zero <= 2) grad_sync_gather_full(g, m->params);
}

float *grad_sync_grads_to_root(GradSync *g, LlamaModel *m) {
    if (!m->grads) die("internal: grad_sync_grads_to_root under ZeRO-2/3: fetch the shards (grad_sync_fetch)");
    if (g->zero == 1) grad_sync_gather_full(g, m->grads); /* whole (zero 0) or sharded (zero 1) */
    return g->world_rank == 0 ? m->grads : NULL;
}

void grad_sync_gather_full(GradSync *g, float *buf) {
    if (!g->zero || !g->counts || g->size == 1) return;
    comm_allgatherv(g->stats, COMM_PARAM_GATHER, MPI_IN_PLACE, g->counts[g->rank], buf, g->counts, g->displs,
                    MPI_FLOAT, g->shard_comm);
}


/* ---------------------------------------------------------------- streaming a save */

typedef struct {
    int64_t array; /* -1: done */
    int64_t first, n;
} FetchRequest;

int grad_sync_streams(const GradSync *g) { return g->zero >= 1 && g->counts && g->size > 1; }

/* Group rank p's part of [first, first + n): count and offset in the piece. */
static void piece_part(const GradSync *g, int p, size_t first, size_t n, size_t *count, size_t *at) {
    const size_t b = max_sz(g->displs[p], first), e = min_sz(g->displs[p] + g->counts[p], first + n);
    *count = e > b ? e - b : 0;
    *at = e > b ? b - first : 0;
}

/* Elements [first, first + n) of array a (first an absolute offset inside the shard): a pointer into
 * it in RAM, else read from the offload file into *scratch (grown to n). */
static const float *shard_part(const ShardArray *a, size_t first, size_t n, const GradSync *g, float **scratch,
                               size_t *cap) {
    if (a->ram || !n) return a->ram ? a->ram + (first - g->shard_begin) : NULL;
    if (*cap < n) {
        xfree(*scratch);
        *scratch = xmalloc(sizeof(float) * n);
        *cap = n;
    }
    optimizer_offload_read(a->disk, a->moment, first - g->shard_begin, n, *scratch);
    return *scratch;
}

void grad_sync_fetch(GradSync *g, const ShardArray *arrays, int k, size_t first, size_t n, float *dst) {
    if (!grad_sync_streams(g)) { /* the root holds its group's whole range */
        if (arrays[k].ram) memcpy(dst, arrays[k].ram + (first - g->shard_begin), sizeof(float) * n);
        else optimizer_offload_read(arrays[k].disk, arrays[k].moment, first - g->shard_begin, n, dst);
        return;
    }
    FetchRequest r = {k, (int64_t)first, (int64_t)n};
    comm_control_bcast(g->stats, "MPI_Bcast (a save's next piece)", &r, sizeof r, 0, g->shard_comm);
    size_t *cnt = xmalloc(sizeof(size_t) * 2 * (size_t)g->size), *at = cnt + g->size;
    for (int p = 0; p < g->size; p++) piece_part(g, p, first, n, &cnt[p], &at[p]);
    float *scratch = NULL;
    size_t cap = 0;
    const float *mine = shard_part(&arrays[k], first + at[0], cnt[0], g, &scratch, &cap);
    comm_gatherv(g->stats, COMM_PARAM_GATHER, mine, cnt[0], dst, cnt, at, MPI_FLOAT, 0, g->shard_comm);
    xfree(scratch);
    xfree(cnt);
}

void grad_sync_fetch_done(GradSync *g) {
    if (!grad_sync_streams(g)) return;
    FetchRequest r = {-1, 0, 0};
    comm_control_bcast(g->stats, "MPI_Bcast (a save's end)", &r, sizeof r, 0, g->shard_comm);
}

void grad_sync_serve(GradSync *g, const ShardArray *arrays, int n_arrays) {
    if (!grad_sync_streams(g) || g->world_rank / g->group != 0) return; /* replicas: group 0 answers */
    float *scratch = NULL; /* the pieces read from the offload file */
    size_t cap = 0;
    for (;;) {
        FetchRequest r;
        comm_control_bcast(g->stats, "MPI_Bcast (a save's next piece, waiting for rank 0)", &r, sizeof r, 0,
                           g->shard_comm);
        if (r.array < 0) break;
        if (r.array >= n_arrays || r.first < 0 || r.n < 0) die("internal: grad_sync_serve: a bad request");
        size_t cnt, at;
        piece_part(g, g->rank, (size_t)r.first, (size_t)r.n, &cnt, &at);
        const float *mine = shard_part(&arrays[r.array], (size_t)r.first + at, cnt, g, &scratch, &cap);
        comm_gatherv(g->stats, COMM_PARAM_GATHER, mine, cnt, NULL, NULL, NULL, MPI_FLOAT, 0, g->shard_comm);
    }
    xfree(scratch);
}
