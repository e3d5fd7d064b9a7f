/* LoongTrain 2D-Attention (SeqAlltoAll x Double-Ring-Attention) and its corners Ulysses and
 * Ring as one SeqAttention: see dist_attention.h for the algorithm, the byte counts and the
 * content of `saved`. */
#include "strategies/dist_attention.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attention/flash_attention.h"
#include "core/common.h"

/* Message tags: forward KV, backward KV and backward dK/dV never share a tag. */
enum {
    TAG_FWD_KV_INNER = 101,
    TAG_FWD_KV_OUTER = 102,
    TAG_BWD_KV_INNER = 201,
    TAG_BWD_KV_OUTER = 202,
    TAG_BWD_DKV_INNER = 203,
    TAG_BWD_DKV_OUTER = 204,
};

/* A run: rows [start, start+len) of a block whose positions form an arithmetic progression. */
typedef struct { int start, len, lo, hi; } Run;

typedef struct {
    const Topology *t;
    Comm *comm;
    int S;
    int heads_set;
    int H, Hkv, d;
    int hp, cp, sp, W, R;   /* R = cp / W outer steps */
    int N, n;               /* local tokens S/sp; context-slot tokens S/cp */
    int Hl, Hk;             /* query heads and (replicated) KV heads per head member */
    int piece_rows;
    int compute;
    DistAttnWork work;          /* of the last forward / backward */
    float scale;
    /* workspaces */
    float *a2a_send, *a2a_recv; /* hp x N x (Hl + 2 Hk) x d each */
    float *kvbuf[4];            /* (2 n Hk d): outer recv x2, inner rotation x2 */
    float *dkv_l[2], *dkv_in, *dkv_wp[2], *dkv_or, *dkv_final; /* (2 n Hk d) each */
    float *dq_h, *dout_h, *delta; /* (n Hl d), (n Hl d), (n Hl) */
    Run *runs;                  /* cp x n runs at most */
    int *n_runs;                /* per context slot */
} DistCtx;

static DistCtx *ctx_of(const SeqAttention *sa) { return (DistCtx *)sa->ctx; }

/* ------------------------------------------------------------------------------------------ */
/* Checks. */

static int heads_split_ok(int H, int Hkv, int hp) {
    if (hp < 1 || H % hp) return 0;
    return Hkv % hp == 0 || hp % Hkv == 0;
}

char *dist_attention_check(const Topology *t, int H, int Hkv, long S, TokenLayout layout) {
    char buf[1024];
    int hp = t->hp, cp = t->cp;
    long sp = (long)hp * cp;
    buf[0] = 0;
    if (H < 1 || Hkv < 1 || H % Hkv) {
        snprintf(buf, sizeof buf, "the model's %d query heads are not a multiple of its %d key/value heads", H, Hkv);
    } else if (!heads_split_ok(H, Hkv, hp)) {
        char valid[512];
        size_t len = 0;
        valid[0] = 0;
        for (int v = 1; v <= H; v++)
            if (heads_split_ok(H, Hkv, v))
                len += (size_t)snprintf(valid + len, sizeof valid - len, "%s%d", len ? ", " : "", v);
        snprintf(buf, sizeof buf,
                 "--hp %d cannot split %d query heads with %d key/value heads (hp must divide the query heads and "
                 "divide or be a multiple of the key/value heads); valid --hp for this model: %s",
                 hp, H, Hkv, valid);
    } else {
        long unit = layout == LAYOUT_ZIGZAG ? 2 * sp : sp;
        if (S <= 0 || S % unit) {
            long below = S / unit * unit, above = below + unit;
            snprintf(buf, sizeof buf,
                     "--seq-len %ld does not split under the %s layout over hp x cp = %ld ranks: it must be divisible "
                     "by %ld (e.g. %ld or %ld)",
                     S, layout_name(layout), sp, unit, below > 0 ? below : above, above);
        }
    }
    if (!buf[0]) return NULL;
    size_t n = strlen(buf) + 1;
    char *s = xmalloc(n);
    memcpy(s, buf, n);
    return s;
}

/* ------------------------------------------------------------------------------------------ */
/* Volumes (bytes per rank per layer). */

