/* The body of seqpar's dispatched kernels, written once against a small vector vocabulary and
 * compiled once per instruction set: simd_scalar.c, simd_avx2.c and simd_avx512.c define
 *   V, VM, VL           vector type, lane-mask type, lanes
 *   vzero vset1 vload vstore vload_m vstore_m vsel_m vmask vadd vsub vmul vdiv vfma vmax vmin
 *   vsqrt vhsum vhmax vexp2
 *   GEMM_MR, GEMM_NV    micro-kernel rows and vectors per row (GEMM_MR x GEMM_NV*VL block of C)
 *   SIMD_FWD_BQ, SIMD_FWD_BK, SIMD_BWD_BK, SIMD_BWD_BQ   attention tile sizes
 *   SIMD_SMALL_L2_TILES (optional) the same four where the L2 per core is small (isa.h)
 *   SIMD_TABLE, SIMD_LEVEL
 * and then include this file. Every function here is static: each object file has its own copy,
 * built for its instruction set, reachable only through its table (isa.h). Masked lanes (vload_m)
 * read as 0 and are never stored; a mask of n lanes covers lanes 0..n-1 (0 <= n <= VL). The word
 * transposes (sb_transpose32, and through it sb_pack_panels) use 256-bit AVX registers directly
 * where VL > 1: every vector path has AVX2. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/exp2_poly.h"
#include "kernels/isa.h"

#define SB_LOG2E 1.4426950408889634f

/* ---------------------------------------------------------------------------------------------
 * Tile product: C (M, N) = alpha A B [+ C]. One GEMM_MR x (GEMM_NV VL) block of C per call of
 * micro(): GEMM_MR x GEMM_NV accumulators; per k, GEMM_NV loads of B and GEMM_MR broadcasts of
 * A from ONE pointer (A's GEMM_MR values of step k lie at a[k apk + r], r < GEMM_MR), so the
 * broadcasts become memory operands of the FMAs. Rows beyond mr are computed and not stored;
 * with `masked` the vectors of the last column block load and store only their lanes in msk[]. */
static inline __attribute__((always_inline)) void micro(int K, int mr, float alpha, const float *a, size_t apk,
                                                        const float *B, size_t ldb, int accumulate, float *C,
                                                        size_t ldc, const int masked, const VM *msk,
                                                        const int rows, size_t ars) {
    V c[GEMM_MR][GEMM_NV];
    const float *ar[GEMM_MR]; /* rows mode: row r of A at a + r ars, steps contiguous */
#pragma GCC unroll 16
    for (int r = 0; r < GEMM_MR; r++) ar[r] = a + (size_t)(r < mr ? r : mr - 1) * ars;
#pragma GCC unroll 16
    for (int r = 0; r < GEMM_MR; r++)
#pragma GCC unroll 8
        for (int v = 0; v < GEMM_NV; v++) c[r][v] = vzero();
    for (int k = 0; k < K; k++) {
        const float *b = B + (size_t)k * ldb, *ak = a + (size_t)k * apk;
        V bv[GEMM_NV];
#pragma GCC unroll 8
        for (int v = 0; v < GEMM_NV; v++) bv[v] = masked ? vload_m(b + v * VL, msk[v]) : vload(b + v * VL);
#pragma GCC unroll 16
        for (int r = 0; r < GEMM_MR; r++) {
            const V av = rows ? vset1(ar[r][k]) : vset1(ak[r]);
#pragma GCC unroll 8
            for (int v = 0; v < GEMM_NV; v++) c[r][v] = vfma(av, bv[v], c[r][v]);
        }
    }
    const V va = vset1(alpha);
#pragma GCC unroll 16
    for (int r = 0; r < GEMM_MR; r++) {
        if (r >= mr) break;
        float *cr = C + (size_t)r * ldc;
#pragma GCC unroll 8
        for (int v = 0; v < GEMM_NV; v++) {
            V y = vmul(va, c[r][v]);
            if (masked) {
                if (accumulate) y = vadd(y, vload_m(cr + v * VL, msk[v]));
                vstore_m(cr + v * VL, msk[v], y);
            } else {
                if (accumulate) y = vadd(y, vload(cr + v * VL));
                vstore(cr + v * VL, y);
            }
        }
    }
}

