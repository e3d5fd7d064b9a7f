/* bf16 mixed precision (--precision bf16): the bf16 number format and its conversions, the
 * precision setting, and the bf16 GEMM the model's linear layers use (bf16 operands, fp32
 * accumulation and output, like cblas_sbgemm).
 *
 * Conversion fp32 -> bf16 rounds to nearest even, as the AVX512_BF16 instruction VCVTNE2PS2BF16
 * does, with its conventions: NaN stays NaN (quieted), fp32 denormals become a signed zero,
 * values that round past the largest bf16 become infinity. bf16 -> fp32 is exact.
 *
 * Two paths, chosen once at the first call: avx512_bf16 (VCVTNE2PS2BF16 for conversions, oneDNN's
 * bf16 matmul, whose kernels use VDPBF16PS, for the GEMM) when the CPU reports AVX512_BF16 and the kernel path
 * (kernels/isa.h, SEQPAR_ISA) is avx512; otherwise the conversion path (portable C conversions,
 * the GEMM as bf16 -> fp32 conversion plus OpenBLAS sgemm: the same products, since a product of
 * two bf16 values is exact in fp32). On a CPU with AMX the avx512_bf16 path's GEMM is the same
 * oneDNN matmul, which then runs its AMX kernels itself (oneDNN 2.6 asks Linux for the tile-data
 * permission on its own); when seqpar's AMX is off (SEQPAR_ISA other than amx, kernels/isa.h)
 * oneDNN is capped at avx512_core_bf16 before its first use, unless DNNL_MAX_CPU_ISA or
 * ONEDNN_MAX_CPU_ISA says otherwise. onednn_isa() names what oneDNN runs. */
#ifndef SEQPAR_BF16_H
#define SEQPAR_BF16_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef uint16_t bf16_t;

typedef enum { PRECISION_FP32 = 0, PRECISION_BF16 = 1 } Precision;
/* "fp32" / "bf16" -> the precision; -1 for anything else. */
int precision_parse(const char *name);
const char *precision_name(int precision);

/* Round to nearest even, NaN quieted, denormals to signed zero (VCVTNE2PS2BF16's rules). */
static inline bf16_t bf16_from_float(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (bf16_t)((u >> 16) | 0x40u); /* NaN */
    if ((u & 0x7f800000u) == 0) return (bf16_t)((u >> 16) & 0x8000u);       /* zero, denormal */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (bf16_t)(u >> 16);
}

static inline float bf16_to_float(bf16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

typedef enum { BF16_PATH_CONVERT = 0, BF16_PATH_AVX512BF16 = 1, BF16_PATH_COUNT = 2 } Bf16Path;

/* The kernels of one bf16 path. Single-threaded except gemm (which parallelises itself). */
typedef struct {
    Bf16Path path;
    void (*pack)(bf16_t *dst, const float *src, size_t n);   /* dst = bf16(src) */
    void (*unpack)(float *dst, const bf16_t *src, size_t n); /* dst = float(src), exact */
    /* Row-major C (M, N; ldc) = alpha op(A) op(B) + beta C with op(A) (M, K), op(B) (K, N), as
     * cblas_sbgemm: bf16 operands, fp32 accumulation. */
    void (*gemm)(int transA, int transB, int M, int N, int K, float alpha, const bf16_t *A, int lda,
                 const bf16_t *B, int ldb, float beta, float *C, int ldc);
} Bf16Kernels;

/* The path for this process (see above). */
const Bf16Kernels *bf16_kernels(void);
/* A path's table, or NULL when this CPU cannot run it (tests). */
const Bf16Kernels *bf16_kernels_for(Bf16Path p);
const char *bf16_path_name(Bf16Path p); /* "convert", "avx512_bf16" */

/* The conversion path's GEMM: both operands widened to fp32, then OpenBLAS sgemm. */
void bf16_gemm_convert(int transA, int transB, int M, int N, int K, float alpha, const bf16_t *A, int lda,
                       const bf16_t *B, int ldb, float beta, float *C, int ldc);

/* The avx512_bf16 path's GEMM: oneDNN's bf16 matmul (bf16_gemm_onednn.c). */
void bf16_gemm_onednn(int transA, int transB, int M, int N, int K, float alpha, const bf16_t *A, int lda,
                      const bf16_t *B, int ldb, float beta, float *C, int ldc);

/* One line for run headers: "avx512_bf16, GEMM: oneDNN 2.6.3 matmul on avx512_core_bf16" or
 * "convert, GEMM: fp32 sgemm on bf16 values (oneDNN 2.6.3)". */
void bf16_describe(char *buf, size_t n);

/* Whether bf16 products run as fp32 sgemm on arrays of bf16 values: the conversion path (ops.h's
 * linear layers read them so; its MFU peak and the planner's GEMM rate are then fp32's). */
int bf16_products_on_sgemm(void);

/* OpenMP-parallel conversions through the chosen path, for large arrays. */
void bf16_pack(bf16_t *dst, const float *src, size_t n);
void bf16_unpack(float *dst, const bf16_t *src, size_t n);
/* x = float(bf16(x)) in place: what a bf16 operand holds, kept in an fp32 buffer. */
void bf16_round(float *x, size_t n);
/* dst = float(bf16(src)): the same, into another buffer. */
void bf16_round_copy(float *dst, const float *src, size_t n);
/* bf16_round on the calling thread alone: for a row or block a parallel loop has just made, while
 * it is in cache (the producers of ops.h's *_bf16 functions). */
void bf16_round_serial(float *x, size_t n);
/* The index of the first element of x that is not a bf16 value (NaN aside), or n if none is. */
size_t bf16_unrounded(const float *x, size_t n);

#endif
