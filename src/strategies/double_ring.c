/* LoongTrain's Double-Ring-Attention as a context schedule (paper 000 §4.3-4.5, Alg. 2): the cp
 * ranks of a context group form cp / W inner rings ("windows") of W consecutive members; the
 * outer ring connects the windows. W = cp is the plain ring of Ring-Attention (Megatron CP), so
 * with the head exchange this one schedule gives LoongTrain 2D attention, DeepSpeed-Ulysses
 * (cp = 1) and Ring-Attention (hp = 1).
 *
 * Forward, R = cp / W outer steps: post the outer transfer of the window's starting KV to the
 * same member of the next window, then W inner steps (the next KV block in flight while the
 * current one computes), then wait for the outer transfer.
 * Backward: KV travels the same route again; the dK/dV accumulators travel with it: inside a
 * window the accumulator follows its KV around the inner ring and makes the W-th hop back to the
 * window's starting member, which adds the partial sum of the earlier windows (received over the
 * outer ring while it computed) and sends the total to the same member of the next window; after
 * the last window this hop lands on the owner. dQ accumulates locally.
 *
 * Bytes each rank sends per layer, Size(kv) = 8 n Hk d (k and v of a slot, fp32), Size16(kv) the
 * same on the bf16 wire (4 n Hk d: KV blocks only; dK/dV accumulators stay fp32):
 *   forward  p2p_inner R (W-1) Size16(kv),  p2p_outer Size16(kv)
 *   backward p2p_inner [R (W-1) Size16(kv) + (W>1) R W Size(kv)],
 *            p2p_outer [(R-1) Size16(kv) + (R>1) R Size(kv)]
 * (LoongTrain §4.5.3-4.5.4 with 4-byte elements; Size16 = Size in fp32). Messages: one per
 * transfer.
 *
 * Sliding windows: the plain ring (R = 1) runs only the steps at which some member's queries can
 * see the KV block it then holds (ring_steps: at step s member c holds slot c - s; with the
 * contiguous layout and a window of w tokens over slots of n, 1 + ceil((w - 1) / n) steps of cp),
 * so the KV blocks no window reaches are never sent; in backward each dK/dV accumulator then makes
 * its last hop straight back to the block's owner, steps - 1 members back (the next member when
 * every step runs). Then forward p2p_inner is (steps - 1) Size16(kv), backward (steps - 1)
 * Size16(kv) + (steps > 1) steps Size(kv). The rule reads the runs' spans (pos_blocks_meet), so
 * a striped slot (one run across the sequence) runs every step; so does the double ring (R > 1). */
#include <stddef.h>
#include <string.h>

#include "attention/flash_attention.h"
#include "core/common.h"
#include "strategies/double_ring.h"

/* Message tags: forward KV, backward KV and backward dK/dV never share a tag. */
enum {
    TAG_FWD_KV_INNER = 101,
    TAG_FWD_KV_OUTER = 102,
    TAG_BWD_KV_INNER = 201,
    TAG_BWD_KV_OUTER = 202,
    TAG_BWD_DKV_INNER = 203,
    TAG_BWD_DKV_OUTER = 204,
    TAG_BWD_DKV_HOME = 205, /* the inner ring's last dK/dV hop, back to the block's owner */
};

typedef struct {
    ScheduleCore core;    /* block compute; core.slot[c]: positions and runs of slot c */
    const Topology *t;
    Comm *comm;
    int n, Hl, Hk, d, cp, W, R;
    CommWire wire;        /* of the KV blocks (their gradients travel in fp32) */
    float *kvbuf[4];      /* outer receive x2, inner rotation x2: (2 n Hk d) each */
    float *dkv_l[2], *dkv_in, *dkv_wp[2], *dkv_or, *dkv_final;
} DoubleRing;

/* The requests of one ring step, by name. */
typedef struct {
    MPI_Request kv_send, kv_recv;          /* inner ring: KV to next, from previous */
    MPI_Request outer_send, outer_recv;    /* outer ring: the window's starting KV */
    MPI_Request dkv_send, dkv_recv;        /* inner ring: dK/dV accumulator to next, from previous */
    MPI_Request dkv_outer_send, dkv_outer_recv; /* outer ring: partial dK/dV of earlier windows */
    MPI_Request dkv_home;                  /* inner ring: the window's dK/dV coming back to its start */
} RingRequests;

