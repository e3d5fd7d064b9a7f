/* Benchmark of the flash-attention kernel on one process: times attn_forward and attn_backward
 * on random data for one shape and reports median seconds and GFLOPS (backward FLOPs = 2.5x the
 * forward's). Used by `seqpar bench`; it does not compare against anything itself. */
#ifndef SEQPAR_ATTENTION_BENCH_H
#define SEQPAR_ATTENTION_BENCH_H

#include "attention/flash_attention.h"

typedef struct {
    double fwd_gflops, bwd_gflops, fwd_seconds, bwd_seconds; /* medians */
    double fwd_best_gflops, bwd_best_gflops; /* the fastest run's: the statistic of the sgemm peak */
} AttnBenchResult;

/* Self-attention of seq_len contiguous tokens (positions 0..seq_len-1), scale 1/sqrt(head_dim),
 * with the current OpenMP thread count. Medians (and the best) over `repeats` (at least 1) timed runs after
 * one untimed warm-up run of each, on the benchmarks' clock (bench_seconds, kernels/sgemm_bench.h).
 * PRECISION_BF16: the inputs are rounded to bf16 values (as the model gives them) and the calls
 * say so (attn_kernel_name() names the kernel that runs). */
void attention_bench(int seq_len, int n_heads, int n_kv_heads, int head_dim, AttnMask mask, Precision precision,
                     int repeats, AttnBenchResult *r);

#endif
