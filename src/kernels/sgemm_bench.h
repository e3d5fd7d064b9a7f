/* Measures the machine's practical fp32 matrix-multiply rate (cblas_sgemm), the yardstick the
 * attention benchmark and MFU figures are compared against. Not a tuning tool for BLAS itself. */
#ifndef SEQPAR_SGEMM_BENCH_H
#define SEQPAR_SGEMM_BENCH_H

/* Median GFLOPS over `repeats` runs (at least 1) of C = A B on square 2048 x 2048 fp32 matrices,
 * with the current OpenMP thread count (OpenBLAS's OpenMP build follows omp_get_max_threads()).
 * One warm-up run is not counted. */
double sgemm_peak_gflops(int repeats);

/* GFLOPS of one sgemm shape (M x K times K x N), median over `repeats` runs; for experiments. */
double sgemm_gflops(int m, int n, int k, int repeats);

/* Median of n doubles (the array is sorted in place); 0 when n <= 0. */
double median_of(double *x, int n);

#endif