static void ring_requests_init(RingRequests *r) {
    MPI_Request *a = (MPI_Request *)r;
    for (size_t i = 0; i < sizeof *r / sizeof *a; i++) a[i] = MPI_REQUEST_NULL;
}

static int inner_next(const DoubleRing *x) { return (x->t->inner_rank + 1) % x->W; }
static int inner_prev(const DoubleRing *x) { return (x->t->inner_rank + x->W - 1) % x->W; }
static int outer_next(const DoubleRing *x) { return (x->t->outer_rank + 1) % x->R; }
static int outer_prev(const DoubleRing *x) { return (x->t->outer_rank + x->R - 1) % x->R; }

/* Context slot whose KV this rank holds at outer step j, inner step s. */
static int kv_owner(const DoubleRing *x, int j, int s) {
    int o = (x->t->outer_rank - j % x->R + x->R) % x->R, i = (x->t->inner_rank - s % x->W + x->W) % x->W;
    return o * x->W + i;
}

/* The inner steps a ring of W members runs (R outer steps): W, or for the plain ring (R = 1) under
 * a window, 1 + the last step s at which some member c's queries may see slot c - s (slots: the
 * cp context slots' positions). */
static int ring_steps(const PosBlock *slots, int cp, int W, int R, int window) {
    if (R > 1 || window <= 0) return W;
    for (int s = W - 1; s > 0; s--)
        for (int c = 0; c < cp; c++)
            if (pos_blocks_meet(&slots[c], &slots[(c - s + cp) % cp], window)) return s + 1;
    return 1;
}

/* Post a KV transfer of `count` floats (send to next, receive from previous) on one ring. */
static void post_pair(DoubleRing *x, CommKind kind, const float *send, float *recv, size_t count, int next, int prev,
                      int tag, MPI_Comm mc, MPI_Request *rs, MPI_Request *rr) {
    comm_isend_floats(x->comm, kind, send, count, x->wire, next, tag, mc, rs);
    comm_irecv_floats(x->comm, kind, recv, count, x->wire, prev, tag, mc, rr);
}

static void dr_set_positions(ContextSchedule *s, const int *all_pos, const int *all_doc) {
    schedule_core_set_positions(&((DoubleRing *)s->ctx)->core, all_pos, all_doc);
}

static void dr_forward(ContextSchedule *s, const float *q, const float *kv, float *o, float *lse) {
    DoubleRing *x = s->ctx;
    const int n = x->n, Hk = x->Hk, d = x->d, W = x->W, R = x->R;
    const size_t half = (size_t)n * Hk * d, kv_floats = 2 * half;
    const Topology *t = x->t;
    AttnShape st = {.n_q = n, .n_heads = x->Hl, .head_dim = d};
    attn_state_init(&st, o, lse);
    RingRequests rq;
    ring_requests_init(&rq);
    Progress pr = {(MPI_Request *)&rq, sizeof rq / sizeof(MPI_Request), W > 1 ? COMM_P2P_INNER : COMM_P2P_OUTER};
    const PosBlock *mine = &x->core.slot[t->cp_rank];
    const int steps = ring_steps(x->core.slot, x->cp, W, R, x->core.ba.window);
    const float *kv_start = kv;
    for (int j = 0; j < R; j++) {
        if (j < R - 1)
            post_pair(x, COMM_P2P_OUTER, kv_start, x->kvbuf[j % 2], kv_floats, outer_next(x), outer_prev(x),
                      TAG_FWD_KV_OUTER, t->outer_comm, &rq.outer_send, &rq.outer_recv);
        const float *cur = kv_start;
        for (int step = 0; step < steps; step++) {
            float *nxt = x->kvbuf[2 + step % 2];
            if (step < steps - 1)
                post_pair(x, COMM_P2P_INNER, cur, nxt, kv_floats, inner_next(x), inner_prev(x), TAG_FWD_KV_INNER,
                          t->inner_comm, &rq.kv_send, &rq.kv_recv);
            block_attn_forward(&x->core.ba, q, mine, cur, cur + half, &x->core.slot[kv_owner(x, j, step)], o, lse, &pr);
            if (step < steps - 1) {
                comm_waitall(x->comm, COMM_P2P_INNER, 2, &rq.kv_send);
                cur = nxt;
            }
        }
        if (j < R - 1) {
            comm_waitall(x->comm, COMM_P2P_OUTER, 2, &rq.outer_send);
            kv_start = x->kvbuf[j % 2];
        }
    }
}

