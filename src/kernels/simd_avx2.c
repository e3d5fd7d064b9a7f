/* The AVX2 + FMA kernel table (isa.h): simd_body.h on 8-lane __m256 vectors, a 6 x 16
 * micro-kernel (12 accumulators of the 16 registers). Built with -mavx2 -mfma (Makefile); only
 * reached through isa.c when the CPU reports both. */
#include <immintrin.h>

#include "kernels/exp2_poly.h"

#include "kernels/isa.h"

typedef __m256 V;
typedef __m256i VM;
#define VL 8
#define vzero() _mm256_setzero_ps()
#define vset1(x) _mm256_set1_ps(x)
#define vload(p) _mm256_loadu_ps(p)
#define vstore(p, x) _mm256_storeu_ps((p), (x))
#define vmask(n) _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7))
#define vload_m(p, m) _mm256_maskload_ps((p), (m))
#define vstore_m(p, m, x) _mm256_maskstore_ps((p), (m), (x))
#define vsel_m(m, x) _mm256_and_ps(_mm256_castsi256_ps(m), (x))
#define vadd _mm256_add_ps
#define vsub _mm256_sub_ps
#define vmul _mm256_mul_ps
#define vdiv _mm256_div_ps
#define vfma _mm256_fmadd_ps
#define vmax _mm256_max_ps
#define vmin _mm256_min_ps
#define vsqrt _mm256_sqrt_ps
#define GEMM_MR 6
#define GEMM_NV 2
#define SIMD_FWD_BQ 256
#define SIMD_FWD_BK 192
#define SIMD_BWD_BK 144
#define SIMD_BWD_BQ 120
/* An L2 of 512 KiB per core (AMD Zen 2 and 3): the forward tile above spills it (its Q^T, scores,
 * output and K, V with the next tile's prefetched are ~550 KiB at d = 64); 192 x 120 (~330 KiB)
 * measured 1.10x / 1.11x the forward at d = 64 / 128 on a Zen 3 EPYC (medians of 6 pairs run at
 * the same time on its two cores, bench/kernel_rates with KR_F32_TILES). The backward's 144 x 120
 * (~420 KiB) fits: 96 x 96 measured 0.99x / 1.04x, so it stays. */
#define SIMD_SMALL_L2_TILES 192, 120, 144, 120
#define SIMD_TABLE simd_kernels_avx2
#define SIMD_LEVEL ISA_AVX2

static inline float vhsum(__m256 a) {
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));
    return _mm_cvtss_f32(h);
}

static inline float vhmax(__m256 a) {
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
    return _mm_cvtss_f32(h);
}

/* 2^k p(f) with k = round(x), f = x - k, for x in [-126, 127] (elsewhere garbage, for a mask). */
static inline __m256 vexp2_core(__m256 x) {
    __m256 k = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 f = _mm256_sub_ps(x, k);
    __m256 p = EXP2_POLY_VEC(_mm256_fmadd_ps, _mm256_set1_ps, f);
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

/* 2^x = 2^k p(f), k = round(x), f in [-0.5, 0.5] (Cephes exp2f polynomial, relative error about
 * 1e-7); 0 below -126 (-inf included), clamped at 2^127, NaN stays NaN. */
static inline __m256 vexp2(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-126.0f), hi = _mm256_set1_ps(127.0f);
    __m256 zero = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    return _mm256_andnot_ps(zero, vexp2_core(_mm256_min_ps(hi, _mm256_max_ps(lo, x)))); /* operand order keeps NaN */
}

/* vexp2 for x <= 127 (softmax arguments): the same values there with neither clamp (a lane
 * below -126, -inf included, computes garbage that the mask then zeroes). */
static inline __m256 vexp2_bounded(__m256 x) {
    return _mm256_andnot_ps(_mm256_cmp_ps(x, _mm256_set1_ps(-126.0f), _CMP_LT_OQ), vexp2_core(x));
}

#include "kernels/simd_body.h"
