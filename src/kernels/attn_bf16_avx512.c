/* The AVX512_BF16 tile kernels of attn_bf16.h: a 6 x 64 VDPBF16PS micro-kernel (24 fp32
 * accumulators; per pair step four 64-byte loads of B and six 32-bit broadcasts of A, each
 * broadcast a memory operand, for 24 VDPBF16PS of 32 multiply-adds each: twice the work per
 * instruction of the fp32 6 x 64 FMA kernel in simd_body.h, with the same loop structure), and
 * the packers that round fp32 tiles to bf16 pair words with VCVTNE2PS2BF16 (round to nearest
 * even, as bf16.h's conversions), two of them fused with the softmax step that makes their input
 * (the probabilities of the forward, dS of the backward) so that it is never stored in fp32.
 * Built with -mavx512bf16 (Makefile); reached only through attn_bf16_tiles() when the CPU reports
 * AVX512_BF16 and the kernel path is avx512. The packers serve the AMX tables too
 * (attn_bf16_amx_body.h): every CPU with AMX-BF16 has AVX512_BF16. */
#include <immintrin.h>
#include <math.h>

#include "kernels/attn_bf16.h"
#include "kernels/avx512_exp2.h"
#include "kernels/bf16.h"

#define MR 6 /* rows of C per micro-kernel call */
#define NV 4 /* 16-lane vectors of C per row: 64 columns */

/* One MR x (NV 16) block of C. A's MR words of pair step kk lie at a[kk apk + r] (transposed A;
 * rows beyond mr are read and not stored) or, in rows mode, at row pointers a + r ars (steps
 * contiguous; rows beyond mr repeat the last row). With `masked` the last column block's vectors
 * load and store only the lanes in msk[]. */
static inline __attribute__((always_inline)) void micro(int K2, int mr, float alpha, const bf16_pair *a, size_t apk,
                                                        const bf16_pair *B, size_t ldb, int accumulate, float *C,
                                                        size_t ldc, const int masked, const __mmask16 *msk,
                                                        const int rows, size_t ars) {
    __m512 c[MR][NV];
    const bf16_pair *ar[MR];
#pragma GCC unroll 8
    for (int r = 0; r < MR; r++) ar[r] = a + (size_t)(r < mr ? r : mr - 1) * ars;
#pragma GCC unroll 8
    for (int r = 0; r < MR; r++)
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) c[r][v] = _mm512_setzero_ps();
    for (int k = 0; k < K2; k++) {
        const bf16_pair *b = B + (size_t)k * ldb, *ak = a + (size_t)k * apk;
        __m512bh bv[NV];
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++)
            bv[v] = (__m512bh)(masked ? _mm512_maskz_loadu_epi32(msk[v], b + v * 16) : _mm512_loadu_si512(b + v * 16));
#pragma GCC unroll 8
        for (int r = 0; r < MR; r++) {
            const __m512bh av = (__m512bh)_mm512_set1_epi32((int)(rows ? ar[r][k] : ak[r]));
#pragma GCC unroll 4
            for (int v = 0; v < NV; v++) c[r][v] = _mm512_dpbf16_ps(c[r][v], av, bv[v]);
        }
    }
    const __m512 va = _mm512_set1_ps(alpha);
#pragma GCC unroll 8
    for (int r = 0; r < MR; r++) {
        if (r >= mr) break;
        float *cr = C + (size_t)r * ldc;
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) {
            __m512 y = _mm512_mul_ps(va, c[r][v]);
            if (masked) {
                if (accumulate) y = _mm512_add_ps(y, _mm512_maskz_loadu_ps(msk[v], cr + v * 16));
                _mm512_mask_storeu_ps(cr + v * 16, msk[v], y);
            } else {
                if (accumulate) y = _mm512_add_ps(y, _mm512_loadu_ps(cr + v * 16));
                _mm512_storeu_ps(cr + v * 16, y);
            }
        }
    }
}

/* Column blocks outside (a 64-column panel of B stays in L1), row blocks inside; A in rows layout,
 * transposed, or (panels) in MR-row panels read in place. */