#define SB_PACK 6144 /* floats of packed A per thread (24 KiB): the partial last row block of a k-chunk */
static _Thread_local float sb_pack[SB_PACK] __attribute__((aligned(64)));

/* Packs rows m0 .. m0+mr-1 of A, steps k0 .. k0+kc-1, as (kc, GEMM_MR); missing rows are zero. */
static void pack_panel(float *dst, const float *A, size_t ars, size_t aks, int m0, int mr, int k0, int kc) {
    for (int k = 0; k < kc; k++)
        for (int r = 0; r < GEMM_MR; r++)
            dst[k * GEMM_MR + r] = r < mr ? A[(size_t)(m0 + r) * ars + (size_t)(k0 + k) * aks] : 0.0f;
}

/* Loop order: k-chunks, then column blocks (a GEMM_NV-vector panel of B stays in L1), then row
 * blocks. A is never copied whole: stored transposed (ars == 1) the GEMM_MR values of a step are
 * contiguous and are read in place (the partial last row block is packed, zero-padded); stored
 * row-major (aks == 1) the kernel broadcasts from GEMM_MR row pointers (rows mode). Packing a
 * row-major A instead measured slower: at N = head_dim = 64 the scalar transposing copy costs a
 * quarter of the product. An A its caller packs once for many products (the forward's K) comes in
 * panels instead (tile_gemm_panels): one sequential stream. */
static inline __attribute__((always_inline)) void gemm_loops(int M, int N, int K, float alpha, const float *A,
                                                             size_t ars, size_t aks, const int panels,
                                                             const float *B, size_t ldb, int accumulate, float *C,
                                                             size_t ldc, Prefetch *pf) {
    if (tile_gemm_trivial(M, N, K, accumulate, C, ldc)) return;
    const int NR = GEMM_NV * VL, nfull = N / NR * NR, nr = N - nfull;
    VM msk[GEMM_NV];
    for (int v = 0; v < GEMM_NV; v++) {
        int cnt = nr - v * VL;
        msk[v] = vmask(cnt < 0 ? 0 : cnt > VL ? VL : cnt);
    }
    const int nmb = (M + GEMM_MR - 1) / GEMM_MR, rows_mode = !panels && ars != 1;
    const int edge = !panels && !rows_mode && M % GEMM_MR; /* in place, with a partial last row block */
    const int KC = edge && K > SB_PACK / GEMM_MR ? SB_PACK / GEMM_MR : K;
    const int n_calls = nmb * ((N + NR - 1) / NR) * ((K + KC - 1) / KC);
    const int pf_per_call = pf ? (pf->total - pf->next + n_calls - 1) / n_calls : 0;
    float *pack = sb_pack;
    for (int k0 = 0; k0 < K; k0 += KC) {
        const int kc = K - k0 < KC ? K - k0 : KC, acc = k0 ? 1 : accumulate;
        if (edge) pack_panel(pack, A, ars, aks, (nmb - 1) * GEMM_MR, M - (nmb - 1) * GEMM_MR, k0, kc);
        const float *Bk = B + (size_t)k0 * ldb;
        for (int n0 = 0; n0 < N; n0 += NR) {
            const int masked = n0 >= nfull;
            for (int mb = 0; mb < nmb; mb++) {
                const int m0 = mb * GEMM_MR, mr = M - m0 < GEMM_MR ? M - m0 : GEMM_MR;
                float *Cb = C + (size_t)m0 * ldc + n0;
                if (pf) prefetch_some(pf, pf_per_call);
                if (rows_mode) {
                    const float *a0 = A + (size_t)m0 * ars + (size_t)k0 * aks;
                    if (masked) micro(kc, mr, alpha, a0, 1, Bk + n0, ldb, acc, Cb, ldc, 1, msk, 1, ars);
                    else micro(kc, mr, alpha, a0, 1, Bk + n0, ldb, acc, Cb, ldc, 0, msk, 1, ars);
                } else { /* a panel (this row block's, or the packed edge) or a transposed A in place */
                    const float *ap = panels ? A + (size_t)m0 * K : mr == GEMM_MR ? A + (size_t)m0 + (size_t)k0 * aks : pack;
                    const size_t apk = panels || mr < GEMM_MR ? GEMM_MR : aks;
                    if (masked) micro(kc, mr, alpha, ap, apk, Bk + n0, ldb, acc, Cb, ldc, 1, msk, 0, 0);
                    else micro(kc, mr, alpha, ap, apk, Bk + n0, ldb, acc, Cb, ldc, 0, msk, 0, 0);
                }
            }
        }
    }
}

