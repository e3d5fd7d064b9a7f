/* Flash attention on the CPU (FlashAttention-2 schedule) for every seqpar strategy.
 *
 * Forward: one work item per (query head, query tile); the item keeps a running max m, sum l and
 * accumulator acc (tile x head_dim) seeded from the caller's (o, lse), so each call merges into
 * the caller's state. Scores are computed transposed, S^T = K Q^T (keys x queries): the query
 * tile is transposed once per item, the softmax runs down the columns vectorised across queries,
 * and acc += P V reads P as (S^T)^T. Key/value tiles are copied into compact buffers (a head's
 * rows are H*d apart, often a power of two, which thrashes the L1 sets), and the next tile is
 * prefetched while the current scores are computed. Scores live in the base-2 domain
 * (alpha = scale * log2 e) so that one exp2 per score is all the softmax needs.
 * Backward: one work item per (key/value head, key tile) with the query heads of its GQA group
 * looped inside, so dk/dv of a tile have a single writer; K and V of the tile are transposed once
 * per item; dq has many writers and goes to per-thread buffers (thread 0 writes dq directly)
 * summed after each key/value head.
 *
 * Tile products go through tile_gemm(): with AVX2+FMA an in-register 6 x 16 kernel on strided
 * operands (no packing, no beta pass: at these tile shapes OpenBLAS spent ~25% of the attention
 * time packing and zeroing; this kernel runs at ~95% of OpenBLAS's large-sgemm rate on them),
 * otherwise, or with -DFA_USE_BLAS, cblas_sgemm on the same strided operands.
 *
 * Masking works on tiles: from the min/max position of each query and key tile a tile pair is
 * fully visible (no mask work), fully hidden (skipped) or partial (elementwise -inf). Nothing is
 * proportional to n_q x n_kv: each thread's workspace is O(tile^2 + tile * head_dim), plus for
 * backward one (n_q, heads per group, head_dim) dq buffer per thread beyond the first.
 *
 * Not here: dropout, sliding windows, low-precision storage; inputs are fp32 and must be finite. */
#include "attention/flash_attention.h"

#include <cblas.h>
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#ifdef __AVX2__
#include <immintrin.h>
#endif

#include "core/common.h"

#if defined(__AVX2__) && defined(__FMA__) && !defined(FA_USE_BLAS)
#define FA_AVX2_KERNEL 1
#endif

/* Tile sizes. Forward: FA_FWD_BQ queries (columns of S^T) x FA_FWD_BK keys (rows of S^T).
 * Backward: FA_BWD_BK keys x FA_BWD_BQ queries. Multiples of 6 (kernel rows) and 16 (kernel
 * columns) waste nothing; any positive values are correct. */
#ifndef FA_FWD_BQ
#define FA_FWD_BQ 256
#endif
#ifndef FA_FWD_BK
#define FA_FWD_BK 192
#endif
#ifndef FA_BWD_BK
#define FA_BWD_BK 144
#endif
#ifndef FA_BWD_BQ
#define FA_BWD_BQ 120
#endif
#define FA_SKEW 16 /* extra floats per buffer row: avoids power-of-two strides (cache-set conflicts) */

#define FA_LOG2E 1.4426950408889634
#define FA_LN2 0.6931471805599453

/* ---------------------------------------------------------------------------------------------
 * Vectorised exp2: 2^x = 2^k * p(f), k = round(x), f in [-0.5, 0.5], p the Cephes exp2f
 * polynomial (relative error about 1e-7). Inputs below -126 (including -inf) give exactly 0,
 * inputs above 127 are clamped to 2^127, NaN stays NaN. */
#define EXP2_P0 1.535336188319500e-4f
#define EXP2_P1 1.339887440266574e-3f
#define EXP2_P2 9.618437357674640e-3f
#define EXP2_P3 5.550332471162809e-2f
#define EXP2_P4 2.402264791363012e-1f
#define EXP2_P5 6.931472028550421e-1f

static inline float exp2_scalar(float x) {
    if (!(x >= -126.0f)) return x != x ? x : 0.0f; /* NaN stays, -inf and tiny -> 0 */
    if (x > 127.0f) x = 127.0f;
    float k = nearbyintf(x);
    float f = x - k;
    float p = EXP2_P0;
    p = p * f + EXP2_P1;
    p = p * f + EXP2_P2;
    p = p * f + EXP2_P3;
    p = p * f + EXP2_P4;
    p = p * f + EXP2_P5;
    p = p * f + 1.0f;
    return ldexpf(p, (int)k);
}

#ifdef __AVX2__
static inline __m256 exp2_avx2(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-126.0f), hi = _mm256_set1_ps(127.0f);
    __m256 zero = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);          /* x < -126, -inf included */
    x = _mm256_min_ps(hi, _mm256_max_ps(lo, x));               /* operand order keeps NaN */
    __m256 k = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 f = _mm256_sub_ps(x, k);
    __m256 p = _mm256_set1_ps(EXP2_P0);
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(EXP2_P1));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(EXP2_P2));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(EXP2_P3));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(EXP2_P4));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(EXP2_P5));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(zero, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}
#endif

