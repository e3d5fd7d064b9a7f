/* bf16 conversions, the conversion-path GEMM and the choice of bf16 path (see bf16.h). */
#include "kernels/bf16.h"

#include <omp.h>
#include <pthread.h>
#include <stdio.h>

#include "core/common.h"
#include "kernels/attn_bf16.h"
#include "kernels/isa.h"
#include "kernels/onednn.h"
#include "kernels/sgemm.h"

int precision_parse(const char *name) {
    if (!name) return -1;
    if (!strcmp(name, "fp32")) return PRECISION_FP32;
    if (!strcmp(name, "bf16")) return PRECISION_BF16;
    return -1;
}

const char *precision_name(int precision) { return precision == PRECISION_BF16 ? "bf16" : "fp32"; }

static void pack_c(bf16_t *dst, const float *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = bf16_from_float(src[i]);
}

static void unpack_c(float *dst, const bf16_t *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = bf16_to_float(src[i]);
}

/* The conversion path's GEMM: both operands widened to fp32 (exact), then the linear layers' fp32
 * GEMM (kernels/sgemm.h: oneDNN unless SEQPAR_SGEMM=openblas). */
void bf16_gemm_convert(int transA, int transB, int M, int N, int K, float alpha, const bf16_t *A, int lda,
                       const bf16_t *B, int ldb, float beta, float *C, int ldc) {
    size_t a_rows = (size_t)(transA ? K : M), b_rows = (size_t)(transB ? N : K);
    size_t a_n = a_rows * (size_t)lda, b_n = b_rows * (size_t)ldb;
    float *Af = xmalloc(sizeof(float) * (a_n ? a_n : 1)), *Bf = xmalloc(sizeof(float) * (b_n ? b_n : 1));
    bf16_unpack(Af, A, a_n);
    bf16_unpack(Bf, B, b_n);
    sgemm_lib_rm(sgemm_lib(), transA, transB, M, N, K, alpha, Af, lda, Bf, ldb, beta, C, ldc);
    xfree(Af);
    xfree(Bf);
}

static const Bf16Kernels KERNELS_CONVERT = {BF16_PATH_CONVERT, pack_c, unpack_c, bf16_gemm_convert};
extern const Bf16Kernels bf16_kernels_avx512bf16; /* bf16_avx512.c */

static const char *const PATH_NAMES[BF16_PATH_COUNT] = {"convert", "avx512_bf16"};
const char *bf16_path_name(Bf16Path p) { return p >= 0 && p < BF16_PATH_COUNT ? PATH_NAMES[p] : "unknown"; }

const Bf16Kernels *bf16_kernels_for(Bf16Path p) {
    if (p == BF16_PATH_CONVERT) return &KERNELS_CONVERT;
    if (p == BF16_PATH_AVX512BF16 && cpu_features()->avx512_bf16) return &bf16_kernels_avx512bf16;
    return NULL;
}

static const Bf16Kernels *g_bf16;
static pthread_once_t g_bf16_once = PTHREAD_ONCE_INIT;

static void choose_bf16(void) {
    /* follows the fp32 kernel path: SEQPAR_ISA below avx512 selects the conversion path */
    g_bf16 = isa_active() == ISA_AVX512 && cpu_features()->avx512_bf16 ? &bf16_kernels_avx512bf16 : &KERNELS_CONVERT;
}

const Bf16Kernels *bf16_kernels(void) {
    pthread_once(&g_bf16_once, choose_bf16);
    return g_bf16;
}

int bf16_products_on_sgemm(void) { return bf16_kernels()->path == BF16_PATH_CONVERT; }

#define BF16_PAR_CHUNK 16384 /* elements per OpenMP work item of the conversions */

void bf16_pack(bf16_t *dst, const float *src, size_t n) {
    const Bf16Kernels *k = bf16_kernels();
    long long chunks = (long long)((n + BF16_PAR_CHUNK - 1) / BF16_PAR_CHUNK);
#pragma omp parallel for schedule(static) if (chunks > 4)
    for (long long c = 0; c < chunks; c++) {
        size_t i0 = (size_t)c * BF16_PAR_CHUNK, m = n - i0 < BF16_PAR_CHUNK ? n - i0 : BF16_PAR_CHUNK;
        k->pack(dst + i0, src + i0, m);
    }
}