static void sb_tile_gemm(int M, int N, int K, float alpha, const float *A, size_t ars, size_t aks, const float *B,
                         size_t ldb, int accumulate, float *C, size_t ldc, Prefetch *pf) {
    gemm_loops(M, N, K, alpha, A, ars, aks, 0, B, ldb, accumulate, C, ldc, pf);
}

/* A in panels (isa.h): the same loops, each row block's panel read in place (the last one
 * zero-padded by pack_panels, so no edge copy; K is never split). */
static void sb_tile_gemm_panels(int M, int N, int K, float alpha, const float *Ap, const float *B, size_t ldb,
                                int accumulate, float *C, size_t ldc, Prefetch *pf) {
    gemm_loops(M, N, K, alpha, Ap, 0, 0, 1, B, ldb, accumulate, C, ldc, pf);
}

static void sb_transpose32(int rows, int cols, const void *src, size_t ld_src, void *dst, size_t ld_dst);

/* A panel is its rows' block transposed, (cols, GEMM_MR); the missing rows of a last partial one
 * are zero. */
static void sb_pack_panels(int rows, int cols, const float *src, size_t ld, float *dst) {
    for (int m0 = 0; m0 < rows; m0 += GEMM_MR, dst += (size_t)GEMM_MR * cols) {
        const int mr = rows - m0 < GEMM_MR ? rows - m0 : GEMM_MR;
        sb_transpose32(mr, cols, src + (size_t)m0 * ld, ld, dst, GEMM_MR);
        for (int k = 0; mr < GEMM_MR && k < cols; k++)
            for (int r = mr; r < GEMM_MR; r++) dst[(size_t)k * GEMM_MR + r] = 0.0f;
    }
}

/* Transposition of 4-byte words: in 8 x 8 blocks of AVX registers where the path has them (two
 * rounds of unpacks and one of 128-bit lane swaps, no scalar gathers; a last block of fewer rows
 * reads zeros for the missing ones and stores only its rows, as 4-, 2- and 1-word stores: a
 * masked store is microcoded on AMD's cores, and the panels of pack_panels are 6-row blocks), the
 * columns past the last whole eight word by word. */
#if VL > 1
/* the first n (1..8) lanes of x at q, unmasked */
static inline __attribute__((always_inline)) void store_lanes(float *q, __m256 x, int n) {
    if (n == 8) {
        _mm256_storeu_ps(q, x);
        return;
    }
    __m128 h = _mm256_castps256_ps128(x);
    if (n >= 4) _mm_storeu_ps(q, h), h = _mm256_extractf128_ps(x, 1), q += 4, n -= 4;
    if (n >= 2) _mm_storel_pi((__m64 *)q, h), h = _mm_movehl_ps(h, h), q += 2, n -= 2;
    if (n) _mm_store_ss(q, h);
}