/* s[j] = 2^(s[j] - m) in place (a row of probabilities in the backward); returns their sum. */
static inline float row_exp2_sum(float *s, int n, float m) {
    float sum = 0.0f;
    int j = 0;
#ifdef __AVX2__
    __m256 vm = _mm256_set1_ps(m), a = _mm256_setzero_ps(), b = a;
    for (; j + 16 <= n; j += 16) {
        __m256 x0 = exp2_avx2(_mm256_sub_ps(_mm256_loadu_ps(s + j), vm));
        __m256 x1 = exp2_avx2(_mm256_sub_ps(_mm256_loadu_ps(s + j + 8), vm));
        _mm256_storeu_ps(s + j, x0);
        _mm256_storeu_ps(s + j + 8, x1);
        a = _mm256_add_ps(a, x0);
        b = _mm256_add_ps(b, x1);
    }
    a = _mm256_add_ps(a, b);
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));
    sum = _mm_cvtss_f32(h);
#endif
    for (; j < n; j++) {
        s[j] = exp2_scalar(s[j] - m);
        sum += s[j];
    }
    return sum;
}

/* s[j] = -inf where kv_pos[j] > qp (causal mask of one row). */
static inline void row_mask(float *restrict s, const int *restrict kv_pos, int n, int qp) {
    for (int j = 0; j < n; j++) s[j] = kv_pos[j] > qp ? -INFINITY : s[j];
}

/* ---------------------------------------------------------------------------------------------
 * Tiles and their visibility. */
typedef struct { int lo, hi; } PosRange; /* min and max position in a tile */

enum { TILE_HIDDEN = ATTN_VIS_HIDDEN, TILE_PARTIAL = ATTN_VIS_PARTIAL, TILE_VISIBLE = ATTN_VIS_FULL };

static void tile_ranges(const int *pos, int n, int tile, PosRange *out) {
    for (int t = 0; t * tile < n; t++) {
        int i0 = t * tile, i1 = i0 + tile < n ? i0 + tile : n;
        PosRange r = {INT_MAX, INT_MIN};
        if (pos) {
            for (int i = i0; i < i1; i++) {
                if (pos[i] < r.lo) r.lo = pos[i];
                if (pos[i] > r.hi) r.hi = pos[i];
            }
        }
        out[t] = r;
    }
}

AttnVisibility attn_visibility(int q_lo, int q_hi, int k_lo, int k_hi) {
    if (k_hi <= q_lo) return ATTN_VIS_FULL;
    if (k_lo > q_hi) return ATTN_VIS_HIDDEN;
    return ATTN_VIS_PARTIAL;
}

static inline int tile_class(AttnMask mask, PosRange q, PosRange k) {
    if (mask == ATTN_FULL) return TILE_VISIBLE;
    return (int)attn_visibility(q.lo, q.hi, k.lo, k.hi);
}

typedef struct { int cost, idx; } TileOrder;

static int cmp_cost_desc(const void *a, const void *b) {
    const TileOrder *x = a, *y = b;
    if (x->cost != y->cost) return y->cost - x->cost;
    return x->idx - y->idx;
}

static void check_shape(const AttnShape *s, const int *q_pos, const int *kv_pos, const char *who) {
    if (s->n_q < 0 || s->n_kv < 0 || s->n_heads <= 0 || s->n_kv_heads <= 0 || s->head_dim <= 0)
        die("%s: bad shape n_q=%d n_kv=%d n_heads=%d n_kv_heads=%d head_dim=%d", who, s->n_q, s->n_kv,
            s->n_heads, s->n_kv_heads, s->head_dim);
    if (s->n_heads % s->n_kv_heads != 0)
        die("%s: n_heads=%d is not a multiple of n_kv_heads=%d", who, s->n_heads, s->n_kv_heads);
    if (s->mask != ATTN_FULL && s->mask != ATTN_CAUSAL) die("%s: unknown mask %d", who, (int)s->mask);
    if (s->mask == ATTN_CAUSAL && ((!q_pos && s->n_q > 0) || (!kv_pos && s->n_kv > 0)))
        die("%s: causal attention needs q_pos and kv_pos", who);
}

/* ---------------------------------------------------------------------------------------------
 * Simple operations. */
void attn_state_init(const AttnShape *s, float *o, float *lse) {
    size_t rows = (size_t)s->n_q * s->n_heads;
    memset(o, 0, rows * s->head_dim * sizeof(float));
    for (size_t i = 0; i < rows; i++) lse[i] = -INFINITY;
}

void attn_merge(int n_rows, int n_heads, int head_dim, float *o, float *lse, const float *o_b,
                const float *lse_b) {
    long long rows = (long long)n_rows * n_heads;
#pragma omp parallel for schedule(static) if (rows * head_dim > 65536)
    for (long long r = 0; r < rows; r++) {
        float a = lse[r], b = lse_b[r];
        float *orow = o + (size_t)r * head_dim;            /* (head_dim) */
        const float *brow = o_b + (size_t)r * head_dim;    /* (head_dim) */
        if (b == -INFINITY) continue;                      /* nothing new */
        if (a == -INFINITY) {                              /* nothing yet: take the partial */
            memcpy(orow, brow, (size_t)head_dim * sizeof(float));
            lse[r] = b;
            continue;
        }
        double mx = a > b ? a : b;
        double nl = mx + log1p(exp(-fabs((double)a - (double)b)));
        float wa = (float)exp((double)a - nl), wb = (float)exp((double)b - nl);
        for (int d = 0; d < head_dim; d++) orow[d] = wa * orow[d] + wb * brow[d];
        lse[r] = (float)nl;
    }
}