static void add_into(Comm *cm, float *dst, const float *src, size_t count) {
    double t0 = comm_compute_begin(cm);
    for (size_t i = 0; i < count; i++) dst[i] += src[i];
    comm_compute_end(cm, "add dkv", t0);
}

static void dr_backward(ContextSchedule *s, const float *q, const float *kv, const float *lse, const float *delta,
                        const float *dout, float *dq, float *dkv) {
    DoubleRing *x = s->ctx;
    const int n = x->n, Hl = x->Hl, Hk = x->Hk, d = x->d, W = x->W, R = x->R;
    const size_t half = (size_t)n * Hk * d, kv_floats = 2 * half, kv_bytes = sizeof(float) * kv_floats;
    Comm *cm = x->comm;
    const Topology *t = x->t;
    memset(dq, 0, sizeof(float) * (size_t)n * Hl * d);
    RingRequests rq;
    ring_requests_init(&rq);
    Progress pr = {(MPI_Request *)&rq, sizeof rq / sizeof(MPI_Request), W > 1 ? COMM_P2P_INNER : COMM_P2P_OUTER};
    const PosBlock *mine = &x->core.slot[t->cp_rank];
    /* the inner steps (ring_steps), and where each accumulator's last hop goes to and comes from:
     * the owner of the block held at the last step, steps - 1 members back (the next member when
     * all W steps run), and the member holding my block then, steps - 1 ahead (the previous one) */
    const int steps = ring_steps(x->core.slot, x->cp, W, R, x->core.ba.window);
    const int home_to = (t->inner_rank - (steps - 1) + W) % W, home_from = (t->inner_rank + steps - 1) % W;
    const float *kv_start = kv;
    for (int j = 0; j < R; j++) {
        float *wp = x->dkv_wp[j % 2];
        if (j < R - 1)
            post_pair(x, COMM_P2P_OUTER, kv_start, x->kvbuf[j % 2], kv_floats, outer_next(x), outer_prev(x),
                      TAG_BWD_KV_OUTER, t->outer_comm, &rq.outer_send, &rq.outer_recv);
        if (R > 1 && j >= 1) /* partial dkv of earlier windows for this step's starting KV */
            comm_irecv(cm, COMM_P2P_OUTER, x->dkv_or, kv_bytes, outer_prev(x), TAG_BWD_DKV_OUTER, t->outer_comm,
                       &rq.dkv_outer_recv);
        const float *cur = kv_start;
        for (int step = 0; step < steps; step++) {
            float *nxt = x->kvbuf[2 + step % 2];
            float *L = x->dkv_l[step % 2];
            if (step < steps - 1)
                post_pair(x, COMM_P2P_INNER, cur, nxt, kv_floats, inner_next(x), inner_prev(x), TAG_BWD_KV_INNER,
                          t->inner_comm, &rq.kv_send, &rq.kv_recv);
            if (steps > 1 && step >= 1)
                comm_irecv(cm, COMM_P2P_INNER, x->dkv_in, kv_bytes, inner_prev(x), TAG_BWD_DKV_INNER, t->inner_comm,
                           &rq.dkv_recv);
            if (steps > 1 && step == steps - 1) /* my block's total, from its last holder */
                comm_irecv(cm, COMM_P2P_INNER, wp, kv_bytes, home_from, TAG_BWD_DKV_HOME, t->inner_comm,
                           &rq.dkv_home);
            double t0 = comm_compute_begin(cm);
            memset(L, 0, kv_bytes);
            comm_compute_end(cm, "zero dkv", t0);
            block_attn_backward(&x->core.ba, q, mine, cur, cur + half, &x->core.slot[kv_owner(x, j, step)], lse,
                                delta, dout, dq, L, L + half, &pr);
            if (steps > 1) {
                if (step >= 1) {
                    comm_waitall(cm, COMM_P2P_INNER, 1, &rq.dkv_recv);
                    add_into(cm, L, x->dkv_in, kv_floats);
                }
                comm_waitall(cm, COMM_P2P_INNER, 1, &rq.dkv_send); /* the previous send (other L buffer) */
                if (step < steps - 1) /* on with its KV block */
                    comm_isend(cm, COMM_P2P_INNER, L, kv_bytes, inner_next(x), TAG_BWD_DKV_INNER, t->inner_comm,
                               &rq.dkv_send);
                else /* the last hop: home to the block's owner */
                    comm_isend(cm, COMM_P2P_INNER, L, kv_bytes, home_to, TAG_BWD_DKV_HOME, t->inner_comm,
                               &rq.dkv_send);
            }
            if (step < steps - 1) {
                comm_waitall(cm, COMM_P2P_INNER, 2, &rq.kv_send);
                cur = nxt;
            }
        }
        /* the window's partial dkv for this step's starting KV */
        if (steps > 1) {
            comm_waitall(cm, COMM_P2P_INNER, 1, &rq.dkv_home);
            comm_waitall(cm, COMM_P2P_INNER, 1, &rq.dkv_send);
        } else {
            memcpy(wp, x->dkv_l[0], kv_bytes);
        }
        if (R > 1) {
            if (j >= 1) {
                comm_waitall(cm, COMM_P2P_OUTER, 1, &rq.dkv_outer_recv);
                add_into(cm, wp, x->dkv_or, kv_floats);
            }
            if (j == R - 1) /* the total for my own KV, from the last window's starting member */
                comm_irecv(cm, COMM_P2P_OUTER, x->dkv_final, kv_bytes, outer_prev(x), TAG_BWD_DKV_OUTER,
                           t->outer_comm, &rq.dkv_outer_recv);
            comm_waitall(cm, COMM_P2P_OUTER, 1, &rq.dkv_outer_send);
            comm_isend(cm, COMM_P2P_OUTER, wp, kv_bytes, outer_next(x), TAG_BWD_DKV_OUTER, t->outer_comm,
                       &rq.dkv_outer_send);
        } else {
            memcpy(x->dkv_final, wp, kv_bytes);
        }
        if (j < R - 1) {
            comm_waitall(cm, COMM_P2P_OUTER, 2, &rq.outer_send);
            kv_start = x->kvbuf[j % 2];
        }
    }
    if (R > 1) comm_waitall(cm, COMM_P2P_OUTER, 2, &rq.dkv_outer_send);
    memcpy(dkv, x->dkv_final, kv_bytes);
}

