/* Implementation of the sgemm yardstick: times an fp32 GEMM library (kernels/sgemm.h) on a fixed
 * shape and reports the median rate, or for the peak the best of several trials of each library.
 * Allocates its matrices per call; does nothing else. */
#include "bench/sgemm_bench.h"

#include <stdlib.h>

#include "core/common.h"
#include "kernels/bf16.h"
#include "kernels/sgemm.h"

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int g_bench_cpu;

void bench_clock_cpu(int on) { g_bench_cpu = on != 0; }
int bench_clock_is_cpu(void) { return g_bench_cpu; }
double bench_seconds(void) { return g_bench_cpu ? cpu_seconds() : now_seconds(); }

double median_of(double *x, int n) {
    if (n <= 0) return 0.0;
    qsort(x, (size_t)n, sizeof *x, cmp_double);
    return (n % 2) ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

/* Times `repeats` trials after one warm-up, a trial one product or (trial_s > 0) as many as take
 * trial_s seconds, timed per product; returns the median (best = 0) or the best rate. */
static double sgemm_rate(SgemmLib lib, int m, int n, int k, int repeats, int best, double trial_s) {
    if (m <= 0 || n <= 0 || k <= 0) die("sgemm_gflops: bad shape %d x %d x %d", m, n, k);
    if (repeats < 1) repeats = 1;
    float *a = xmalloc_aligned((size_t)m * k * sizeof(float)); /* (m, k) */
    float *b = xmalloc_aligned((size_t)k * n * sizeof(float)); /* (k, n) */
    float *c = xmalloc_aligned((size_t)m * n * sizeof(float)); /* (m, n) */
    Rng rng;
    rng_seed(&rng, 1234);
    for (size_t i = 0; i < (size_t)m * k; i++) a[i] = (float)(rng_uniform(&rng) - 0.5);
    for (size_t i = 0; i < (size_t)k * n; i++) b[i] = (float)(rng_uniform(&rng) - 0.5);
    double *t = xmalloc((size_t)repeats * sizeof(double));
    for (int r = -1; r < repeats; r++) { /* r = -1: warm-up */
        const double t0 = bench_seconds();
        int calls = 0;
        do sgemm_lib_rm(lib, 0, 0, m, n, k, 1.0f, a, k, b, n, 0.0f, c, n), calls++;
        while (r >= 0 && bench_seconds() - t0 < trial_s);
        if (r >= 0) t[r] = (bench_seconds() - t0) / calls;
    }
    double sel = median_of(t, repeats); /* sorts t ascending */
    if (best) sel = t[0];
    xfree(t);
    xfree(a);
    xfree(b);
    xfree(c);
    return 2.0 * m * n * (double)k / sel * 1e-9;
}

double sgemm_gflops(int m, int n, int k, int repeats, double trial_s) {
    return sgemm_rate(SGEMM_OPENBLAS, m, n, k, repeats, 0, trial_s);
}

double sgemm_peak_gflops_libs(int trials, double per_lib[SGEMM_LIBS]) {
    double best = 0;
    for (int l = 0; l < SGEMM_LIBS; l++) {
        const double g = sgemm_rate((SgemmLib)l, 2048, 2048, 2048, trials < 3 ? 3 : trials, 1, 0);
        if (per_lib) per_lib[l] = g;
        if (g > best) best = g;
    }
    return best;
}

double sgemm_peak_gflops(int trials) { return sgemm_peak_gflops_libs(trials, NULL); }

double bf16_gemm_peak_gflops(int trials) {
    if (bf16_products_on_sgemm()) return sgemm_peak_gflops(trials);
    const int n = 2048;
    size_t nn = (size_t)n * n;
    bf16_t *A = xmalloc(sizeof(bf16_t) * nn), *B = xmalloc(sizeof(bf16_t) * nn);
    float *C = xmalloc(sizeof(float) * nn);
    Rng rng;
    rng_seed(&rng, 1234);
    for (size_t i = 0; i < nn; i++) {
        A[i] = bf16_from_float((float)(rng_uniform(&rng) - 0.5));
        B[i] = bf16_from_float((float)(rng_uniform(&rng) - 0.5));
    }
    const Bf16Kernels *k = bf16_kernels();
    if (trials < 3) trials = 3;
    double best = 1e300;
    for (int r = -1; r < trials; r++) { /* r = -1: warm-up */
        double t0 = bench_seconds();
        k->gemm(0, 0, n, n, n, 1.0f, A, n, B, n, 0.0f, C, n);
        double dt = bench_seconds() - t0;
        if (r >= 0 && dt < best) best = dt;
    }
    xfree(A);
    xfree(B);
    xfree(C);
    return 2.0 * (double)n * n * n / best * 1e-9;
}