void attn_backward_delta(const AttnShape *s, const float *o, const float *dout, float *delta) {
    long long rows = (long long)s->n_q * s->n_heads;
    int d = s->head_dim;
#pragma omp parallel for schedule(static) if (rows * d > 65536)
    for (long long r = 0; r < rows; r++) {
        const float *a = o + (size_t)r * d, *b = dout + (size_t)r * d;
        double acc = 0.0;
        for (int k = 0; k < d; k++) acc += (double)a[k] * b[k];
        delta[r] = (float)acc;
    }
}

static int cmp_int(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

double attn_forward_flops(const AttnShape *s, const int *q_pos, const int *kv_pos) {
    check_shape(s, q_pos, kv_pos, "attn_forward_flops");
    double pairs;
    if (s->mask == ATTN_FULL || s->n_q == 0 || s->n_kv == 0) {
        pairs = (double)s->n_q * s->n_kv;
    } else {
        int *sorted = xmalloc((size_t)s->n_kv * sizeof(int));
        memcpy(sorted, kv_pos, (size_t)s->n_kv * sizeof(int));
        qsort(sorted, (size_t)s->n_kv, sizeof(int), cmp_int);
        pairs = 0;
        for (int i = 0; i < s->n_q; i++) { /* number of keys with position <= q_pos[i] */
            int lo = 0, hi = s->n_kv;
            while (lo < hi) {
                int mid = lo + (hi - lo) / 2;
                if (sorted[mid] <= q_pos[i]) lo = mid + 1; else hi = mid;
            }
            pairs += lo;
        }
        xfree(sorted);
    }
    return 4.0 * s->head_dim * (double)s->n_heads * pairs;
}

/* ---------------------------------------------------------------------------------------------
 * Tile matrix product on strided operands:
 *   C (M, N; row stride ldc) = alpha * A B  [+ C when accumulate]
 * with A(m, k) = A[m * ars + k * aks] (one of ars, aks is 1: A or A^T stored row-major) and
 * B(k, n) = B[k * ldb + n] (rows contiguous). */
#ifdef FA_AVX2_KERNEL
/* One 6 x 16 block of C (rows beyond mr recompute row mr-1 and are not stored; columns beyond
 * nr are masked off when `masked`). 12 accumulators, K-loop of 2 loads, 6 broadcasts, 12 FMA. */
static inline __attribute__((always_inline)) void
micro_6x16(int K, int mr, float alpha, const float *A, size_t ars, size_t aks, const float *B, size_t ldb,
           int accumulate, float *C, size_t ldc, const int masked, __m256i mlo, __m256i mhi) {
    const float *a0 = A, *a1 = A + (size_t)(mr > 1) * ars, *a2 = A + (size_t)(mr > 2 ? 2 : mr - 1) * ars;
    const float *a3 = A + (size_t)(mr > 3 ? 3 : mr - 1) * ars, *a4 = A + (size_t)(mr > 4 ? 4 : mr - 1) * ars;
    const float *a5 = A + (size_t)(mr > 5 ? 5 : mr - 1) * ars;
    __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
    __m256 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
    for (int k = 0; k < K; k++) {
        const float *b = B + (size_t)k * ldb;
        __m256 b0 = masked ? _mm256_maskload_ps(b, mlo) : _mm256_loadu_ps(b);
        __m256 b1 = masked ? _mm256_maskload_ps(b + 8, mhi) : _mm256_loadu_ps(b + 8);
        size_t ko = (size_t)k * aks;
        __m256 a = _mm256_broadcast_ss(a0 + ko);
        c00 = _mm256_fmadd_ps(a, b0, c00);
        c01 = _mm256_fmadd_ps(a, b1, c01);
        a = _mm256_broadcast_ss(a1 + ko);
        c10 = _mm256_fmadd_ps(a, b0, c10);
        c11 = _mm256_fmadd_ps(a, b1, c11);
        a = _mm256_broadcast_ss(a2 + ko);
        c20 = _mm256_fmadd_ps(a, b0, c20);
        c21 = _mm256_fmadd_ps(a, b1, c21);
        a = _mm256_broadcast_ss(a3 + ko);
        c30 = _mm256_fmadd_ps(a, b0, c30);
        c31 = _mm256_fmadd_ps(a, b1, c31);
        a = _mm256_broadcast_ss(a4 + ko);
        c40 = _mm256_fmadd_ps(a, b0, c40);
        c41 = _mm256_fmadd_ps(a, b1, c41);
        a = _mm256_broadcast_ss(a5 + ko);
        c50 = _mm256_fmadd_ps(a, b0, c50);
        c51 = _mm256_fmadd_ps(a, b1, c51);
    }
    const __m256 va = _mm256_set1_ps(alpha);
#define FA_STORE_ROW(r, x0, x1)                                                                      \
    if (r < mr) {                                                                                    \
        float *cr = C + (size_t)r * ldc;                                                             \
        __m256 y0 = _mm256_mul_ps(va, x0), y1 = _mm256_mul_ps(va, x1);                               \
        if (masked) {                                                                                \
            if (accumulate) {                                                                        \
                y0 = _mm256_add_ps(y0, _mm256_maskload_ps(cr, mlo));                                 \
                y1 = _mm256_add_ps(y1, _mm256_maskload_ps(cr + 8, mhi));                             \
            }                                                                                        \
            _mm256_maskstore_ps(cr, mlo, y0);                                                        \
            _mm256_maskstore_ps(cr + 8, mhi, y1);                                                    \
        } else {                                                                                     \
            if (accumulate) {                                                                        \
                y0 = _mm256_add_ps(y0, _mm256_loadu_ps(cr));                                         \
                y1 = _mm256_add_ps(y1, _mm256_loadu_ps(cr + 8));                                     \
            }                                                                                        \
            _mm256_storeu_ps(cr, y0);                                                                \
            _mm256_storeu_ps(cr + 8, y1);                                                            \
        }                                                                                            \
    }
    FA_STORE_ROW(0, c00, c01)
    FA_STORE_ROW(1, c10, c11)
    FA_STORE_ROW(2, c20, c21)
    FA_STORE_ROW(3, c30, c31)
    FA_STORE_ROW(4, c40, c41)
    FA_STORE_ROW(5, c50, c51)
#undef FA_STORE_ROW
}
#endif

/* Rows of up to two strided tiles (the next key and value tiles) to be brought into L2 a few
 * lines at a time while a product runs, so that the next tile's copy does not wait on memory. */
typedef struct {
    const char *base[2];
    size_t stride;     /* bytes between rows */
    int rows;          /* rows per tile */
    int lines_per_row; /* 64-byte lines per row, counting a possibly straddled one */
    int next, total;   /* next line to fetch, out of 2 * rows * lines_per_row (0 total: nothing) */
} Prefetch;

static inline void prefetch_some(Prefetch *p, int n) {
#ifdef __AVX2__
    for (; n > 0 && p->next < p->total; n--, p->next++) {
        int t = p->next / (p->rows * p->lines_per_row), rem = p->next % (p->rows * p->lines_per_row);
        const char *addr = p->base[t] + (size_t)(rem / p->lines_per_row) * p->stride + (size_t)(rem % p->lines_per_row) * 64;
        _mm_prefetch(addr, _MM_HINT_T1);
    }
#else
    (void)p;
    (void)n;
#endif
}

static void tile_gemm(int M, int N, int K, float alpha, const float *A, size_t ars, size_t aks,
                      const float *B, size_t ldb, int accumulate, float *C, size_t ldc, Prefetch *pf) {
    if (M <= 0 || N <= 0) return;
    if (K <= 0) {
        if (!accumulate)
            for (int m = 0; m < M; m++) memset(C + (size_t)m * ldc, 0, (size_t)N * sizeof(float));
        return;
    }
#ifdef FA_AVX2_KERNEL
    const int n_calls = ((M + 5) / 6) * ((N + 15) / 16);
    const int pf_per_call = pf ? (pf->total - pf->next + n_calls - 1) / n_calls : 0;
    for (int n0 = 0; n0 < N; n0 += 16) {
        const int nr = N - n0 < 16 ? N - n0 : 16;
        if (nr == 16) {
            const __m256i none = _mm256_setzero_si256();
            for (int m0 = 0; m0 < M; m0 += 6) {
                if (pf) prefetch_some(pf, pf_per_call);
                micro_6x16(K, M - m0 < 6 ? M - m0 : 6, alpha, A + (size_t)m0 * ars, ars, aks, B + n0, ldb,
                           accumulate, C + (size_t)m0 * ldc + n0, ldc, 0, none, none);
            }
        } else {
            const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), vn = _mm256_set1_epi32(nr);
            const __m256i mlo = _mm256_cmpgt_epi32(vn, lane);
            const __m256i mhi = _mm256_cmpgt_epi32(vn, _mm256_add_epi32(lane, _mm256_set1_epi32(8)));
            for (int m0 = 0; m0 < M; m0 += 6) {
                if (pf) prefetch_some(pf, pf_per_call);
                micro_6x16(K, M - m0 < 6 ? M - m0 : 6, alpha, A + (size_t)m0 * ars, ars, aks, B + n0, ldb,
                           accumulate, C + (size_t)m0 * ldc + n0, ldc, 1, mlo, mhi);
            }
        }
    }
#else
    (void)pf;
    if (aks != 1 && ars != 1) die("tile_gemm: neither A nor A^T is row-major");
    cblas_sgemm(CblasRowMajor, aks == 1 ? CblasNoTrans : CblasTrans, CblasNoTrans, M, N, K, alpha, A,
                (int)(aks == 1 ? ars : aks), B, (int)ldb, accumulate ? 1.0f : 0.0f, C, (int)ldc);
#endif
}