static void dr_destroy(ContextSchedule *s) {
    DoubleRing *x = s->ctx;
    for (int i = 0; i < 4; i++) xfree(x->kvbuf[i]);
    for (int i = 0; i < 2; i++) {
        xfree(x->dkv_l[i]);
        xfree(x->dkv_wp[i]);
    }
    xfree(x->dkv_in);
    xfree(x->dkv_or);
    xfree(x->dkv_final);
    schedule_core_free(&x->core);
    xfree(x);
    xfree(s);
}

static int ring_w(const StrategyParams *p) { return p->ring_inner > 0 ? p->ring_inner : p->cp; }

static ContextSchedule *dr_create(const ScheduleShape *sh) {
    DoubleRing *x = xcalloc(1, sizeof *x);
    x->t = sh->topo;
    x->comm = sh->comm;
    x->n = sh->n;
    x->Hl = sh->heads;
    x->Hk = sh->kv_heads;
    x->d = sh->head_dim;
    x->cp = sh->topo->cp;
    x->W = sh->topo->ring_inner > 0 ? sh->topo->ring_inner : x->cp;
    x->R = x->cp / x->W;
    x->wire = sh->wire;
    schedule_core_init(&x->core, sh);
    const size_t kv = 2 * (size_t)x->n * x->Hk * x->d;
    const int R = x->R, W = x->W;
    /* ring buffers only where the ring needs them: outer ones when R > 1, inner ones when W > 1 */
    for (int i = 0; i < 4; i++) x->kvbuf[i] = (i < 2 ? R > 1 : W > 1) ? xmalloc_aligned(sizeof(float) * kv) : NULL;
    x->dkv_l[0] = xmalloc_aligned(sizeof(float) * kv);
    x->dkv_l[1] = W > 1 ? xmalloc_aligned(sizeof(float) * kv) : NULL;
    x->dkv_in = W > 1 ? xmalloc_aligned(sizeof(float) * kv) : NULL;
    x->dkv_wp[0] = xmalloc_aligned(sizeof(float) * kv);
    x->dkv_wp[1] = R > 1 ? xmalloc_aligned(sizeof(float) * kv) : NULL;
    x->dkv_or = R > 1 ? xmalloc_aligned(sizeof(float) * kv) : NULL;
    x->dkv_final = xmalloc_aligned(sizeof(float) * kv);
    static const ContextSchedule OPS = {.set_positions = dr_set_positions, .forward = dr_forward,
                                        .backward = dr_backward, .destroy = dr_destroy};
    return schedule_core_new(&OPS, x, &x->core);
}

