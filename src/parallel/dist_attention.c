/* The composition of the head exchange and a context schedule as one SeqAttention: see
 * dist_attention.h. */
#include "parallel/dist_attention.h"

#include <string.h>

#include "attention/flash_attention.h"
#include "core/common.h"

typedef struct {
    const Topology *t;
    Comm *comm;
    HeadExchange hx;
    ContextSchedule *sched;
    int S, N, n, Hl, Hk, d;
    int *all_pos;             /* (S) positions of the whole sp group, slot-major */
    int *all_doc;             /* (S) their document ids (packed sequences), same order */
    float *delta_loc;         /* (N, H) delta = rowsum(dout * o) of the local rows */
    float *dout_h, *delta, *dq_h, *dkv_h;
    AttnWork last;            /* work of the last forward / backward */
} Dist;

static size_t off_kv(const Dist *x) { return (size_t)x->n * x->Hl * x->d; }
static size_t off_lse(const Dist *x) { return off_kv(x) + 2 * (size_t)x->n * x->Hk * x->d; }
static size_t saved_total(const Dist *x) { return off_lse(x) + (size_t)x->n * x->Hl; }

static void dist_set_positions(SeqAttention *sa, const int *positions, const int *docs) {
    Dist *x = sa->ctx;
    const size_t bytes = sizeof(int) * (size_t)x->N;
    if (x->t->sp > 1) {
        comm_allgather_meta(x->comm, COMM_ALLTOALL, positions, x->all_pos, bytes, x->t->sp_comm);
        if (docs) comm_allgather_meta(x->comm, COMM_ALLTOALL, docs, x->all_doc, bytes, x->t->sp_comm);
    } else {
        memcpy(x->all_pos, positions, bytes);
        if (docs) memcpy(x->all_doc, docs, bytes);
    }
    x->sched->set_positions(x->sched, x->all_pos, docs ? x->all_doc : NULL);
}

static void dist_forward(SeqAttention *sa, const float *q, const float *k, const float *v, float *o, float *saved) {
    Dist *x = sa->ctx;
    float *q_h = saved, *kv_h = saved + off_kv(x), *lse_h = saved + off_lse(x);
    BlockAttn *b = x->sched->blocks;
    b->work.fwd_calls = b->work.fwd_cells = 0;
    b->window = sa->window;
    head_exchange_qkv(&x->hx, q, k, v, q_h, kv_h);
    /* the head-parallel output straight into the exchange's send buffer (idle until the exchange
     * back); with hp = 1 straight into o, whose layout it is */
    float *o_h = x->hx.split.hp == 1 ? o : head_exchange_out_buffer(&x->hx);
    x->sched->forward(x->sched, q_h, kv_h, o_h, lse_h);
    head_exchange_out(&x->hx, o_h, o);
    x->last.fwd_calls = b->work.fwd_calls;
    x->last.fwd_cells = b->work.fwd_cells;
}

static void dist_backward(SeqAttention *sa, const float *q, const float *k, const float *v, const float *o,
                          const float *saved, const float *dout, float *dq, float *dk, float *dv) {
    Dist *x = sa->ctx;
    (void)q, (void)k, (void)v; /* the strategy's own copies are in `saved` */
    if (!o) die("internal: %s: backward needs the forward's output o (the local rows)", sa->name);
    const float *q_h = saved, *kv_h = saved + off_kv(x), *lse_h = saved + off_lse(x);
    BlockAttn *b = x->sched->blocks;
    b->work.bwd_calls = b->work.bwd_cells = 0;
    b->window = sa->window;
    /* delta = rowsum(dO * O) where O lives (the local rows, every head; per row in double, so the
     * same values as from the head-parallel rows), carried by dout's exchange */
    double t0 = comm_compute_begin(x->comm);
    AttnShape st = {.n_q = x->N, .n_heads = x->hx.split.H, .head_dim = x->d};
    attn_backward_delta(&st, o, dout, x->delta_loc);
    comm_compute_end(x->comm, "delta", t0);
    head_exchange_dout_delta(&x->hx, dout, x->delta_loc, x->dout_h, x->delta);
    x->sched->backward(x->sched, q_h, kv_h, lse_h, x->delta, x->dout_h, x->dq_h, x->dkv_h);
    head_exchange_grads(&x->hx, x->dq_h, x->dkv_h, dq, dk, dv);
    x->last.bwd_calls = b->work.bwd_calls;
    x->last.bwd_cells = b->work.bwd_cells;
}

/* Selective checkpointing: q_h, kv_h by the forward's head exchange of the recomputed q, k, v.
 * Only lse_h is kept. */
static void dist_restore(SeqAttention *sa, const float *q, const float *k, const float *v, const float *o,
                         float *saved) {
    Dist *x = sa->ctx;
    (void)o;
    head_exchange_qkv(&x->hx, q, k, v, saved, saved + off_kv(x));
}

static void dist_set_piece_rows(SeqAttention *sa, int rows) {
    ((Dist *)sa->ctx)->sched->blocks->piece_rows = rows > 0 ? rows : 0;
}

static void dist_set_compute(SeqAttention *sa, int enabled) { ((Dist *)sa->ctx)->sched->blocks->compute = enabled != 0; }