void dist_attention_volume(const Topology *t, int S, int H, int Hkv, int d, DistAttnVolume *v) {
    memset(v, 0, sizeof *v);
    unsigned long long hp = (unsigned)t->hp, cp = (unsigned)t->cp, sp = hp * cp, W = (unsigned)t->ring_inner,
                       R = cp / W;
    unsigned long long N = (unsigned long long)S / sp, Hk = (unsigned)(Hkv > t->hp ? Hkv : t->hp) / hp;
    unsigned long long size_q = 4ULL * N * (unsigned)H * (unsigned)d;        /* = Size(out) */
    unsigned long long size_kv = 8ULL * N * Hk * hp * (unsigned)d;            /* k and v */
    unsigned long long a2a = (hp - 1) * (2 * size_q + size_kv) / hp;           /* exact: hp | H, N Hk hp */
    v->fwd[COMM_ALLTOALL] = v->bwd[COMM_ALLTOALL] = a2a;
    v->fwd_msgs[COMM_ALLTOALL] = v->bwd_msgs[COMM_ALLTOALL] = 2 * (hp - 1);
    unsigned long long fi = R * (W - 1), fo = R - 1;
    unsigned long long bi = R * (W - 1) + (W > 1 ? R * W : 0), bo = (R - 1) + (R > 1 ? R : 0);
    v->fwd[COMM_P2P_INNER] = fi * size_kv;
    v->fwd[COMM_P2P_OUTER] = fo * size_kv;
    v->bwd[COMM_P2P_INNER] = bi * size_kv;
    v->bwd[COMM_P2P_OUTER] = bo * size_kv;
    v->fwd_msgs[COMM_P2P_INNER] = fi;
    v->fwd_msgs[COMM_P2P_OUTER] = fo;
    v->bwd_msgs[COMM_P2P_INNER] = bi;
    v->bwd_msgs[COMM_P2P_OUTER] = bo;
    v->meta_fwd = 4ULL * N * (sp - 1);
}

/* ------------------------------------------------------------------------------------------ */
/* Layout of `saved`. */

static size_t off_k(const DistCtx *x) { return (size_t)x->n * x->Hl * x->d; }
static size_t off_v(const DistCtx *x) { return off_k(x) + (size_t)x->n * x->Hk * x->d; }
static size_t off_o(const DistCtx *x) { return off_v(x) + (size_t)x->n * x->Hk * x->d; }
static size_t off_lse(const DistCtx *x) { return off_o(x) + (size_t)x->n * x->Hl * x->d; }
static size_t off_pos(const DistCtx *x) { return off_lse(x) + (size_t)x->n * x->Hl; }
static size_t saved_total(const DistCtx *x) { return off_pos(x) + (size_t)x->S; }

static void require_heads(const DistCtx *x, const char *who) {
    if (!x->heads_set)
        die("dist_attention: %s called before dist_attention_set_heads(): the strategy must know the model's heads "
            "and head_dim to size its buffers",
            who);
}

static size_t dist_saved_floats(const SeqAttention *sa, int N, int n_heads) {
    DistCtx *x = ctx_of(sa);
    require_heads(x, "saved_floats");
    if (N != x->N || n_heads != x->H)
        die("dist_attention: saved_floats asked for N=%d, H=%d but the strategy was set up for N=%d (S=%d over sp=%d), "
            "H=%d",
            N, n_heads, x->N, x->S, x->sp, x->H);
    return saved_total(x);
}

void dist_attention_saved_view(const SeqAttention *sa, const float *saved, DistSavedView *v) {
    const DistCtx *x = ctx_of(sa);
    require_heads(x, "saved_view");
    v->n_rows = x->n;
    v->heads = x->Hl;
    v->head_offset = x->t->hp_rank * x->Hl;
    v->kv_heads = x->Hk;
    v->q = saved;
    v->k = saved + off_k(x);
    v->v = saved + off_v(x);
    v->o = saved + off_o(x);
    v->lse = saved + off_lse(x);
    v->positions = (const int *)(saved + off_pos(x)) + (size_t)x->t->cp_rank * x->n;
}

/* ------------------------------------------------------------------------------------------ */
/* Runs of positions. */

static int make_runs(const int *pos, int n, Run *out) {
    int count = 0, i = 0;
    while (i < n) {
        int j = i + 1;
        if (j < n) {
            long stride = (long)pos[j] - pos[i];
            while (j + 1 < n && (long)pos[j + 1] - pos[j] == stride) j++;
            j++;
        }
        Run r = {i, j - i, pos[i], pos[i]};
        for (int k = i; k < j; k++) {
            if (pos[k] < r.lo) r.lo = pos[k];
            if (pos[k] > r.hi) r.hi = pos[k];
        }
        out[count++] = r;
        i = j;
    }
    return count;
}

static void build_runs(DistCtx *x, const int *all_pos) {
    for (int c = 0; c < x->cp; c++)
        x->n_runs[c] = make_runs(all_pos + (size_t)c * x->n, x->n, x->runs + (size_t)c * x->n);
}

enum { VIS_HIDDEN = 0, VIS_PARTIAL = 1, VIS_FULL = 2 };

static int visibility(int qlo, int qhi, int klo, int khi) {
    if (khi <= qlo) return VIS_FULL;
    if (klo > qhi) return VIS_HIDDEN;
    return VIS_PARTIAL;
}

static void range_of(const int *pos, int n, int *lo, int *hi) {
    int a = pos[0], b = pos[0];
    for (int i = 1; i < n; i++) {
        if (pos[i] < a) a = pos[i];
        if (pos[i] > b) b = pos[i];
    }
    *lo = a;
    *hi = b;
}

/* ------------------------------------------------------------------------------------------ */
/* Block compute: own q block (context slot c_q) against the kv block of slot c_kv, in pieces
 * of query rows with a progress test of the in-flight requests between pieces. */

typedef struct {
    MPI_Request *reqs;
    int n;
    CommKind kind;
} Progress;

