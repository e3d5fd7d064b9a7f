/* WallFacer multi-ring attention (paper 002, §3.2-3.5, Alg. 1-3; notes/algorithms.md §6) as a
 * context schedule of P = cp ranks with teams of C members (wallfacer.h: names, placement and
 * the Communication Configuration Generator).
 *
 * Forward (Alg. 1), per layer, on each context rank (team t, member m):
 *   1. all-gather q and kv of the slot inside the team (COMM_TEAM): the rank now holds the
 *      team's C n query rows and C n kv rows, in member order (the gathered buffers are the
 *      working layout: no unpacking);
 *   2. initial send (Alg. 2, COMM_P2P_OUTER): the team's kv goes to team m G + t / C, member
 *      t % C (nothing moves when that is this rank), and the kv of another team arrives;
 *   3. G = P / C^2 sub-ring steps (Alg. 3, COMM_P2P_INNER): the next kv is in flight to/from the
 *      same member of the next/previous team of the team group while the team's queries attend
 *      the current kv (block_attn_forward per (query member, kv member) block, progress tests
 *      between pieces), merged into (o, lse) partials of the C n team rows;
 *   4. reduce-scatter with the merge rule (COMM_TEAM): an all-to-all inside the team sends the
 *      (o, lse) rows of member j to member j, which merges the C partials with attn_merge in
 *      member order (not a sum).
 * Over the C members and G steps a team's queries meet the kv of every team exactly once.
 *
 * Backward (paper §3.2.1 prose, notes §6): kv and dk/dv stay put, queries travel with their dq.
 *   1. all-gather the query bundle [q | dout | lse | delta] and kv inside the team (COMM_TEAM);
 *      delta is given, so the team never needs O;
 *   2. the same initial kv send as forward (COMM_P2P_OUTER); that kv stays on this rank;
 *   3. G steps: the query bundle of step s+1 is in flight on the sub-ring while step s computes
 *      dq into a fresh buffer and dk/dv into the fixed kv's accumulator; the dq partial of the
 *      query team of step s then arrives from the previous rank (its step s-1), is added and
 *      sent on; the last hop (step G-1) returns the summed dq to the team that owns those
 *      queries (COMM_P2P_INNER: G-1 bundle hops, G dq hops, dq only on the last one since the
 *      owner still holds its queries);
 *   4. dq reduce-scattered (sum) inside the team (COMM_TEAM); dk/dv partials sent back through
 *      the inverse of the initial map (COMM_P2P_OUTER) and reduce-scattered (sum) in the team.
 *
 * Bytes per rank per layer, fp32, a = n H d, b = n Hkv d, h = n H (heads after the head
 * exchange; n = S / cp):
 *   fwd  team  (C-1) 4 (a + 2b) + (C-1) 4 (a + h)          messages 3 (C-1)
 *        inner (G-1) 4 (2 C b)                             messages G-1
 *        outer 4 (2 C b)                                   messages 1   (0 on the ranks whose
 *                                                          initial send targets themselves)
 *   bwd  team  (C-1) 4 (2a + 2h + 2b) + (C-1) 4 a + (C-1) 4 (2b)   messages 4 (C-1)
 *        inner G > 1: (G-1) 4 C (2a + 2h) + G 4 C a        messages 2G-1 (0 when G = 1)
 *        outer 2 x 4 (2 C b)                               messages 2   (0 on those ranks)
 * so the P2P bytes of a forward are G 4 (2 C b) = the paper's Eq. 4 and its team bytes Eq. 3
 * (plus the lse column the merge needs).
 * Workspace (floats), one arena shared by forward and backward:
 *   fwd  C a + 4 C b + 2 C (a + h)       (q_team; kv current + next; (o, lse) partials + received)
 *   bwd  (1 + 2C)(2a + 2h) + 6 C b + 3 C a  (gathered row; query bundle current + next; kv as
 *        gathered + received; dk/dv; dq x 2 + incoming partial; the summed dq and the returned
 *        dk/dv reuse the idle bundle and kv buffers)
 *   arena = max(fwd, bwd); the paper's Eq. 7 term 3CA is q_team + one kv buffer of the forward
 * plus P n PosRuns (16 bytes each) for the slots' positions.
 *
 * On the bf16 wire (--precision bf16) q and kv travel in bf16 (2-byte elements: the team
 * all-gathers of q and kv, the initial sends and the forward sub-ring; exact, they are bf16
 * values); the backward's query bundle (it carries the fp32 lse and delta), the (o, lse)
 * partials, dq and dk/dv stay fp32: in the formulas above 4 becomes 2 in those terms only.
 *
 * What it does not do: no recomputation. */
#include "parallel/merge_scatter.h"
#include "strategies/wallfacer.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "attention/flash_attention.h"
#include "core/common.h"
#include "strategies/registry.h"

/* Message tags on the schedule's own communicator: no two streams share one. */
enum {
    TAG_FWD_INIT = 301,
    TAG_FWD_KV = 302,
    TAG_BWD_INIT = 311,
    TAG_BWD_Q = 312,
    TAG_BWD_DQ = 313,
    TAG_BWD_DQ_LAST = 314,
    TAG_BWD_DKV = 315,
};

/* ------------------------------------------------------------------------------------------ */
/* Communication Configuration Generator (pure). */

