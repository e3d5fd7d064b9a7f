/* All-gather context parallelism (the Llama 3 / TransformerEngine `all_gather` CP variant): the cp
 * ranks of a context group all-gather k|v (only the KV heads travel), every rank attends its own
 * queries to the whole gathered sequence, one slot's kv block at a time through block_attention
 * (the position rule skips future blocks, so zigzag balances the work), and in backward
 * accumulates dk|dv for the whole gathered sequence and reduce-scatters them (sum); dq stays
 * local. Any layout is exact.
 *
 * Communication (COMM_TEAM, ctx_comm): forward one all-gather of k|v; backward the same
 * all-gather again (the gathered kv is not kept between forward and backward: it would cost
 * 2 S Hk d floats per layer) and one reduce-scatter of dk|dv. Under --precision bf16 the
 * all-gathers carry bf16 (exact: k and v are bf16 values), the reduce-scatter fp32 (a sum).
 *
 * Not here: overlap of the all-gather with compute (Llama 3 overlaps it with other work; here it
 * is a blocking collective, its whole time counts as exposed wait), the head exchange. */
#include <stdio.h>
#include <string.h>

#include "attention/flash_attention.h"
#include "core/common.h"
#include "strategies/registry.h"

static int kv_heads_held(const StrategyParams *p) {
    int hp = p->hp > 0 ? p->hp : 1;
    return (p->n_kv_heads > hp ? p->n_kv_heads : hp) / hp;
}

/* floats of one slot's k|v block */
static size_t kv_floats(const StrategyParams *p) {
    int cp = p->cp > 0 ? p->cp : 1;
    return 2 * (size_t)(p->seq_len / cp) * (size_t)kv_heads_held(p) * (size_t)p->head_dim;
}

static void allgather_volume(const StrategyParams *p, int cp_rank, AttnVolume *v) {
    (void)cp_rank; /* symmetric */
    memset(v, 0, sizeof *v);
    if (p->cp <= 1) return;
    const unsigned long long P = (unsigned)p->cp, kv = 4ULL * kv_floats(p);
    const unsigned long long kv_wire = p->wire_bf16 ? kv / 2 : kv;
    v->fwd[COMM_TEAM] = (P - 1) * kv_wire;             /* all-gather: my block to each peer */
    v->fwd_msgs[COMM_TEAM] = P - 1;
    v->bwd[COMM_TEAM] = (P - 1) * (kv_wire + kv);      /* all-gather again + reduce-scatter of dk|dv */
    v->bwd_msgs[COMM_TEAM] = 2 * (P - 1);
}

/* forward: the gathered k|v (cp blocks); backward: that plus dk|dv for all of it; the bf16 wire's
 * staging (my block and the gathered blocks in bf16: (cp + 1) blocks of half the size) */
static size_t allgather_workspace_floats(const StrategyParams *p) {
    if (p->cp <= 1) return 0;
    return 2 * (size_t)p->cp * kv_floats(p) + (p->wire_bf16 ? ((size_t)p->cp + 1) * kv_floats(p) / 2 : 0);
}

static char *allgather_check(const StrategyParams *p) {
    char buf[512];
    const int hp = p->hp > 0 ? p->hp : 1;
    if (p->cp < 1) {
        snprintf(buf, sizeof buf, "allgather needs --cp of at least 1 (got %d)", p->cp);
        return xstrdup(buf);
    }
    return layout_split_error(p->layout, p->seq_len, hp, p->cp);
}

typedef struct {
    Comm *comm;
    MPI_Comm mc;
    int P, r, n, H, Hk, d;
    CommWire wire;  /* of the all-gathers */
    size_t kvf, qf; /* floats of one k|v block, of the q block */
    ScheduleCore core; /* block compute; core.slot[c]: slot c's rows */
    float *kv_all;  /* (P, 2, n, Hk, d): slot c's k|v at c kvf */
    float *dkv_all; /* same shape: dk|dv of every slot, before the reduce-scatter */
} AgCtx;

static AgCtx *ag_of(ContextSchedule *s) { return (AgCtx *)s->ctx; }

static void ag_set_positions(ContextSchedule *s, const int *all_pos, const int *all_doc) {
    schedule_core_set_positions(&ag_of(s)->core, all_pos, all_doc);
}

/* The gathered k|v of every slot (my own without a copy when P = 1). */
static const float *gather_kv(AgCtx *x, const float *kv) {
    if (x->P == 1) return kv;
    comm_allgather_floats(x->comm, COMM_TEAM, kv, x->kv_all, x->kvf, x->wire, x->mc);
    return x->kv_all;
}

/* Slots in the order a rank visits them: its own first, then the others. */
static int slot_at(const AgCtx *x, int i) { return (x->r + i) % x->P; }

static void ag_forward(ContextSchedule *s, const float *q, const float *kv, float *o, float *lse) {
    AgCtx *x = ag_of(s);
    AttnShape st = {.n_q = x->n, .n_heads = x->H, .head_dim = x->d};
    attn_state_init(&st, o, lse);
    const float *all = gather_kv(x, kv);
    const size_t half = x->kvf / 2;
    for (int i = 0; i < x->P; i++) {
        int c = slot_at(x, i);
        const float *k = all + (size_t)c * x->kvf;
        block_attn_forward(&x->core.ba, q, &x->core.slot[x->r], k, k + half, &x->core.slot[c], o, lse, NULL);
    }
}

