/* Implementation of the attention benchmark: allocates q, k, v, o, lse, dout and gradients for
 * one shape, fills them with a fixed-seed RNG, times forward (state init + attn_forward) and
 * backward (attn_backward_delta + attn_backward) and reports medians, on the benchmarks' clock
 * (bench_seconds: wall, or CPU time under `seqpar bench --cpu-time`). */
#include "bench/attention_bench.h"

#include <math.h>
#include <string.h>

#include "core/common.h"
#include "bench/sgemm_bench.h"

static float *random_buffer(size_t n, Rng *rng, float amp) {
    float *x = xmalloc_aligned(n * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = amp * (float)rng_normal(rng);
    return x;
}

void attention_bench(int seq_len, int n_heads, int n_kv_heads, int head_dim, AttnMask mask, Precision precision,
                     int repeats, AttnBenchResult *r) {
    if (seq_len <= 0 || n_heads <= 0 || n_kv_heads <= 0 || head_dim <= 0 || n_heads % n_kv_heads)
        die("attention_bench: bad shape seq_len=%d n_heads=%d n_kv_heads=%d head_dim=%d", seq_len, n_heads,
            n_kv_heads, head_dim);
    if (repeats < 1) repeats = 1;
    AttnShape s = {.n_q = seq_len, .n_kv = seq_len, .n_heads = n_heads, .n_kv_heads = n_kv_heads, .head_dim = head_dim,
                   .scale = 1.0f / sqrtf((float)head_dim), .mask = mask, .precision = precision};
    const size_t nq = (size_t)seq_len * n_heads * head_dim;    /* (S, H, d) */
    const size_t nkv = (size_t)seq_len * n_kv_heads * head_dim; /* (S, Hkv, d) */
    Rng rng;
    rng_seed(&rng, 42);
    float *q = random_buffer(nq, &rng, 1.0f), *k = random_buffer(nkv, &rng, 1.0f);
    float *v = random_buffer(nkv, &rng, 1.0f), *dout = random_buffer(nq, &rng, 1.0f);
    if (precision == PRECISION_BF16) {
        bf16_round(q, nq);
        bf16_round(k, nkv);
        bf16_round(v, nkv);
        bf16_round(dout, nq);
    }
    float *o = xmalloc_aligned(nq * sizeof(float)), *dq = xmalloc_aligned(nq * sizeof(float));
    float *dk = xmalloc_aligned(nkv * sizeof(float)), *dv = xmalloc_aligned(nkv * sizeof(float));
    float *lse = xmalloc_aligned((size_t)seq_len * n_heads * sizeof(float));   /* (S, H) */
    float *delta = xmalloc_aligned((size_t)seq_len * n_heads * sizeof(float)); /* (S, H) */
    int *pos = xmalloc((size_t)seq_len * sizeof(int));
    for (int i = 0; i < seq_len; i++) pos[i] = i;

    double *tf = xmalloc((size_t)repeats * sizeof(double)), *tb = xmalloc((size_t)repeats * sizeof(double));
    for (int it = -1; it < repeats; it++) { /* it = -1: warm-up */
        double t0 = bench_seconds();
        attn_state_init(&s, o, lse);
        attn_forward(&s, q, pos, k, v, pos, o, lse);
        double t1 = bench_seconds();
        memset(dq, 0, nq * sizeof(float));
        memset(dk, 0, nkv * sizeof(float));
        memset(dv, 0, nkv * sizeof(float));
        double t2 = bench_seconds();
        attn_backward_delta(&s, o, dout, delta);
        attn_backward(&s, q, pos, k, v, pos, lse, delta, dout, dq, dk, dv);
        double t3 = bench_seconds();
        if (it >= 0) {
            tf[it] = t1 - t0;
            tb[it] = t3 - t2;
        }
    }
    double flops = attn_forward_flops(&s, pos, pos);
    r->fwd_seconds = median_of(tf, repeats); /* sorts: tf[0], tb[0] are the fastest runs */
    r->bwd_seconds = median_of(tb, repeats);
    r->fwd_gflops = flops / r->fwd_seconds * 1e-9;
    r->bwd_gflops = 2.5 * flops / r->bwd_seconds * 1e-9;
    r->fwd_best_gflops = flops / tf[0] * 1e-9;
    r->bwd_best_gflops = 2.5 * flops / tb[0] * 1e-9;

    xfree(tf); xfree(tb); xfree(pos);
    xfree(q); xfree(k); xfree(v); xfree(dout); xfree(o); xfree(dq); xfree(dk); xfree(dv);
    xfree(lse); xfree(delta);
}