static inline __attribute__((always_inline)) void gemm_loops_bf16(int M, int N, int K2, float alpha,
                                                                  const bf16_pair *A, size_t ars, size_t aks,
                                                                  const int panels, const bf16_pair *B, size_t ldb,
                                                                  int accumulate, float *C, size_t ldc, Prefetch *pf) {
    if (tile_gemm_trivial(M, N, K2, accumulate, C, ldc)) return;
    const int NR = NV * 16, nfull = N / NR * NR, nr = N - nfull;
    __mmask16 msk[NV];
    for (int v = 0; v < NV; v++) {
        int cnt = nr - v * 16;
        cnt = cnt < 0 ? 0 : cnt > 16 ? 16 : cnt;
        msk[v] = (__mmask16)((1u << cnt) - 1u);
    }
    const int nmb = (M + MR - 1) / MR, rows_mode = !panels && ars != 1;
    const int n_calls = nmb * ((N + NR - 1) / NR);
    const int pf_per_call = pf ? (pf->total - pf->next + n_calls - 1) / n_calls : 0;
    for (int n0 = 0; n0 < N; n0 += NR) {
        const int masked = n0 >= nfull;
        for (int mb = 0; mb < nmb; mb++) {
            const int m0 = mb * MR, mr = M - m0 < MR ? M - m0 : MR;
            float *Cb = C + (size_t)m0 * ldc + n0;
            if (pf) prefetch_some(pf, pf_per_call);
            if (rows_mode) {
                const bf16_pair *a0 = A + (size_t)m0 * ars;
                if (masked) micro(K2, mr, alpha, a0, 1, B + n0, ldb, accumulate, Cb, ldc, 1, msk, 1, ars);
                else micro(K2, mr, alpha, a0, 1, B + n0, ldb, accumulate, Cb, ldc, 0, msk, 1, ars);
            } else {
                const bf16_pair *a0 = panels ? A + (size_t)m0 * K2 : A + (size_t)m0;
                const size_t apk = panels ? MR : aks;
                if (masked) micro(K2, mr, alpha, a0, apk, B + n0, ldb, accumulate, Cb, ldc, 1, msk, 0, 0);
                else micro(K2, mr, alpha, a0, apk, B + n0, ldb, accumulate, Cb, ldc, 0, msk, 0, 0);
            }
        }
    }
}

static void tile_gemm_bf16(int M, int N, int K2, float alpha, const bf16_pair *A, size_t ars, size_t aks,
                           const bf16_pair *B, size_t ldb, int accumulate, float *C, size_t ldc, Prefetch *pf) {
    gemm_loops_bf16(M, N, K2, alpha, A, ars, aks, 0, B, ldb, accumulate, C, ldc, pf);
}

/* A in panels (pack_panels_bf16; the last one zero-padded). */
static void tile_gemm_panels_bf16(int M, int N, int K2, float alpha, const bf16_pair *Ap, const bf16_pair *B,
                                  size_t ldb, int accumulate, float *C, size_t ldc, Prefetch *pf) {
    gemm_loops_bf16(M, N, K2, alpha, Ap, 0, 0, 1, B, ldb, accumulate, C, ldc, pf);
}

/* Panels of MR rows: each block's rows packed (pack_rows, into a stack buffer of up to 64 words a
 * row at a time), then laid out step-major by the kernel table's word transpose; the rows of a
 * last partial panel past `rows` zero. */
static void pack_panels_bf16(int rows, int cols, const float *src, size_t lds, bf16_pair *dst) {
    enum { CW = 64 }; /* words per chunk of a row */
    const int k2 = (cols + 1) / 2;
    const SimdKernels *sk = simd();
    bf16_pair buf[MR][CW];
    for (int m0 = 0; m0 < rows; m0 += MR, dst += (size_t)MR * k2) {
        const int mr = rows - m0 < MR ? rows - m0 : MR;
        for (int w0 = 0; w0 < k2; w0 += CW) {
            const int nw = k2 - w0 < CW ? k2 - w0 : CW, c0 = 2 * w0, nc = cols - c0 < 2 * CW ? cols - c0 : 2 * CW;
            attn_bf16_pack_rows_avx512(mr, nc, src + (size_t)m0 * lds + c0, lds, &buf[0][0], CW);
            sk->transpose32(mr, nw, &buf[0][0], CW, dst + (size_t)w0 * MR, MR);
        }
        for (int w = 0; mr < MR && w < k2; w++)
            for (int r = mr; r < MR; r++) dst[(size_t)w * MR + r] = 0u;
    }
}

