/* The visible-pair iterator of distributed attention: see block_attention.h. */
#include "parallel/block_attention.h"

#include <limits.h>
#include <math.h>
#include <string.h>

#include "attention/flash_attention.h"
#include "core/common.h"

void pos_block_init(PosBlock *b, const int *pos, const int *doc, int n, PosRun *runs) {
    int count = 0, i = 0;
    while (i < n) {
        int j = i + 1;
        if (j < n) {
            long stride = (long)pos[j] - pos[i];
            while (j + 1 < n && (long)pos[j + 1] - pos[j] == stride) j++;
            j++;
        }
        /* a progression's extremes are its ends: only document ids need the scan */
        const AttnSpan sp = doc ? attn_span(pos + i, doc + i, j - i)
                                : (AttnSpan){pos[i] < pos[j - 1] ? pos[i] : pos[j - 1],
                                             pos[i] > pos[j - 1] ? pos[i] : pos[j - 1], 0, 0};
        runs[count++] = (PosRun){i, j - i, sp.pos_lo, sp.pos_hi, sp.doc_lo, sp.doc_hi};
        i = j;
    }
    b->pos = pos;
    b->doc = doc;
    b->n = n;
    b->runs = runs;
    b->n_runs = count;
}

void pos_block_init_pieces(PosBlock *b, const int *pos, int n, PosRun *runs, const int *starts, int n_pieces) {
    int count = 0, i = 0, k = 0; /* piece k holds index i */
    while (i < n) {
        while (k + 1 < n_pieces && starts[k + 1] <= i) k++;
        int j = i; /* the run's last index: extended as pos_block_init does, a piece at a time */
        if (i + 1 < n) {
            const long stride = (long)pos[i + 1] - pos[i];
            int kk = k;
            j = i + 1;
            for (;;) {
                while (kk + 1 < n_pieces && starts[kk + 1] <= j) kk++;
                const int end = kk + 1 < n_pieces ? starts[kk + 1] - 1 : n - 1; /* the piece's last */
                /* inside the piece every step is the piece's own: the run takes it whole or stops */
                if (j < end) {
                    if ((long)pos[j + 1] - pos[j] != stride) break;
                    j = end;
                }
                if (j + 1 < n && (long)pos[j + 1] - pos[j] == stride) j++; /* across into the next piece */
                else break;
            }
        }
        runs[count++] = (PosRun){i, j - i + 1, pos[i] < pos[j] ? pos[i] : pos[j], pos[i] > pos[j] ? pos[i] : pos[j], 0, 0};
        i = j + 1;
    }
    b->pos = pos;
    b->doc = NULL;
    b->n = n;
    b->runs = runs;
    b->n_runs = count;
}

int pos_blocks_meet(const PosBlock *q, const PosBlock *k, int window) {
    for (int a = 0; a < q->n_runs; a++)
        for (int c = 0; c < k->n_runs; c++)
            if (attn_visibility((AttnSpan){q->runs[a].lo, q->runs[a].hi, 0, 0},
                                (AttnSpan){k->runs[c].lo, k->runs[c].hi, 0, 0}, window) != ATTN_VIS_HIDDEN)
                return 1;
    return 0;
}

void block_attn_init(BlockAttn *b, Comm *comm, int heads, int kv_heads, int head_dim) {
    memset(b, 0, sizeof *b);
    b->comm = comm;
    b->heads = heads;
    b->kv_heads = kv_heads;
    b->head_dim = head_dim;
    b->scale = 1.0f / sqrtf((float)head_dim);
    b->piece_rows = 0; /* whole runs: the kernel calls progress between its tiles */
    b->compute = 1;
}

/* The one iterator: calls visit(pair) for every visible (query piece, key run) pair, and tests
 * the caller's requests after every piece that computed something. */
typedef struct {
    int i0, nq;    /* query rows [i0, i0 + nq) */
    int j0, nk;    /* key rows [j0, j0 + nk): key run kc */
    int kc;
    AttnVisibility vis;
} Pair;

typedef void (*PairFn)(BlockAttn *b, const Pair *p, void *arg);

static void for_each_visible_pair(BlockAttn *b, const PosBlock *qb, const PosBlock *kb, PairFn fn, void *arg,
                                  const Progress *pr) {
    for (int a = 0; a < qb->n_runs; a++) {
        const PosRun *qr = &qb->runs[a];
        const int rows = b->piece_rows > 0 ? b->piece_rows : qr->len; /* default: the whole run */
        for (int r0 = 0; r0 < qr->len; r0 += rows) {
            Pair p = {.i0 = qr->start + r0, .nq = qr->len - r0 < rows ? qr->len - r0 : rows};
            int did = 0;
            /* a whole run's span is the one pos_block_init found for it */
            const AttnSpan piece = p.nq == qr->len ? (AttnSpan){qr->lo, qr->hi, qr->doc_lo, qr->doc_hi}
                                                   : attn_span(qb->pos + p.i0, qb->doc ? qb->doc + p.i0 : NULL, p.nq);
            for (int c = 0; c < kb->n_runs; c++) {
                const PosRun *kr = &kb->runs[c];
                p.vis = attn_visibility(piece, (AttnSpan){kr->lo, kr->hi, kr->doc_lo, kr->doc_hi}, b->window);
                if (p.vis == ATTN_VIS_HIDDEN) continue;
                p.j0 = kr->start;
                p.nk = kr->len;
                p.kc = c;
                fn(b, &p, arg);
                did = 1;
            }
            if (did && pr && pr->n) comm_testall(b->comm, pr->kind, pr->n, pr->reqs);
        }
    }
}