int wallfacer_team_valid(int P, int C) { return P >= 1 && C >= 1 && (long)C * C <= P && P % (C * C) == 0; }

int wallfacer_ctx_rank(int P, int C, int ring_first, int team, int member) {
    const int G = P / (C * C);
    if (!ring_first) return team * C + member;
    return ((team / G) * C + member) * G + team % G;
}

static void coords_of(int P, int C, int ring_first, int c, int *team, int *member) {
    const int G = P / (C * C);
    if (!ring_first) {
        *team = c / C;
        *member = c % C;
    } else {
        int i = c % G, r2 = c / G;
        *member = r2 % C;
        *team = (r2 / C) * G + i;
    }
}

void wallfacer_rank_config(int P, int C, int ring_first, int rank, WallfacerRank *r) {
    if (!wallfacer_team_valid(P, C)) die("wallfacer: team size %d is not valid for %d context ranks", C, P);
    memset(r, 0, sizeof *r);
    const int G = P / (C * C);
    r->P = P;
    r->C = C;
    r->G = G;
    r->T = P / C;
    r->ring_first = ring_first != 0;
    r->rank = rank;
    coords_of(P, C, r->ring_first, rank, &r->team, &r->member);
    const int t = r->team, m = r->member, i = t % G;
    r->group = t / G;
    /* Alg. 2: member m of team t sends its team's kv to team m G + t / C, member t % C */
    r->init_send = wallfacer_ctx_rank(P, C, r->ring_first, m * G + t / C, t % C);
    /* ... so the kv arriving here comes from team (t % G) C + m, member t / G */
    r->init_recv = wallfacer_ctx_rank(P, C, r->ring_first, i * C + m, t / G);
    /* Alg. 3: same member of the next / previous team of the team group */
    r->ring_next = wallfacer_ctx_rank(P, C, r->ring_first, r->group * G + (i + 1) % G, m);
    r->ring_prev = wallfacer_ctx_rank(P, C, r->ring_first, r->group * G + (i + G - 1) % G, m);
}

int wallfacer_fwd_kv_team(const WallfacerRank *r, int step) {
    const int G = r->G, i = r->team % G;
    return ((i - step % G + G) % G) * r->C + r->member;
}

int wallfacer_bwd_q_team(const WallfacerRank *r, int step) {
    const int G = r->G, i = r->team % G;
    return r->group * G + (i - step % G + G) % G;
}

/* ------------------------------------------------------------------------------------------ */
/* Sizes, volume, workspace. */

typedef struct {
    size_t n, H, Hk, d, C, G;
    size_t a, b, h; /* n H d, n Hk d, n H */
    size_t E;       /* bytes of a q or kv element on the wire: 4, or 2 on the bf16 wire */
} Sizes;

static Sizes sizes_of(size_t n, int H, int Hk, int d, int C, int P) {
    Sizes z = {.n = n, .H = (size_t)H, .Hk = (size_t)Hk, .d = (size_t)d, .C = (size_t)C,
               .G = (size_t)(P / (C * C))};
    z.a = n * z.H * z.d;
    z.b = n * z.Hk * z.d;
    z.h = n * z.H;
    z.E = sizeof(float);
    return z;
}

/* Heads held by a context rank after the head exchange (KV replicated when Hkv < hp). */
static Sizes sizes_of_params(const StrategyParams *p) {
    int hp = p->hp > 0 ? p->hp : 1;
    int H = p->n_heads / hp, Hk = (p->n_kv_heads > hp ? p->n_kv_heads : hp) / hp;
    Sizes z = sizes_of((size_t)(p->seq_len / p->cp), H, Hk, p->head_dim, p->team, p->cp);
    if (p->wire_bf16) z.E = 2;
    return z;
}

static void volume_of(const Sizes *z, int sends_outer, AttnVolume *v) {
    memset(v, 0, sizeof *v);
    const unsigned long long C = z->C, G = z->G, a = z->a, b = z->b, h = z->h, F = sizeof(float), E = z->E;
    v->fwd[COMM_TEAM] = (C - 1) * E * (a + 2 * b) + (C - 1) * F * (a + h);
    v->fwd_msgs[COMM_TEAM] = 3 * (C - 1);
    v->fwd[COMM_P2P_INNER] = (G - 1) * E * 2 * C * b;
    v->fwd_msgs[COMM_P2P_INNER] = G - 1;
    v->fwd[COMM_P2P_OUTER] = sends_outer ? E * 2 * C * b : 0;
    v->fwd_msgs[COMM_P2P_OUTER] = sends_outer ? 1 : 0;
    v->bwd[COMM_TEAM] = (C - 1) * F * (2 * a + 2 * h) + (C - 1) * E * 2 * b + (C - 1) * F * a + (C - 1) * F * 2 * b;
    v->bwd_msgs[COMM_TEAM] = 4 * (C - 1);
    v->bwd[COMM_P2P_INNER] = G > 1 ? (G - 1) * F * C * (2 * a + 2 * h) + G * F * C * a : 0;
    v->bwd_msgs[COMM_P2P_INNER] = G > 1 ? 2 * G - 1 : 0;
    v->bwd[COMM_P2P_OUTER] = sends_outer ? (E + F) * 2 * C * b : 0;
    v->bwd_msgs[COMM_P2P_OUTER] = sends_outer ? 2 : 0;
    v->meta_batch = 0; /* positions come with set_positions */
}

