/* A rank's shard of a key/value cache, its capture from a strategy's forward, and the decode
 * attention merged across ranks; see kv_shard.h. */
#include "parallel/kv_shard.h"

#include <math.h>
#include <string.h>

#include "core/common.h"

void kv_shard_init(KvShard *s, int layers, int heads, int kv_heads, int head_dim, int cap, int ranks) {
    memset(s, 0, sizeof *s);
    s->layers = layers;
    s->heads = heads;
    s->kv_heads = kv_heads;
    s->head_dim = head_dim;
    s->cap = cap > 0 ? cap : 1;
    s->ranks = ranks;
    const size_t rows = (size_t)layers * (size_t)s->cap * (size_t)kv_heads * (size_t)head_dim;
    s->pos = xmalloc(sizeof(int) * (size_t)s->cap);
    s->k = xmalloc(sizeof(float) * (rows ? rows : 1));
    s->v = xmalloc(sizeof(float) * (rows ? rows : 1));
    s->scores = xmalloc(sizeof(double) * (size_t)s->cap);
    s->part = xmalloc(sizeof(double) * (size_t)heads * (size_t)(head_dim + 2));
    s->all = xmalloc(sizeof(double) * (size_t)ranks * (size_t)heads * (size_t)(head_dim + 2));
}

void kv_shard_set_bf16(KvShard *s) {
    if (s->bf16) return;
    const size_t rows = (size_t)s->layers * (size_t)s->cap * (size_t)s->kv_heads * (size_t)s->head_dim;
    xfree(s->k);
    xfree(s->v);
    s->k = s->v = NULL;
    s->k16 = xmalloc(sizeof(bf16_t) * (rows ? rows : 1));
    s->v16 = xmalloc(sizeof(bf16_t) * (rows ? rows : 1));
    s->bf16 = 1;
}

size_t kv_shard_elem(const KvShard *s) { return s->bf16 ? sizeof(bf16_t) : sizeof(float); }

/* Layer `layer`'s keys (or values) from row `row` on, as stored. */
static void *at_row(const KvShard *s, int values, int layer, int row) {
    const size_t i = ((size_t)layer * s->cap + (size_t)row) * s->kv_heads * s->head_dim;
    if (s->bf16) return (values ? s->v16 : s->k16) + i;
    return (values ? s->v : s->k) + i;
}

void *kv_shard_rows(const KvShard *s, int values, int layer) { return at_row(s, values, layer, 0); }

/* n rows of keys and values (fp32; bf16 values under bf16) into layer `layer` from row `row` on. */
static void put_rows(KvShard *s, int layer, int row, int n, const float *k, const float *v) {
    const size_t m = (size_t)n * s->kv_heads * s->head_dim;
    if (s->bf16) {
        bf16_pack(at_row(s, 0, layer, row), k, m);
        bf16_pack(at_row(s, 1, layer, row), v, m);
    } else {
        memcpy(at_row(s, 0, layer, row), k, sizeof(float) * m);
        memcpy(at_row(s, 1, layer, row), v, sizeof(float) * m);
    }
}

void kv_shard_free(KvShard *s) {
    xfree(s->k16); xfree(s->v16);
    xfree(s->pos); xfree(s->k); xfree(s->v); xfree(s->part); xfree(s->all); xfree(s->scores);
    memset(s, 0, sizeof *s);
}

size_t kv_shard_bytes(const KvShard *s) {
    return 2 * kv_shard_elem(s) * (size_t)s->layers * (size_t)s->cap * (size_t)s->kv_heads * (size_t)s->head_dim;
}

/* ------------------------------------------------------------------ capture */

typedef struct {
    SeqAttention *inner;
    KvShard *s;
    int layer; /* the layer of the next forward */
} Capture;

static void capture_set_positions(SeqAttention *sa, const int *positions, const int *docs) {
    Capture *c = sa->ctx;
    c->layer = 0;
    c->inner->set_positions(c->inner, positions, docs);
}

static void capture_forward(SeqAttention *sa, const float *q, const float *k, const float *v, float *o, float *saved) {
    Capture *c = sa->ctx;
    KvShard *s = c->s;
    const int N = sa->heads.n_local;
    if (c->layer >= s->layers || N > s->cap) die("internal: captured layer %d of %d, %d rows of %d", c->layer, s->layers, N, s->cap);
    put_rows(s, c->layer, 0, N, k, v);
    c->layer++;
    c->inner->window = sa->window;
    c->inner->forward(c->inner, q, k, v, o, saved);
}