static inline __attribute__((always_inline)) void transpose8x8(const float *p, size_t ld_src, int nrow, float *q,
                                                               size_t ld_dst) {
    __m256 a[8];
#pragma GCC unroll 8
    for (int r = 0; r < 8; r++) a[r] = r < nrow ? _mm256_loadu_ps(p + r * ld_src) : _mm256_setzero_ps();
    /* pairs of rows interleaved, then quads, then the halves exchanged */
    const __m256 b0 = _mm256_unpacklo_ps(a[0], a[1]), b1 = _mm256_unpackhi_ps(a[0], a[1]);
    const __m256 b2 = _mm256_unpacklo_ps(a[2], a[3]), b3 = _mm256_unpackhi_ps(a[2], a[3]);
    const __m256 b4 = _mm256_unpacklo_ps(a[4], a[5]), b5 = _mm256_unpackhi_ps(a[4], a[5]);
    const __m256 b6 = _mm256_unpacklo_ps(a[6], a[7]), b7 = _mm256_unpackhi_ps(a[6], a[7]);
    const __m256 c[8] = {_mm256_shuffle_ps(b0, b2, 0x44), _mm256_shuffle_ps(b0, b2, 0xEE),
                         _mm256_shuffle_ps(b1, b3, 0x44), _mm256_shuffle_ps(b1, b3, 0xEE),
                         _mm256_shuffle_ps(b4, b6, 0x44), _mm256_shuffle_ps(b4, b6, 0xEE),
                         _mm256_shuffle_ps(b5, b7, 0x44), _mm256_shuffle_ps(b5, b7, 0xEE)};
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++) { /* column j: rows 0-3 from c[j % 4], rows 4-7 from c[j % 4 + 4] */
        const __m256 col = j < 4 ? _mm256_permute2f128_ps(c[j], c[j + 4], 0x20)
                                 : _mm256_permute2f128_ps(c[j - 4], c[j], 0x31);
        store_lanes(q + j * ld_dst, col, nrow);
    }
}
#endif

static void sb_transpose32(int rows, int cols, const void *src, size_t ld_src, void *dst, size_t ld_dst) {
    const uint32_t *s = (const uint32_t *)src;
    uint32_t *t = (uint32_t *)dst;
    for (int r0 = 0; r0 < rows; r0 += 8) {
        const int nrow = rows - r0 < 8 ? rows - r0 : 8;
        int c0 = 0;
#if VL > 1
        for (; c0 + 8 <= cols; c0 += 8) { /* whole blocks specialised: no masks */
            const float *p = (const float *)(s + (size_t)r0 * ld_src + c0);
            float *q = (float *)(t + (size_t)c0 * ld_dst + r0);
            if (nrow == 8) transpose8x8(p, ld_src, 8, q, ld_dst);
            else if (nrow == 6) transpose8x8(p, ld_src, 6, q, ld_dst); /* pack_panels' blocks */
            else transpose8x8(p, ld_src, nrow, q, ld_dst);
        }
#endif
        for (int c = c0; c < cols; c++)
            for (int r = r0; r < r0 + nrow; r++) t[(size_t)c * ld_dst + r] = s[(size_t)r * ld_src + c];
    }
}

/* ---------------------------------------------------------------------------------------------
 * Softmax pieces of the attention tiles. */
static void sb_col_max(const float *s, int rows, int n, size_t ld, float *mx) {
    int i = 0;
    for (; i + 4 * VL <= n; i += 4 * VL) { /* strips of 4 vectors: maxima stay in registers */
        V m0 = vset1(-INFINITY), m1 = m0, m2 = m0, m3 = m0;
        for (int j = 0; j < rows; j++) {
            const float *row = s + (size_t)j * ld + i;
            m0 = vmax(m0, vload(row));
            m1 = vmax(m1, vload(row + VL));
            m2 = vmax(m2, vload(row + 2 * VL));
            m3 = vmax(m3, vload(row + 3 * VL));
        }
        vstore(mx + i, m0);
        vstore(mx + i + VL, m1);
        vstore(mx + i + 2 * VL, m2);
        vstore(mx + i + 3 * VL, m3);
    }
    for (; i < n; i += VL) {
        const int cnt = n - i < VL ? n - i : VL;
        const VM mk = vmask(cnt);
        V m0 = vset1(-INFINITY);
        for (int j = 0; j < rows; j++) m0 = vmax(m0, cnt == VL ? vload(s + (size_t)j * ld + i) : vload_m(s + (size_t)j * ld + i, mk));
        if (cnt == VL) vstore(mx + i, m0); else vstore_m(mx + i, mk, m0);
    }
}