void wallfacer_rank_volume(const StrategyParams *p, int ring_first, int ctx_rank, AttnVolume *v) {
    WallfacerRank r;
    wallfacer_rank_config(p->cp, p->team, ring_first, ctx_rank, &r);
    Sizes z = sizes_of_params(p);
    volume_of(&z, r.init_send != r.rank, v);
}

static void wf_volume(const StrategyParams *p, int cp_rank, AttnVolume *v) {
    if (!wallfacer_team_valid(p->cp, p->team)) { /* check() says why; nothing to count */
        memset(v, 0, sizeof *v);
        return;
    }
    /* exact per rank: up to C ranks are fixed points of the initial send and send nothing outer */
    wallfacer_rank_volume(p, p->placement == PLACEMENT_RING_FIRST, cp_rank, v);
}

/* Arena layout: forward and backward regions overlap (a call uses one of them). Team buffers
 * hold C member blocks in member order, so an all-gather lands in them as they are:
 *   q_team (C n, H, d); kv of a team: C blocks [k_j | v_j] of 2b; (o, lse) partials: C blocks
 *   [o_j | lse_j]; a query bundle: C blocks [q_j | dout_j | lse_j | delta_j] of 2a + 2h;
 *   dq of a team (C n, H, d); dk/dv of a team: C blocks [dk_j | dv_j]. */
typedef struct {
    size_t f_q, f_kv0, f_kv1, f_ol, f_recv, f_end;
    size_t b_gsend, b_bundle0, b_bundle1, b_kv0, b_kv1, b_dkv, b_dql0, b_dql1, b_dqin, b_end;
} Arena;

static Arena arena_of(const Sizes *z) {
    Arena A;
    const size_t C = z->C, a = z->a, b = z->b, h = z->h, Z = 2 * a + 2 * h;
    size_t o = 0;
    A.f_q = o, o += C * a;
    A.f_kv0 = o, o += 2 * C * b;
    A.f_kv1 = o, o += 2 * C * b;
    A.f_ol = o, o += C * (a + h);
    A.f_recv = o, o += C * (a + h);
    A.f_end = o;
    o = 0;
    A.b_gsend = o, o += Z;
    A.b_bundle0 = o, o += C * Z;
    A.b_bundle1 = o, o += C * Z;
    A.b_kv0 = o, o += 2 * C * b;
    A.b_kv1 = o, o += 2 * C * b;
    A.b_dkv = o, o += 2 * C * b;
    A.b_dql0 = o, o += C * a;
    A.b_dql1 = o, o += C * a;
    A.b_dqin = o, o += C * a;
    A.b_end = o;
    return A;
}

static size_t arena_floats(const Arena *A) { return A->f_end > A->b_end ? A->f_end : A->b_end; }

static size_t wf_workspace_floats(const StrategyParams *p) {
    if (!wallfacer_team_valid(p->cp, p->team)) return 0;
    Sizes z = sizes_of_params(p);
    Arena A = arena_of(&z);
    /* the bf16 wire's two staging buffers (send, receive) of the largest bf16 message */
    const size_t big = z.C * z.a > 2 * z.C * z.b ? z.C * z.a : 2 * z.C * z.b;
    return arena_floats(&A) + (p->wire_bf16 ? big : 0);
}

/* ------------------------------------------------------------------------------------------ */
/* Check. */

static char *wf_check(const StrategyParams *p) {
    char buf[512], valid[256];
    size_t len = 0;
    valid[0] = 0;
    for (int c = 1; (long)c * c <= p->cp; c++)
        if (wallfacer_team_valid(p->cp, c)) len += (size_t)snprintf(valid + len, sizeof valid - len, "%s%d", len ? ", " : "", c);
    if (p->cp < 1) {
        snprintf(buf, sizeof buf, "wallfacer needs --cp >= 1 (got %d)", p->cp);
        return xstrdup(buf);
    }
    if (p->team == 0) {
        snprintf(buf, sizeof buf, "wallfacer needs --team C (C² divides cp): valid --team for cp %d: %s", p->cp, valid);
        return xstrdup(buf);
    }
    if (p->team < 1) {
        snprintf(buf, sizeof buf, "--team %d must be at least 1: valid --team for cp %d: %s", p->team, p->cp, valid);
        return xstrdup(buf);
    }
    if ((long)p->team * p->team > p->cp) {
        snprintf(buf, sizeof buf, "--team %d exceeds sqrt(cp) (C² = %ld > cp = %d): valid --team for cp %d: %s", p->team,
                 (long)p->team * p->team, p->cp, p->cp, valid);
        return xstrdup(buf);
    }
    if (!wallfacer_team_valid(p->cp, p->team)) {
        snprintf(buf, sizeof buf, "--team %d needs C² = %d to divide cp = %d: valid --team for cp %d: %s", p->team,
                 p->team * p->team, p->cp, p->cp, valid);
        return xstrdup(buf);
    }
    return layout_split_error(p->layout, p->seq_len, p->hp, p->cp);
}

/* ------------------------------------------------------------------------------------------ */
/* The schedule. */