/* dst (cols, ld_dst) = src (rows, cols; ld_src)^T. */
static void transpose_tile(int rows, int cols, const float *src, size_t ld_src, float *dst, size_t ld_dst) {
    for (int r0 = 0; r0 < rows; r0 += 8)
        for (int c = 0; c < cols; c++)
            for (int r = r0; r < rows && r < r0 + 8; r++) dst[(size_t)c * ld_dst + r] = src[(size_t)r * ld_src + c];
}

/* dst (rows, cols; ld_dst) = src (rows, cols; ld_src): gathers a strided head slice into a
 * compact tile, so that the kernel's operand rows are not a power of two apart. */
static void copy_tile(int rows, int cols, const float *src, size_t ld_src, float *dst, size_t ld_dst) {
    for (int r = 0; r < rows; r++) memcpy(dst + (size_t)r * ld_dst, src + (size_t)r * ld_src, (size_t)cols * sizeof(float));
}

/* Column operations on a (rows, n; ld) score tile, vectorised across the n columns. */
static void col_max(const float *s, int rows, int n, size_t ld, float *mx) {
    for (int i = 0; i < n; i++) mx[i] = -INFINITY;
    for (int j = 0; j < rows; j++) {
        const float *row = s + (size_t)j * ld;
        int i = 0;
#ifdef __AVX2__
        for (; i + 8 <= n; i += 8)
            _mm256_storeu_ps(mx + i, _mm256_max_ps(_mm256_loadu_ps(mx + i), _mm256_loadu_ps(row + i)));
#endif
        for (; i < n; i++) mx[i] = row[i] > mx[i] ? row[i] : mx[i];
    }
}

