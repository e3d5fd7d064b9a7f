/* Measures the machine's practical fp32 matrix-multiply rate (the better of oneDNN's and
 * OpenBLAS's sgemm, kernels/sgemm.h), the yardstick the attention benchmark and MFU figures are
 * compared against. Not a tuning tool for BLAS itself. */
#ifndef SEQPAR_SGEMM_BENCH_H
#define SEQPAR_SGEMM_BENCH_H

#include "kernels/sgemm.h"

/* The fp32 peak for MFU: the BEST GFLOPS of `trials` short runs (at least 3) of C = A B on square
 * 2048 x 2048 fp32 matrices through each library of sgemm.h, the better library's, with the
 * current OpenMP thread count (both follow omp_get_max_threads()), after one warm-up run each. The
 * best, not the median: on a shared machine a trial can only be slowed down, never sped up, so the
 * best trial is the closest to the peak. per_lib (may be NULL) receives each library's best. */
double sgemm_peak_gflops_libs(int trials, double per_lib[SGEMM_LIBS]);
double sgemm_peak_gflops(int trials);
#define SGEMM_PEAK_TRIALS 7

/* The bf16 peak for MFU under --precision bf16: the best GFLOPS of `trials` (at least 3) runs of
 * this path's GEMM on square 2048 x 2048 bf16 matrices, after one warm-up (as sgemm_peak_gflops).
 * On the conversion path the linear layers' products are fp32 sgemm on arrays of bf16 values
 * (ops.h), the same arithmetic at the same rate as fp32's: its peak is the fp32 peak
 * (sgemm_peak_gflops, the better library's), not bf16_gemm_convert's, whose two widening passes
 * made the peak read lower and the utilisation higher than the hardware's. */
double bf16_gemm_peak_gflops(int trials);

/* GFLOPS of one OpenBLAS sgemm shape (M x K times K x N), the median of `repeats` trials, each one
 * product or (trial_s > 0) as many as take trial_s seconds (ranks sharing cores then each get their
 * share within a trial). */
double sgemm_gflops(int m, int n, int k, int repeats, double trial_s);

/* The benchmarks' clock (these yardsticks, attention_bench, the bf16 GEMM's peak, `seqpar bench`):
 * wall time (monotonic) by default; after bench_clock_cpu(1) this process's CPU time, every thread
 * counted (`seqpar bench --cpu-time`), so that a kernel and its yardstick are both rates per
 * CPU-second: time a shared machine gives to other processes does not count, time a thread of this
 * process spends waiting does. */
void bench_clock_cpu(int on);
int bench_clock_is_cpu(void);
double bench_seconds(void);

/* Median of n doubles (the array is sorted in place); 0 when n <= 0. */
double median_of(double *x, int n);

#endif