typedef struct {
    const Topology *topo;
    Comm *comm;
    WallfacerRank me;
    Sizes z;
    int n, H, Hk, d;
    CommWire wire;      /* of q and kv (the backward's query bundle, partials and gradients: fp32) */
    MPI_Comm team_comm; /* the C members of this rank's team, ordered by member */
    MPI_Comm p2p_comm;  /* a duplicate of ctx_comm for the initial sends and the sub-rings */
    ScheduleCore core;  /* block compute; core.slot[c]: the rows of context slot c */
    Arena A;
    float *arena;
    const int *all_pos; /* (P, n), the caller's */
} WfCtx;

static void wf_set_positions(ContextSchedule *s, const int *all_pos, const int *all_doc) {
    WfCtx *x = s->ctx;
    x->all_pos = all_pos;
    schedule_core_set_positions(&x->core, all_pos, all_doc);
}

/* The rows of member j of team t. */
static const PosBlock *member_rows(const WfCtx *x, int t, int j) {
    return &x->core.slot[wallfacer_ctx_rank(x->me.P, x->me.C, x->me.ring_first, t, j)];
}

static void require_positions(const WfCtx *x, const char *who) {
    if (!x->all_pos) die("wallfacer %s: called before set_positions(): the schedule needs every slot's positions", who);
}

static void copy_f(float *dst, const float *src, size_t count) { memcpy(dst, src, sizeof(float) * count); }

static void add_into(float *dst, const float *src, size_t count) {
    for (size_t i = 0; i < count; i++) dst[i] += src[i];
}

/* The initial send of Alg. 2 (and its inverse): sends `mine` to `to`, receives into `other` from
 * `from`; returns the buffer that now holds the received data (mine when the map is identity). */
static float *initial_exchange(WfCtx *x, float *mine, float *other, size_t floats, int to, int from, int tag) {
    if (to == x->me.rank) return mine; /* a fixed point: from is this rank too */
    MPI_Request r[2];
    comm_isend_floats(x->comm, COMM_P2P_OUTER, mine, floats, x->wire, to, tag, x->p2p_comm, &r[0]);
    comm_irecv_floats(x->comm, COMM_P2P_OUTER, other, floats, x->wire, from, tag, x->p2p_comm, &r[1]);
    comm_waitall(x->comm, COMM_P2P_OUTER, 2, r);
    return other;
}