static void progress(DistCtx *x, const Progress *p) {
    if (p && p->n) comm_testall(x->comm, p->kind, p->n, p->reqs);
}

static AttnShape piece_shape(const DistCtx *x, int nq, int nkv, int vis) {
    AttnShape s = {.n_q = nq, .n_kv = nkv, .n_heads = x->Hl, .n_kv_heads = x->Hk, .head_dim = x->d,
                   .scale = x->scale, .mask = vis == VIS_FULL ? ATTN_FULL : ATTN_CAUSAL};
    return s;
}

/* Forward: merges attention of q_h against kv (packed k | v of slot c_kv) into (o, lse). */
static void block_forward(DistCtx *x, const float *q, const int *all_pos, int c_q, const float *kv, int c_kv,
                          float *o, float *lse, const Progress *pr) {
    const int n = x->n, Hl = x->Hl, Hk = x->Hk, d = x->d;
    const int *qpos = all_pos + (size_t)c_q * n, *kpos = all_pos + (size_t)c_kv * n;
    const Run *qr = x->runs + (size_t)c_q * n, *kr = x->runs + (size_t)c_kv * n;
    const float *k = kv, *v = kv + (size_t)n * Hk * d;
    for (int a = 0; a < x->n_runs[c_q]; a++) {
        for (int r0 = 0; r0 < qr[a].len; r0 += x->piece_rows) {
            const int i0 = qr[a].start + r0;
            const int nq = qr[a].len - r0 < x->piece_rows ? qr[a].len - r0 : x->piece_rows;
            int plo, phi, did = 0;
            range_of(qpos + i0, nq, &plo, &phi);
            for (int b = 0; b < x->n_runs[c_kv]; b++) {
                int vis = visibility(plo, phi, kr[b].lo, kr[b].hi);
                if (vis == VIS_HIDDEN) continue;
                const int j0 = kr[b].start;
                AttnShape s = piece_shape(x, nq, kr[b].len, vis);
                x->work.fwd_calls++;
                x->work.fwd_cells += (unsigned long long)nq * (unsigned)kr[b].len;
                if (x->compute) {
                    double t0 = comm_compute_begin(x->comm);
                    attn_forward(&s, q + (size_t)i0 * Hl * d, qpos + i0, k + (size_t)j0 * Hk * d,
                                 v + (size_t)j0 * Hk * d, kpos + j0, o + (size_t)i0 * Hl * d, lse + (size_t)i0 * Hl);
                    comm_compute_end(x->comm, "attn fwd", t0);
                }
                did = 1;
            }
            if (did) progress(x, pr);
        }
    }
}

/* Backward: accumulates dq (own rows) and dkv (packed dk | dv of the kv block). */
static void block_backward(DistCtx *x, const float *q, const int *all_pos, int c_q, const float *kv, int c_kv,
                           const float *lse, const float *delta, const float *dout, float *dq, float *dkv,
                           const Progress *pr) {
    const int n = x->n, Hl = x->Hl, Hk = x->Hk, d = x->d;
    const int *qpos = all_pos + (size_t)c_q * n, *kpos = all_pos + (size_t)c_kv * n;
    const Run *qr = x->runs + (size_t)c_q * n, *kr = x->runs + (size_t)c_kv * n;
    const float *k = kv, *v = kv + (size_t)n * Hk * d;
    float *dk = dkv, *dv = dkv + (size_t)n * Hk * d;
    for (int a = 0; a < x->n_runs[c_q]; a++) {
        for (int r0 = 0; r0 < qr[a].len; r0 += x->piece_rows) {
            const int i0 = qr[a].start + r0;
            const int nq = qr[a].len - r0 < x->piece_rows ? qr[a].len - r0 : x->piece_rows;
            int plo, phi, did = 0;
            range_of(qpos + i0, nq, &plo, &phi);
            for (int b = 0; b < x->n_runs[c_kv]; b++) {
                int vis = visibility(plo, phi, kr[b].lo, kr[b].hi);
                if (vis == VIS_HIDDEN) continue;
                const int j0 = kr[b].start;
                const size_t qo = (size_t)i0 * Hl * d, ko = (size_t)j0 * Hk * d;
                AttnShape s = piece_shape(x, nq, kr[b].len, vis);
                x->work.bwd_calls++;
                x->work.bwd_cells += (unsigned long long)nq * (unsigned)kr[b].len;
                if (x->compute) {
                    double t0 = comm_compute_begin(x->comm);
                    attn_backward(&s, q + qo, qpos + i0, k + ko, v + ko, kpos + j0, lse + (size_t)i0 * Hl,
                                  delta + (size_t)i0 * Hl, dout + qo, dq + qo, dk + ko, dv + ko);
                    comm_compute_end(x->comm, "attn bwd", t0);
                }
                did = 1;
            }
            if (did) progress(x, pr);
        }
    }
}

/* ------------------------------------------------------------------------------------------ */
/* SeqAlltoAll helpers. */

/* Global KV head sent to head member p as its local KV head j (KV replication when Hkv < hp). */
static int kv_src_head(const DistCtx *x, int p, int j) {
    return x->Hkv >= x->hp ? p * x->Hk + j : p / (x->hp / x->Hkv);
}

