/* The coefficients of the exp2 polynomial every kernel path uses: 2^x = 2^k p(f), k = round(x),
 * f = x - k in [-0.5, 0.5], p(f) = ((((((P0 f + P1) f + P2) f + P3) f + P4) f + P5) f + 1), the
 * Cephes exp2f polynomial (relative error about 1e-7). One copy for simd_body.h's scalar exp2,
 * simd_avx2.c's and avx512_exp2.h's vexp2. */
#ifndef SEQPAR_EXP2_POLY_H
#define SEQPAR_EXP2_POLY_H

#define EXP2_POLY_P0 1.535336188319500e-4f
#define EXP2_POLY_P1 1.339887440266574e-3f
#define EXP2_POLY_P2 9.618437357674640e-3f
#define EXP2_POLY_P3 5.550332471162809e-2f
#define EXP2_POLY_P4 2.402264791363012e-1f
#define EXP2_POLY_P5 6.931472028550421e-1f

/* p(f) by Horner's rule on vectors, for the vector paths: FMA(a, b, c) = a b + c fused, SET1(x) a
 * vector of x (the intrinsics of the path's width). */
#define EXP2_POLY_VEC(FMA, SET1, f)                                                                          \
    FMA(FMA(FMA(FMA(FMA(FMA(SET1(EXP2_POLY_P0), (f), SET1(EXP2_POLY_P1)), (f), SET1(EXP2_POLY_P2)), (f),         \
                    SET1(EXP2_POLY_P3)),                                                                        \
                (f), SET1(EXP2_POLY_P4)),                                                                       \
            (f), SET1(EXP2_POLY_P5)),                                                                           \
        (f), SET1(1.0f))

/* Degree 4 for values rounded to bf16 next (attn_bf16_avx512.c's softmax step): p(f) = (((P0 f + P1)
 * f + P2) f + P3) f + P4, relative error at most 2.7e-6 on [-0.5, 0.5] (fitted for relative error;
 * the running sum, and so LSE, stay within the fp32 kernel's tolerance). */
#define EXP2_BF16_POLY_P0 0.009570085443556309f
#define EXP2_BF16_POLY_P1 0.05591785907745361f
#define EXP2_BF16_POLY_P2 0.2402474582195282f
#define EXP2_BF16_POLY_P3 0.6931217908859253f
#define EXP2_BF16_POLY_P4 0.9999992847442627f

#endif