static void wf_forward(ContextSchedule *s, const float *q, const float *kv, float *o, float *lse) {
    WfCtx *x = s->ctx;
    require_positions(x, "forward");
    Comm *cm = x->comm;
    const WallfacerRank *me = &x->me;
    const size_t C = x->z.C, a = x->z.a, b = x->z.b, h = x->z.h;
    const int G = me->G;
    float *W = x->arena;
    float *qt = W + x->A.f_q, *kv0 = W + x->A.f_kv0, *kv1 = W + x->A.f_kv1, *ol = W + x->A.f_ol;
    float *recv = W + x->A.f_recv;

    /* 1. team all-gathers: q_team (C n, H, d) and the team's kv, both in member order */
    comm_allgather_floats(cm, COMM_TEAM, q, qt, a, x->wire, x->team_comm);
    comm_allgather_floats(cm, COMM_TEAM, kv, kv0, 2 * b, x->wire, x->team_comm);
    double t0 = comm_compute_begin(cm);
    AttnShape st = {.n_q = x->n, .n_kv = 1, .n_heads = x->H, .n_kv_heads = x->Hk, .head_dim = x->d,
                    .scale = x->core.ba.scale, .mask = ATTN_CAUSAL};
    for (size_t i = 0; i < C; i++) attn_state_init(&st, ol + i * (a + h), ol + i * (a + h) + a);
    comm_compute_end(cm, "wallfacer init", t0);

    /* 2. initial send (Alg. 2) */
    float *cur = initial_exchange(x, kv0, kv1, 2 * C * b, me->init_send, me->init_recv, TAG_FWD_INIT);
    float *nxt = cur == kv0 ? kv1 : kv0;

    /* 3. G sub-ring steps (Alg. 3), the next kv in flight while the current one computes;
     *    every (query member i, kv member j) block of the team pair */
    MPI_Request reqs[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    Progress pr = {reqs, 2, COMM_P2P_INNER};
    for (int step = 0; step < G; step++) {
        if (step < G - 1) {
            comm_isend_floats(cm, COMM_P2P_INNER, cur, 2 * C * b, x->wire, me->ring_next, TAG_FWD_KV, x->p2p_comm,
                              &reqs[0]);
            comm_irecv_floats(cm, COMM_P2P_INNER, nxt, 2 * C * b, x->wire, me->ring_prev, TAG_FWD_KV, x->p2p_comm,
                              &reqs[1]);
        }
        const int kt = wallfacer_fwd_kv_team(me, step);
        for (size_t i = 0; i < C; i++)
            for (size_t j = 0; j < C; j++)
                block_attn_forward(&x->core.ba, qt + i * a, member_rows(x, me->team, (int)i), cur + j * 2 * b,
                                   cur + j * 2 * b + b, member_rows(x, kt, (int)j), ol + i * (a + h),
                                   ol + i * (a + h) + a, &pr);
        if (step < G - 1) {
            comm_waitall(cm, COMM_P2P_INNER, 2, reqs);
            float *tmp = cur;
            cur = nxt;
            nxt = tmp;
        }
    }

    /* 4. reduce-scatter with the merge rule: member j gets every member's (o, lse) of its rows */
    merge_reduce_scatter(cm, COMM_TEAM, x->team_comm, ol, recv, x->n, x->H, x->d, o, lse);
}

static void wf_backward(ContextSchedule *s, const float *q, const float *kv, const float *lse, const float *delta,
                        const float *dout, float *dq, float *dkv) {
    WfCtx *x = s->ctx;
    require_positions(x, "backward");
    Comm *cm = x->comm;
    const WallfacerRank *me = &x->me;
    const size_t C = x->z.C, a = x->z.a, b = x->z.b, h = x->z.h, Z = 2 * a + 2 * h;
    const int G = me->G;
    float *W = x->arena;
    float *gsend = W + x->A.b_gsend;
    float *bundle[2] = {W + x->A.b_bundle0, W + x->A.b_bundle1};
    float *kv0 = W + x->A.b_kv0, *kv1 = W + x->A.b_kv1, *dkvt = W + x->A.b_dkv;
    float *dql[2] = {W + x->A.b_dql0, W + x->A.b_dql1}, *dqin = W + x->A.b_dqin;
    float *dqlast = NULL; /* the bundle buffer that receives nothing at the last step */

    /* 1. team all-gathers: the query bundle, C blocks [q_j | dout_j | lse_j | delta_j], and the
     *    team's kv */
    double t0 = comm_compute_begin(cm);
    copy_f(gsend, q, a);
    copy_f(gsend + a, dout, a);
    copy_f(gsend + 2 * a, lse, h);
    copy_f(gsend + 2 * a + h, delta, h);
    comm_compute_end(cm, "wallfacer pack", t0);
    comm_allgather(cm, COMM_TEAM, gsend, bundle[0], Z * sizeof(float), x->team_comm);
    comm_allgather_floats(cm, COMM_TEAM, kv, kv0, 2 * b, x->wire, x->team_comm);
    t0 = comm_compute_begin(cm);
    memset(dkvt, 0, sizeof(float) * 2 * C * b);
    comm_compute_end(cm, "zero dkv", t0);

    /* 2. the same initial kv send as forward: this kv and its gradient stay here */
    const float *kvf = initial_exchange(x, kv0, kv1, 2 * C * b, me->init_send, me->init_recv, TAG_BWD_INIT);
    const int kt = wallfacer_fwd_kv_team(me, 0);

    /* 3. G steps: queries travel with their dq. reqs: 0-1 bundle send/recv, 2 dq send,
     *    3 dq partial recv, 4 the summed dq of this team coming home (last hop) */
    MPI_Request reqs[5];
    for (int i = 0; i < 5; i++) reqs[i] = MPI_REQUEST_NULL;
    Progress pr = {reqs, 5, COMM_P2P_INNER};
    const size_t bundle_bytes = C * Z * sizeof(float), dq_bytes = C * a * sizeof(float);
    float *bcur = bundle[0], *bnxt = bundle[1];
    for (int step = 0; step < G; step++) {
        float *L = dql[step % 2];
        if (step < G - 1) {
            comm_isend(cm, COMM_P2P_INNER, bcur, bundle_bytes, me->ring_next, TAG_BWD_Q, x->p2p_comm, &reqs[0]);
            comm_irecv(cm, COMM_P2P_INNER, bnxt, bundle_bytes, me->ring_prev, TAG_BWD_Q, x->p2p_comm, &reqs[1]);
        }
        if (step >= 1)
            comm_irecv(cm, COMM_P2P_INNER, dqin, dq_bytes, me->ring_prev, TAG_BWD_DQ, x->p2p_comm, &reqs[3]);
        if (G > 1 && step == G - 1) {
            dqlast = bnxt; /* its last send (step G-2) completed: C Z >= C a floats */
            comm_irecv(cm, COMM_P2P_INNER, dqlast, dq_bytes, me->ring_prev, TAG_BWD_DQ_LAST, x->p2p_comm, &reqs[4]);
        }
        t0 = comm_compute_begin(cm);
        memset(L, 0, dq_bytes);
        comm_compute_end(cm, "zero dq", t0);
        const int qt = wallfacer_bwd_q_team(me, step);
        for (size_t i = 0; i < C; i++) {
            const float *B = bcur + i * Z; /* q_i | dout_i | lse_i | delta_i */
            for (size_t j = 0; j < C; j++)
                block_attn_backward(&x->core.ba, B, member_rows(x, qt, (int)i), kvf + j * 2 * b, kvf + j * 2 * b + b,
                                    member_rows(x, kt, (int)j), B + 2 * a, B + 2 * a + h, B + a, L + i * a,
                                    dkvt + j * 2 * b, dkvt + j * 2 * b + b, &pr);
        }
        if (G > 1) {
            if (step >= 1) {
                comm_waitall(cm, COMM_P2P_INNER, 1, &reqs[3]);
                t0 = comm_compute_begin(cm);
                add_into(L, dqin, C * a);
                comm_compute_end(cm, "add dq", t0);
            }
            comm_waitall(cm, COMM_P2P_INNER, 1, &reqs[2]); /* the previous dq send (the other L) */
            comm_isend(cm, COMM_P2P_INNER, L, dq_bytes, me->ring_next, step == G - 1 ? TAG_BWD_DQ_LAST : TAG_BWD_DQ,
                       x->p2p_comm, &reqs[2]);
        }
        if (step < G - 1) {
            comm_waitall(cm, COMM_P2P_INNER, 2, reqs);
            float *tmp = bcur;
            bcur = bnxt;
            bnxt = tmp;
        }
    }
    float *dq_team = dql[0]; /* G = 1: the only step's dq is complete */
    if (G > 1) {
        comm_waitall(cm, COMM_P2P_INNER, 1, &reqs[4]);
        comm_waitall(cm, COMM_P2P_INNER, 1, &reqs[2]);
        dq_team = dqlast;
    }

    /* 4. dk/dv back through the inverse of the initial map, overlapping the dq reduce-scatter;
     *    then reduce-scatter (sum) of the C member blocks [dk_j | dv_j] */
    MPI_Request back[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    float *dkv_home = dkvt;
    if (me->init_send != me->rank) {
        float *dkvback = kv0; /* sent by the initial exchange, which completed: free */
        comm_isend(cm, COMM_P2P_OUTER, dkvt, 2 * C * b * sizeof(float), me->init_recv, TAG_BWD_DKV, x->p2p_comm,
                   &back[0]);
        comm_irecv(cm, COMM_P2P_OUTER, dkvback, 2 * C * b * sizeof(float), me->init_send, TAG_BWD_DKV, x->p2p_comm,
                   &back[1]);
        dkv_home = dkvback;
    }
    comm_reduce_scatter_block(cm, COMM_TEAM, dq_team, dq, a, x->team_comm);
    comm_waitall(cm, COMM_P2P_OUTER, 2, back);
    comm_reduce_scatter_block(cm, COMM_TEAM, dkv_home, dkv, 2 * b, x->team_comm);
}

static void wf_destroy(ContextSchedule *s) {
    if (!s) return;
    WfCtx *x = s->ctx;
    if (x) {
        if (x->team_comm != MPI_COMM_NULL) MPI_Comm_free(&x->team_comm);
        if (x->p2p_comm != MPI_COMM_NULL) MPI_Comm_free(&x->p2p_comm);
        xfree(x->arena);
        schedule_core_free(&x->core);
        xfree(x);
    }
    xfree(s);
}

static ContextSchedule *wf_create(const ScheduleShape *sh) {
    const Topology *t = sh->topo;
    const int P = t->cp, C = sh->team;
    if (!wallfacer_team_valid(P, C))
        die_collective("wallfacer: --team %d is not valid for --cp %d (C >= 1 and C² must divide cp)", C, P);
    if (sh->n < 1 || sh->heads < 1 || sh->kv_heads < 1 || sh->heads % sh->kv_heads || sh->head_dim < 1)
        die_collective("wallfacer: bad shape n %d, heads %d, kv_heads %d, head_dim %d", sh->n, sh->heads, sh->kv_heads,
                       sh->head_dim);
    WfCtx *x = xcalloc(1, sizeof *x);
    x->topo = t;
    x->comm = sh->comm;
    x->n = sh->n;
    x->H = sh->heads;
    x->Hk = sh->kv_heads;
    x->d = sh->head_dim;
    x->wire = sh->wire;
    wallfacer_rank_config(P, C, t->placement == PLACEMENT_RING_FIRST, t->cp_rank, &x->me);
    x->z = sizes_of((size_t)sh->n, sh->heads, sh->kv_heads, sh->head_dim, C, P);
    x->A = arena_of(&x->z);
    x->arena = xmalloc_aligned(sizeof(float) * arena_floats(&x->A));
    schedule_core_init(&x->core, sh);
    if (MPI_Comm_split(t->ctx_comm, x->me.team, x->me.member, &x->team_comm) != MPI_SUCCESS)
        die("wallfacer: MPI_Comm_split of the team communicator failed");
    if (MPI_Comm_dup(t->ctx_comm, &x->p2p_comm) != MPI_SUCCESS) die("wallfacer: MPI_Comm_dup of ctx_comm failed");
    static const ContextSchedule OPS = {.set_positions = wf_set_positions, .forward = wf_forward,
                                        .backward = wf_backward, .destroy = wf_destroy};
    return schedule_core_new(&OPS, x, &x->core);
}

static char *wf_refuse_team(const Strategy *runner, int value) {
    (void)runner;
    return xstrdup_printf("--team %d is read by --strategy wallfacer only: drop it or use --strategy wallfacer", value);
}

static char *wf_refuse(unsigned knob, const Strategy *runner, const ParallelConfig *cfg) {
    (void)knob; /* KNOB_TEAM_PLACEMENT, the bit it owns */
    return xstrdup_printf("--placement %s places WallFacer's teams: --strategy %s takes head-first (the default) "
                          "or context-first", placement_name(cfg->placement), runner->name);
}

/* Its placements are its teams' (team-first, the default, or ring-first): the head-and-context ones are
 * refused, head-first where given (as the default it stands for team-first). */
static char *wf_check_config(const ParallelConfig *cfg) {
    if (cfg->placement == PLACEMENT_CONTEXT_FIRST || (cfg->placement == PLACEMENT_HEAD_FIRST && cfg->placement_given))
        return xstrdup_printf("--placement %s orders head and context groups: --strategy wallfacer takes team-first "
                              "(the default) or ring-first", placement_name(cfg->placement));
    return NULL;
}

/* The team when --team is not given: the largest C with C^2 dividing cp. */
static void wf_defaults(StrategyParams *p) {
    if (p->team > 0) return;
    for (int c = 1; c * c <= p->cp; c++)
        if (p->cp % (c * c) == 0) p->team = c;
}

static void wf_describe(const StrategyParams *p, char *buf, size_t n) { snprintf(buf, n, ", team %d", p->team); }

/* Teams C with C^2 dividing cp (teams of one, the plain ring, only where asked for: --team 1 or
 * --strategy wallfacer), each team-first and, where the sub-rings differ from the teams, ring-first. */
static int wf_candidates(int hp, int cp, const StrategyFixed *fixed, StrategyCandidate *out, int max) {
    (void)hp;
    const int fixed_team = knob_get(&fixed->knobs, "team");
    int n = 0;
    /* a team of `team` needs team^2 to divide cp: no larger team (in long: 46341^2 overflowed) */
    for (int team = 1; team <= cp && (long)team * team <= cp; team++) {
        if (cp % (team * team) || (fixed_team > 0 && fixed_team != team)) continue;
        if (team == 1 && fixed_team != 1 && !fixed->strategy_given) continue;
        for (int pl = 0; pl < 4; pl++) {
            if (fixed->placement >= 0 && fixed->placement != pl) continue;
            if (fixed->placement < 0 && pl != PLACEMENT_TEAM_FIRST &&
                (pl != PLACEMENT_RING_FIRST || team == 1 || team * team == cp))
                continue;
            if (n < max) {
                out[n] = (StrategyCandidate){.placement = (Placement)pl};
                knob_set(&out[n++].knobs, "team", team);
            }
        }
    }
    return n;
}

/* Team collectives inside the team; Alg. 3's sub-ring to the next team's member; Alg. 2's initial
 * send of k, v out (forward, and again in backward) and dk, dv back (half of the backward's bytes). */
static void wf_route(const StrategyParams *p, int cr, const RankTraffic *t, const TrafficSink *sink) {
    WallfacerRank r;
    wallfacer_rank_config(p->cp, p->team, p->placement == PLACEMENT_RING_FIRST, cr, &r);
    int *peers = xmalloc(sizeof(int) * (size_t)p->team); /* its team's members */
    for (int mb = 0; mb < p->team; mb++) peers[mb] = wallfacer_ctx_rank(p->cp, p->team, r.ring_first, r.team, mb);
    sink->peers(sink->ctx, COMM_TEAM, peers, p->team, t->bytes[COMM_TEAM]);
    xfree(peers);
    sink->to(sink->ctx, COMM_P2P_INNER, r.ring_next, t->bytes[COMM_P2P_INNER]);
    const double back = t->micro * t->n_layers * (double)t->layer[0]->bwd[COMM_P2P_OUTER] / 2; /* dk, dv back */
    sink->to(sink->ctx, COMM_P2P_OUTER, r.init_send, t->bytes[COMM_P2P_OUTER] - back);
    sink->to(sink->ctx, COMM_P2P_OUTER, r.init_recv, back);
}

/* WallFacer's memory terms (paper 002 Eq. 5-7): A = B N H / P, one layer's hidden activation of the
 * local tokens; the (Y + 1) A checkpoints plus 3 A of q, k, v (ring) or 3 C A (teams of C). */
static void wf_paper_memory(const PaperMemoryInput *in, PaperMemory *out) {
    const StrategyParams *p = in->p;
    const double N = (double)(p->seq_len / ((long)p->hp * p->cp)), A = N * in->D * 4, L = in->L;
    const int C = p->team > 0 ? p->team : 1;
    out->n = 3;
    snprintf(out->line[0], sizeof out->line[0], "  WallFacer Eq. 5  A = B N H / P                  %10.2f MiB",
             A / 1048576.0);
    snprintf(out->line[1], sizeof out->line[1], "  WallFacer Eq. 6  (Y + 1) A + 3 A   (ring)       %10.2f MiB (+ M_m+o)",
             ((L + 1) * A + 3 * A) / 1048576.0);
    snprintf(out->line[2], sizeof out->line[2], "  WallFacer Eq. 7  (Y + 1) A + 3 C A (teams)      %10.2f MiB (+ M_m+o)",
             ((L + 1) * A + 3.0 * C * A) / 1048576.0);
}

static const StrategyKnob KNOBS[] = {
    {.name = "team", .metavar = "C", .help = "wallfacer: teams of C ranks, C^2 divides cp (default: the largest such C)",
     .max = 1 << 20, .param = offsetof(StrategyParams, team), .column = "team", .refuse = wf_refuse_team},
    {0},
};

/* A team collective in the schedule: every rank sends `bytes` to each other member of its team. */
static void team_all(StepSchedule *out, const WallfacerRank *rk, int P, int C, int rf, unsigned long long bytes) {
    for (int c = 0; c < P; c++)
        for (int j = 0; j < C; j++)
            if (j != rk[c].member)
                schedule_message(out, COMM_TEAM, c, wallfacer_ctx_rank(P, C, rf, rk[c].team, j), bytes, 1);
}

/* The schedule wf_forward / wf_backward run, every context rank at once: the team all-gathers, the
 * initial send, G sub-ring steps of C x C blocks with the next kv (forward) or query bundle
 * (backward) in flight, and the reduce-scatters; backward's dq partial leaves after its step's
 * blocks and is added during the next step, its last hop waited after the ring. */
static void wf_play(const StrategyParams *p, SchedulePass pass, StepSchedule *out) {
    if (!wallfacer_team_valid(p->cp, p->team)) die("wallfacer: team size %d is not valid for %d context ranks", p->team, p->cp);
    const int P = p->cp, C = p->team, rf = p->placement == PLACEMENT_RING_FIRST, bwd = pass == PASS_BACKWARD;
    const Sizes z = sizes_of_params(p);
    const unsigned long long a = z.a, b = z.b, h = z.h, E = z.E, F = sizeof(float), Z = 2 * a + 2 * h;
    WallfacerRank *rk = xmalloc(sizeof *rk * (size_t)P);
    for (int c = 0; c < P; c++) wallfacer_rank_config(P, C, rf, c, &rk[c]);
    const int G = rk[0].G, H = (int)z.H, Hk = (int)z.Hk;
    SlotBlocks sb;
    slot_blocks_init(&sb, p->layout, p->seq_len, P);
    schedule_step(out, bwd ? "team all-gather: q | dout | lse | delta, kv" : "team all-gather: q, kv");
    team_all(out, rk, P, C, rf, bwd ? F * Z : E * a);
    team_all(out, rk, P, C, rf, E * 2 * b);
    schedule_step(out, "initial kv send");
    for (int c = 0; c < P; c++)
        if (rk[c].init_send != c) schedule_message(out, COMM_P2P_OUTER, c, rk[c].init_send, E * 2 * C * b, 1);
    for (int step = 0; step < G; step++) {
        schedule_step(out, bwd ? "sub-ring step (backward)" : "sub-ring step");
        for (int c = 0; c < P; c++) {
            const WallfacerRank *r = &rk[c];
            if (step < G - 1) schedule_message(out, COMM_P2P_INNER, c, r->ring_next, bwd ? F * C * Z : E * 2 * C * b, 1);
            const int qt = bwd ? wallfacer_bwd_q_team(r, step) : r->team;
            const int kt = wallfacer_fwd_kv_team(r, bwd ? 0 : step);
            for (int i = 0; i < C; i++)
                for (int j = 0; j < C; j++)
                    schedule_compute(out, c, H, Hk, &sb.slot[wallfacer_ctx_rank(P, C, rf, qt, i)],
                                     &sb.slot[wallfacer_ctx_rank(P, C, rf, kt, j)], p->window);
            if (bwd && G > 1) /* the dq partial on to the next team, added there during its next step */
                schedule_result(out, COMM_P2P_INNER, c, r->ring_next, F * C * a, step < G - 1 ? 2 : 1);
        }
    }
    if (!bwd) {
        schedule_step(out, "merge reduce-scatter: o, lse");
        team_all(out, rk, P, C, rf, F * (a + h));
    } else {
        schedule_step(out, "dk|dv back, reduce-scatter dq");
        for (int c = 0; c < P; c++)
            if (rk[c].init_send != c) schedule_message(out, COMM_P2P_OUTER, c, rk[c].init_recv, F * 2 * C * b, 1);
        team_all(out, rk, P, C, rf, F * a);
        schedule_step(out, "reduce-scatter dk|dv");
        team_all(out, rk, P, C, rf, F * 2 * b);
    }
    slot_blocks_free(&sb);
    xfree(rk);
}

static const ScheduleInfo wallfacer_schedule = {
    .play = wf_play,
    .name = "wallfacer",
    .check = wf_check,
    .create = wf_create,
    .volume = wf_volume,
    .workspace_floats = wf_workspace_floats,
};

const Strategy wallfacer_strategy = {
    .name = "wallfacer",
    .title = "WallFacer",
    .summary = "WallFacer multi-ring attention: teams of C ranks all-gather q, k, v and run C^2 sub-rings of "
               "cp/C^2 steps (paper 002)",
    .flags = "--hp --cp --team --placement --layout",
    .constraints = "--team C >= 1 with C^2 dividing cp (C = 1: plain ring; C = sqrt(cp): no ring steps); "
                   "--placement team-first (teams on consecutive ranks, default) or ring-first (sub-rings); any "
                   "layout (zigzag balances causal work); S divisible by sp (zigzag: also by 2 cp)",
    .grid = GRID_CONTEXT,
    .default_layout = LAYOUT_ZIGZAG,
    .schedule = &wallfacer_schedule,
    .knobs = KNOBS,
    .reads = KNOB_TEAM_PLACEMENT,
    .owns = KNOB_TEAM_PLACEMENT,
    .balanced = 1,
    .refuse = wf_refuse,
    .check_config = wf_check_config,
    .defaults = wf_defaults,
    .describe = wf_describe,
    .candidates = wf_candidates,
    .route = wf_route,
    .paper_memory = wf_paper_memory,
};