static void sb_col_exp2_sum(float *s, int rows, int n, size_t ld, const float *m, float *sum) {
    int i = 0;
    for (; i + 4 * VL <= n; i += 4 * VL) {
        const V m0 = vload(m + i), m1 = vload(m + i + VL), m2 = vload(m + i + 2 * VL), m3 = vload(m + i + 3 * VL);
        V s0 = vzero(), s1 = s0, s2 = s0, s3 = s0;
        for (int j = 0; j < rows; j++) {
            float *row = s + (size_t)j * ld + i;
            V p0 = vexp2_bounded(vsub(vload(row), m0)), p1 = vexp2_bounded(vsub(vload(row + VL), m1));
            V p2 = vexp2_bounded(vsub(vload(row + 2 * VL), m2)), p3 = vexp2_bounded(vsub(vload(row + 3 * VL), m3));
            vstore(row, p0);
            vstore(row + VL, p1);
            vstore(row + 2 * VL, p2);
            vstore(row + 3 * VL, p3);
            s0 = vadd(s0, p0);
            s1 = vadd(s1, p1);
            s2 = vadd(s2, p2);
            s3 = vadd(s3, p3);
        }
        vstore(sum + i, s0);
        vstore(sum + i + VL, s1);
        vstore(sum + i + 2 * VL, s2);
        vstore(sum + i + 3 * VL, s3);
    }
    for (; i < n; i += VL) {
        const int cnt = n - i < VL ? n - i : VL;
        const VM mk = vmask(cnt);
        const V m0 = vload_m(m + i, mk);
        V s0 = vzero();
        for (int j = 0; j < rows; j++) {
            float *row = s + (size_t)j * ld + i;
            V p = vsel_m(mk, vexp2_bounded(vsub(vload_m(row, mk), m0)));
            vstore_m(row, mk, p);
            s0 = vadd(s0, p);
        }
        vstore_m(sum + i, mk, s0);
    }
}

/* s[j] = 2^(s[j] - m); their sum */
static float sb_row_exp2_sum(float *s, int n, float m) {
    const V vm = vset1(m);
    V a = vzero(), b = a;
    int j = 0;
    for (; j + 2 * VL <= n; j += 2 * VL) {
        V x0 = vexp2_bounded(vsub(vload(s + j), vm)), x1 = vexp2_bounded(vsub(vload(s + j + VL), vm));
        vstore(s + j, x0);
        vstore(s + j + VL, x1);
        a = vadd(a, x0);
        b = vadd(b, x1);
    }
    for (; j < n; j += VL) {
        const int cnt = n - j < VL ? n - j : VL;
        const VM mk = vmask(cnt);
        V x = vsel_m(mk, vexp2_bounded(vsub(vload_m(s + j, mk), vm)));
        vstore_m(s + j, mk, x);
        a = vadd(a, x);
    }
    return vhsum(vadd(a, b));
}

static void sb_ds_row(float *p, const float *dp, int n, float delta) {
    const V vd = vset1(delta);
    for (int j = 0; j < n; j += VL) {
        const int cnt = n - j < VL ? n - j : VL;
        if (cnt == VL) {
            vstore(p + j, vmul(vload(p + j), vsub(vload(dp + j), vd)));
        } else {
            const VM mk = vmask(cnt);
            vstore_m(p + j, mk, vmul(vload_m(p + j, mk), vsub(vload_m(dp + j, mk), vd)));
        }
    }
}