static void dist_destroy(SeqAttention *sa) {
    if (!sa) return;
    Dist *x = sa->ctx;
    context_schedule_destroy(x->sched);
    head_exchange_free(&x->hx);
    xfree(x->all_pos);
    xfree(x->all_doc);
    xfree(x->delta_loc);
    xfree(x->dout_h);
    xfree(x->delta);
    xfree(x->dq_h);
    xfree(x->dkv_h);
    xfree(x);
    xfree(sa);
}

SeqAttention *dist_attention_create(const ScheduleInfo *schedule, const StrategyParams *p, const Topology *t,
                                    Comm *comm) {
    Dist *x = xcalloc(1, sizeof *x);
    x->t = t;
    x->comm = comm;
    x->S = (int)p->seq_len;
    x->N = x->S / t->sp;
    x->n = x->S / t->cp;
    x->d = p->head_dim;
    dist_attention_exchange_init(&x->hx, p, t, comm, x->N);
    x->Hl = x->hx.Hl;
    x->Hk = x->hx.Hk;
    ScheduleShape sh = {.topo = t, .comm = comm, .n = x->n, .heads = x->Hl, .kv_heads = x->Hk,
                        .head_dim = p->head_dim, .team = p->team, .layout = p->layout,
                        .wire = p->wire_bf16 ? COMM_WIRE_BF16 : COMM_WIRE_FP32};
    x->sched = schedule->create(&sh);
    if (p->attn_bf16) x->sched->blocks->precision = PRECISION_BF16; /* bf16 inputs: the kernel's bf16 tiles */
    const size_t n = (size_t)x->n, d = (size_t)x->d;
    x->all_pos = xmalloc(sizeof(int) * (size_t)x->S);
    x->all_doc = xmalloc(sizeof(int) * (size_t)x->S);
    x->delta_loc = xmalloc_aligned(sizeof(float) * (size_t)x->N * p->n_heads);
    x->dout_h = xmalloc_aligned(sizeof(float) * n * x->Hl * d);
    x->delta = xmalloc_aligned(sizeof(float) * n * x->Hl);
    x->dq_h = xmalloc_aligned(sizeof(float) * n * x->Hl * d);
    x->dkv_h = xmalloc_aligned(sizeof(float) * 2 * n * x->Hk * d);
    SeqAttention *sa = xcalloc(1, sizeof *sa);
    sa->name = schedule->name;
    sa->ctx = x;
    sa->heads = (AttnHeads){.n_local = x->N, .n_heads = p->n_heads, .n_kv_heads = p->n_kv_heads,
                            .head_dim = p->head_dim};
    sa->saved_floats = saved_total(x);
    sa->keeps_inputs = 1;
    sa->kept_floats = saved_total(x) - off_lse(x); /* lse_h */
    sa->bf16_floats = off_lse(x);                  /* q_h, kv_h: copies of q, k, v */
    sa->set_positions = dist_set_positions;
    sa->forward = dist_forward;
    sa->backward = dist_backward;
    sa->restore = dist_restore;
    sa->set_piece_rows = dist_set_piece_rows;
    sa->set_compute = dist_set_compute;
    sa->destroy = dist_destroy;
    return sa;
}

void dist_attention_exchange_init(HeadExchange *hx, const StrategyParams *p, const Topology *t, Comm *comm, int rows) {
    head_exchange_init(hx, comm, t->head_comm, t->hp, t->hp_rank, rows, p->n_heads, p->n_kv_heads, p->head_dim);
    if (p->wire_bf16) head_exchange_set_wire_bf16(hx);
}

void dist_attention_exchange_volume(const StrategyParams *p, const HeadSplit *hs, int hp_rank, long rows,
                                    int exchanges, int dout_delta, AttnVolume *v) {
    unsigned long long fb, bb, msgs;
    head_exchange_volume(hs, hp_rank, rows, p->head_dim, p->wire_bf16 ? 2 : 4, &fb, &bb, &msgs);
    if (dout_delta) bb += head_exchange_delta_bytes(hs, hp_rank, rows);
    const unsigned long long u = (unsigned long long)exchanges;
    v->fwd[COMM_ALLTOALL] = u * fb;
    v->bwd[COMM_ALLTOALL] = u * bb;
    v->fwd_msgs[COMM_ALLTOALL] = v->bwd_msgs[COMM_ALLTOALL] = u * msgs;
    /* the positions: N ints of every member to the sp - 1 others */
    const long sp = (long)p->hp * p->cp, N = p->seq_len / sp;
    v->meta_batch = 4ULL * (unsigned long long)N * (unsigned long long)(sp - 1);
}

void dist_attention_saved_view(const SeqAttention *sa, const float *saved, DistSavedView *v) {
    const Dist *x = sa->ctx;
    v->n_rows = x->n;
    v->heads = x->Hl;
    v->head_offset = x->hx.split.h0[x->hx.me];
    v->kv_heads = x->Hk;
    v->q = saved;
    v->k = saved + off_kv(x);
    v->v = v->k + (size_t)x->n * x->Hk * x->d;
    v->lse = saved + off_lse(x);
    v->positions = x->all_pos + (size_t)x->t->cp_rank * x->n;
}

void dist_attention_work(const SeqAttention *sa, AttnWork *w) { *w = ((const Dist *)sa->ctx)->last; }

void dist_attention_set_piece_rows(SeqAttention *sa, int rows) {
    if (sa->set_piece_rows) sa->set_piece_rows(sa, rows);
}

void dist_attention_set_compute(SeqAttention *sa, int enabled) {
    if (sa->set_compute) sa->set_compute(sa, enabled);
}
