/* The attention tile products through four implementations, one thread, rates per CPU-second:
 * seqpar's dispatched micro-kernel (every path this CPU runs), OpenBLAS cblas_sgemm, libxsmm's
 * JIT small GEMM (Debian libxsmm-dev 1.17) and oneDNN's dnnl_sgemm (Debian libdnnl-dev 2.6), on
 * the shapes flash attention multiplies (row-major, strided like the real tiles; the accumulate
 * form C += A B where the kernel accumulates). Then the same shapes with bf16 operands and fp32
 * accumulation where the CPU has AVX512_BF16: seqpar's VDPBF16PS tile kernel (kernels/attn_bf16.h,
 * pair words), libxsmm's bf16 JIT GEMM (libxsmm_bsmmdispatch with A in its VNNI pair layout) and
 * oneDNN's bf16 matmul as seqpar's bf16 GEMM calls it (bf16_gemm_onednn: a cached primitive,
 * memory objects made per call). The measurement behind the choice of the tile kernels; not part
 * of seqpar. Built by `make bench-libs` when both packages are installed. */
#include <dnnl.h>
#include <libxsmm.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "core/common.h"
#include "kernels/attn_bf16.h"
#include "kernels/bf16.h"
#include "kernels/isa.h"

typedef struct { const char *what; int M, N, K, acc; } Shape;

enum { IMPL_OURS, IMPL_BLAS, IMPL_XSMM, IMPL_DNNL };

/* GFLOPS per CPU-second, best of 5 batches of `calls` products. */
static double rate(int impl, const Shape *s, const float *A, size_t lda, const float *B, size_t ldb, float *C,
                   size_t ldc, libxsmm_smmfunction xk) {
    int calls = (int)(2e8 / (2.0 * s->M * s->N * s->K)) + 1;
    double best = 0;
    for (int rep = 0; rep < 6; rep++) {
        double t0 = cpu_seconds();
        for (int c = 0; c < calls; c++) {
            switch (impl) {
            case IMPL_OURS:
                simd()->tile_gemm(s->M, s->N, s->K, 1.0f, A, lda, 1, B, ldb, s->acc, C, ldc, NULL);
                break;
            case IMPL_BLAS:
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, s->M, s->N, s->K, 1.0f, A, (int)lda, B, (int)ldb,
                            s->acc ? 1.0f : 0.0f, C, (int)ldc);
                break;
            case IMPL_XSMM: /* column-major: C^T (N, M) = B^T (N, K) A^T (K, M) */
                xk(B, A, C);
                break;
            case IMPL_DNNL:
                dnnl_sgemm('N', 'N', s->M, s->N, s->K, 1.0f, A, (dnnl_dim_t)lda, B, (dnnl_dim_t)ldb, s->acc ? 1.0f : 0.0f,
                           C, (dnnl_dim_t)ldc);
                break;
            }
        }
        double g = 2.0 * s->M * s->N * (double)s->K * calls / (cpu_seconds() - t0) * 1e-9;
        if (rep && g > best) best = g;
    }
    return best;
}

/* bf16 operands, fp32 accumulation: GFLOPS per CPU-second, best of 5 batches. The operands' values
 * do not matter for the rate (each implementation reads its own layout of the same sizes). */
static void bf16_rates(const Shape *shapes, size_t n_shapes) {
    printf("bf16 tile products, 1 thread, GFLOPS per CPU-second (best of 5)\n%-24s %10s %10s %10s\n",
           "shape (M x N x K)", "seqpar", "libxsmm", "oneDNN");
    const AttnBf16Tiles *bt = attn_bf16_tiles();
    for (size_t i = 0; i < n_shapes; i++) {
        const Shape *s = &shapes[i];
        const int K2 = s->K / 2;
        const size_t lda = (size_t)s->K + 32, ldb = (size_t)s->N + 32, ldc = (size_t)s->N;
        bf16_t *A = xmalloc_aligned(sizeof(bf16_t) * lda * s->M), *B = xmalloc_aligned(sizeof(bf16_t) * ldb * s->K);
        float *C = xmalloc_aligned(sizeof(float) * ldc * s->M);
        for (size_t j = 0; j < lda * s->M; j++) A[j] = bf16_from_float((float)(j % 7) * 0.01f);
        for (size_t j = 0; j < ldb * s->K; j++) B[j] = bf16_from_float((float)(j % 5) * 0.01f);
        memset(C, 0, sizeof(float) * ldc * s->M);
        float alpha = 1.0f, beta = s->acc ? 1.0f : 0.0f;
        /* libxsmm, column-major C^T (N, M) = B^T (N, K) A^T (K, M): its A is our B, in VNNI pairs */
        libxsmm_blasint m = s->N, n = s->M, k = s->K, xa = (libxsmm_blasint)ldb, xb = (libxsmm_blasint)lda,
                        xc = (libxsmm_blasint)ldc;
        int flags = LIBXSMM_GEMM_FLAGS('N', 'N') | LIBXSMM_GEMM_FLAG_VNNI_A, pf = LIBXSMM_GEMM_PREFETCH_NONE;
        libxsmm_bsmmfunction xk = libxsmm_bsmmdispatch(m, n, k, &xa, &xb, &xc, &alpha, &beta, &flags, &pf);
        double r[3] = {0, -1, 0};
        const int calls = (int)(4e8 / (2.0 * s->M * s->N * s->K)) + 1;
        for (int impl = 0; impl < 3; impl++) {
            if (impl == 1 && !xk) continue;
            double best = 0;
            for (int rep = 0; rep < 6; rep++) {
                double t0 = cpu_seconds();
                for (int c = 0; c < calls; c++) {
                    if (impl == 0) /* A rows (K2 words each), B in pairs (K2 rows of N words) */
                        bt->tile_gemm(s->M, s->N, K2, 1.0f, (const bf16_pair *)A, lda / 2, 1, (const bf16_pair *)B,
                                      ldb, s->acc, C, ldc, NULL);
                    else if (impl == 1)
                        xk((const libxsmm_bfloat16 *)B, (const libxsmm_bfloat16 *)A, C);
                    else
                        bf16_gemm_onednn(0, 0, s->M, s->N, s->K, 1.0f, A, (int)lda, B, (int)ldb, beta, C, (int)ldc);
                }
                double g = 2.0 * s->M * s->N * (double)s->K * calls / (cpu_seconds() - t0) * 1e-9;
                if (rep && g > best) best = g;
            }
            r[impl] = best;
        }
        char name[64];
        snprintf(name, sizeof name, "%dx%dx%d%s", s->M, s->N, s->K, s->acc ? " +=" : "");
        printf("%-24s %10.1f %10.1f %10.1f   %s\n", name, r[0], r[1], r[2], s->what);
        fflush(stdout);
        xfree(A); xfree(B); xfree(C);
    }
}