static void ag_backward(ContextSchedule *s, const float *q, const float *kv, const float *lse, const float *delta,
                        const float *dout, float *dq, float *dkv) {
    AgCtx *x = ag_of(s);
    const float *all = gather_kv(x, kv);
    float *dall = x->P == 1 ? dkv : x->dkv_all;
    const size_t half = x->kvf / 2;
    double t0 = comm_compute_begin(x->comm);
    memset(dq, 0, sizeof(float) * x->qf);
    memset(dall, 0, sizeof(float) * x->kvf * (size_t)x->P);
    comm_compute_end(x->comm, "zero grads", t0);
    for (int i = 0; i < x->P; i++) {
        int c = slot_at(x, i);
        const float *k = all + (size_t)c * x->kvf;
        float *dk = dall + (size_t)c * x->kvf;
        block_attn_backward(&x->core.ba, q, &x->core.slot[x->r], k, k + half, &x->core.slot[c], lse, delta, dout, dq,
                            dk, dk + half, NULL);
    }
    if (x->P > 1)
        comm_reduce_scatter_block(x->comm, COMM_TEAM, x->dkv_all, dkv, x->kvf, x->mc);
}

static void ag_destroy(ContextSchedule *s) {
    AgCtx *x = ag_of(s);
    xfree(x->kv_all);
    xfree(x->dkv_all);
    schedule_core_free(&x->core);
    xfree(x);
    xfree(s);
}

static ContextSchedule *allgather_create(const ScheduleShape *sh) {
    const Topology *t = sh->topo;
    AgCtx *x = xcalloc(1, sizeof *x);
    x->comm = sh->comm;
    x->mc = t->ctx_comm;
    x->P = t->cp;
    x->r = t->cp_rank;
    x->n = sh->n;
    x->H = sh->heads;
    x->Hk = sh->kv_heads;
    x->d = sh->head_dim;
    x->wire = sh->wire;
    x->kvf = 2 * (size_t)sh->n * (size_t)sh->kv_heads * (size_t)sh->head_dim;
    x->qf = (size_t)sh->n * (size_t)sh->heads * (size_t)sh->head_dim;
    schedule_core_init(&x->core, sh);
    if (x->P > 1) {
        x->kv_all = xmalloc_aligned(sizeof(float) * x->kvf * (size_t)x->P);
        x->dkv_all = xmalloc_aligned(sizeof(float) * x->kvf * (size_t)x->P);
    }
    static const ContextSchedule OPS = {.set_positions = ag_set_positions, .forward = ag_forward,
                                        .backward = ag_backward, .destroy = ag_destroy};
    return schedule_core_new(&OPS, x, &x->core);
}

/* The schedule ag_forward / ag_backward run: a blocking all-gather of k|v, then each rank's
 * queries against every slot (its own first); backward the all-gather again, the blocks, and the
 * reduce-scatter of dk|dv (each rank sends every other the sum's share it owns: one fp32 block). */
static void allgather_play(const StrategyParams *p, SchedulePass pass, StepSchedule *out) {
    const int P = p->cp, bwd = pass == PASS_BACKWARD;
    const unsigned long long kv = 4ULL * kv_floats(p), kv_wire = p->wire_bf16 ? kv / 2 : kv;
    SlotBlocks sb;
    slot_blocks_init(&sb, p->layout, p->seq_len, P);
    if (P > 1) {
        schedule_step(out, "all-gather k|v");
        for (int r = 0; r < P; r++)
            for (int c = 0; c < P; c++)
                if (c != r) schedule_message(out, COMM_TEAM, r, c, kv_wire, 1);
    }
    schedule_step(out, bwd ? "attention backward, every slot" : "attention, every slot");
    for (int r = 0; r < P; r++)
        for (int i = 0; i < P; i++)
            schedule_compute(out, r, p->n_heads, kv_heads_held(p), &sb.slot[r], &sb.slot[(r + i) % P], p->window);
    if (bwd && P > 1) {
        schedule_step(out, "reduce-scatter dk|dv");
        for (int r = 0; r < P; r++)
            for (int c = 0; c < P; c++)
                if (c != r) schedule_message(out, COMM_TEAM, r, c, kv, 1);
    }
    slot_blocks_free(&sb);
}

static const ScheduleInfo allgather_schedule = {
    .name = "allgather",
    .play = allgather_play,
    .check = allgather_check,
    .create = allgather_create,
    .volume = allgather_volume,
    .workspace_floats = allgather_workspace_floats,
};

const Strategy allgather_strategy = {
    .name = "allgather",
    .title = "all-gather context parallelism",
    .summary = "all-gather context parallelism (Llama 3 / TransformerEngine all_gather CP): all-gather k|v, "
               "reduce-scatter dk|dv",
    .flags = "--hp --cp --layout",
    .constraints = "any cp; any layout (zigzag balances the causal work); seq-len divisible by hp x cp (zigzag: also by "
                   "2 cp)",
    .grid = GRID_CONTEXT,
    .default_layout = LAYOUT_ZIGZAG,
    .schedule = &allgather_schedule,
};