void attn_bf16_pack_rows_avx512(int rows, int cols, const float *src, size_t lds, bf16_pair *dst, size_t ldd) {
    for (int r = 0; r < rows; r++) {
        const float *s = src + (size_t)r * lds;
        bf16_pair *d = dst + (size_t)r * ldd;
        int c = 0;
        for (; c + 32 <= cols; c += 32) { /* 32 floats -> 16 words */
            __m512bh h = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(s + c + 16), _mm512_loadu_ps(s + c));
            _mm512_storeu_si512(d + c / 2, (__m512i)h);
        }
        if (c < cols) {
            const int left = cols - c, lo = left < 16 ? left : 16, hi = left - lo;
            const __m512 x0 = _mm512_maskz_loadu_ps((__mmask16)((1u << lo) - 1u), s + c);
            const __m512 x1 = _mm512_maskz_loadu_ps((__mmask16)((1u << hi) - 1u), s + c + 16);
            __m512bh h = _mm512_cvtne2ps_pbh(x1, x0);
            _mm512_mask_storeu_epi32(d + c / 2, (__mmask16)((1u << ((left + 1) / 2)) - 1u), (__m512i)h);
        }
    }
}

/* Two rows of 16 floats as 16 pair words: row x0 in the low halves, x1 in the high halves. */
static inline __m512i interleave_pairs(__m512 x0, __m512 x1) {
    const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                                         21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    return _mm512_permutexvar_epi16(idx, (__m512i)_mm512_cvtne2ps_pbh(x1, x0));
}

void attn_bf16_pack_pairs_avx512(int rows, int cols, const float *src, size_t lds, bf16_pair *dst, size_t ldd) {
    for (int rr = 0; rr < (rows + 1) / 2; rr++) {
        const int has1 = 2 * rr + 1 < rows;
        const float *s0 = src + (size_t)(2 * rr) * lds, *s1 = has1 ? s0 + lds : s0;
        bf16_pair *d = dst + (size_t)rr * ldd;
        for (int c = 0; c < cols; c += 16) {
            const int n = cols - c < 16 ? cols - c : 16;
            const __mmask16 m = (__mmask16)((1u << n) - 1u);
            const __m512 x0 = _mm512_maskz_loadu_ps(m, s0 + c);
            const __m512 x1 = has1 ? _mm512_maskz_loadu_ps(m, s1 + c) : _mm512_setzero_ps();
            const __m512i w = interleave_pairs(x0, x1);
            if (n == 16) _mm512_storeu_si512(d + c, w);
            else _mm512_mask_storeu_epi32(d + c, m, w);
        }
    }
}

/* col_exp2_pairs' body; with_max (a constant at each call) also keeps each column's largest
 * argument alpha s - m in xmax */
static inline __attribute__((always_inline)) void col_exp2_pairs_body(const float *s, int rows, int n, size_t ld,
                                                                      float alpha, const float *m, float *sum,
                                                                      bf16_pair *dst, size_t ldd, float *xmax,
                                                                      const int with_max) {
    const __m512 av = _mm512_set1_ps(alpha);
    for (int c = 0; c < n; c += 16) {
        const int cnt = n - c < 16 ? n - c : 16;
        const __mmask16 mk = (__mmask16)((1u << cnt) - 1u);
        const __m512 mv = _mm512_maskz_loadu_ps(mk, m + c);
        __m512 acc0 = _mm512_setzero_ps(), acc1 = acc0, mx0 = _mm512_set1_ps(-INFINITY), mx1 = mx0;
        for (int rr = 0; rr < rows / 2; rr++) {
            const float *r0 = s + (size_t)(2 * rr) * ld + c;
            const __m512 y0 = _mm512_fmsub_ps(av, _mm512_maskz_loadu_ps(mk, r0), mv);
            const __m512 y1 = _mm512_fmsub_ps(av, _mm512_maskz_loadu_ps(mk, r0 + ld), mv);
            if (with_max) mx0 = _mm512_max_ps(mx0, y0), mx1 = _mm512_max_ps(mx1, y1);
            const __m512 x0 = vexp2_bf16_maskz(mk, y0), x1 = vexp2_bf16_maskz(mk, y1);
            acc0 = _mm512_add_ps(acc0, x0);
            acc1 = _mm512_add_ps(acc1, x1);
            _mm512_mask_storeu_epi32(dst + (size_t)rr * ldd + c, mk, interleave_pairs(x0, x1));
        }
        if (rows % 2) { /* the last row pairs with 0 */
            const float *r0 = s + (size_t)(rows - 1) * ld + c;
            const __m512 y0 = _mm512_fmsub_ps(av, _mm512_maskz_loadu_ps(mk, r0), mv);
            if (with_max) mx0 = _mm512_max_ps(mx0, y0);
            const __m512 x0 = vexp2_bf16_maskz(mk, y0);
            acc0 = _mm512_add_ps(acc0, x0);
            _mm512_mask_storeu_epi32(dst + (size_t)(rows / 2) * ldd + c, mk, interleave_pairs(x0, _mm512_setzero_ps()));
        }
        _mm512_mask_storeu_ps(sum + c, mk, _mm512_add_ps(acc0, acc1));
        if (with_max) _mm512_mask_storeu_ps(xmax + c, mk, _mm512_max_ps(mx0, mx1));
    }
}

