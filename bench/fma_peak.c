/* How close the same-run sgemm (the yardstick of every MFU, HFU and "% of sgemm" figure) comes to
 * what the CPU's FMA units can do: a loop of independent FMA chains held in registers (no memory
 * traffic), on the widest vectors this CPU has (AVX-512 where it reports AVX512F, else AVX2+FMA),
 * one copy per thread, best of `trials`; then the sgemm peak as `seqpar bench` measures it, in the
 * same run. Not a test; built by `make bench-tools`.
 * usage: [FMA_PEAK_ISA=avx2] build/bench/fma_peak [threads (default: all CPUs)] [trials (default 7)]
 *        (FMA_PEAK_ISA=avx2: the AVX2 loop on an AVX-512 CPU too) */
#include <immintrin.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "bench/sgemm_bench.h"

#define CHAINS 12 /* > FMA latency x FMA ports on every x86 core seen here (4 x 2) */

__attribute__((target("avx2"))) static float hsum256(__m256 v) {
    float t[8], s = 0;
    _mm256_storeu_ps(t, v);
    for (int j = 0; j < 8; j++) s += t[j];
    return s;
}

/* iters x CHAINS dependency-free FMAs of one vector each, one function per instruction set; returns
 * a sum so that nothing is dropped. */
#define CHAINS_FN(name, isa, V, set1, fmadd, hsum)                                                             \
    __attribute__((target(isa))) static float name(long iters) {                                               \
        V a[CHAINS];                                                                                           \
        for (int i = 0; i < CHAINS; i++) a[i] = set1(1.0f + (float)i * 1e-7f);                                 \
        const V b = set1(0.9999999f), c = set1(1e-8f);                                                         \
        for (long n = 0; n < iters; n++)                                                                       \
            _Pragma("GCC unroll 12") for (int i = 0; i < CHAINS; i++) a[i] = fmadd(a[i], b, c);                \
        float s = 0;                                                                                           \
        for (int i = 0; i < CHAINS; i++) s += hsum(a[i]);                                                      \
        return s;                                                                                              \
    }
CHAINS_FN(chains_avx512, "avx512f", __m512, _mm512_set1_ps, _mm512_fmadd_ps, _mm512_reduce_add_ps)
CHAINS_FN(chains_avx2, "avx2,fma", __m256, _mm256_set1_ps, _mm256_fmadd_ps, hsum256)

int main(int argc, char **argv) {
    const int threads = argc > 1 ? atoi(argv[1]) : omp_get_num_procs();
    const int trials = argc > 2 ? atoi(argv[2]) : 7;
    if (threads < 1 || trials < 1) {
        fprintf(stderr, "usage: fma_peak [threads >= 1] [trials >= 1]\n");
        return 2;
    }
    __builtin_cpu_init();
    const char *force = getenv("FMA_PEAK_ISA");
    const int wide = __builtin_cpu_supports("avx512f") && !(force && strcmp(force, "avx2") == 0);
    if (!wide && !(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))) {
        fprintf(stderr, "fma_peak: this CPU has neither AVX-512 nor AVX2+FMA\n");
        return 1;
    }
    const int lanes = wide ? 16 : 8;
    const long iters = 20000000; /* about 0.1-0.2 s per trial on the machines seen */
    omp_set_num_threads(threads);
    double best = 0, sink = 0;
    for (int t = 0; t < trials; t++) {
        double t0 = omp_get_wtime();
        float s = 0;
#pragma omp parallel reduction(+ : s)
        s += wide ? chains_avx512(iters) : chains_avx2(iters);
        double dt = omp_get_wtime() - t0, g = 2.0 * iters * CHAINS * lanes * threads / dt * 1e-9;
        sink += s;
        if (g > best) best = g;
    }
    double libs[SGEMM_LIBS];
    const double sgemm = sgemm_peak_gflops_libs(SGEMM_PEAK_TRIALS, libs);
    printf("FMA peak (%d independent %d-lane FMA chains in registers per thread, %d threads, best of %d): %.1f GFLOPS "
           "(checksum %.3g)\n", CHAINS, lanes, threads, trials, best, sink);
    printf("sgemm peak (2048^3, the better library's, best of %d, as seqpar bench): %.1f GFLOPS = %.1f%% of the FMA peak\n",
           SGEMM_PEAK_TRIALS, sgemm, 100 * sgemm / best);
    return 0;
}
