/* LightSeq / DistFlashAttn's balanced causal schedule: the plan (lightseq_step, see lightseq.h)
 * and the context schedule that runs it over the cp ranks of a context group.
 *
 * Every step posts its transfers first (the inputs of the next step and the partial result of
 * the previous step's block that belongs to another rank), computes its block while they are in
 * flight (block_attention tests them between query pieces), then waits and folds in the partial
 * that arrived for its own rows: forward (o, lse) with attn_merge, backward dq or dk|dv by
 * addition. All transfers are point-to-point in ctx_comm, counted as COMM_P2P_INNER. On the bf16
 * wire (--precision bf16) k|v and q blocks travel in bf16 (exact: bf16 values); the (o, lse)
 * partials, the backward's q|dout|lse|delta bundle, dq and dk|dv in fp32.
 *
 * Not here: the head exchange (hp ranks), any layout but contiguous (the plan computes only the
 * block pairs (q_i, kv_j) with i >= j, which is the whole causal attention only when every token
 * of slot i is at or after every token of slot j; set_positions checks that), odd P (the paper's
 * odd-P variant has no idle step, but notes §7 and this code only do even P). */
#include "strategies/lightseq.h"

#include <stdio.h>
#include <string.h>

#include "attention/flash_attention.h"
#include "core/common.h"
#include "strategies/registry.h"

/* ------------------------------------------------------------------------------------------ */
/* The plan. */

int lightseq_steps(int P) { return P <= 1 ? 1 : P / 2 + 2; }

void lightseq_rows(LightseqRows rows, int n, int *row0, int *count) {
    *row0 = rows == LS_ROWS_SECOND ? n / 2 : 0;
    *count = rows == LS_ROWS_ALL ? n : rows == LS_ROWS_FIRST ? n / 2 : n - n / 2;
}

/* The block rank r computes at step t: 1 with *q, *kv, *rows set, 0 when idle. */
static int block_at(int P, int r, int t, int *q, int *kv, LightseqRows *rows) {
    const int h = P / 2;
    *rows = LS_ROWS_ALL;
    if (t == 0) {
        *q = *kv = r;
        return 1;
    }
    if (P <= 1 || t < 0 || t > h) return 0;
    if (r >= (h < t ? h : t)) { /* owner; at t = h the first half of the rows */
        *q = r;
        *kv = r - t;
        if (t == h) *rows = LS_ROWS_FIRST;
        return 1;
    }
    if (r < h && r < t) { /* helper; at t = h the second half of the owner's rows */
        *q = r + P - t;
        *kv = r;
        if (t == h) *rows = LS_ROWS_SECOND;
        return 1;
    }
    return 0;
}