static void sb_scale_cols(float *x, int rows, int n, size_t ld, const float *a) {
    for (int r = 0; r < rows; r++) {
        float *xr = x + (size_t)r * ld;
        for (int j = 0; j < n; j += VL) {
            const int cnt = n - j < VL ? n - j : VL;
            if (cnt == VL) {
                vstore(xr + j, vmul(vload(xr + j), vload(a + j)));
            } else {
                const VM mk = vmask(cnt);
                vstore_m(xr + j, mk, vmul(vload_m(xr + j, mk), vload_m(a + j, mk)));
            }
        }
    }
}

static void sb_scale_row(float *x, int n, float a) {
    const V va = vset1(a);
    for (int j = 0; j < n; j += VL) {
        const int cnt = n - j < VL ? n - j : VL;
        if (cnt == VL) {
            vstore(x + j, vmul(vload(x + j), va));
        } else {
            const VM mk = vmask(cnt);
            vstore_m(x + j, mk, vmul(vload_m(x + j, mk), va));
        }
    }
}

static void sb_add_row(float *y, const float *x, size_t n) {
    size_t j = 0;
    for (; j + VL <= n; j += VL) vstore(y + j, vadd(vload(y + j), vload(x + j)));
    for (; j < n; j++) y[j] += x[j];
}

/* ---------------------------------------------------------------------------------------------
 * Dense element-wise operations of the model. */
static float sb_rmsnorm_row(float *out, const float *x, const float *w, int D, float eps) {
    V a = vzero(), b = a;
    int j = 0;
    for (; j + 2 * VL <= D; j += 2 * VL) {
        V x0 = vload(x + j), x1 = vload(x + j + VL);
        a = vfma(x0, x0, a);
        b = vfma(x1, x1, b);
    }
    float ss = vhsum(vadd(a, b));
    for (; j < D; j++) ss += x[j] * x[j];
    const float r = 1.0f / sqrtf(ss / (float)D + eps);
    const V vr = vset1(r);
    j = 0;
    for (; j + VL <= D; j += VL) vstore(out + j, vmul(vmul(vload(x + j), vr), vload(w + j)));
    for (; j < D; j++) out[j] = x[j] * r * w[j];
    return r;
}

static void sb_rmsnorm_bwd_row(float *dx, float *dw_acc, const float *dout, const float *x, const float *w, float r,
                               int D) {
    V a = vzero();
    int j = 0;
    for (; j + VL <= D; j += VL) a = vfma(vmul(vload(dout + j), vload(w + j)), vload(x + j), a);
    float dot = vhsum(a);
    for (; j < D; j++) dot += dout[j] * w[j] * x[j];
    const float c = dot * r * r * r / (float)D;
    const V vr = vset1(r), vc = vset1(c);
    j = 0;
    for (; j + VL <= D; j += VL) {
        V g = vload(dout + j), xv = vload(x + j);
        vstore(dx + j, vadd(vload(dx + j), vsub(vmul(vmul(vr, g), vload(w + j)), vmul(vc, xv))));
        if (dw_acc) vstore(dw_acc + j, vfma(vmul(g, xv), vr, vload(dw_acc + j)));
    }
    for (; j < D; j++) {
        dx[j] += r * dout[j] * w[j] - c * x[j];
        if (dw_acc) dw_acc[j] += dout[j] * x[j] * r;
    }
}

static void sb_rope_head(float *x, const float *c, const float *s, int half, float sign) {
    const V vs = vset1(sign);
    float *x2 = x + half;
    int j = 0;
    for (; j + VL <= half; j += VL) {
        V a = vload(x + j), b = vload(x2 + j), cv = vload(c + j), sv = vmul(vs, vload(s + j));
        vstore(x + j, vsub(vmul(a, cv), vmul(b, sv)));
        vstore(x2 + j, vadd(vmul(b, cv), vmul(a, sv)));
    }
    for (; j < half; j++) {
        float a = x[j], b = x2[j], sj = sign * s[j];
        x[j] = a * c[j] - b * sj;
        x2[j] = b * c[j] + a * sj;
    }
}