static void capture_backward(SeqAttention *sa, const float *q, const float *k, const float *v, const float *o,
                             const float *saved, const float *dout, float *dq, float *dk, float *dv) {
    (void)q; (void)k; (void)v; (void)o; (void)saved; (void)dout; (void)dq; (void)dk; (void)dv;
    die("internal: %s: a captured prefill has no backward", sa->name);
}

static void capture_restore(SeqAttention *sa, const float *q, const float *k, const float *v, const float *o,
                            float *saved) {
    (void)q; (void)k; (void)v; (void)o; (void)saved;
    die("internal: %s: a captured prefill has no backward", sa->name);
}

static void capture_destroy(SeqAttention *sa) {
    xfree(sa->ctx);
    xfree(sa);
}

SeqAttention *kv_capture_create(SeqAttention *inner, KvShard *s) {
    Capture *c = xcalloc(1, sizeof *c);
    c->inner = inner;
    c->s = s;
    SeqAttention *sa = xmalloc(sizeof *sa); /* inner's shape and buffers; no chunk calls, no knobs */
    *sa = (SeqAttention){.name = inner->name, .ctx = c, .heads = inner->heads, .saved_floats = inner->saved_floats,
                         .keeps_inputs = inner->keeps_inputs, .kept_floats = inner->kept_floats,
                         .bf16_floats = inner->bf16_floats, .set_positions = capture_set_positions,
                         .forward = capture_forward, .backward = capture_backward, .restore = capture_restore,
                         .destroy = capture_destroy};
    return sa;
}

void kv_shard_keep(KvShard *s, const int *positions, int N, int keep_below) {
    const size_t row = kv_shard_elem(s) * s->kv_heads * s->head_dim;
    int n = 0;
    for (int i = 0; i < N; i++) {
        if (positions[i] >= keep_below) continue;
        if (n != i)
            for (int l = 0; l < s->layers; l++) {
                memmove(at_row(s, 0, l, n), at_row(s, 0, l, i), row);
                memmove(at_row(s, 1, l, n), at_row(s, 1, l, i), row);
            }
        s->pos[n++] = positions[i];
    }
    s->n = n;
}

int kv_shard_reserve(KvShard *s, int pos) {
    if (s->n >= s->cap) return -1;
    s->pos[s->n] = pos;
    return s->n++;
}

/* ------------------------------------------------------------------ decode attention */

/* One query's partial result per head over rows 0..n-1 (keys K, values V, kvd floats a row; pos
 * their positions), those at a position in first..last only: p (H, d + 2) = the largest score m,
 * s = sum exp(score - m) and acc = sum exp(score - m) v, in double as one process's attention
 * (model/generate.c); m = -inf where no row is in reach. */