static void copy_heads(float *dst, const float *src, int rows, int dst_ld, int src_ld, int width) {
    for (int i = 0; i < rows; i++)
        memcpy(dst + (size_t)i * dst_ld, src + (size_t)i * src_ld, sizeof(float) * (size_t)width);
}

/* Forward q, k, v: local (N, H|Hkv, d) -> saved q_h, k_h, v_h (n, Hl|Hk, d). */
static void a2a_qkv_forward(DistCtx *x, const float *q, const float *k, const float *v, float *saved) {
    const int N = x->N, H = x->H, Hkv = x->Hkv, Hl = x->Hl, Hk = x->Hk, d = x->d, hp = x->hp;
    const size_t blk = (size_t)N * (Hl + 2 * Hk) * d;
    double t0 = comm_compute_begin(x->comm);
    for (int p = 0; p < hp; p++) {
        float *b = x->a2a_send + (size_t)p * blk;
        float *bq = b, *bk = b + (size_t)N * Hl * d, *bv = bk + (size_t)N * Hk * d;
        copy_heads(bq, q + (size_t)p * Hl * d, N, Hl * d, H * d, Hl * d);
        for (int j = 0; j < Hk; j++) {
            int g = kv_src_head(x, p, j);
            for (int i = 0; i < N; i++) {
                memcpy(bk + ((size_t)i * Hk + j) * d, k + ((size_t)i * Hkv + g) * d, sizeof(float) * (size_t)d);
                memcpy(bv + ((size_t)i * Hk + j) * d, v + ((size_t)i * Hkv + g) * d, sizeof(float) * (size_t)d);
            }
        }
    }
    comm_compute_end(x->comm, "a2a pack", t0);
    const float *recv = x->a2a_send;
    if (hp > 1) {
        comm_alltoall(x->comm, COMM_ALLTOALL, x->a2a_send, x->a2a_recv, blk * sizeof(float), x->t->head_comm);
        recv = x->a2a_recv;
    }
    t0 = comm_compute_begin(x->comm);
    float *qh = saved, *kh = saved + off_k(x), *vh = saved + off_v(x);
    for (int p = 0; p < hp; p++) { /* member p's tokens are rows [p N, (p+1) N) of the slot */
        const float *b = recv + (size_t)p * blk;
        memcpy(qh + (size_t)p * N * Hl * d, b, sizeof(float) * (size_t)N * Hl * d);
        memcpy(kh + (size_t)p * N * Hk * d, b + (size_t)N * Hl * d, sizeof(float) * (size_t)N * Hk * d);
        memcpy(vh + (size_t)p * N * Hk * d, b + (size_t)N * (Hl + Hk) * d, sizeof(float) * (size_t)N * Hk * d);
    }
    comm_compute_end(x->comm, "a2a unpack", t0);
}

/* Head-parallel (n, Hl, d) -> local (N, H, d): the output forward. */
static void a2a_heads_to_local(DistCtx *x, const float *src_h, float *dst) {
    const int N = x->N, H = x->H, Hl = x->Hl, d = x->d, hp = x->hp;
    const size_t blk = (size_t)N * Hl * d;
    const float *recv = src_h; /* block p of src_h (rows p N..) goes to member p: no packing */
    if (hp > 1) {
        comm_alltoall(x->comm, COMM_ALLTOALL, src_h, x->a2a_recv, blk * sizeof(float), x->t->head_comm);
        recv = x->a2a_recv;
    }
    double t0 = comm_compute_begin(x->comm);
    for (int p = 0; p < hp; p++) copy_heads(dst + (size_t)p * Hl * d, recv + (size_t)p * blk, N, H * d, Hl * d, Hl * d);
    comm_compute_end(x->comm, "a2a unpack", t0);
}

/* Local (N, H, d) -> head-parallel (n, Hl, d): dout backward. */
static void a2a_local_to_heads(DistCtx *x, const float *src, float *dst_h) {
    const int N = x->N, H = x->H, Hl = x->Hl, d = x->d, hp = x->hp;
    const size_t blk = (size_t)N * Hl * d;
    double t0 = comm_compute_begin(x->comm);
    float *send = hp > 1 ? x->a2a_send : dst_h;
    for (int p = 0; p < hp; p++) copy_heads(send + (size_t)p * blk, src + (size_t)p * Hl * d, N, Hl * d, H * d, Hl * d);
    comm_compute_end(x->comm, "a2a pack", t0);
    if (hp > 1) comm_alltoall(x->comm, COMM_ALLTOALL, x->a2a_send, dst_h, blk * sizeof(float), x->t->head_comm);
}

