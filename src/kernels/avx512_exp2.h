/* vexp2 for AVX-512 code (simd_avx512.c, attn_bf16_avx512.c): 2^x of 16 floats, the Cephes exp2f
 * polynomial with scalef doing the 2^k: 0 below -126 (-inf included), clamped at 2^127, NaN stays
 * NaN; the same values as simd_avx2.c's vexp2 (both fuse the polynomial's steps; the scalar path,
 * built for any x86-64, rounds each product first). Include only from files built with AVX-512F. */
#ifndef SEQPAR_AVX512_EXP2_H
#define SEQPAR_AVX512_EXP2_H

#include <immintrin.h>

#include "kernels/exp2_poly.h"

/* 2^k p(f) with k = round(x), f = x - k, zero outside `keep`. */
static inline __m512 vexp2_core(__mmask16 keep, __m512 x) {
    __m512 k = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 f = _mm512_sub_ps(x, k);
    __m512 p = _mm512_set1_ps(EXP2_POLY_P0);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(EXP2_POLY_P1));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(EXP2_POLY_P2));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(EXP2_POLY_P3));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(EXP2_POLY_P4));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(EXP2_POLY_P5));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    return _mm512_maskz_scalef_ps(keep, p, k);
}

static inline __m512 vexp2(__m512 x) {
    const __m512 lo = _mm512_set1_ps(-126.0f), hi = _mm512_set1_ps(127.0f);
    const __mmask16 keep = _mm512_cmp_ps_mask(x, lo, _CMP_NLT_UQ); /* x >= -126 or NaN */
    return vexp2_core(keep, _mm512_min_ps(hi, _mm512_max_ps(lo, x)));
}

/* vexp2 for arguments at most 127 (softmax arguments, never above their maximum but for
 * rounding): the same values as vexp2 there with neither clamp; lanes below -126 (-inf included)
 * and lanes outside `lanes` are zeroed by the scaling's mask. */
static inline __m512 vexp2_bounded_maskz(__mmask16 lanes, __m512 x) {
    return vexp2_core(_mm512_mask_cmp_ps_mask(lanes, x, _mm512_set1_ps(-126.0f), _CMP_NLT_UQ), x); /* >= -126, NaN */
}
static inline __m512 vexp2_bounded(__m512 x) { return vexp2_bounded_maskz((__mmask16)0xFFFF, x); }

#endif