static void partial(int H, int group, int d, size_t kvd, const float *q, const void *Kv, const void *Vv, int bf16,
                    const int *pos, int n, int first, int last, double *scores, double *part) {
    /* bf16 words (exact bf16 values) are widened as they are read: the same sums as fp32 rows */
    const float *K = bf16 ? NULL : Kv, *V = bf16 ? NULL : Vv;
    const bf16_t *K16 = bf16 ? Kv : NULL, *V16 = bf16 ? Vv : NULL;
    const int stride = d + 2;
    const double scale = 1.0 / sqrt((double)d);
    for (int h = 0; h < H; h++) {
        const float *qh = q + (size_t)h * d;
        const int kh = h / group;
        double *p = part + (size_t)h * stride, mx = -INFINITY;
        /* the rows in reach four at a time: four independent sums (each in i order, as one row's
         * alone: the same bits) instead of one chain of dependent additions */
        int js[4], m = 0;
        for (int j = 0; j <= n; j++) {
            if (j < n) {
                if (pos[j] < first || pos[j] > last) continue;
                js[m++] = j;
                if (m < 4) continue;
            }
            if (m == 4) {
                const size_t o0 = (size_t)js[0] * kvd + (size_t)kh * d, o1 = (size_t)js[1] * kvd + (size_t)kh * d;
                const size_t o2 = (size_t)js[2] * kvd + (size_t)kh * d, o3 = (size_t)js[3] * kvd + (size_t)kh * d;
                double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
                if (K) {
                    const float *k0 = K + o0, *k1 = K + o1, *k2 = K + o2, *k3 = K + o3;
                    for (int i = 0; i < d; i++) {
                        const double x = qh[i];
                        s0 += x * k0[i];
                        s1 += x * k1[i];
                        s2 += x * k2[i];
                        s3 += x * k3[i];
                    }
                } else {
                    const bf16_t *k0 = K16 + o0, *k1 = K16 + o1, *k2 = K16 + o2, *k3 = K16 + o3;
                    for (int i = 0; i < d; i++) {
                        const double x = qh[i];
                        s0 += x * bf16_to_float(k0[i]);
                        s1 += x * bf16_to_float(k1[i]);
                        s2 += x * bf16_to_float(k2[i]);
                        s3 += x * bf16_to_float(k3[i]);
                    }
                }
                scores[js[0]] = s0 * scale, scores[js[1]] = s1 * scale;
                scores[js[2]] = s2 * scale, scores[js[3]] = s3 * scale;
            } else {
                for (int r = 0; r < m; r++) {
                    const size_t o = (size_t)js[r] * kvd + (size_t)kh * d;
                    double dot = 0;
                    if (K)
                        for (int i = 0; i < d; i++) dot += (double)qh[i] * K[o + i];
                    else
                        for (int i = 0; i < d; i++) dot += (double)qh[i] * bf16_to_float(K16[o + i]);
                    scores[js[r]] = dot * scale;
                }
            }
            for (int r = 0; r < m; r++)
                if (scores[js[r]] > mx) mx = scores[js[r]];
            m = 0;
        }
        double sum = 0;
        for (int i = 0; i < d; i++) p[2 + i] = 0;
        if (mx > -INFINITY)
            for (int j = 0; j < n; j++) {
                if (pos[j] < first || pos[j] > last) continue;
                const double w = exp(scores[j] - mx);
                sum += w;
                if (V) {
                    const float *vj = V + (size_t)j * kvd + (size_t)kh * d;
                    for (int i = 0; i < d; i++) p[2 + i] += w * vj[i];
                } else {
                    const bf16_t *vj = V16 + (size_t)j * kvd + (size_t)kh * d;
                    for (int i = 0; i < d; i++) p[2 + i] += w * bf16_to_float(vj[i]);
                }
            }
        p[0] = mx;
        p[1] = sum;
    }
}

/* The log-sum-exp merge of one query's partials, rank r's at all + r * rank_stride (H, d + 2), in
 * rank order: o (H d) = sum_r acc_r e^(m_r - M) / sum_r s_r e^(m_r - M); acc (d) scratch. */
static void merge(int H, int d, int ranks, const double *all, size_t rank_stride, double *acc, float *o) {
    const int stride = d + 2;
    for (int h = 0; h < H; h++) {
        double M = -INFINITY;
        for (int r = 0; r < ranks; r++) {
            const double m = all[(size_t)r * rank_stride + (size_t)h * stride];
            if (m > M) M = m;
        }
        double sum = 0;
        for (int i = 0; i < d; i++) acc[i] = 0;
        for (int r = 0; r < ranks; r++) {
            const double *p = all + (size_t)r * rank_stride + (size_t)h * stride;
            if (!(p[0] > -INFINITY)) continue; /* no key of this rank in reach */
            const double f = exp(p[0] - M);
            sum += p[1] * f;
            for (int i = 0; i < d; i++) acc[i] += p[2 + i] * f;
        }
        for (int i = 0; i < d; i++) o[(size_t)h * d + i] = (float)(acc[i] / sum);
    }
}

/* The earliest position a query at pos sees under window (0: all). */
static int reach(int pos, int window) { return window > 0 ? pos - window + 1 : 0; }

void kv_shard_attend(KvShard *s, Comm *c, MPI_Comm mc, int layer, int pos, int row, int window, const float *q,
                     const float *k, const float *v, float *o) {
    const int H = s->heads, Hkv = s->kv_heads, d = s->head_dim, stride = d + 2;
    const size_t kvd = (size_t)Hkv * d;
    if (row >= 0) put_rows(s, layer, row, 1, k, v);
    partial(H, H / Hkv, d, kvd, q, at_row(s, 0, layer, 0), at_row(s, 1, layer, 0), s->bf16, s->pos, s->n, reach(pos, window), pos, s->scores, s->part);
    const size_t bytes = sizeof(double) * (size_t)H * stride;
    if (s->ranks > 1) comm_allgather(c, COMM_TEAM, s->part, s->all, bytes, mc);
    else memcpy(s->all, s->part, bytes);
    merge(H, d, s->ranks, s->all, (size_t)H * stride, s->part /* sent already: free for the sum */, o);
}

/* ------------------------------------------------------------------ a continuation's prefill */

const char *kv_scheme_name(KvScheme k) { return k == KV_PASS_KV ? "pass-KV" : k == KV_PASS_Q ? "pass-Q" : "auto"; }

