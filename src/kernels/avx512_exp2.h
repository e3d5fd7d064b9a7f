/* vexp2 for AVX-512 code (simd_avx512.c, attn_bf16_avx512.c): 2^x of 16 floats, the Cephes exp2f
 * polynomial with scalef doing the 2^k: 0 below -126 (-inf included), clamped at 2^127, NaN stays
 * NaN; the same values as simd_body.h's scalar exp2. Include only from files built with AVX-512F. */
#ifndef SEQPAR_AVX512_EXP2_H
#define SEQPAR_AVX512_EXP2_H

#include <immintrin.h>

static inline __m512 vexp2(__m512 x) {
    const __m512 lo = _mm512_set1_ps(-126.0f), hi = _mm512_set1_ps(127.0f);
    const __mmask16 keep = _mm512_cmp_ps_mask(x, lo, _CMP_NLT_UQ); /* x >= -126 or NaN */
    x = _mm512_min_ps(hi, _mm512_max_ps(lo, x));
    __m512 k = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 f = _mm512_sub_ps(x, k);
    __m512 p = _mm512_set1_ps(1.535336188319500e-4f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.339887440266574e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.618437357674640e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.550332471162809e-2f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.402264791363012e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.931472028550421e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    return _mm512_maskz_mov_ps(keep, _mm512_scalef_ps(p, k));
}

#endif