void attn_bf16_col_exp2_pairs_avx512(const float *s, int rows, int n, size_t ld, float alpha, const float *m,
                                     float *sum, bf16_pair *dst, size_t ldd, float *xmax) {
    if (xmax) col_exp2_pairs_body(s, rows, n, ld, alpha, m, sum, dst, ldd, xmax, 1);
    else col_exp2_pairs_body(s, rows, n, ld, alpha, m, sum, dst, ldd, NULL, 0);
}

void attn_bf16_row_exp2_pairs_avx512(float *p, int rows, int n, size_t ld, float alpha, const float *m,
                                     bf16_pair *dst, size_t ldd) {
    const __m512 av = _mm512_set1_ps(alpha), zero = _mm512_setzero_ps();
    for (int rr = 0; rr < (rows + 1) / 2; rr++) {
        const int has1 = 2 * rr + 1 < rows;
        float *p0 = p + (size_t)(2 * rr) * ld, *p1 = has1 ? p0 + ld : NULL;
        const __m512 m0 = _mm512_set1_ps(m[2 * rr]), m1 = _mm512_set1_ps(has1 ? m[2 * rr + 1] : 0.0f);
        bf16_pair *d = dst + (size_t)rr * ldd;
        for (int c = 0; c < n; c += 16) {
            const int cnt = n - c < 16 ? n - c : 16;
            const __mmask16 mk = (__mmask16)((1u << cnt) - 1u);
            const __m512 x0 = vexp2_bf16_maskz(mk, _mm512_fmsub_ps(av, _mm512_maskz_loadu_ps(mk, p0 + c), m0));
            _mm512_mask_storeu_ps(p0 + c, mk, x0);
            __m512 x1 = zero;
            if (has1) {
                x1 = vexp2_bf16_maskz(mk, _mm512_fmsub_ps(av, _mm512_maskz_loadu_ps(mk, p1 + c), m1));
                _mm512_mask_storeu_ps(p1 + c, mk, x1);
            }
            _mm512_mask_storeu_epi32(d + c, mk, interleave_pairs(x0, x1));
        }
    }
}

void attn_bf16_ds_pack_avx512(const float *p, const float *dp, size_t ld, int rows, int n, const float *delta,
                              float scale, bf16_pair *pairs, size_t ldpairs, bf16_pair *rows_w, size_t ldrows) {
    const __m512 sc = _mm512_set1_ps(scale);
    for (int rr = 0; rr < (rows + 1) / 2; rr++) {
        const int r0 = 2 * rr, has1 = r0 + 1 < rows;
        const float *p0 = p + (size_t)r0 * ld, *d0 = dp + (size_t)r0 * ld;
        const float *p1 = has1 ? p0 + ld : p0, *d1 = has1 ? d0 + ld : d0;
        const __m512 del0 = _mm512_set1_ps(delta[r0]), del1 = _mm512_set1_ps(has1 ? delta[r0 + 1] : 0.0f);
        for (int c = 0; c < n; c += 32) {
            const int left = n - c, ca = left < 16 ? left : 16, cb = left - ca < 16 ? left - ca : 16;
            const __mmask16 ma = (__mmask16)((1u << ca) - 1u), mb = (__mmask16)((1u << cb) - 1u);
            /* scale (p (dp - delta)), rounded in that order */
            const __m512 x0a = _mm512_mul_ps(sc, _mm512_mul_ps(_mm512_maskz_loadu_ps(ma, p0 + c),
                                                               _mm512_sub_ps(_mm512_maskz_loadu_ps(ma, d0 + c), del0)));
            const __m512 x0b = _mm512_mul_ps(sc, _mm512_mul_ps(_mm512_maskz_loadu_ps(mb, p0 + c + 16),
                                                               _mm512_sub_ps(_mm512_maskz_loadu_ps(mb, d0 + c + 16), del0)));
            __m512 x1a = _mm512_setzero_ps(), x1b = x1a;
            if (has1) {
                x1a = _mm512_mul_ps(sc, _mm512_mul_ps(_mm512_maskz_loadu_ps(ma, p1 + c),
                                                      _mm512_sub_ps(_mm512_maskz_loadu_ps(ma, d1 + c), del1)));
                x1b = _mm512_mul_ps(sc, _mm512_mul_ps(_mm512_maskz_loadu_ps(mb, p1 + c + 16),
                                                      _mm512_sub_ps(_mm512_maskz_loadu_ps(mb, d1 + c + 16), del1)));
            }
            /* masked lanes: p loads as 0, so x is 0 there (dp - delta finite) */
            bf16_pair *pw = pairs + (size_t)rr * ldpairs + c;
            _mm512_mask_storeu_epi32(pw, ma, interleave_pairs(x0a, x1a));
            if (cb > 0) _mm512_mask_storeu_epi32(pw + 16, mb, interleave_pairs(x0b, x1b));
            const __mmask16 mw = (__mmask16)((1u << ((left < 32 ? left + 1 : 32) / 2)) - 1u); /* words of a row */
            _mm512_mask_storeu_epi32(rows_w + (size_t)r0 * ldrows + c / 2, mw, (__m512i)_mm512_cvtne2ps_pbh(x0b, x0a));
            if (has1)
                _mm512_mask_storeu_epi32(rows_w + (size_t)(r0 + 1) * ldrows + c / 2, mw,
                                         (__m512i)_mm512_cvtne2ps_pbh(x1b, x1a));
        }
    }
}