/* s[j][i] = 2^(s[j][i] - m[i]); sum[i] = sum over j of the new values. Strips of 32 columns
 * keep their sums in registers. */
static void col_exp2_sum(float *s, int rows, int n, size_t ld, const float *m, float *sum) {
    int i0 = 0;
#ifdef __AVX2__
    for (; i0 + 32 <= n; i0 += 32) {
        const __m256 m0 = _mm256_loadu_ps(m + i0), m1 = _mm256_loadu_ps(m + i0 + 8);
        const __m256 m2 = _mm256_loadu_ps(m + i0 + 16), m3 = _mm256_loadu_ps(m + i0 + 24);
        __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
        for (int j = 0; j < rows; j++) {
            float *row = s + (size_t)j * ld + i0;
            __m256 p0 = exp2_avx2(_mm256_sub_ps(_mm256_loadu_ps(row), m0));
            __m256 p1 = exp2_avx2(_mm256_sub_ps(_mm256_loadu_ps(row + 8), m1));
            __m256 p2 = exp2_avx2(_mm256_sub_ps(_mm256_loadu_ps(row + 16), m2));
            __m256 p3 = exp2_avx2(_mm256_sub_ps(_mm256_loadu_ps(row + 24), m3));
            _mm256_storeu_ps(row, p0);
            _mm256_storeu_ps(row + 8, p1);
            _mm256_storeu_ps(row + 16, p2);
            _mm256_storeu_ps(row + 24, p3);
            s0 = _mm256_add_ps(s0, p0);
            s1 = _mm256_add_ps(s1, p1);
            s2 = _mm256_add_ps(s2, p2);
            s3 = _mm256_add_ps(s3, p3);
        }
        _mm256_storeu_ps(sum + i0, s0);
        _mm256_storeu_ps(sum + i0 + 8, s1);
        _mm256_storeu_ps(sum + i0 + 16, s2);
        _mm256_storeu_ps(sum + i0 + 24, s3);
    }
#endif
    for (int i = i0; i < n; i++) sum[i] = 0.0f;
    for (int j = 0; j < rows; j++) {
        float *row = s + (size_t)j * ld;
        for (int i = i0; i < n; i++) {
            row[i] = exp2_scalar(row[i] - m[i]);
            sum[i] += row[i];
        }
    }
}

/* ---------------------------------------------------------------------------------------------
 * Forward. */