/* Backward dq_h, dk_h, dv_h (n, Hl|Hk, d) -> local dq (N, H, d), dk, dv (N, Hkv, d), replicas summed. */
static void a2a_grads_backward(DistCtx *x, const float *dqh, const float *dkvh, float *dq, float *dk, float *dv) {
    const int N = x->N, H = x->H, Hkv = x->Hkv, Hl = x->Hl, Hk = x->Hk, d = x->d, hp = x->hp, n = x->n;
    const size_t blk = (size_t)N * (Hl + 2 * Hk) * d;
    const float *dkh = dkvh, *dvh = dkvh + (size_t)n * Hk * d;
    double t0 = comm_compute_begin(x->comm);
    for (int p = 0; p < hp; p++) {
        float *b = x->a2a_send + (size_t)p * blk;
        memcpy(b, dqh + (size_t)p * N * Hl * d, sizeof(float) * (size_t)N * Hl * d);
        memcpy(b + (size_t)N * Hl * d, dkh + (size_t)p * N * Hk * d, sizeof(float) * (size_t)N * Hk * d);
        memcpy(b + (size_t)N * (Hl + Hk) * d, dvh + (size_t)p * N * Hk * d, sizeof(float) * (size_t)N * Hk * d);
    }
    comm_compute_end(x->comm, "a2a pack", t0);
    const float *recv = x->a2a_send;
    if (hp > 1) {
        comm_alltoall(x->comm, COMM_ALLTOALL, x->a2a_send, x->a2a_recv, blk * sizeof(float), x->t->head_comm);
        recv = x->a2a_recv;
    }
    t0 = comm_compute_begin(x->comm);
    memset(dk, 0, sizeof(float) * (size_t)N * Hkv * d);
    memset(dv, 0, sizeof(float) * (size_t)N * Hkv * d);
    for (int p = 0; p < hp; p++) {
        const float *b = recv + (size_t)p * blk;
        const float *bk = b + (size_t)N * Hl * d, *bv = bk + (size_t)N * Hk * d;
        copy_heads(dq + (size_t)p * Hl * d, b, N, H * d, Hl * d, Hl * d);
        for (int j = 0; j < Hk; j++) {
            int g = kv_src_head(x, p, j);
            for (int i = 0; i < N; i++) {
                float *tk = dk + ((size_t)i * Hkv + g) * d, *tv = dv + ((size_t)i * Hkv + g) * d;
                const float *sk = bk + ((size_t)i * Hk + j) * d, *sv = bv + ((size_t)i * Hk + j) * d;
                for (int e = 0; e < d; e++) {
                    tk[e] += sk[e];
                    tv[e] += sv[e];
                }
            }
        }
    }
    comm_compute_end(x->comm, "a2a unpack", t0);
}

/* ------------------------------------------------------------------------------------------ */
/* Ring neighbours. */

static int inner_next(const DistCtx *x) { return (x->t->inner_rank + 1) % x->W; }
static int inner_prev(const DistCtx *x) { return (x->t->inner_rank + x->W - 1) % x->W; }
static int outer_next(const DistCtx *x) { return (x->t->outer_rank + 1) % x->R; }
static int outer_prev(const DistCtx *x) { return (x->t->outer_rank + x->R - 1) % x->R; }

/* Context slot whose KV this rank holds at outer step j, inner step s. */
static int kv_owner(const DistCtx *x, int j, int s) {
    int o = (x->t->outer_rank - j % x->R + x->R) % x->R, i = (x->t->inner_rank - s % x->W + x->W) % x->W;
    return o * x->W + i;
}

/* ------------------------------------------------------------------------------------------ */
/* Forward. */

static void check_call(const DistCtx *x, int N, int H, int Hkv, int d, const char *who) {
    require_heads(x, who);
    if (N != x->N || H != x->H || Hkv != x->Hkv || d != x->d)
        die("dist_attention %s: called with N=%d H=%d Hkv=%d d=%d but set up for N=%d H=%d Hkv=%d d=%d", who, N, H, Hkv,
            d, x->N, x->H, x->Hkv, x->d);
}