void attn_bf16_transpose16_avx512(const bf16_pair *src, size_t lds, bf16_pair dst[16][16]) {
    __m512i r[16], t[16];
    for (int k = 0; k < 16; k++) r[k] = _mm512_loadu_si512((const void *)(src + (size_t)k * lds));
    /* 32-bit, then 64-bit interleaves within 128-bit lanes: t[4q + j] holds, per lane L, words
     * (rows 4q .. 4q + 3) x (column 4L + j) */
    for (int q = 0; q < 4; q++) {
        const __m512i a0 = _mm512_unpacklo_epi32(r[4 * q], r[4 * q + 1]), a1 = _mm512_unpackhi_epi32(r[4 * q], r[4 * q + 1]);
        const __m512i a2 = _mm512_unpacklo_epi32(r[4 * q + 2], r[4 * q + 3]), a3 = _mm512_unpackhi_epi32(r[4 * q + 2], r[4 * q + 3]);
        t[4 * q + 0] = _mm512_unpacklo_epi64(a0, a2);
        t[4 * q + 1] = _mm512_unpackhi_epi64(a0, a2);
        t[4 * q + 2] = _mm512_unpacklo_epi64(a1, a3);
        t[4 * q + 3] = _mm512_unpackhi_epi64(a1, a3);
    }
    /* 128-bit lanes: column 4L + j gathers lane L of t[j], t[4 + j], t[8 + j], t[12 + j] */
    for (int j = 0; j < 4; j++) {
        const __m512i b0 = _mm512_shuffle_i32x4(t[j], t[4 + j], 0x44), b1 = _mm512_shuffle_i32x4(t[j], t[4 + j], 0xEE);
        const __m512i b2 = _mm512_shuffle_i32x4(t[8 + j], t[12 + j], 0x44), b3 = _mm512_shuffle_i32x4(t[8 + j], t[12 + j], 0xEE);
        _mm512_storeu_si512((void *)dst[j], _mm512_shuffle_i32x4(b0, b2, 0x88));
        _mm512_storeu_si512((void *)dst[4 + j], _mm512_shuffle_i32x4(b0, b2, 0xDD));
        _mm512_storeu_si512((void *)dst[8 + j], _mm512_shuffle_i32x4(b1, b3, 0x88));
        _mm512_storeu_si512((void *)dst[12 + j], _mm512_shuffle_i32x4(b1, b3, 0xDD));
    }
}

const AttnBf16Tiles attn_bf16_tiles_avx512 = {
    .name = "bf16 tiles (VDPBF16PS)",
    .mr = MR,
    .fwd_acc_transposed = 0, /* see attn_bf16.h */
    .bwd_acc_transposed = 0,
    .tile_gemm = tile_gemm_bf16,
    .tile_gemm_panels = tile_gemm_panels_bf16,
    .pack_panels = pack_panels_bf16,
    .panel_mr = MR,
    ATTN_BF16_SHARED_FIELDS,
};