void attn_forward(const AttnShape *s, const float *q, const int *q_pos, const float *k,
                  const float *v, const int *kv_pos, float *o, float *lse) {
    check_shape(s, q_pos, kv_pos, "attn_forward");
    const int n_q = s->n_q, n_kv = s->n_kv, H = s->n_heads, Hkv = s->n_kv_heads, d = s->head_dim;
    if (n_q == 0 || n_kv == 0) return;
    const int group = H / Hkv, BQ = FA_FWD_BQ, BK = FA_FWD_BK;
    const int nqt = (n_q + BQ - 1) / BQ, nkt = (n_kv + BK - 1) / BK;
    const size_t ldq = (size_t)H * d, ldk = (size_t)Hkv * d, ldt = (size_t)BQ + FA_SKEW;
    const size_t ldc = (size_t)d + FA_SKEW; /* row stride of the compact k and v tiles */
    const float alpha = (float)(s->scale * FA_LOG2E); /* scores in log2 units */
    const AttnMask mask = s->mask;

    PosRange *qr = xmalloc((size_t)nqt * sizeof *qr), *kr = xmalloc((size_t)nkt * sizeof *kr);
    tile_ranges(mask == ATTN_CAUSAL ? q_pos : NULL, n_q, BQ, qr);
    tile_ranges(mask == ATTN_CAUSAL ? kv_pos : NULL, n_kv, BK, kr);
    /* Heaviest query tiles first, so the dynamic schedule ends balanced. */
    TileOrder *order = xmalloc((size_t)nqt * sizeof *order);
    int n_busy = 0;
    for (int t = 0; t < nqt; t++) {
        int c = 0;
        for (int u = 0; u < nkt; u++) c += tile_class(mask, qr[t], kr[u]) != TILE_HIDDEN;
        if (c) order[n_busy++] = (TileOrder){c, t};
    }
    qsort(order, (size_t)n_busy, sizeof *order, cmp_cost_desc);

    const int nth = omp_get_max_threads();
    /* per thread: Q^T (d, ldt) | S^T (BK, ldt) | K, V (BK, ldc) | acc (BQ, d) | m, l, mx, msafe,
     * corr, sum (BQ) */
    const size_t per_thread =
        ((size_t)d * ldt + (size_t)BK * ldt + 2 * (size_t)BK * ldc + (size_t)BQ * d + 6 * (size_t)BQ + 15) / 16 * 16;
    float *work = xmalloc_aligned((size_t)nth * per_thread * sizeof(float));
    const long long n_items = (long long)n_busy * H;

#pragma omp parallel num_threads(nth)
    {
        float *Qt = work + (size_t)omp_get_thread_num() * per_thread; /* (d, bq) transposed q tile */
        float *ST = Qt + (size_t)d * ldt;                             /* (bk, bq) scores^T / probs^T */
        float *Kc = ST + (size_t)BK * ldt;                            /* (bk, d) compact k tile */
        float *Vc = Kc + (size_t)BK * ldc;                            /* (bk, d) compact v tile */
        float *acc = Vc + (size_t)BK * ldc;                           /* (bq, d) */
        float *m = acc + (size_t)BQ * d;                              /* (bq) running max, log2 */
        float *l = m + BQ;                                            /* (bq) running sum */
        float *mx = l + BQ, *msafe = mx + BQ, *corr = msafe + BQ, *sum = corr + BQ; /* (bq) each */
        unsigned char seen[FA_FWD_BQ];

#pragma omp for schedule(dynamic, 1)
        for (long long w = 0; w < n_items; w++) {
            /* head-major: the threads work on one head at a time and share its K/V in L3 */
            const int h = (int)(w / n_busy), qt = order[w % n_busy].idx, g = h / group;
            const int i0 = qt * BQ, bq = i0 + BQ <= n_q ? BQ : n_q - i0;
            transpose_tile(bq, d, q + ((size_t)i0 * H + h) * d, ldq, Qt, ldt);
            for (int r = 0; r < bq; r++) {
                size_t row = (size_t)(i0 + r) * H + h;
                float L = lse[row];
                seen[r] = 0;
                if (L == -INFINITY) {
                    m[r] = -INFINITY;
                    l[r] = 0.0f;
                    memset(acc + (size_t)r * d, 0, (size_t)d * sizeof(float));
                } else {
                    m[r] = (float)(L * FA_LOG2E);
                    l[r] = 1.0f;
                    memcpy(acc + (size_t)r * d, o + row * d, (size_t)d * sizeof(float));
                }
            }
            for (int kt = 0; kt < nkt; kt++) {
                const int cls = tile_class(mask, qr[qt], kr[kt]);
                if (cls == TILE_HIDDEN) continue;
                const int j0 = kt * BK, bk = j0 + BK <= n_kv ? BK : n_kv - j0;
                copy_tile(bk, d, k + ((size_t)j0 * Hkv + g) * d, ldk, Kc, ldc);
                copy_tile(bk, d, v + ((size_t)j0 * Hkv + g) * d, ldk, Vc, ldc);
                /* S^T (bk, bq) = alpha K (bk, d) Q^T (d, bq) */
                Prefetch pf = {{NULL, NULL}, ldk * sizeof(float), 0, (int)((d * sizeof(float) + 63) / 64 + 1), 0, 0};
                for (int nt = kt + 1; nt < nkt; nt++) { /* the next key tile this item will read */
                    if (tile_class(mask, qr[qt], kr[nt]) == TILE_HIDDEN) continue;
                    const int n0 = nt * BK, nb = n0 + BK <= n_kv ? BK : n_kv - n0;
                    pf.base[0] = (const char *)(k + ((size_t)n0 * Hkv + g) * d);
                    pf.base[1] = (const char *)(v + ((size_t)n0 * Hkv + g) * d);
                    pf.rows = nb;
                    pf.total = 2 * nb * pf.lines_per_row;
                    break;
                }
                tile_gemm(bk, bq, d, alpha, Kc, ldc, 1, Qt, ldt, 0, ST, ldt, &pf);
                if (cls == TILE_PARTIAL)
                    for (int j = 0; j < bk; j++) {
                        const int kp = kv_pos[j0 + j];
                        if (kp <= qr[qt].lo) continue; /* every query of the tile sees this key */
                        float *row = ST + (size_t)j * ldt;
                        const int *qp = q_pos + i0;
                        for (int i = 0; i < bq; i++) row[i] = kp > qp[i] ? -INFINITY : row[i];
                    }
                col_max(ST, bk, bq, ldt, mx);
                for (int i = 0; i < bq; i++) {
                    float mnew = m[i] > mx[i] ? m[i] : mx[i];
                    seen[i] |= mx[i] != -INFINITY;
                    msafe[i] = mnew == -INFINITY ? 0.0f : mnew; /* a column with no key yet: p = 0 */
                    corr[i] = exp2_scalar(m[i] - msafe[i]);     /* 0 when m was -inf */
                    m[i] = mnew;
                }
                col_exp2_sum(ST, bk, bq, ldt, msafe, sum);
                for (int i = 0; i < bq; i++) {
                    l[i] = l[i] * corr[i] + sum[i];
                    if (corr[i] != 1.0f) {
                        float *arow = acc + (size_t)i * d;
                        for (int c = 0; c < d; c++) arow[c] *= corr[i];
                    }
                }
                /* acc (bq, d) += P (bq, bk) V (bk, d), P read as (S^T)^T */
                tile_gemm(bq, d, bk, 1.0f, ST, 1, ldt, Vc, ldc, 1, acc, (size_t)d, NULL);
            }
            for (int r = 0; r < bq; r++) {
                if (!seen[r]) continue; /* no visible key in this call: state unchanged */
                size_t row = (size_t)(i0 + r) * H + h;
                float inv = 1.0f / l[r];
                const float *arow = acc + (size_t)r * d;
                float *orow = o + row * d;
                for (int c = 0; c < d; c++) orow[c] = arow[c] * inv;
                lse[row] = (float)(((double)m[r] + log2((double)l[r])) * FA_LN2);
            }
        }
    }
    xfree(work);
    xfree(order);
    xfree(qr);
    xfree(kr);
}

