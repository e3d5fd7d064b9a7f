/* The attention tile products through four implementations, one thread, rates per CPU-second:
 * seqpar's dispatched micro-kernel (every path this CPU runs), OpenBLAS cblas_sgemm, libxsmm's
 * JIT small GEMM (Debian libxsmm-dev 1.17) and oneDNN's dnnl_sgemm (Debian libdnnl-dev 2.6), on
 * the shapes flash attention multiplies (row-major, strided like the real tiles; the accumulate
 * form C += A B where the kernel accumulates). The measurement behind the choice of the tile
 * kernel; not part of seqpar. Built by `make bench-libs` when both packages are installed. */
#include <dnnl.h>
#include <libxsmm.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cblas.h>

#include "core/common.h"
#include "kernels/isa.h"

static double cpu_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

typedef struct { const char *what; int M, N, K, acc; } Shape;

enum { IMPL_OURS, IMPL_BLAS, IMPL_XSMM, IMPL_DNNL };

/* GFLOPS per CPU-second, best of 5 batches of `calls` products. */
static double rate(int impl, const Shape *s, const float *A, size_t lda, const float *B, size_t ldb, float *C,
                   size_t ldc, libxsmm_smmfunction xk) {
    int calls = (int)(2e8 / (2.0 * s->M * s->N * s->K)) + 1;
    double best = 0;
    for (int rep = 0; rep < 6; rep++) {
        double t0 = cpu_now();
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
        double g = 2.0 * s->M * s->N * (double)s->K * calls / (cpu_now() - t0) * 1e-9;
        if (rep && g > best) best = g;
    }
    return best;
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
    libxsmm_finalize();
    return 0;
}