typedef struct {
    const float *q, *k, *v, *lse, *delta, *dout;
    const int *qpos, *kpos, *qdoc, *kdoc; /* docs NULL: one document */
    float *o, *lse_out, *dq, *dk, *dv;
    Comm *comm;
    const Progress *pr; /* the caller's requests in flight (NULL or none: nothing to test) */
} PairArgs;

/* AttnShape.progress: the caller's requests, tested from inside the kernel between its tiles. */
static void progress_requests(void *arg) {
    const PairArgs *a = arg;
    comm_testall(a->comm, a->pr->kind, a->pr->n, a->pr->reqs);
}

static AttnShape pair_shape(const BlockAttn *b, const Pair *p, const PairArgs *a) {
    const int test = a->pr && a->pr->n;
    AttnShape s = {.n_q = p->nq, .n_kv = p->nk, .n_heads = b->heads, .n_kv_heads = b->kv_heads,
                   .head_dim = b->head_dim, .scale = b->scale,
                   .mask = p->vis == ATTN_VIS_FULL ? ATTN_FULL : ATTN_CAUSAL,
                   .window = p->vis == ATTN_VIS_FULL ? 0 : b->window, .precision = b->precision,
                   .progress = test ? progress_requests : NULL, .progress_arg = test ? (void *)a : NULL};
    return s;
}

static void forward_pair(BlockAttn *b, const Pair *p, void *arg) {
    const PairArgs *a = arg;
    const size_t H = (size_t)b->heads, Hk = (size_t)b->kv_heads, d = (size_t)b->head_dim;
    b->work.fwd_calls++;
    b->work.fwd_cells += (unsigned long long)p->nq * (unsigned)p->nk;
    if (!b->compute) return;
    AttnShape s = pair_shape(b, p, a);
    double t0 = comm_compute_begin(b->comm);
    const int docs = a->qdoc && s.mask == ATTN_CAUSAL; /* a fully visible pair needs no ids */
    attn_forward_docs(&s, a->q + p->i0 * H * d, a->qpos + p->i0, docs ? a->qdoc + p->i0 : NULL, a->k + p->j0 * Hk * d,
                      a->v + p->j0 * Hk * d, a->kpos + p->j0, docs ? a->kdoc + p->j0 : NULL, a->o + p->i0 * H * d,
                      a->lse_out + p->i0 * H);
    comm_compute_end(b->comm, "attn fwd", t0);
}

static void backward_pair(BlockAttn *b, const Pair *p, void *arg) {
    const PairArgs *a = arg;
    const size_t H = (size_t)b->heads, Hk = (size_t)b->kv_heads, d = (size_t)b->head_dim;
    const size_t qo = (size_t)p->i0 * H * d, ko = (size_t)p->j0 * Hk * d;
    b->work.bwd_calls++;
    b->work.bwd_cells += (unsigned long long)p->nq * (unsigned)p->nk;
    if (!b->compute) return;
    AttnShape s = pair_shape(b, p, a);
    double t0 = comm_compute_begin(b->comm);
    const int docs = a->qdoc && s.mask == ATTN_CAUSAL;
    attn_backward_docs(&s, a->q + qo, a->qpos + p->i0, docs ? a->qdoc + p->i0 : NULL, a->k + ko, a->v + ko,
                       a->kpos + p->j0, docs ? a->kdoc + p->j0 : NULL, a->lse + p->i0 * H, a->delta + p->i0 * H,
                       a->dout + qo, a->dq ? a->dq + qo : NULL, a->dk ? a->dk + ko : NULL, a->dv ? a->dv + ko : NULL);
    comm_compute_end(b->comm, "attn bwd", t0);
}

void block_attn_forward(BlockAttn *b, const float *q, const PosBlock *qb, const float *k, const float *v,
                        const PosBlock *kb, float *o, float *lse, const Progress *pr) {
    if ((qb->doc == NULL) != (kb->doc == NULL)) die("block_attn_forward: document ids on one side only");
    PairArgs a = {.q = q, .k = k, .v = v, .qpos = qb->pos, .kpos = kb->pos, .qdoc = qb->doc, .kdoc = kb->doc, .o = o,
                  .lse_out = lse, .comm = b->comm, .pr = pr};
    for_each_visible_pair(b, qb, kb, forward_pair, &a, pr);
}