int main(void) {
    omp_set_num_threads(1);
    setenv("DNNL_VERBOSE", "0", 0);
    libxsmm_init();
    const Shape shapes[] = {
        {"fwd S^T = K Q^T, d 64", 192, 192, 64, 0},   {"fwd O += P V, d 64", 192, 64, 192, 1},
        {"fwd S^T = K Q^T, d 128", 192, 192, 128, 0}, {"fwd O += P V, d 128", 192, 128, 192, 1},
        {"bwd dQ += dS K, d 64", 96, 64, 192, 1},
    };
    printf("tile products, 1 thread, GFLOPS per CPU-second (best of 5); libxsmm target %s\n",
           libxsmm_get_target_arch());
    printf("%-24s %8s %8s %8s %8s %8s %8s\n", "shape (M x N x K)", "scalar", "avx2", "avx512", "OpenBLAS", "libxsmm",
           "oneDNN");
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const Shape *s = &shapes[i];
        size_t lda = (size_t)s->K + 16, ldb = (size_t)s->N + 16, ldc = (size_t)s->N;
        float *A = xmalloc_aligned(sizeof(float) * lda * s->M), *B = xmalloc_aligned(sizeof(float) * ldb * s->K);
        float *C = xmalloc_aligned(sizeof(float) * ldc * s->M);
        for (size_t j = 0; j < lda * s->M; j++) A[j] = (float)(j % 7) * 0.01f;
        for (size_t j = 0; j < ldb * s->K; j++) B[j] = (float)(j % 5) * 0.01f;
        memset(C, 0, sizeof(float) * ldc * s->M);
        float alpha = 1.0f, beta = s->acc ? 1.0f : 0.0f;
        libxsmm_blasint m = s->N, n = s->M, k = s->K, xa = (libxsmm_blasint)ldb, xb = (libxsmm_blasint)lda,
                        xc = (libxsmm_blasint)ldc;
        int flags = LIBXSMM_GEMM_FLAGS('N', 'N'), pf = LIBXSMM_GEMM_PREFETCH_NONE;
        libxsmm_smmfunction xk = libxsmm_smmdispatch(m, n, k, &xa, &xb, &xc, &alpha, &beta, &flags, &pf);
        double r[6] = {0};
        for (int l = 0; l < ISA_COUNT; l++)
            if (isa_force((IsaLevel)l)) r[l] = rate(IMPL_OURS, s, A, lda, B, ldb, C, ldc, NULL);
        isa_force(isa_best());
        r[3] = rate(IMPL_BLAS, s, A, lda, B, ldb, C, ldc, NULL);
        r[4] = xk ? rate(IMPL_XSMM, s, A, lda, B, ldb, C, ldc, xk) : -1;
        r[5] = rate(IMPL_DNNL, s, A, lda, B, ldb, C, ldc, NULL);
        char name[64];
        snprintf(name, sizeof name, "%dx%dx%d%s", s->M, s->N, s->K, s->acc ? " +=" : "");
        printf("%-24s %8.1f %8.1f %8.1f %8.1f %8.1f %8.1f   %s\n", name, r[0], r[1], r[2], r[3], r[4], r[5], s->what);
        fflush(stdout);
        xfree(A); xfree(B); xfree(C);
    }
    if (attn_bf16_tiles()) bf16_rates(shapes, sizeof shapes / sizeof shapes[0]);
    else printf("bf16 tile products: not measured (no AVX512_BF16 on the avx512 path)\n");
    libxsmm_finalize();
    return 0;
}
