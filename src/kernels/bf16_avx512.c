/* The avx512_bf16 path of bf16.h: conversions with VCVTNE2PS2BF16 / VCVTNEPS2BF16 (16 and 32
 * lanes, masked tails); its GEMM is oneDNN's (bf16_gemm_onednn.c). Built with -mavx512bf16 (Makefile); only reached through bf16.c when the
 * CPU reports AVX512_BF16. */
#include <immintrin.h>

#include "kernels/bf16.h"

static void pack_avx512bf16(bf16_t *dst, const float *src, size_t n) {
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m512bh h = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(src + i + 16), _mm512_loadu_ps(src + i));
        _mm512_storeu_si512((void *)(dst + i), (__m512i)h);
    }
    for (; i < n; i += 16) {
        size_t m = n - i < 16 ? n - i : 16;
        __mmask16 k = (__mmask16)((1u << m) - 1u);
        __m256bh h = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(k, src + i));
        _mm256_mask_storeu_epi16((void *)(dst + i), k, (__m256i)h);
    }
}

static void unpack_avx512bf16(float *dst, const bf16_t *src, size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const void *)(src + i)));
        _mm512_storeu_ps(dst + i, _mm512_castsi512_ps(_mm512_slli_epi32(w, 16)));
    }
    if (i < n) {
        __mmask16 k = (__mmask16)((1u << (n - i)) - 1u);
        __m512i w = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(k, (const void *)(src + i)));
        _mm512_mask_storeu_ps(dst + i, k, _mm512_castsi512_ps(_mm512_slli_epi32(w, 16)));
    }
}

const Bf16Kernels bf16_kernels_avx512bf16 = {BF16_PATH_AVX512BF16, pack_avx512bf16, unpack_avx512bf16,
                                             bf16_gemm_onednn};