void block_attn_backward(BlockAttn *b, const float *q, const PosBlock *qb, const float *k, const float *v,
                         const PosBlock *kb, const float *lse, const float *delta, const float *dout, float *dq,
                         float *dk, float *dv, const Progress *pr) {
    if ((qb->doc == NULL) != (kb->doc == NULL)) die("block_attn_backward: document ids on one side only");
    PairArgs a = {.q = q, .k = k, .v = v, .lse = lse, .delta = delta, .dout = dout, .qpos = qb->pos, .kpos = kb->pos,
                  .qdoc = qb->doc, .kdoc = kb->doc, .dq = dq, .dk = dk, .dv = dv, .comm = b->comm, .pr = pr};
    for_each_visible_pair(b, qb, kb, backward_pair, &a, pr);
}

typedef struct {
    const PosBlock *q, *k;
    int window;
    unsigned long long cells, calls, visible;
} WorkCount;

/* Keys of run r (positions lo, lo + stride, ..., len of them) in [a, b]. */
static long long run_keys_in(const PosRun *r, const int *pos, long long a, long long b) {
    if (b < a || r->len <= 0) return 0;
    const long long lo = pos[r->start], stride = r->len > 1 ? (long long)pos[r->start + 1] - lo : 1;
    /* indices i with a <= lo + i stride <= b, 0 <= i < len (stride >= 1: positions increase) */
    long long i0 = a <= lo ? 0 : (a - lo + stride - 1) / stride, i1 = b < lo ? -1 : (b - lo) / stride;
    if (i1 > r->len - 1) i1 = r->len - 1;
    return i1 >= i0 ? i1 - i0 + 1 : 0;
}

/* sum over i in [0, n) of floor((a i + b) / m), for m >= 1 and a, b >= 0 (the Euclid-like reduction
 * of the floor sum: O(log m) steps). Every term it adds is part of the sum, so nothing overflows
 * where the sum fits. */
static unsigned long long floor_sum(unsigned long long n, unsigned long long m, unsigned long long a,
                                    unsigned long long b) {
    unsigned long long sum = 0;
    for (;;) {
        if (a >= m) sum += n * (n - 1) / 2 * (a / m), a %= m;
        if (b >= m) sum += n * (b / m), b %= m;
        const unsigned long long top = a * n + b;
        if (top < m) return sum;
        n = top / m, b = top % m;
        const unsigned long long t = m;
        m = a, a = t;
    }
}

/* Smallest i >= 0 with c + i s >= x (s >= 1), at most n. */
static long long first_at_least(long long c, long long s, long long x, long long n) {
    const long long i = c >= x ? 0 : (x - c + s - 1) / s;
    return i < n ? i : n;
}

/* Sum over the n query positions c, c + sq, ..., of the keys of run r (positions k0, k0 + sk, ...,
 * nk of them, sk >= 1) at or before each: each query's count is 0 before k0, nk from the last key
 * on, floor((x - k0) / sk) + 1 between. */
static unsigned long long keys_at_or_before(long long c, long long sq, long long n, long long k0, long long sk,
                                            long long nk) {
    const long long lo = first_at_least(c, sq, k0, n), hi = first_at_least(c, sq, k0 + (nk - 1) * sk, n);
    return (unsigned long long)((n - hi) * nk + (hi - lo)) +
           floor_sum((unsigned long long)(hi - lo), (unsigned long long)sk, (unsigned long long)sq,
                     (unsigned long long)(c + lo * sq - k0));
}

static void count_pair(BlockAttn *b, const Pair *p, void *arg) {
    (void)b;
    WorkCount *w = arg;
    w->calls++;
    w->cells += (unsigned long long)p->nq * (unsigned)p->nk;
    if (p->vis == ATTN_VIS_FULL) {
        w->visible += (unsigned long long)p->nq * (unsigned)p->nk;
        return;
    }
    const PosRun *kr = &w->k->runs[p->kc];
    const int *qpos = w->q->pos + p->i0;
    const long long sq = p->nq > 1 ? (long long)qpos[1] - qpos[0] : 1,
                    sk = kr->len > 1 ? (long long)w->k->pos[kr->start + 1] - w->k->pos[kr->start] : 1;
    if (sq >= 1 && sk >= 1) { /* both progressions increase: the per-query counts below, summed in closed form */
        const long long k0 = w->k->pos[kr->start];
        w->visible += keys_at_or_before(qpos[0], sq, p->nq, k0, sk, kr->len);
        if (w->window > 0) w->visible -= keys_at_or_before((long long)qpos[0] - w->window, sq, p->nq, k0, sk, kr->len);
        return;
    }
    for (int i = p->i0; i < p->i0 + p->nq; i++) {
        const long long qp = w->q->pos[i];
        w->visible += (unsigned long long)run_keys_in(kr, w->k->pos, w->window > 0 ? qp - w->window + 1 : LLONG_MIN, qp);
    }
}

void pos_blocks_work(const PosBlock *q, const PosBlock *k, int window, unsigned long long *cells,
                     unsigned long long *calls, unsigned long long *visible) {
    BlockAttn b = {.window = window}; /* piece_rows 0: whole runs, as the strategies call it */
    WorkCount w = {q, k, window, 0, 0, 0};
    for_each_visible_pair(&b, q, k, count_pair, &w, NULL);
    *cells = w.cells;
    *calls = w.calls;
    *visible = w.visible;
}