static void dist_forward(const SeqAttention *sa, int N, int n_heads, int n_kv_heads, int head_dim, const float *q,
                         const float *k, const float *v, const int *positions, float *o, float *saved) {
    DistCtx *x = ctx_of(sa);
    check_call(x, N, n_heads, n_kv_heads, head_dim, "forward");
    const int n = x->n, Hk = x->Hk, d = x->d, W = x->W, R = x->R;
    const size_t kv_bytes = sizeof(float) * 2 * (size_t)n * Hk * d;
    Comm *cm = x->comm;
    const Topology *t = x->t;

    /* 1. positions of the whole group, in sp-rank order = T_0, T_1, ... */
    int *all_pos = (int *)(saved + off_pos(x));
    if (x->sp > 1)
        comm_allgather_meta(cm, COMM_ALLTOALL, positions, all_pos, sizeof(int) * (size_t)N, t->sp_comm);
    else
        memcpy(all_pos, positions, sizeof(int) * (size_t)N);
    build_runs(x, all_pos);
    x->work.fwd_calls = x->work.fwd_cells = 0;

    /* 2. SeqAlltoAll of q, k, v (with KV replication). */
    a2a_qkv_forward(x, q, k, v, saved);
    const float *qh = saved;
    float *oh = saved + off_o(x), *lseh = saved + off_lse(x);
    AttnShape st = piece_shape(x, n, n, VIS_PARTIAL);
    attn_state_init(&st, oh, lseh);

    /* 3. Double ring. reqs: 0-1 inner send/recv, 2-3 outer send/recv. */
    MPI_Request reqs[4] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL, MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    Progress pr = {reqs, 4, W > 1 ? COMM_P2P_INNER : COMM_P2P_OUTER};
    const float *kv_start = saved + off_k(x); /* own k_h | v_h, contiguous */
    for (int j = 0; j < R; j++) {
        if (j < R - 1) {
            comm_isend(cm, COMM_P2P_OUTER, kv_start, kv_bytes, outer_next(x), TAG_FWD_KV_OUTER, t->outer_comm, &reqs[2]);
            comm_irecv(cm, COMM_P2P_OUTER, x->kvbuf[j % 2], kv_bytes, outer_prev(x), TAG_FWD_KV_OUTER, t->outer_comm,
                       &reqs[3]);
        }
        const float *cur = kv_start;
        for (int s = 0; s < W; s++) {
            float *nxt = x->kvbuf[2 + s % 2];
            if (s < W - 1) {
                comm_isend(cm, COMM_P2P_INNER, cur, kv_bytes, inner_next(x), TAG_FWD_KV_INNER, t->inner_comm, &reqs[0]);
                comm_irecv(cm, COMM_P2P_INNER, nxt, kv_bytes, inner_prev(x), TAG_FWD_KV_INNER, t->inner_comm, &reqs[1]);
            }
            block_forward(x, qh, all_pos, t->cp_rank, cur, kv_owner(x, j, s), oh, lseh, &pr);
            if (s < W - 1) {
                comm_waitall(cm, COMM_P2P_INNER, 2, &reqs[0]);
                cur = nxt;
            }
        }
        if (j < R - 1) {
            comm_waitall(cm, COMM_P2P_OUTER, 2, &reqs[2]);
            kv_start = x->kvbuf[j % 2];
        }
    }

    /* 4. output back to the local layout */
    a2a_heads_to_local(x, oh, o);
}

/* ------------------------------------------------------------------------------------------ */
/* Backward. */

static void add_into(float *dst, const float *src, size_t count) {
    for (size_t i = 0; i < count; i++) dst[i] += src[i];
}