/* Exp2 of one float with the same polynomial as vexp2: 0 below -126 (and for -inf), clamped at 127. */
static inline float sb_exp2f(float x) {
    if (!(x >= -126.0f)) return x != x ? x : 0.0f;
    if (x > 127.0f) x = 127.0f;
    float k = nearbyintf(x), f = x - k, p = EXP2_POLY_P0;
    p = p * f + EXP2_POLY_P1;
    p = p * f + EXP2_POLY_P2;
    p = p * f + EXP2_POLY_P3;
    p = p * f + EXP2_POLY_P4;
    p = p * f + EXP2_POLY_P5;
    p = p * f + 1.0f;
    return ldexpf(p, (int)k);
}

static void sb_swiglu_fwd(float *h, const float *gate, const float *up, size_t n) {
    const V one = vset1(1.0f), nl2e = vset1(-SB_LOG2E);
    size_t i = 0;
    for (; i + VL <= n; i += VL) {
        V g = vload(gate + i);
        V sig = vdiv(one, vadd(one, vexp2(vmul(g, nl2e))));
        vstore(h + i, vmul(vmul(g, sig), vload(up + i)));
    }
    for (; i < n; i++) {
        float g = gate[i];
        h[i] = g / (1.0f + sb_exp2f(-g * SB_LOG2E)) * up[i];
    }
}

static void sb_swiglu_bwd(float *dgate, float *dup, const float *dh, const float *gate, const float *up, size_t n) {
    const V one = vset1(1.0f), nl2e = vset1(-SB_LOG2E);
    size_t i = 0;
    for (; i + VL <= n; i += VL) {
        V g = vload(gate + i), d = vload(dh + i);
        V sig = vdiv(one, vadd(one, vexp2(vmul(g, nl2e))));
        V dsilu = vmul(sig, vfma(g, vsub(one, sig), one)); /* sig (1 + g (1 - sig)) */
        vstore(dgate + i, vmul(vmul(d, vload(up + i)), dsilu));
        vstore(dup + i, vmul(d, vmul(g, sig)));
    }
    for (; i < n; i++) {
        float g = gate[i], sig = 1.0f / (1.0f + sb_exp2f(-g * SB_LOG2E));
        dgate[i] = dh[i] * up[i] * sig * (1.0f + g * (1.0f - sig));
        dup[i] = dh[i] * g * sig;
    }
}

static double sb_xent_row(float *li, int V_, int t, float scale, int grad, int *arg) {
    V vmx = vset1(-INFINITY);
    int j = 0;
    for (; j + VL <= V_; j += VL) vmx = vmax(vmx, vload(li + j));
    float mx = vhmax(vmx);
    for (; j < V_; j++) mx = li[j] > mx ? li[j] : mx;
    int a = 0;
    while (a < V_ - 1 && !(li[a] == mx)) a++; /* first index of the maximum */
    if (arg) *arg = a;
    const V l2e = vset1(SB_LOG2E), vm = vset1(mx);
    V s = vzero();
    for (j = 0; j + VL <= V_; j += VL) s = vadd(s, vexp2(vmul(vsub(vload(li + j), vm), l2e)));
    double sum = vhsum(s);
    for (; j < V_; j++) sum += sb_exp2f((li[j] - mx) * SB_LOG2E);
    const double lse = (double)mx + log(sum);
    const double loss = t >= 0 ? lse - (double)li[t] : 0.0;
    if (grad) { /* li = scale * softmax - scale * onehot */
        const float sc = t >= 0 ? scale : 0.0f, flse = (float)lse;
        const V vsc = vset1(sc), vl = vset1(flse);
        for (j = 0; j + VL <= V_; j += VL) vstore(li + j, vmul(vsc, vexp2(vmul(vsub(vload(li + j), vl), l2e))));
        for (; j < V_; j++) li[j] = sc * sb_exp2f((li[j] - flse) * SB_LOG2E);
        if (t >= 0) li[t] -= sc;
    }
    return loss;
}