void bf16_unpack(float *dst, const bf16_t *src, size_t n) {
    const Bf16Kernels *k = bf16_kernels();
    long long chunks = (long long)((n + BF16_PAR_CHUNK - 1) / BF16_PAR_CHUNK);
#pragma omp parallel for schedule(static) if (chunks > 4)
    for (long long c = 0; c < chunks; c++) {
        size_t i0 = (size_t)c * BF16_PAR_CHUNK, m = n - i0 < BF16_PAR_CHUNK ? n - i0 : BF16_PAR_CHUNK;
        k->unpack(dst + i0, src + i0, m);
    }
}

/* Rounding in fp32 buffers runs on the dispatched kernel (isa.h: the same bits as either path's
 * pack followed by unpack, in one pass and no bf16 copy). */
void bf16_round_copy(float *dst, const float *src, size_t n) {
    const SimdKernels *sk = simd();
    long long chunks = (long long)((n + BF16_PAR_CHUNK - 1) / BF16_PAR_CHUNK);
#pragma omp parallel for schedule(static) if (chunks > 4)
    for (long long c = 0; c < chunks; c++) {
        size_t i0 = (size_t)c * BF16_PAR_CHUNK, m = n - i0 < BF16_PAR_CHUNK ? n - i0 : BF16_PAR_CHUNK;
        sk->bf16_round(dst + i0, src + i0, m);
    }
}

void bf16_round_serial(float *x, size_t n) { simd()->bf16_round(x, x, n); }

size_t bf16_unrounded(const float *x, size_t n) {
    for (size_t i = 0; i < n; i++) {
        const float r = bf16_to_float(bf16_from_float(x[i]));
        if (r != x[i] && x[i] == x[i]) return i; /* NaN compares unequal to itself: not counted */
    }
    return n;
}

/* in place too: each element is read before it is written */
void bf16_round(float *x, size_t n) { bf16_round_copy(x, x, n); }

void bf16_describe(char *buf, size_t n) {
    const Bf16Kernels *k = bf16_kernels();
    if (k->path == BF16_PATH_AVX512BF16)
        snprintf(buf, n, "%s, GEMM: oneDNN %s matmul on %s", bf16_path_name(k->path), onednn_version(),
                 onednn_isa());
    else
        snprintf(buf, n, "%s, GEMM: fp32 sgemm on bf16 values (%s)", bf16_path_name(k->path), sgemm_lib_name(sgemm_lib()));
}

extern const AttnBf16Tiles attn_bf16_tiles_avx512;       /* attn_bf16_avx512.c */
extern const AttnBf16Tiles attn_bf16_tiles_amx;          /* attn_bf16_amx.c */
extern const AttnBf16Tiles attn_bf16_tiles_amx_emulated; /* attn_bf16_amx_emulated.c */

static const AttnBf16Tiles *g_tiles_override;

const AttnBf16Tiles *attn_bf16_tiles_for(AttnBf16Kind kind) {
    if (!cpu_features()->avx512_bf16) return NULL; /* every table's packers are AVX512_BF16 code */
    switch (kind) {
    case ATTN_BF16_VDPBF16PS: return &attn_bf16_tiles_avx512;
    case ATTN_BF16_AMX: return amx_available(NULL, 0) ? &attn_bf16_tiles_amx : NULL;
    case ATTN_BF16_AMX_EMULATED: return &attn_bf16_tiles_amx_emulated;
    default: return NULL;
    }
}

void attn_bf16_tiles_use(const AttnBf16Tiles *t) { g_tiles_override = t; }

const AttnBf16Tiles *attn_bf16_tiles(void) {
    if (g_tiles_override) return g_tiles_override;
    /* as the bf16 GEMM's path: the avx512 kernel path on a CPU with AVX512_BF16; AMX above it */
    if (isa_active() != ISA_AVX512 || !cpu_features()->avx512_bf16) return NULL;
    return isa_amx() ? &attn_bf16_tiles_amx : &attn_bf16_tiles_avx512;
}