static char *dr_check(const StrategyParams *p) {
    int W = ring_w(p);
    if (W < 1 || p->cp % W) {
        char buf[256];
        int len = snprintf(buf, sizeof buf, "--ring-inner %d does not divide --cp %d: use one of", W, p->cp);
        for (int w = 1; w <= p->cp && len < (int)sizeof buf - 16; w++)
            if (p->cp % w == 0) len += snprintf(buf + len, sizeof buf - (size_t)len, " %d", w);
        return xstrdup(buf);
    }
    return NULL;
}

/* Size(kv) of a slot: 8 n Hk d; Hk is the KV heads a head member holds (the same on every
 * member when hp divides the heads; the volume is per rank, so take the rank's own). */
/* ring_steps on the layout's positions (the slots' as set_positions will give them). The planner
 * asks for every rank of every configuration it weighs, each an O(S + W cp) pass: the last answer
 * is kept (a pure function of these five values; the planner runs on one thread). */
static int volume_steps(const StrategyParams *p) {
    const int W = ring_w(p), R = p->cp / W;
    if (R > 1 || p->window <= 0) return W;
    static struct { TokenLayout layout; long seq_len; int cp, W, window, steps; } last = {.steps = 0};
    if (last.steps && last.layout == p->layout && last.seq_len == p->seq_len && last.cp == p->cp && last.W == W &&
        last.window == p->window)
        return last.steps;
    SlotBlocks sb;
    slot_blocks_init(&sb, p->layout, p->seq_len, p->cp);
    const int steps = ring_steps(sb.slot, p->cp, W, R, p->window);
    slot_blocks_free(&sb);
    last.layout = p->layout, last.seq_len = p->seq_len, last.cp = p->cp, last.W = W, last.window = p->window;
    last.steps = steps;
    return steps;
}

static void dr_volume_for(const StrategyParams *p, int kv_heads, AttnVolume *v) {
    const unsigned long long W = (unsigned)ring_w(p), R = (unsigned)p->cp / W, S = (unsigned)volume_steps(p);
    const unsigned long long n = (unsigned long long)p->seq_len / (unsigned)p->cp;
    const unsigned long long size_kv = 8ULL * n * (unsigned)kv_heads * (unsigned)p->head_dim;
    const unsigned long long size_kv_wire = p->wire_bf16 ? size_kv / 2 : size_kv;
    const unsigned long long fi = R * (S - 1), fo = R - 1; /* S: the inner steps (W, or fewer: ring_steps) */
    const unsigned long long gi = S > 1 ? R * S : 0, go = R > 1 ? R : 0; /* dK/dV hops */
    const unsigned long long bi = fi + gi, bo = fo + go;
    v->fwd[COMM_P2P_INNER] += fi * size_kv_wire;
    v->fwd[COMM_P2P_OUTER] += fo * size_kv_wire;
    v->bwd[COMM_P2P_INNER] += fi * size_kv_wire + gi * size_kv;
    v->bwd[COMM_P2P_OUTER] += fo * size_kv_wire + go * size_kv;
    v->fwd_msgs[COMM_P2P_INNER] += fi;
    v->fwd_msgs[COMM_P2P_OUTER] += fo;
    v->bwd_msgs[COMM_P2P_INNER] += bi;
    v->bwd_msgs[COMM_P2P_OUTER] += bo;
    if (S > 1) { /* the last dK/dV hop of each outer step, S - 1 members back */
        v->ring_home_bytes += R * size_kv;
        v->ring_home_back = (int)S - 1;
    }
}

static void dr_volume(const StrategyParams *p, int cp_rank, AttnVolume *v) {
    (void)cp_rank; /* every member of a ring sends the same */
    dr_volume_for(p, p->n_kv_heads, v);
}