static void dist_backward(const SeqAttention *sa, int N, int n_heads, int n_kv_heads, int head_dim, const float *q,
                          const float *k, const float *v, const int *positions, const float *o, const float *saved,
                          const float *dout, float *dq, float *dk, float *dv) {
    DistCtx *x = ctx_of(sa);
    check_call(x, N, n_heads, n_kv_heads, head_dim, "backward");
    (void)q;
    (void)k;
    (void)v;
    (void)o;
    const int n = x->n, Hl = x->Hl, Hk = x->Hk, d = x->d, W = x->W, R = x->R;
    const size_t kv_floats = 2 * (size_t)n * Hk * d, kv_bytes = sizeof(float) * kv_floats;
    Comm *cm = x->comm;
    const Topology *t = x->t;
    const int *all_pos = (const int *)(saved + off_pos(x));
    if (memcmp(positions, all_pos + (size_t)t->sp_rank * N, sizeof(int) * (size_t)N) != 0)
        die("dist_attention backward: the positions differ from those of the forward that filled `saved`");
    build_runs(x, all_pos);
    x->work.bwd_calls = x->work.bwd_cells = 0;
    const float *qh = saved, *oh = saved + off_o(x), *lseh = saved + off_lse(x);

    /* dout to head-parallel, delta from the final o */
    a2a_local_to_heads(x, dout, x->dout_h);
    double t0 = comm_compute_begin(cm);
    AttnShape st = piece_shape(x, n, n, VIS_PARTIAL);
    attn_backward_delta(&st, oh, x->dout_h, x->delta);
    memset(x->dq_h, 0, sizeof(float) * (size_t)n * Hl * d);
    comm_compute_end(cm, "delta", t0);

    /* reqs: 0-1 kv inner, 2-3 kv outer, 4 dkv inner send, 5 dkv inner recv (incoming partial),
     * 6 dkv outer send, 7 dkv outer recv, 8 dkv inner recv (the window partial coming home) */
    MPI_Request reqs[9];
    for (int i = 0; i < 9; i++) reqs[i] = MPI_REQUEST_NULL;
    Progress pr = {reqs, 9, W > 1 ? COMM_P2P_INNER : COMM_P2P_OUTER};
    const float *kv_start = saved + off_k(x);
    for (int j = 0; j < R; j++) {
        float *wp = x->dkv_wp[j % 2];
        if (j < R - 1) {
            comm_isend(cm, COMM_P2P_OUTER, kv_start, kv_bytes, outer_next(x), TAG_BWD_KV_OUTER, t->outer_comm, &reqs[2]);
            comm_irecv(cm, COMM_P2P_OUTER, x->kvbuf[j % 2], kv_bytes, outer_prev(x), TAG_BWD_KV_OUTER, t->outer_comm,
                       &reqs[3]);
        }
        if (R > 1 && j >= 1) /* partial dkv of earlier windows for this step's starting KV */
            comm_irecv(cm, COMM_P2P_OUTER, x->dkv_or, kv_bytes, outer_prev(x), TAG_BWD_DKV_OUTER, t->outer_comm,
                       &reqs[7]);
        const float *cur = kv_start;
        for (int s = 0; s < W; s++) {
            float *nxt = x->kvbuf[2 + s % 2];
            float *L = x->dkv_l[s % 2];
            if (s < W - 1) {
                comm_isend(cm, COMM_P2P_INNER, cur, kv_bytes, inner_next(x), TAG_BWD_KV_INNER, t->inner_comm, &reqs[0]);
                comm_irecv(cm, COMM_P2P_INNER, nxt, kv_bytes, inner_prev(x), TAG_BWD_KV_INNER, t->inner_comm, &reqs[1]);
            }
            if (W > 1 && s >= 1)
                comm_irecv(cm, COMM_P2P_INNER, x->dkv_in, kv_bytes, inner_prev(x), TAG_BWD_DKV_INNER, t->inner_comm,
                           &reqs[5]);
            if (W > 1 && s == W - 1) /* posted after reqs[5]: same source and tag match in order */
                comm_irecv(cm, COMM_P2P_INNER, wp, kv_bytes, inner_prev(x), TAG_BWD_DKV_INNER, t->inner_comm, &reqs[8]);
            t0 = comm_compute_begin(cm);
            memset(L, 0, kv_bytes);
            comm_compute_end(cm, "zero dkv", t0);
            block_backward(x, qh, all_pos, t->cp_rank, cur, kv_owner(x, j, s), lseh, x->delta, x->dout_h, x->dq_h, L,
                           &pr);
            if (W > 1) {
                if (s >= 1) {
                    comm_waitall(cm, COMM_P2P_INNER, 1, &reqs[5]);
                    t0 = comm_compute_begin(cm);
                    add_into(L, x->dkv_in, kv_floats);
                    comm_compute_end(cm, "add dkv", t0);
                }
                comm_waitall(cm, COMM_P2P_INNER, 1, &reqs[4]); /* the previous dkv send (other L buffer) */
                comm_isend(cm, COMM_P2P_INNER, L, kv_bytes, inner_next(x), TAG_BWD_DKV_INNER, t->inner_comm, &reqs[4]);
            }
            if (s < W - 1) {
                comm_waitall(cm, COMM_P2P_INNER, 2, &reqs[0]);
                cur = nxt;
            }
        }
        /* the window's partial dkv for this step's starting KV */
        if (W > 1) {
            comm_waitall(cm, COMM_P2P_INNER, 1, &reqs[8]);
            comm_waitall(cm, COMM_P2P_INNER, 1, &reqs[4]);
        } else {
            memcpy(wp, x->dkv_l[0], kv_bytes);
        }
        if (R > 1) {
            if (j >= 1) {
                comm_waitall(cm, COMM_P2P_OUTER, 1, &reqs[7]);
                t0 = comm_compute_begin(cm);
                add_into(wp, x->dkv_or, kv_floats);
                comm_compute_end(cm, "add dkv", t0);
            }
            if (j == R - 1) /* the total for my own KV, from the last window's starting member */
                comm_irecv(cm, COMM_P2P_OUTER, x->dkv_final, kv_bytes, outer_prev(x), TAG_BWD_DKV_OUTER, t->outer_comm,
                           &reqs[7]);
            comm_waitall(cm, COMM_P2P_OUTER, 1, &reqs[6]);
            comm_isend(cm, COMM_P2P_OUTER, wp, kv_bytes, outer_next(x), TAG_BWD_DKV_OUTER, t->outer_comm, &reqs[6]);
        } else {
            memcpy(x->dkv_final, wp, kv_bytes);
        }
        if (j < R - 1) {
            comm_waitall(cm, COMM_P2P_OUTER, 2, &reqs[2]);
            kv_start = x->kvbuf[j % 2];
        }
    }
    if (R > 1) comm_waitall(cm, COMM_P2P_OUTER, 2, &reqs[6]);

    /* dq, dk, dv back to the local layout */
    a2a_grads_backward(x, x->dq_h, x->dkv_final, dq, dk, dv);
}

/* ------------------------------------------------------------------------------------------ */
/* Life cycle. */

static void free_work(DistCtx *x) {
    xfree(x->a2a_send);
    xfree(x->a2a_recv);
    for (int i = 0; i < 4; i++) xfree(x->kvbuf[i]);
    for (int i = 0; i < 2; i++) {
        xfree(x->dkv_l[i]);
        xfree(x->dkv_wp[i]);
    }
    xfree(x->dkv_in);
    xfree(x->dkv_or);
    xfree(x->dkv_final);
    xfree(x->dq_h);
    xfree(x->dout_h);
    xfree(x->delta);
    xfree(x->runs);
    xfree(x->n_runs);
}

static void dist_destroy(SeqAttention *sa) {
    if (!sa) return;
    DistCtx *x = ctx_of(sa);
    if (x->heads_set) free_work(x);
    xfree(x);
    xfree(sa);
}