void kv_scheme_bytes(const KvShard *s, int T, long cached, const int *windows, double *pass_q, double *pass_kv) {
    const double N = s->ranks, H = s->heads, d = s->head_dim, kvd = (double)s->kv_heads * d;
    *pass_q = s->layers * N * (N - 1) * T * H * (d + 2) * sizeof(double);
    *pass_kv = 0;
    for (int l = 0; l < s->layers; l++) {
        /* the cache holds positions 0 .. cached-1: under window W the block's first query reaches
         * the last W - 1 of them, and no later query reaches further back */
        const int w = windows ? windows[l] : 0;
        const double sent = w > 0 && w - 1 < cached ? (double)(w - 1) : (double)cached;
        *pass_kv += (N - 1) * (sent * (2 * kvd * (double)kv_shard_elem(s) + sizeof(int)) + (double)T * H * d * sizeof(float));
    }
}

/* The first of the T new queries that rank r answers under pass-KV (contiguous blocks). */
static int block(int T, int ranks, int r) { return (int)((long)T * r / ranks); }

void kv_shard_attend_block(KvShard *s, Comm *c, MPI_Comm mc, KvScheme scheme, int layer, int T, const int *pos,
                           const int *rows, const int *owner, const int *cached, int window, const float *q,
                           const float *k, const float *v, float *o) {
    const int H = s->heads, Hkv = s->kv_heads, d = s->head_dim, stride = d + 2, R = s->ranks, group = H / Hkv;
    const size_t kvd = (size_t)Hkv * d, qd = (size_t)H * stride;
    const void *K = at_row(s, 0, layer, 0), *V = at_row(s, 1, layer, 0);
    const size_t es = kv_shard_elem(s); /* bytes of a cached value */
    const MPI_Datatype edt = s->bf16 ? MPI_UINT16_T : MPI_FLOAT;
    int me = 0;
    if (R > 1) MPI_Comm_rank(mc, &me);
    for (int t = 0; t < T; t++) /* the new keys and values this rank keeps */
        if (rows[t] >= 0) put_rows(s, layer, rows[t], 1, k + (size_t)t * kvd, v + (size_t)t * kvd);
    double *all = xmalloc(sizeof(double) * (size_t)R * T * qd), *acc = xmalloc(sizeof(double) * (size_t)d);
    if (scheme != KV_PASS_KV) {
        /* pass-Q: every query is on every rank already (the dense ops run everywhere); each attends
         * them all to its shard (its cached rows and the new rows it keeps, so the new tokens' own
         * causal block is split as the rows are) and the partials are all-gathered */
        double *part = R > 1 ? xmalloc(sizeof(double) * (size_t)T * qd) : all;
        for (int t = 0; t < T; t++)
            partial(H, group, d, kvd, q + (size_t)t * H * d, K, V, s->bf16, s->pos, s->n, reach(pos[t], window), pos[t],
                    s->scores, part + (size_t)t * qd);
        if (R > 1) {
            comm_allgather(c, COMM_TEAM, part, all, sizeof(double) * (size_t)T * qd, mc);
            xfree(part);
        }
        for (int t = 0; t < T; t++) merge(H, d, R, all + (size_t)t * qd, (size_t)T * qd, acc, o + (size_t)t * H * d);
    } else {
        /* pass-KV: each rank answers a contiguous block of the queries; every rank's cached rows
         * (keys, values, positions) are all-gathered, the new rows need no sending (every rank has
         * them), and each rank's share is rebuilt in its shard's order (cached rows, then the new
         * rows it keeps) so that the partials are those pass-Q computes; the outputs are
         * all-gathered */
        size_t *cnt = xmalloc(sizeof(size_t) * (size_t)R), *dis = xmalloc(sizeof(size_t) * (size_t)R);
        /* under a window only the cached rows the block's first query reaches (the others reach
         * no further back) are sent: this rank's packed in shard order, their counts exchanged */
        int *sent = xmalloc(sizeof(int) * (size_t)R), n_send = cached[me];
        const int *sendP = s->pos;
        const void *sendK = K, *sendV = V;
        char *packK = NULL, *packV = NULL;
        int *packP = NULL;
        memcpy(sent, cached, sizeof(int) * (size_t)R);
        if (window > 0) {
            const int lo = reach(pos[0], window);
            n_send = 0;
            for (int i = 0; i < cached[me]; i++) n_send += s->pos[i] >= lo;
            if (n_send < cached[me]) {
                const size_t row_b = kvd * es;
                packK = xmalloc((size_t)n_send * row_b + 1);
                packV = xmalloc((size_t)n_send * row_b + 1);
                packP = xmalloc(sizeof(int) * ((size_t)n_send + 1));
                for (int i = 0, j = 0; i < cached[me]; i++)
                    if (s->pos[i] >= lo) {
                        memcpy(packK + (size_t)j * row_b, (const char *)K + (size_t)i * row_b, row_b);
                        memcpy(packV + (size_t)j * row_b, (const char *)V + (size_t)i * row_b, row_b);
                        packP[j++] = s->pos[i];
                    }
                sendK = packK, sendV = packV, sendP = packP;
            }
            if (R > 1) comm_allgather_meta(c, COMM_TEAM, &n_send, sent, sizeof(int), mc);
            else sent[0] = n_send;
        }
        int most = 0;
        for (int r = 0; r < R; r++)
            if (sent[r] > most) most = sent[r];
        /* rank r's share at KV + r * rows_r * 2 row_b bytes: its keys (rows_r rows), then its values
         * (es bytes a value: bf16 words under bf16, sent as they are) */
        const size_t rows_r = (size_t)most + (size_t)T, row_b = kvd * es;
        char *KV = xmalloc((size_t)R * rows_r * row_b * 2);
        int *P = xmalloc(sizeof(int) * (size_t)R * rows_r), *n_r = xmalloc(sizeof(int) * (size_t)R);
        for (int r = 0; r < R; r++) cnt[r] = (size_t)sent[r], dis[r] = (size_t)r * rows_r, n_r[r] = sent[r];
        if (R > 1) {
            comm_allgatherv(c, COMM_TEAM, sendP, (size_t)n_send, P, cnt, dis, MPI_INT, mc);
            for (int r = 0; r < R; r++) cnt[r] *= kvd, dis[r] *= 2 * kvd;
            comm_allgatherv(c, COMM_TEAM, sendK, (size_t)n_send * kvd, KV, cnt, dis, edt, mc);
            comm_allgatherv(c, COMM_TEAM, sendV, (size_t)n_send * kvd, KV + rows_r * row_b, cnt, dis, edt, mc);
        } else {
            memcpy(P, sendP, sizeof(int) * (size_t)n_send);
            memcpy(KV, sendK, (size_t)n_send * row_b);
            memcpy(KV + rows_r * row_b, sendV, (size_t)n_send * row_b);
        }
        xfree(packK); xfree(packV); xfree(packP); xfree(sent);
        for (int t = 0; t < T; t++) { /* the new rows, each in its keeper's share */
            const int r = owner[t];
            char *Kr = KV + (size_t)r * rows_r * row_b * 2, *Vr = Kr + rows_r * row_b;
            if (s->bf16) {
                bf16_pack((bf16_t *)(void *)(Kr + (size_t)n_r[r] * row_b), k + (size_t)t * kvd, kvd);
                bf16_pack((bf16_t *)(void *)(Vr + (size_t)n_r[r] * row_b), v + (size_t)t * kvd, kvd);
            } else {
                memcpy(Kr + (size_t)n_r[r] * row_b, k + (size_t)t * kvd, row_b);
                memcpy(Vr + (size_t)n_r[r] * row_b, v + (size_t)t * kvd, row_b);
            }
            P[(size_t)r * rows_r + n_r[r]++] = pos[t];
        }
        double *scores = xmalloc(sizeof(double) * rows_r);
        const int t0 = block(T, R, me), t1 = block(T, R, me + 1);
        for (int t = t0; t < t1; t++) {
            for (int r = 0; r < R; r++) {
                const char *Kr = KV + (size_t)r * rows_r * row_b * 2;
                partial(H, group, d, kvd, q + (size_t)t * H * d, Kr, Kr + rows_r * row_b, s->bf16, P + (size_t)r * rows_r, n_r[r],
                        reach(pos[t], window), pos[t], scores, all + (size_t)r * qd);
            }
            merge(H, d, R, all, qd, acc, o + (size_t)t * H * d);
        }
        if (R > 1) {
            const size_t od = (size_t)H * d;
            for (int r = 0; r < R; r++) dis[r] = (size_t)block(T, R, r) * od, cnt[r] = (size_t)block(T, R, r + 1) * od - dis[r];
            comm_allgatherv(c, COMM_TEAM, MPI_IN_PLACE, cnt[me], o, cnt, dis, MPI_FLOAT, mc);
        }
        xfree(cnt); xfree(dis); xfree(KV); xfree(P); xfree(n_r); xfree(scores);
    }
    xfree(all);
    xfree(acc);
}