static size_t dr_workspace(const StrategyParams *p) {
    const int W = ring_w(p), R = p->cp / W;
    const size_t kv = 2 * (size_t)(p->seq_len / p->cp) * (size_t)p->n_kv_heads * (size_t)p->head_dim;
    size_t bufs = (R > 1 ? 2 : 0) + (W > 1 ? 2 : 0) /* kvbuf */ + 1 + (W > 1) /* dkv_l */ + (W > 1) /* dkv_in */ +
                  1 + (R > 1) /* dkv_wp */ + (R > 1) /* dkv_or */ + 1 /* dkv_final */;
    /* the bf16 wire's staging: a send and a receive of a KV block in bf16 per ring in use */
    size_t staging = p->wire_bf16 ? (size_t)((R > 1 ? 2 : 0) + (W > 1 ? 2 : 0)) * kv / 2 : 0;
    return bufs * kv + staging;
}

/* The schedule dr_forward / dr_backward run, every context rank c = (window o, member i) at once:
 * one schedule step per (outer step j, inner step). The window's outer KV transfer is posted with
 * its first inner step and waited after its last; inside a window the next KV is in flight while
 * the current block computes. Backward: each dK/dV accumulator leaves after its block (result),
 * arrives during the next step, and makes its last hop home; a window's partial sum crosses the
 * outer ring after its last step and is waited at the end of the next window. */
static void dr_play(const StrategyParams *p, SchedulePass pass, StepSchedule *out) {
    const int cp = p->cp, W = ring_w(p), R = cp / W, steps = volume_steps(p), bwd = pass == PASS_BACKWARD;
    const unsigned long long size_kv = 8ULL * (unsigned long long)(p->seq_len / cp) * (unsigned)p->n_kv_heads *
                                       (unsigned)p->head_dim;
    const unsigned long long size_kv_wire = p->wire_bf16 ? size_kv / 2 : size_kv;
    SlotBlocks sb;
    slot_blocks_init(&sb, p->layout, p->seq_len, cp);
    for (int j = 0; j < R; j++)
        for (int step = 0; step < steps; step++) {
            schedule_step(out, bwd ? "ring step (backward)" : "ring step");
            for (int c = 0; c < cp; c++) {
                const int o = c / W, i = c % W, next = o * W + (i + 1) % W, outer = ((o + 1) % R) * W + i;
                const int held = ((o - j % R + R) % R) * W + (i - step % W + W) % W;
                if (step == 0 && j < R - 1) schedule_message(out, COMM_P2P_OUTER, c, outer, size_kv_wire, steps);
                if (step < steps - 1) schedule_message(out, COMM_P2P_INNER, c, next, size_kv_wire, 1);
                schedule_compute(out, c, p->n_heads, p->n_kv_heads, &sb.slot[c], &sb.slot[held], p->window);
                if (!bwd) continue;
                if (steps > 1) { /* the accumulator on with its KV block, or home from the last step */
                    const int home = o * W + (i - (steps - 1) + W) % W;
                    schedule_result(out, COMM_P2P_INNER, c, step < steps - 1 ? next : home, size_kv,
                                    step < steps - 1 ? 2 : 1);
                }
                if (R > 1 && step == steps - 1) /* the window's partial sum, waited a window later */
                    schedule_result(out, COMM_P2P_OUTER, c, outer, size_kv, j < R - 1 ? steps + 1 : 1);
            }
        }
    slot_blocks_free(&sb);
}

const ScheduleInfo double_ring_schedule = {
    .name = "2d",
    .check = dr_check,
    .create = dr_create,
    .volume = dr_volume,
    .workspace_floats = dr_workspace,
    .play = dr_play,
};

static char *double_ring_refuse(const Strategy *runner, int value) {
    char teams[96] = "";
    if (strategy_knob_of(runner, strategy_knob_slot("team")))
        snprintf(teams, sizeof teams, "; %s's rings are set by --team", runner->name);
    return xstrdup_printf("--ring-inner %d is read by --strategy ring and 2d only (their double ring%s): drop it "
                          "or use --strategy ring or 2d", value, teams);
}

