/* vexp2 for AVX-512 code (simd_avx512.c, attn_bf16_avx512.c): 2^x of 16 floats, the Cephes exp2f
 * polynomial with scalef doing the 2^k: 0 below -126 (-inf included), clamped at 2^127, NaN stays
 * NaN; the same values as simd_avx2.c's vexp2 (both fuse the polynomial's steps; the scalar path,
 * built for any x86-64, rounds each product first). Include only from files built with AVX-512F. */
#ifndef SEQPAR_AVX512_EXP2_H
#define SEQPAR_AVX512_EXP2_H

#include <immintrin.h>

#include "kernels/exp2_poly.h"

/* 2^k p(f) with k = round(x), f = x - k, zero outside `keep`; p exp2_poly.h's degree-6 polynomial. */
static inline __m512 vexp2_core(__mmask16 keep, __m512 x) {
    __m512 k = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 f = _mm512_sub_ps(x, k);
    return _mm512_maskz_scalef_ps(keep, EXP2_POLY_VEC(_mm512_fmadd_ps, _mm512_set1_ps, f), k);
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

/* 2^x of `lanes` (others 0) for probabilities that are rounded to bf16 next (attn_bf16_avx512.c's
 * softmax step): the degree-4 polynomial (relative error 2.7e-6, against bf16's rounding of up to
 * 2^-9 = 2.0e-3, and small enough that the fp32 column sums keep LSE within the fp32 kernel's
 * tolerance: one FMA less in the chain, the softmax step 1.2-1.3x as fast on Zen 4, kernel_rates'
 * pieces 4.5 -> 5.5-5.8 elements/ns). The fraction comes from VREDUCEPS (x - round(x), 0 for
 * +-inf) and the integer part as x minus it, so -inf needs no compare: k = -inf and scalef gives 0.
 * For x >= -126 the same f and k as vexp2_core's rounding, so the same values; below it the
 * results are fp32 denormals or 0 where vexp2_bounded_maskz gives 0 (the bf16 conversion flushes
 * denormals to 0, and the fp32 sums take at most 2^-126 from each); NaN stays NaN, +inf gives inf.
 * Two instructions fewer per vector than the compare and VRNDSCALEPS (two uops on Ice Lake and
 * Sapphire Rapids). */
static inline __m512 vexp2_bf16_maskz(__mmask16 lanes, __m512 x) {
    const __m512 f = _mm512_reduce_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 k = _mm512_sub_ps(x, f);
    __m512 p = _mm512_set1_ps(EXP2_BF16_POLY_P0);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(EXP2_BF16_POLY_P1));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(EXP2_BF16_POLY_P2));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(EXP2_BF16_POLY_P3));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(EXP2_BF16_POLY_P4));
    return _mm512_maskz_scalef_ps(lanes, p, k);
}

#endif