SeqAttention *dist_attention_create(const Topology *t, Comm *comm, int seq_len_global) {
    if (seq_len_global <= 0 || seq_len_global % t->sp)
        die_collective("dist_attention: sequence length %d is not a positive multiple of sp = %d", seq_len_global,
                       t->sp);
    DistCtx *x = xcalloc(1, sizeof *x);
    x->t = t;
    x->comm = comm;
    x->S = seq_len_global;
    x->hp = t->hp;
    x->cp = t->cp;
    x->sp = t->sp;
    x->W = t->ring_inner > 0 ? t->ring_inner : t->cp;
    x->R = x->cp / x->W;
    x->N = seq_len_global / t->sp;
    x->n = seq_len_global / t->cp;
    x->piece_rows = 256;
    x->compute = 1;
    SeqAttention *sa = xcalloc(1, sizeof *sa);
    sa->name = t->cp == 1 && t->hp > 1 ? "ulysses" : t->hp == 1 && t->cp > 1 ? (x->W == x->cp ? "ring" : "double-ring")
               : t->sp == 1 ? "dist-local" : "2d-attention";
    sa->ctx = x;
    sa->saved_floats = dist_saved_floats;
    sa->forward = dist_forward;
    sa->backward = dist_backward;
    sa->destroy = dist_destroy;
    return sa;
}

void dist_attention_set_heads(SeqAttention *sa, int n_heads, int n_kv_heads, int head_dim) {
    DistCtx *x = ctx_of(sa);
    /* the layout only matters for S; S % sp was checked at creation, so test with contiguous */
    char *err = dist_attention_check(x->t, n_heads, n_kv_heads, x->S, LAYOUT_CONTIGUOUS);
    if (err) {
        char msg[1100];
        snprintf(msg, sizeof msg, "%s", err);
        xfree(err);
        die_collective("%s", msg);
    }
    if (head_dim < 1) die_collective("dist_attention: head_dim %d must be positive", head_dim);
    if (x->heads_set) free_work(x);
    x->H = n_heads;
    x->Hkv = n_kv_heads;
    x->d = head_dim;
    x->Hl = n_heads / x->hp;
    x->Hk = (n_kv_heads > x->hp ? n_kv_heads : x->hp) / x->hp;
    x->scale = 1.0f / sqrtf((float)head_dim);
    const size_t n = (size_t)x->n, d = (size_t)head_dim, kv = 2 * n * x->Hk * d;
    const size_t a2a = (size_t)x->hp * x->N * (x->Hl + 2 * x->Hk) * d;
    x->a2a_send = xmalloc_aligned(sizeof(float) * a2a);
    x->a2a_recv = x->hp > 1 ? xmalloc_aligned(sizeof(float) * a2a) : NULL; /* hp = 1: no all-to-all */
    /* ring buffers only where the ring needs them: outer ones when R > 1, inner ones when W > 1 */
    const int R = x->R, W = x->W;
    for (int i = 0; i < 4; i++) x->kvbuf[i] = (i < 2 ? R > 1 : W > 1) ? xmalloc_aligned(sizeof(float) * kv) : NULL;
    x->dkv_l[0] = xmalloc_aligned(sizeof(float) * kv);
    x->dkv_l[1] = W > 1 ? xmalloc_aligned(sizeof(float) * kv) : NULL;
    x->dkv_in = W > 1 ? xmalloc_aligned(sizeof(float) * kv) : NULL;
    x->dkv_wp[0] = xmalloc_aligned(sizeof(float) * kv);
    x->dkv_wp[1] = R > 1 ? xmalloc_aligned(sizeof(float) * kv) : NULL;
    x->dkv_or = R > 1 ? xmalloc_aligned(sizeof(float) * kv) : NULL;
    x->dkv_final = xmalloc_aligned(sizeof(float) * kv);
    x->dq_h = xmalloc_aligned(sizeof(float) * n * x->Hl * d);
    x->dout_h = xmalloc_aligned(sizeof(float) * n * x->Hl * d);
    x->delta = xmalloc_aligned(sizeof(float) * n * x->Hl);
    x->runs = xmalloc(sizeof(Run) * (size_t)x->S);
    x->n_runs = xcalloc((size_t)x->cp, sizeof(int));
    x->heads_set = 1;
}

SeqAttention *dist_attention_create_for(const Topology *t, Comm *comm, int seq_len_global, int n_heads,
                                        int n_kv_heads, int head_dim) {
    SeqAttention *sa = dist_attention_create(t, comm, seq_len_global);
    dist_attention_set_heads(sa, n_heads, n_kv_heads, head_dim);
    return sa;
}

void dist_attention_set_piece_rows(SeqAttention *sa, int rows) { ctx_of(sa)->piece_rows = rows > 0 ? rows : 256; }

void dist_attention_work(const SeqAttention *sa, DistAttnWork *w) { *w = ctx_of(sa)->work; }

void dist_attention_set_compute(SeqAttention *sa, int enabled) { ctx_of(sa)->compute = enabled != 0; }