int double_ring_candidates(int hp, int cp, const StrategyFixed *fixed, StrategyCandidate *out, int max) {
    const int ring = cp > 1; /* on one context rank there is no ring to split */
    const int fixed_w = knob_get(&fixed->knobs, "ring-inner");
    int n = 0;
    for (int W = 1; W <= cp; W++) {
        if (cp % W || (fixed_w > 0 && fixed_w != W)) continue;
        if (!ring && W != cp) continue;
        if (W == 1 && cp > 1 && fixed_w != 1) continue; /* inner rings of one: the plain ring */
        for (int pl = 0; pl < 4; pl++) {
            if (fixed->placement >= 0 && fixed->placement != pl) continue;
            if (fixed->placement < 0 && pl != PLACEMENT_HEAD_FIRST && (pl != PLACEMENT_CONTEXT_FIRST || hp == 1 || cp == 1))
                continue; /* the placements that differ */
            if (n < max) {
                out[n] = (StrategyCandidate){.placement = (Placement)pl, .plain_ring = ring && W == cp};
                if (ring) knob_set(&out[n].knobs, "ring-inner", W);
                n++;
            }
        }
    }
    return n;
}

void double_ring_route(const StrategyParams *p, int cr, const RankTraffic *t, const TrafficSink *sink) {
    const int W = p->ring_inner, cp = p->cp;
    const int inner = (cr / W) * W + (cr % W + 1) % W, outer = (cr + W) % cp;
    /* the last dK/dV hop of each ring pass goes to the block's owner, ring_home_back members back
     * (the next member when every step runs) */
    double to_next = t->bytes[COMM_P2P_INNER];
    for (int i = 0; i < 2; i++) {
        if (!t->layers[i] || !t->layer[i]->ring_home_bytes) continue;
        const double home = t->micro * t->layers[i] * (double)t->layer[i]->ring_home_bytes;
        const int to = (cr / W) * W + (cr % W - t->layer[i]->ring_home_back + W) % W;
        sink->to(sink->ctx, COMM_P2P_INNER, to, home);
        to_next -= home;
    }
    sink->to(sink->ctx, COMM_P2P_INNER, inner, to_next);
    sink->to(sink->ctx, COMM_P2P_OUTER, outer, t->bytes[COMM_P2P_OUTER]);
}

/* LoongTrain's memory terms (paper 000 §4.5.5 and §5.2): the head-parallel q, k, v a layer keeps, the
 * two rings' KV buffers, and Selective Checkpoint++'s (S D + S H) / d_sp a layer. */
static void double_ring_paper_memory(const PaperMemoryInput *in, PaperMemory *out) {
    const StrategyParams *p = in->p;
    const double S = (double)p->seq_len, n = S / p->cp, d = p->head_dim;
    const double qd = p->n_heads * d, kvd = p->n_kv_heads * d;
    const int W = p->ring_inner > 0 ? p->ring_inner : p->cp, sp = p->hp * p->cp;
    const double qkv = 4 * n * (qd + 2 * kvd) / p->hp;
    const double rings = 4 * (W > 1 ? 1 : 0) * 2 * n * kvd / p->hp + 4 * (p->cp / W > 1 ? 1 : 0) * 2 * n * kvd / p->hp;
    const double selective = 4 * (S * in->D + S * p->n_heads) / sp;
    out->n = 2;
    snprintf(out->line[0], sizeof out->line[0],
             "  LoongTrain 4.5.5 saved q, k, v per layer        %10.2f MiB; inner + outer ring buffers %.2f MiB",
             qkv / 1048576.0, rings / 1048576.0);
    snprintf(out->line[1], sizeof out->line[1], "  LoongTrain 5.2   Selective++ (SD + SH)/d_sp     %10.2f MiB per layer",
             selective / 1048576.0);
}

const StrategyKnob double_ring_knobs[] = {
    {.name = "ring-inner", .metavar = "W",
     .help = "2d, ring: double ring with inner rings of W ranks; W divides cp (default cp)",
     .max = 1 << 20, .param = offsetof(StrategyParams, ring_inner), .same = KNOB_SAME_CP, .column = "W",
     .refuse = double_ring_refuse},
    {0},
};

const Strategy double_ring_strategy = {
    .name = "2d",
    .title = "2D-Attention",
    .summary = "LoongTrain 2D attention: head all-to-all x Double-Ring-Attention (Ulysses: cp 1; Ring: hp 1)",
    .flags = "--hp --cp --ring-inner --placement --layout",
    .constraints = "--ring-inner divides --cp; any layout",
    .grid = GRID_2D,
    .default_layout = LAYOUT_ZIGZAG,
    .schedule = &double_ring_schedule,
    .knobs = double_ring_knobs,
    .candidates = double_ring_candidates,
    .route = double_ring_route,
    .paper_memory = double_ring_paper_memory,
};