static void sb_adamw(float *p, const float *g, float *m, float *v, size_t n, const AdamWConsts *k) {
    const V b1 = vset1(k->b1), b2 = vset1(k->b2), omb1 = vset1(k->omb1), omb2 = vset1(k->omb2);
    const V eps = vset1(k->eps), step = vset1(k->step_size), ibc = vset1(k->inv_bc2_sqrt);
    const V dm = vset1(k->decay_mul), gs = vset1(k->grad_scale);
    size_t i = 0;
    for (; i + VL <= n; i += VL) {
        V gi = vmul(vload(g + i), gs), pi = vmul(vload(p + i), dm);
        V mi = vadd(vmul(b1, vload(m + i)), vmul(omb1, gi));
        V vi = vadd(vmul(b2, vload(v + i)), vmul(omb2, vmul(gi, gi)));
        vstore(m + i, mi);
        vstore(v + i, vi);
        vstore(p + i, vsub(pi, vdiv(vmul(step, mi), vadd(vmul(vsqrt(vi), ibc), eps))));
    }
    for (; i < n; i++) {
        float gi = g[i] * k->grad_scale, pi = p[i] * k->decay_mul;
        float mi = k->b1 * m[i] + k->omb1 * gi, vi = k->b2 * v[i] + k->omb2 * (gi * gi);
        m[i] = mi;
        v[i] = vi;
        p[i] = pi - k->step_size * mi / (sqrtf(vi) * k->inv_bc2_sqrt + k->eps);
    }
}

/* The compiler turns the selects into blends of integer vectors on every vector path. */
static void sb_bf16_round(float *dst, const float *src, size_t n) {
    for (size_t i = 0; i < n; i++) {
        uint32_t u, r;
        memcpy(&u, src + i, sizeof u);
        r = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;        /* nearest even; overflow gives inf */
        r = (u & 0x7fffffffu) > 0x7f800000u ? (u | 0x00400000u) & 0xffff0000u : r; /* NaN, quieted */
        r = (u & 0x7f800000u) == 0 ? u & 0x80000000u : r;          /* zero, denormal: signed zero */
        memcpy(dst + i, &r, sizeof r);
    }
}

const SimdKernels SIMD_TABLE = {
    .level = SIMD_LEVEL,
    .fwd_bq = SIMD_FWD_BQ,
    .fwd_bk = SIMD_FWD_BK,
    .bwd_bk = SIMD_BWD_BK,
    .bwd_bq = SIMD_BWD_BQ,
#ifdef SIMD_SMALL_L2_TILES
    .small_l2 = {SIMD_SMALL_L2_TILES},
#endif
    .tile_gemm = sb_tile_gemm,
    .tile_gemm_panels = sb_tile_gemm_panels,
    .pack_panels = sb_pack_panels,
    .gemm_mr = GEMM_MR,
    .transpose32 = sb_transpose32,
    .col_max = sb_col_max,
    .col_exp2_sum = sb_col_exp2_sum,
    .row_exp2_sum = sb_row_exp2_sum,
    .ds_row = sb_ds_row,
    .scale_row = sb_scale_row,
    .scale_cols = sb_scale_cols,
    .add_row = sb_add_row,
    .rmsnorm_row = sb_rmsnorm_row,
    .rmsnorm_bwd_row = sb_rmsnorm_bwd_row,
    .rope_head = sb_rope_head,
    .swiglu_fwd = sb_swiglu_fwd,
    .swiglu_bwd = sb_swiglu_bwd,
    .xent_row = sb_xent_row,
    .adamw = sb_adamw,
    .bf16_round = sb_bf16_round,
};