void lightseq_step(int P, int r, int t, LightseqStep *s) {
    const int h = P / 2;
    s->q = s->kv = -1;
    s->rows = s->q_rows = s->ret_rows = LS_ROWS_ALL;
    s->send_kv_to = s->send_q_to = s->recv_kv_from = s->recv_q_from = -1;
    s->ret_to = s->ret_from = s->dkv_to = s->dkv_from = -1;
    if (P <= 1) {
        if (t == 0) s->q = s->kv = r;
        return;
    }
    block_at(P, r, t, &s->q, &s->kv, &s->rows);
    if (t <= h - 1) { /* inputs of step t + 1 */
        int to = r + t + 1, from = r - t - 1;
        if (to < P) s->send_kv_to = to;
        else s->send_q_to = to - P;
        if (from >= 0) s->recv_kv_from = from;
        else s->recv_q_from = from + P;
        if (t == h - 1) s->q_rows = LS_ROWS_SECOND; /* the q of a split block */
    }
    int q, kv;
    LightseqRows rows;
    if (t >= 1 && block_at(P, r, t - 1, &q, &kv, &rows)) { /* my block of step t - 1 produced for another rank */
        if (q != r) {
            s->ret_to = q;
            s->ret_rows = rows;
        } else if (kv != r) {
            s->dkv_to = kv;
        }
    }
    if (t >= 2) {
        int helper = r - P + t - 1; /* helped my q at step t - 1 */
        if (helper >= 0 && helper != r && block_at(P, helper, t - 1, &q, &kv, &rows) && q == r && kv == helper) {
            s->ret_from = helper;
            s->ret_rows = rows;
        }
        int owner = r + t - 1; /* used my kv at step t - 1 */
        if (owner < P && owner != r && block_at(P, owner, t - 1, &q, &kv, &rows) && q == owner && kv == r)
            s->dkv_from = owner;
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Volumes and memory. */

typedef struct {
    unsigned long long kv, q, res, bundle; /* bytes: k|v block, q block, o|lse, q|dout|lse|delta */
    unsigned long long kv_wire, q_wire;    /* bytes of a k|v and a q block on the wire (bf16: half) */
    size_t kvf, qf, lf;                    /* floats: k|v block, q block, lse */
} Sizes;

static int kv_heads_held(const StrategyParams *p) {
    int hp = p->hp > 0 ? p->hp : 1;
    return (p->n_kv_heads > hp ? p->n_kv_heads : hp) / hp;
}

static Sizes sizes_of(long n, int heads, int kv_heads, int d, int wire_bf16) {
    Sizes z;
    z.kvf = 2 * (size_t)n * (size_t)kv_heads * (size_t)d;
    z.qf = (size_t)n * (size_t)heads * (size_t)d;
    z.lf = (size_t)n * (size_t)heads;
    z.kv = 4ULL * z.kvf;
    z.q = 4ULL * z.qf;
    z.res = 4ULL * (z.qf + z.lf);
    z.bundle = 4ULL * (2 * z.qf + 2 * z.lf);
    z.kv_wire = wire_bf16 ? z.kv / 2 : z.kv;
    z.q_wire = wire_bf16 ? z.q / 2 : z.q;
    return z;
}

static Sizes params_sizes(const StrategyParams *p) {
    int hp = p->hp > 0 ? p->hp : 1, cp = p->cp > 0 ? p->cp : 1;
    return sizes_of(p->seq_len / cp, p->n_heads / hp, kv_heads_held(p), p->head_dim, p->wire_bf16);
}

void lightseq_rank_volume(const StrategyParams *p, int r, AttnVolume *v) {
    memset(v, 0, sizeof *v);
    const long long P = p->cp, h = P / 2;
    if (P <= 1) return;
    const Sizes z = params_sizes(p);
    int row0, m; /* the rows of a split block's helper half */
    lightseq_rows(LS_ROWS_SECOND, (int)(p->seq_len / P), &row0, &m);
    const int hp = p->hp > 0 ? p->hp : 1;
    const Sizes zs = sizes_of(m, p->n_heads / hp, kv_heads_held(p), p->head_dim, p->wire_bf16);
    const int k = COMM_P2P_INNER;
    /* on the bf16 wire k|v and q travel in bf16; o|lse, the q|dout|lse|delta bundle (its lse and
     * delta are fp32), dq and dk|dv in fp32 */
    if (r < h) { /* kv to each later rank of the first P/2 steps; helpers return o|lse and dq;
                    owner blocks (t = 1 .. r) return dk|dv */
        v->fwd[k] = (unsigned long long)h * z.kv_wire + (unsigned long long)(h - 1 - r) * z.res + zs.res;
        v->fwd_msgs[k] = (unsigned long long)(P - r);
        v->bwd[k] = (unsigned long long)h * z.kv_wire + (unsigned long long)r * z.kv +
                    (unsigned long long)(h - 1 - r) * z.q + zs.q;
    } else { /* kv while a later rank exists, then q to the helpers; owner blocks return dk|dv */
        v->fwd[k] = (unsigned long long)(P - 1 - r) * z.kv_wire + (unsigned long long)(r - h) * z.q_wire + zs.q_wire;
        v->fwd_msgs[k] = (unsigned long long)h;
        v->bwd[k] = (unsigned long long)(P - 1 - r) * z.kv_wire + (unsigned long long)h * z.kv +
                    (unsigned long long)(r - h) * z.bundle + zs.bundle;
    }
    v->bwd_msgs[k] = (unsigned long long)P;
}

static void lightseq_volume(const StrategyParams *p, int cp_rank, AttnVolume *v) {
    lightseq_rank_volume(p, cp_rank, v);
}

static size_t max_sz(size_t a, size_t b) { return a > b ? a : b; }

/* Buffers (floats): 2 incoming inputs (k|v or q|dout|lse|delta), 2 outgoing partials and 1
 * incoming partial (k|v, or o|lse / dq), the packed q|dout|lse|delta this rank sends. */
static size_t buffer_floats(const Sizes *z, size_t *pay, size_t *part, size_t *bundle) {
    *pay = max_sz(z->kvf, 2 * z->qf + 2 * z->lf);
    *part = max_sz(z->kvf, z->qf + z->lf);
    *bundle = 2 * z->qf + 2 * z->lf;
    return 2 * *pay + 3 * *part + *bundle;
}

static size_t lightseq_workspace_floats(const StrategyParams *p) {
    if (p->cp <= 1) return 0;
    Sizes z = params_sizes(p);
    size_t a, b, c;
    /* the bf16 wire's staging: a send and a receive of a k|v or q block in bf16 */
    return buffer_floats(&z, &a, &b, &c) + (p->wire_bf16 ? max_sz(z.kvf, z.qf) : 0);
}

/* ------------------------------------------------------------------------------------------ */
/* Check. */

/* "lightseq needs an even --cp (got 3): ..." naming grids that run on the same ranks: first those
 * of the same hp x cp ranks a replica (dp kept), then, where there is none, those of all dp x hp x
 * cp ranks (dp 0: not known, 1), each with no more head ranks than heads (n_heads 0: not known);
 * where the ranks have no even divisor at all, the ranks to start instead. */
static char *odd_cp_message(int hp, int cp, int dp, int n_heads) {
    char buf[512];
    const int sp = hp * cp, world = sp * (dp > 0 ? dp : 1);
    int len = snprintf(buf, sizeof buf, "lightseq needs an even --cp (got %d): ", cp), listed = 0;
    for (int c = 2; c <= sp && listed < 3; c += 2)
        if (sp % c == 0 && (n_heads <= 0 || sp / c <= n_heads))
            len += snprintf(buf + len, sizeof buf - (size_t)len, "%s--hp %d --cp %d", listed++ ? " or " : "on these "
                            "ranks use ", sp / c, c);
    if (!listed) /* other replicas: dp x cp with the heads whole, the most context ranks first */
        for (int c = world - world % 2; c >= 2 && listed < 3; c -= 2)
            if (world % c == 0) {
                if (!listed) len += snprintf(buf + len, sizeof buf - (size_t)len, "on these %d ranks use ", world);
                len += snprintf(buf + len, sizeof buf - (size_t)len, "%s--dp %d --hp 1 --cp %d", listed++ ? " or " : "",
                                world / c, c);
            }
    if (!listed)
        snprintf(buf + len, sizeof buf - (size_t)len, "%d ranks have no even cp: start %d or %d (mpirun -np), or use "
                 "another --strategy", world, world - 1, world + 1);
    return xstrdup(buf);
}

static char *lightseq_check(const StrategyParams *p) {
    char buf[512];
    const int cp = p->cp, hp = p->hp > 0 ? p->hp : 1;
    if (cp < 1) {
        snprintf(buf, sizeof buf, "lightseq needs --cp of at least 1 (got %d)", cp);
        return xstrdup(buf);
    }
    if (cp > 1 && cp % 2) return odd_cp_message(hp, cp, p->dp, p->n_heads);
    if (cp > 1 && p->layout != LAYOUT_CONTIGUOUS) {
        snprintf(buf, sizeof buf,
                 "lightseq needs the contiguous layout (its plan computes only blocks of earlier or equal slots; got "
                 "%s): add --layout contiguous",
                 layout_name(p->layout));
        return xstrdup(buf);
    }
    return layout_split_error(p->layout, p->seq_len, hp, cp);
}

/* ------------------------------------------------------------------------------------------ */
/* The schedule. */

enum { TAG_FWD_IN = 401, TAG_FWD_RES = 402, TAG_BWD_IN = 411, TAG_BWD_DQ = 412, TAG_BWD_DKV = 413 };

typedef struct {
    Comm *comm;
    MPI_Comm mc;
    int P, r, n, H, Hk, d;
    CommWire wire;          /* of k|v and q */
    Sizes z;
    ScheduleCore core;      /* block compute; core.slot[c]: all rows of slot c */
    PosBlock *pb_first;     /* (P) the first n/2 rows of each slot */
    PosBlock *pb_second;    /* (P) the other rows */
    PosRun *runs_split;     /* (P n) */
    float *pay[2], *part[2], *in, *bundle;
} LsCtx;

static LsCtx *ls_of(ContextSchedule *s) { return (LsCtx *)s->ctx; }

static const PosBlock *rows_block(const LsCtx *x, int slot, LightseqRows rows) {
    return rows == LS_ROWS_FIRST    ? &x->pb_first[slot]
           : rows == LS_ROWS_SECOND ? &x->pb_second[slot]
                                    : &x->core.slot[slot];
}

static void ls_set_positions(ContextSchedule *s, const int *all_pos, const int *all_doc) {
    LsCtx *x = ls_of(s);
    int f0, fn, s0, sn;
    lightseq_rows(LS_ROWS_FIRST, x->n, &f0, &fn);
    lightseq_rows(LS_ROWS_SECOND, x->n, &s0, &sn);
    schedule_core_set_positions(&x->core, all_pos, all_doc);
    for (int c = 0; c < x->P; c++) {
        const int *pos = all_pos + (size_t)c * x->n, *doc = all_doc ? all_doc + (size_t)c * x->n : NULL;
        PosRun *runs = x->runs_split + (size_t)c * x->n;
        pos_block_init(&x->pb_first[c], pos + f0, doc ? doc + f0 : NULL, fn, runs);
        pos_block_init(&x->pb_second[c], pos + s0, doc ? doc + s0 : NULL, sn, runs + fn);
    }
    /* exact only if no key of a later slot is visible to a query of an earlier slot */
    for (int c = 0; c + 1 < x->P; c++) {
        int hi = all_pos[(size_t)c * x->n], lo = all_pos[(size_t)(c + 1) * x->n];
        for (int i = 0; i < x->n; i++) {
            if (all_pos[(size_t)c * x->n + i] > hi) hi = all_pos[(size_t)c * x->n + i];
            if (all_pos[(size_t)(c + 1) * x->n + i] < lo) lo = all_pos[(size_t)(c + 1) * x->n + i];
        }
        if (lo <= hi)
            die("lightseq: slot %d has a token at position %d, not after every token of slot %d (up to %d): the "
                "schedule needs the contiguous layout (--layout contiguous)",
                c + 1, lo, c, hi);
    }
}

/* Elements of `rows` rows: q|o rows (rows H d), lse rows (rows H). */
static size_t q_elems(const LsCtx *x, int rows) { return (size_t)rows * (size_t)x->H * (size_t)x->d; }
static size_t l_elems(const LsCtx *x, int rows) { return (size_t)rows * (size_t)x->H; }

static void add_into(Comm *cm, float *dst, const float *src, size_t count) {
    double t0 = comm_compute_begin(cm);
    for (size_t i = 0; i < count; i++) dst[i] += src[i];
    comm_compute_end(cm, "add partial", t0);
}

static void ls_forward(ContextSchedule *s, const float *q, const float *kv, float *o, float *lse) {
    LsCtx *x = ls_of(s);
    const Sizes *z = &x->z;
    const size_t half = z->kvf / 2;
    Comm *cm = x->comm;
    AttnShape st = {.n_q = x->n, .n_kv = x->n, .n_heads = x->H, .n_kv_heads = x->Hk, .head_dim = x->d,
                    .scale = x->core.ba.scale, .mask = ATTN_CAUSAL};
    attn_state_init(&st, o, lse);
    MPI_Request reqs[4];
    Progress pr = {reqs, 4, COMM_P2P_INNER};
    const int steps = lightseq_steps(x->P);
    for (int t = 0; t < steps; t++) {
        LightseqStep p;
        lightseq_step(x->P, x->r, t, &p);
        int r0, nr, q0, nq, e0, ne; /* rows of: my block, the q transfer, the returned partial */
        lightseq_rows(p.rows, x->n, &r0, &nr);
        lightseq_rows(p.q_rows, x->n, &q0, &nq);
        lightseq_rows(p.ret_rows, x->n, &e0, &ne);
        const size_t ret_bytes = 4 * (q_elems(x, ne) + l_elems(x, ne));
        for (int i = 0; i < 4; i++) reqs[i] = MPI_REQUEST_NULL;
        float *next = x->pay[t % 2], *prev = x->pay[(t + 1) % 2];
        if (p.recv_kv_from >= 0)
            comm_irecv_floats(cm, COMM_P2P_INNER, next, z->kvf, x->wire, p.recv_kv_from, TAG_FWD_IN, x->mc, &reqs[0]);
        else if (p.recv_q_from >= 0)
            comm_irecv_floats(cm, COMM_P2P_INNER, next, q_elems(x, nq), x->wire, p.recv_q_from, TAG_FWD_IN, x->mc,
                              &reqs[0]);
        if (p.ret_from >= 0) comm_irecv(cm, COMM_P2P_INNER, x->in, ret_bytes, p.ret_from, TAG_FWD_RES, x->mc, &reqs[1]);
        if (p.send_kv_to >= 0)
            comm_isend_floats(cm, COMM_P2P_INNER, kv, z->kvf, x->wire, p.send_kv_to, TAG_FWD_IN, x->mc, &reqs[2]);
        else if (p.send_q_to >= 0)
            comm_isend_floats(cm, COMM_P2P_INNER, q + q_elems(x, q0), q_elems(x, nq), x->wire, p.send_q_to, TAG_FWD_IN,
                              x->mc, &reqs[2]);
        if (p.ret_to >= 0)
            comm_isend(cm, COMM_P2P_INNER, x->part[(t + 1) % 2], ret_bytes, p.ret_to, TAG_FWD_RES, x->mc, &reqs[3]);
        if (p.q == x->r) { /* own rows: kv own (t = 0) or received at step t - 1 */
            const float *k = p.kv == x->r ? kv : prev;
            block_attn_forward(&x->core.ba, q + q_elems(x, r0), rows_block(x, p.q, p.rows), k, k + half,
                               &x->core.slot[p.kv], o + q_elems(x, r0), lse + l_elems(x, r0), &pr);
        } else if (p.q >= 0) { /* helper: another rank's q rows against my kv, into a fresh partial */
            float *res = x->part[t % 2];
            double t0 = comm_compute_begin(cm);
            AttnShape sh = st;
            sh.n_q = nr;
            attn_state_init(&sh, res, res + q_elems(x, nr));
            comm_compute_end(cm, "init partial", t0);
            block_attn_forward(&x->core.ba, prev, rows_block(x, p.q, p.rows), kv, kv + half, &x->core.slot[p.kv],
                               res, res + q_elems(x, nr), &pr);
        }
        comm_waitall(cm, COMM_P2P_INNER, 4, reqs);
        if (p.ret_from >= 0) {
            double t0 = comm_compute_begin(cm);
            attn_merge(ne, x->H, x->d, o + q_elems(x, e0), lse + l_elems(x, e0), x->in, x->in + q_elems(x, ne));
            comm_compute_end(cm, "merge partial", t0);
        }
    }
}

/* q | dout | lse | delta of rows [r0, r0 + nr): what a helper needs for them. */
static void pack_bundle(const LsCtx *x, float *dst, int r0, int nr, const float *q, const float *dout,
                        const float *lse, const float *delta) {
    const size_t qe = q_elems(x, nr), le = l_elems(x, nr);
    memcpy(dst, q + q_elems(x, r0), sizeof(float) * qe);
    memcpy(dst + qe, dout + q_elems(x, r0), sizeof(float) * qe);
    memcpy(dst + 2 * qe, lse + l_elems(x, r0), sizeof(float) * le);
    memcpy(dst + 2 * qe + le, delta + l_elems(x, r0), sizeof(float) * le);
}

static void ls_backward(ContextSchedule *s, const float *q, const float *kv, const float *lse, const float *delta,
                        const float *dout, float *dq, float *dkv) {
    LsCtx *x = ls_of(s);
    const Sizes *z = &x->z;
    const size_t half = z->kvf / 2;
    Comm *cm = x->comm;
    double t0 = comm_compute_begin(cm);
    memset(dq, 0, sizeof(float) * z->qf);
    memset(dkv, 0, sizeof(float) * z->kvf);
    comm_compute_end(cm, "zero grads", t0);
    MPI_Request reqs[4];
    Progress pr = {reqs, 4, COMM_P2P_INNER};
    LightseqRows packed = (LightseqRows)-1; /* the rows x->bundle holds */
    const int steps = lightseq_steps(x->P);
    for (int t = 0; t < steps; t++) {
        LightseqStep p;
        lightseq_step(x->P, x->r, t, &p);
        int r0, nr, q0, nq, e0, ne; /* rows of: my block, the q transfer, the returned dq */
        lightseq_rows(p.rows, x->n, &r0, &nr);
        lightseq_rows(p.q_rows, x->n, &q0, &nq);
        lightseq_rows(p.ret_rows, x->n, &e0, &ne);
        const size_t bundle_bytes = 4 * (2 * q_elems(x, nq) + 2 * l_elems(x, nq)), dq_bytes = 4 * q_elems(x, ne);
        for (int i = 0; i < 4; i++) reqs[i] = MPI_REQUEST_NULL;
        float *next = x->pay[t % 2], *prev = x->pay[(t + 1) % 2];
        if (p.recv_kv_from >= 0)
            comm_irecv_floats(cm, COMM_P2P_INNER, next, z->kvf, x->wire, p.recv_kv_from, TAG_BWD_IN, x->mc, &reqs[0]);
        else if (p.recv_q_from >= 0)
            comm_irecv(cm, COMM_P2P_INNER, next, bundle_bytes, p.recv_q_from, TAG_BWD_IN, x->mc, &reqs[0]);
        if (p.ret_from >= 0) comm_irecv(cm, COMM_P2P_INNER, x->in, dq_bytes, p.ret_from, TAG_BWD_DQ, x->mc, &reqs[1]);
        else if (p.dkv_from >= 0)
            comm_irecv(cm, COMM_P2P_INNER, x->in, z->kv, p.dkv_from, TAG_BWD_DKV, x->mc, &reqs[1]);
        if (p.send_kv_to >= 0) {
            comm_isend_floats(cm, COMM_P2P_INNER, kv, z->kvf, x->wire, p.send_kv_to, TAG_BWD_IN, x->mc, &reqs[2]);
        } else if (p.send_q_to >= 0) {
            if (packed != p.q_rows) { /* the previous send of the bundle completed at its step's wait */
                t0 = comm_compute_begin(cm);
                pack_bundle(x, x->bundle, q0, nq, q, dout, lse, delta);
                comm_compute_end(cm, "pack q", t0);
                packed = p.q_rows;
            }
            comm_isend(cm, COMM_P2P_INNER, x->bundle, bundle_bytes, p.send_q_to, TAG_BWD_IN, x->mc, &reqs[2]);
        }
        float *out_prev = x->part[(t + 1) % 2], *out = x->part[t % 2];
        if (p.ret_to >= 0) comm_isend(cm, COMM_P2P_INNER, out_prev, dq_bytes, p.ret_to, TAG_BWD_DQ, x->mc, &reqs[3]);
        else if (p.dkv_to >= 0)
            comm_isend(cm, COMM_P2P_INNER, out_prev, z->kv, p.dkv_to, TAG_BWD_DKV, x->mc, &reqs[3]);
        const size_t qo = q_elems(x, r0), lo = l_elems(x, r0);
        if (p.q == x->r && p.kv == x->r) {
            block_attn_backward(&x->core.ba, q, &x->core.slot[p.q], kv, kv + half, &x->core.slot[p.kv], lse, delta,
                                dout, dq, dkv, dkv + half, &pr);
        } else if (p.q == x->r) { /* owner block: dk|dv of the received kv go back next step */
            t0 = comm_compute_begin(cm);
            memset(out, 0, sizeof(float) * z->kvf);
            comm_compute_end(cm, "zero partial", t0);
            block_attn_backward(&x->core.ba, q + qo, rows_block(x, p.q, p.rows), prev, prev + half,
                                &x->core.slot[p.kv], lse + lo, delta + lo, dout + qo, dq + qo, out, out + half, &pr);
        } else if (p.q >= 0) { /* helper block: dq of the received rows goes back next step */
            const size_t qe = q_elems(x, nr), le = l_elems(x, nr);
            const float *qm = prev, *doutm = prev + qe, *lsem = prev + 2 * qe, *deltam = lsem + le;
            t0 = comm_compute_begin(cm);
            memset(out, 0, sizeof(float) * qe);
            comm_compute_end(cm, "zero partial", t0);
            block_attn_backward(&x->core.ba, qm, rows_block(x, p.q, p.rows), kv, kv + half, &x->core.slot[p.kv],
                                lsem, deltam, doutm, out, dkv, dkv + half, &pr);
        }
        comm_waitall(cm, COMM_P2P_INNER, 4, reqs);
        if (p.ret_from >= 0) add_into(cm, dq + q_elems(x, e0), x->in, q_elems(x, ne));
        else if (p.dkv_from >= 0) add_into(cm, dkv, x->in, z->kvf);
    }
}

static void ls_destroy(ContextSchedule *s) {
    LsCtx *x = ls_of(s);
    for (int i = 0; i < 2; i++) {
        xfree(x->pay[i]);
        xfree(x->part[i]);
    }
    xfree(x->in);
    xfree(x->bundle);
    schedule_core_free(&x->core);
    xfree(x->pb_first);
    xfree(x->pb_second);
    xfree(x->runs_split);
    xfree(x);
    xfree(s);
}

static ContextSchedule *lightseq_create(const ScheduleShape *sh) {
    const Topology *t = sh->topo;
    if (t->cp > 1 && t->cp % 2) die_collective("%s", odd_cp_message(t->hp, t->cp, t->dp, 0));
    LsCtx *x = xcalloc(1, sizeof *x);
    x->comm = sh->comm;
    x->mc = t->ctx_comm;
    x->P = t->cp;
    x->r = t->cp_rank;
    x->n = sh->n;
    x->H = sh->heads;
    x->Hk = sh->kv_heads;
    x->d = sh->head_dim;
    x->wire = sh->wire;
    x->z = sizes_of(sh->n, sh->heads, sh->kv_heads, sh->head_dim, sh->wire == COMM_WIRE_BF16);
    schedule_core_init(&x->core, sh);
    x->pb_first = xcalloc((size_t)x->P, sizeof(PosBlock));
    x->pb_second = xcalloc((size_t)x->P, sizeof(PosBlock));
    x->runs_split = xmalloc(sizeof(PosRun) * (size_t)x->P * (size_t)x->n);
    if (x->P > 1) {
        size_t pay, part, bundle;
        buffer_floats(&x->z, &pay, &part, &bundle);
        for (int i = 0; i < 2; i++) {
            x->pay[i] = xmalloc_aligned(sizeof(float) * pay);
            x->part[i] = xmalloc_aligned(sizeof(float) * part);
        }
        x->in = xmalloc_aligned(sizeof(float) * part);
        x->bundle = xmalloc_aligned(sizeof(float) * bundle);
    }
    static const ContextSchedule OPS = {.set_positions = ls_set_positions, .forward = ls_forward,
                                        .backward = ls_backward, .destroy = ls_destroy};
    return schedule_core_new(&OPS, x, &x->core);
}

/* The schedule ls_forward / ls_backward run: the plan's steps (lightseq_step), every rank's
 * transfers posted at the step's start (the next step's input, the previous step's partial for
 * another rank) while its block computes. */
static void lightseq_play(const StrategyParams *p, SchedulePass pass, StepSchedule *out) {
    const int P = p->cp, bwd = pass == PASS_BACKWARD, H = p->n_heads, Hk = kv_heads_held(p);
    const Sizes z = params_sizes(p);
    const int n = (int)(p->seq_len / P), elem = p->wire_bf16 ? 2 : 4;
    SlotBlocks sb;
    slot_blocks_init(&sb, p->layout, p->seq_len, P);
    PosRun *runs = xmalloc(sizeof(PosRun) * (size_t)n);
    for (int t = 0; t < lightseq_steps(P); t++) {
        schedule_step(out, t <= P / 2 ? (bwd ? "balanced step (backward)" : "balanced step") : "return the last partials");
        for (int r = 0; r < P; r++) {
            LightseqStep st;
            lightseq_step(P, r, t, &st);
            int r0, nr, q0, nq, e0, ne;
            lightseq_rows(st.rows, n, &r0, &nr);
            lightseq_rows(st.q_rows, n, &q0, &nq);
            lightseq_rows(st.ret_rows, n, &e0, &ne);
            const unsigned long long qe = (unsigned long long)nq * (unsigned)H * (unsigned)p->head_dim,
                                     le = (unsigned long long)nq * (unsigned)H;
            const unsigned long long re = (unsigned long long)ne * (unsigned)H * (unsigned)p->head_dim,
                                     rl = (unsigned long long)ne * (unsigned)H;
            if (st.send_kv_to >= 0) schedule_message(out, COMM_P2P_INNER, r, st.send_kv_to, z.kv_wire, 1);
            else if (st.send_q_to >= 0) /* forward: q rows on the wire; backward: q | dout | lse | delta, fp32 */
                schedule_message(out, COMM_P2P_INNER, r, st.send_q_to, bwd ? 4 * (2 * qe + 2 * le) : elem * qe, 1);
            if (st.ret_to >= 0) /* forward: o | lse of a helper block; backward: its dq */
                schedule_message(out, COMM_P2P_INNER, r, st.ret_to, bwd ? 4 * re : 4 * (re + rl), 1);
            else if (bwd && st.dkv_to >= 0)
                schedule_message(out, COMM_P2P_INNER, r, st.dkv_to, z.kv, 1);
            if (st.q < 0) continue;
            PosBlock qb; /* all of a slot's rows: the slot's block, cut once */
            if (st.rows != LS_ROWS_ALL) pos_block_init(&qb, sb.pos + (size_t)st.q * n + r0, NULL, nr, runs);
            schedule_compute(out, r, H, Hk, st.rows == LS_ROWS_ALL ? &sb.slot[st.q] : &qb, &sb.slot[st.kv], p->window);
        }
    }
    xfree(runs);
    slot_blocks_free(&sb);
}

static const ScheduleInfo lightseq_schedule = {
    .name = "lightseq",
    .check = lightseq_check,
    .create = lightseq_create,
    .volume = lightseq_volume,
    .workspace_floats = lightseq_workspace_floats,
    .play = lightseq_play,
};

const Strategy lightseq_strategy = {
    .name = "lightseq",
    .title = "LightSeq",
    .summary = "LightSeq / DistFlashAttn balanced causal schedule: idle early ranks compute later ranks' blocks "
               "(paper 004 §3.2)",
    .flags = "--hp --cp --layout",
    .constraints = "cp even (or 1); contiguous layout; seq-len divisible by hp x cp",
    .grid = GRID_CONTEXT,
    .default_layout = LAYOUT_CONTIGUOUS,
    .schedule = &lightseq_schedule,
    .balanced = 1,
};