/* ---------------------------------------------------------------------------------------------
 * Backward. */
void attn_backward(const AttnShape *s, const float *q, const int *q_pos, const float *k,
                   const float *v, const int *kv_pos, const float *lse, const float *delta,
                   const float *dout, float *dq, float *dk, float *dv) {
    check_shape(s, q_pos, kv_pos, "attn_backward");
    const int n_q = s->n_q, n_kv = s->n_kv, H = s->n_heads, Hkv = s->n_kv_heads, d = s->head_dim;
    if (n_q == 0 || n_kv == 0 || (!dq && !dk && !dv)) return;
    const int group = H / Hkv, BQ = FA_BWD_BQ, BK = FA_BWD_BK;
    const int nqt = (n_q + BQ - 1) / BQ, nkt = (n_kv + BK - 1) / BK;
    const size_t ldq = (size_t)H * d, ldk = (size_t)Hkv * d, ldp = (size_t)BK + FA_SKEW;
    const size_t ldc = (size_t)d + FA_SKEW; /* row stride of the compact k, q and dout tiles */
    const float alpha = (float)(s->scale * FA_LOG2E), scale = s->scale;
    const AttnMask mask = s->mask;

    PosRange *qr = xmalloc((size_t)nqt * sizeof *qr), *kr = xmalloc((size_t)nkt * sizeof *kr);
    tile_ranges(mask == ATTN_CAUSAL ? q_pos : NULL, n_q, BQ, qr);
    tile_ranges(mask == ATTN_CAUSAL ? kv_pos : NULL, n_kv, BK, kr);
    TileOrder *order = xmalloc((size_t)nkt * sizeof *order);
    int n_busy = 0;
    for (int u = 0; u < nkt; u++) {
        int c = 0;
        for (int t = 0; t < nqt; t++) c += tile_class(mask, qr[t], kr[u]) != TILE_HIDDEN;
        if (c) order[n_busy++] = (TileOrder){c, u};
    }
    qsort(order, (size_t)n_busy, sizeof *order, cmp_cost_desc);

    const int nth = omp_get_max_threads();
    /* per thread: K^T, V^T (d, ldp) | P, dP (BQ, ldp) | dK acc, dV acc (BK, d) | K (BK, ldc) |
     * Q, dO (BQ, ldc) */
    const size_t per_thread = (2 * (size_t)d * ldp + 2 * (size_t)BQ * ldp + 2 * (size_t)BK * d + (size_t)BK * ldc +
                               2 * (size_t)BQ * ldc + 15) / 16 * 16;
    float *work = xmalloc_aligned((size_t)nth * per_thread * sizeof(float));
    /* dq of threads 1.. : (n_q, group, d) each, for the heads of the current kv head */
    const size_t dq_elems = (size_t)n_q * group * d;
    float **dqbuf = xcalloc((size_t)nth, sizeof *dqbuf);
    if (dq)
        for (int t = 1; t < nth; t++) dqbuf[t] = xmalloc_aligned(dq_elems * sizeof(float));

#pragma omp parallel num_threads(nth)
    {
        const int tid = omp_get_thread_num(), team = omp_get_num_threads();
        float *Kt = work + (size_t)tid * per_thread; /* (d, bk) transposed k tile */
        float *Vt = Kt + (size_t)d * ldp;            /* (d, bk) transposed v tile */
        float *P = Vt + (size_t)d * ldp;             /* (bq, bk) probabilities, then dS */
        float *dP = P + (size_t)BQ * ldp;            /* (bq, bk) */
        float *dKa = dP + (size_t)BQ * ldp;          /* (bk, d) */
        float *dVa = dKa + (size_t)BK * d;           /* (bk, d) */
        float *Kc = dVa + (size_t)BK * d;            /* (bk, d) compact k tile */
        float *Qc = Kc + (size_t)BK * ldc;           /* (bq, d) compact q tile */
        float *dOc = Qc + (size_t)BQ * ldc;          /* (bq, d) compact dout tile */
        for (int g = 0; g < Hkv; g++) {
            const int h0 = g * group;
            /* no barrier needed here: the previous kv head's reduction ended with one */
            if (dq && tid > 0) memset(dqbuf[tid], 0, dq_elems * sizeof(float));
            /* thread 0 accumulates straight into dq; the others into their (n_q, group, d) buffer */
            float *dq_base = !dq ? NULL : tid == 0 ? dq + (size_t)h0 * d : dqbuf[tid];
            const size_t dq_ld = tid == 0 ? ldq : (size_t)group * d; /* row stride of dq_base */
            /* Round-robin over the cost-sorted kv tiles, NOT a dynamic schedule: which thread sums
             * which tiles' dq contributions must not depend on timing, so that a run is
             * bit-reproducible for a given thread count (resume, checkpointing). */
#pragma omp for schedule(static, 1)
            for (int w = 0; w < n_busy; w++) {
                const int kt = order[w].idx, j0 = kt * BK, bk = j0 + BK <= n_kv ? BK : n_kv - j0;
                const float *ktile = k + ((size_t)j0 * Hkv + g) * d; /* (bk, d), stride ldk */
                const float *vtile = v + ((size_t)j0 * Hkv + g) * d; /* (bk, d), stride ldk */
                transpose_tile(bk, d, ktile, ldk, Kt, ldp);
                if (dq) copy_tile(bk, d, ktile, ldk, Kc, ldc);
                transpose_tile(bk, d, vtile, ldk, Vt, ldp);
                memset(dKa, 0, (size_t)bk * d * sizeof(float));
                memset(dVa, 0, (size_t)bk * d * sizeof(float));
                for (int hh = 0; hh < group; hh++) {
                    const int h = h0 + hh;
                    for (int qt = 0; qt < nqt; qt++) {
                        const int cls = tile_class(mask, qr[qt], kr[kt]);
                        if (cls == TILE_HIDDEN) continue;
                        const int i0 = qt * BQ, bq = i0 + BQ <= n_q ? BQ : n_q - i0;
                        copy_tile(bq, d, q + ((size_t)i0 * H + h) * d, ldq, Qc, ldc);
                        /* S (bq, bk) = alpha Q (bq, d) K^T (d, bk) */
                        tile_gemm(bq, bk, d, alpha, Qc, ldc, 1, Kt, ldp, 0, P, ldp, NULL);
                        int any = 0;
                        for (int r = 0; r < bq; r++) {
                            float *prow = P + (size_t)r * ldp;
                            float L = lse[(size_t)(i0 + r) * H + h];
                            int hidden = L == -INFINITY;
                            if (cls == TILE_PARTIAL && !hidden) {
                                int qp = q_pos[i0 + r];
                                if (qp < kr[kt].lo) hidden = 1;
                                else if (qp < kr[kt].hi) row_mask(prow, kv_pos + j0, bk, qp);
                            }
                            if (hidden) {
                                memset(prow, 0, (size_t)bk * sizeof(float));
                                continue;
                            }
                            any = 1;
                            row_exp2_sum(prow, bk, (float)(L * FA_LOG2E));
                        }
                        if (!any) continue;
                        copy_tile(bq, d, dout + ((size_t)i0 * H + h) * d, ldq, dOc, ldc);
                        if (dv) /* dV (bk, d) += P^T (bk, bq) dO (bq, d) */
                            tile_gemm(bk, d, bq, 1.0f, P, 1, ldp, dOc, ldc, 1, dVa, (size_t)d, NULL);
                        if (!dq && !dk) continue;
                        /* dP (bq, bk) = dO (bq, d) V^T (d, bk) */
                        tile_gemm(bq, bk, d, 1.0f, dOc, ldc, 1, Vt, ldp, 0, dP, ldp, NULL);
                        for (int r = 0; r < bq; r++) { /* dS = P * (dP - delta), into P */
                            const float dl = delta[(size_t)(i0 + r) * H + h];
                            float *prow = P + (size_t)r * ldp;
                            const float *dprow = dP + (size_t)r * ldp;
                            for (int c = 0; c < bk; c++) prow[c] = prow[c] * (dprow[c] - dl);
                        }
                        if (dk) /* dK (bk, d) += scale dS^T (bk, bq) Q (bq, d) */
                            tile_gemm(bk, d, bq, scale, P, 1, ldp, Qc, ldc, 1, dKa, (size_t)d, NULL);
                        if (dq) /* dQ (bq, d) += scale dS (bq, bk) K (bk, d) */
                            tile_gemm(bq, d, bk, scale, P, ldp, 1, Kc, ldc, 1,
                                      dq_base + (size_t)i0 * dq_ld + (size_t)hh * d, dq_ld, NULL);
                    }
                }
                for (int j = 0; j < bk; j++) { /* this thread is the only writer of these rows */
                    size_t off = ((size_t)(j0 + j) * Hkv + g) * d;
                    if (dk) for (int c = 0; c < d; c++) dk[off + c] += dKa[(size_t)j * d + c];
                    if (dv) for (int c = 0; c < d; c++) dv[off + c] += dVa[(size_t)j * d + c];
                }
            }
            /* implicit barrier: every thread's dq part for kv head g is complete */
            if (dq && team > 1) {
#pragma omp for schedule(static)
                for (int i = 0; i < n_q; i++) {
                    float *dst = dq + ((size_t)i * H + h0) * d; /* (group, d) contiguous */
                    for (int t = 1; t < team; t++) {
                        const float *src = dqbuf[t] + (size_t)i * group * d;
                        for (size_t c = 0; c < (size_t)group * d; c++) dst[c] += src[c];
                    }
                }
            }
        }
    }
    for (int t = 1; t < nth; t++) xfree(dqbuf[t]);
    xfree(dqbuf);
    xfree(work);
    xfree(order);
    xfree(qr);
    xfree(kr);
}
