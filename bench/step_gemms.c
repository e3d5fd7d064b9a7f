/* The reference model's fp32 linear-layer products (ops.c's linear_forward / linear_backward) on
 * the rows the model runs them over at S tokens: q/o 256 -> 256, k/v 256 -> 128, the MLP's gate/up
 * 256 -> 1024 and down 1024 -> 256, each over one chunk of the default FFN chunking's rows
 * (llama_ffn_chunks_default: the layers' token-wise parts all run chunk by chunk), and the
 * 256-token vocabulary head over the loss's chunks of 256 rows; through OpenBLAS's cblas_sgemm and
 * oneDNN's dnnl_sgemm, wall clock with the process's OpenMP threads, best of N: which library
 * wins on this CPU, shape by shape, and what the products of one training step add up to (each
 * shape's forward, dX and dW times the calls a step makes: 4 layers, q and o, k and v, gate and
 * up twice, S / rows chunks), comparable with `seqpar bench step`'s linear-layer time. Rows lie as
 * the model lays them out (linear_row_stride: the MLP's 1024-wide rows 1040 floats apart); where
 * that stride differs from the width, a second line times rows packed at the width, the layout
 * before the padding. Not a test; built by `make bench-tools`.
 * usage: build/bench/step_gemms [S] [repeats] */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

#include <cblas.h>
#include <oneapi/dnnl/dnnl.h>

#include "core/common.h"
#include "kernels/blas_core.h"
#include "kernels/ops.h"
#include "model/llama.h"

/* C (M, N) = A op B + beta C, row major; which = 0 OpenBLAS, 1 oneDNN */
static void gemm(int which, int ta, int tb, int M, int N, int K, const float *A, int lda, const float *B, int ldb,
                 float beta, float *C, int ldc) {
    if (which == 0)
        cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, 1.0f, A,
                    lda, B, ldb, beta, C, ldc);
    else if (dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc) != dnnl_success)
        die("dnnl_sgemm failed (M %d N %d K %d)", M, N, K);
}

int main(int argc, char **argv) {
    char err[200], blas[300];
    if (blas_core_reexec_if_weak(argv, err, sizeof err)) {
        fprintf(stderr, "step_gemms: %s\n", err);
        return 2;
    }
    blas_describe(blas, sizeof blas);
    const int S = argc > 1 ? atoi(argv[1]) : 8192, reps = argc > 2 ? atoi(argv[2]) : 5;
    const dnnl_version_t *v = dnnl_version();
    printf("BLAS: %s; oneDNN %d.%d.%d; %d threads; S = %d; GFLOPS wall clock, best of %d\n", blas, v->major, v->minor,
           v->patch, omp_get_max_threads(), S, reps);
    const LlamaConfig ref = llama_reference_config();
    const int K = llama_ffn_chunks_default(&ref, S, 0, 1), rows = (S + K - 1) / K, head_rows = S < 256 ? S : 256;
    printf("the layers' products over %d rows (%d FFN chunks), the head's over %d\n", rows, K, head_rows);
    const struct {
        const char *name;
        int n_in, n_out, rows, per_chunk; /* per_chunk: calls per layer and chunk (0: the head) */
    } L[] = {{"q/o 256->256", 256, 256, rows, 2},      {"k/v 256->128", 256, 128, rows, 2},
             {"gate/up 256->1024", 256, 1024, rows, 2}, {"down 1024->256", 1024, 256, rows, 1},
             {"head 256->256", 256, 256, head_rows, 0}};
    Rng rng;
    rng_seed(&rng, 3);
    double tot[2] = {0, 0};
    for (size_t row = 0; row < 2 * sizeof L / sizeof L[0]; row++) {
        const size_t l = row / 2;
        const int packed = (int)(row & 1), N = L[l].rows, ni = L[l].n_in, no = L[l].n_out;
        const int li = packed ? ni : linear_row_stride(ni), lo = packed ? no : linear_row_stride(no);
        if (packed && li == linear_row_stride(ni) && lo == linear_row_stride(no)) continue; /* no second layout */
        float *in = xmalloc_aligned((size_t)N * li * 4), *out = xmalloc_aligned((size_t)N * lo * 4);
        float *W = xmalloc_aligned((size_t)no * ni * 4), *dW = xmalloc_aligned((size_t)no * ni * 4);
        float *din = xmalloc_aligned((size_t)N * li * 4);
        for (size_t i = 0; i < (size_t)N * li; i++) in[i] = (float)rng_normal(&rng), din[i] = 0;
        for (size_t i = 0; i < (size_t)N * lo; i++) out[i] = (float)rng_normal(&rng);
        for (size_t i = 0; i < (size_t)no * ni; i++) W[i] = (float)rng_normal(&rng), dW[i] = 0;
        const double fl = 2.0 * N * ni * no;
        char name[64];
        snprintf(name, sizeof name, "%s%s", L[l].name, packed ? " packed" : "");
        printf("%-25s N %5d:", name, N);
        for (int which = 0; which < 2; which++) {
            double best[3] = {1e30, 1e30, 1e30};
            for (int r = 0; r <= reps; r++) {
                double t0 = now_seconds();
                gemm(which, 0, 1, N, no, ni, in, li, W, ni, 0.0f, out, lo); /* forward */
                double t1 = now_seconds();
                gemm(which, 0, 0, N, ni, no, out, lo, W, ni, 1.0f, din, li); /* din += dout W */
                double t2 = now_seconds();
                gemm(which, 1, 0, no, ni, N, out, lo, in, li, 1.0f, dW, ni); /* dW += dout^T in */
                double t3 = now_seconds();
                const double t[3] = {t1 - t0, t2 - t1, t3 - t2};
                for (int j = 0; j < 3 && r; j++)
                    if (t[j] < best[j]) best[j] = t[j];
            }
            printf(" %s fwd %6.1f dX %6.1f dW %6.1f |", which ? "oneDNN" : "OpenBLAS", fl / best[0] * 1e-9,
                   fl / best[1] * 1e-9, fl / best[2] * 1e-9);
            const double calls = L[l].per_chunk ? (double)ref.num_hidden_layers * L[l].per_chunk * S / N : (double)S / N;
            if (!packed) tot[which] += calls * (best[0] + best[1] + best[2]);
        }
        printf("\n");
        xfree(in); xfree(out); xfree(W); xfree(dW); xfree(din);
    }
    printf("one step's products (the best times, the model's layout): OpenBLAS %.1f ms, oneDNN %.1f ms (oneDNN / OpenBLAS "
           "speed %.2fx)\n", tot[0] * 1e3, tot[1] * 1e3, tot[0] / tot[1]);
    return 0;
}
