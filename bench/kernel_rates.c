/* Kernel rates per CPU-second, for A/B work on a shared machine: for every kernel path this CPU
 * can run (isa.h), times flash attention forward and backward (causal, one thread) and OpenBLAS
 * sgemm with the process's CPU clock instead of the wall clock, so that time the scheduler gives
 * to other processes does not count; then, on the best path, attention with bf16 inputs (the bf16
 * tiles where the CPU has AVX512_BF16) against the bf16 GEMM (bf16.h) alike. Not a test; built by
 * `make bench-tools`.
 * usage: [SEQPAR_ISA=path] [KR_F32_TILES="fbq,fbk,bbk,bbq;..."] [KR_BF16_TILES="fbq,fbk,bbk,bbq;..."]
 *        build/bench/kernel_rates [S] [head_dim] [heads] [repeats] (KR_F32_TILES: each path's fp32 attention
 *        first with those tile sizes; KR_BF16_TILES: the bf16 attention again with those, for tuning) */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "attention/flash_attention.h"
#include "kernels/attn_bf16.h"
#include "core/common.h"
#include "kernels/bf16.h"
#include "kernels/blas_core.h"
#include "kernels/isa.h"
#include "bench/sgemm_bench.h"

static float *rnd(size_t n, Rng *r) {
    float *x = xmalloc_aligned(n * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = (float)rng_normal(r);
    return x;
}

/* Forward and backward rates (FLOPs per CPU-second, the best of reps timed calls after one
 * warm-up) of the causal attention s describes on these arrays (n elements each). */
static void attn_rates(const AttnShape *s, const float *q, const float *k, const float *v, const float *dout,
                       const int *pos, float *o, float *lse, float *delta, float *dq, float *dk, float *dv, size_t n,
                       double flops, int reps, double *bf, double *bb) {
    *bf = *bb = 0;
    for (int r = 0; r <= reps; r++) {
        double t0 = cpu_seconds();
        attn_state_init(s, o, lse);
        attn_forward(s, q, pos, k, v, pos, o, lse);
        double t1 = cpu_seconds();
        memset(dq, 0, n * 4); memset(dk, 0, n * 4); memset(dv, 0, n * 4);
        double t2 = cpu_seconds();
        attn_backward_delta(s, o, dout, delta);
        attn_backward(s, q, pos, k, v, pos, lse, delta, dout, dq, dk, dv);
        double t3 = cpu_seconds();
        if (r && flops / (t1 - t0) > *bf) *bf = flops / (t1 - t0);
        if (r && 2.5 * flops / (t3 - t2) > *bb) *bb = 2.5 * flops / (t3 - t2);
    }
}

/* The forward's product with V: O^T (d, bq) += V^T (d, bk2 pairs) P (bk2, bq) where the table
 * accumulates transposed, else O (bq, d) += P^T V with P (bk2, bq) read transposed. */
static void pv_product(const AttnBf16Tiles *t, int acc_t, int bq, int bk2, int d, const bf16_pair *pw,
                       const bf16_pair *vw, const bf16_pair *vtw, float *ob) {
    if (acc_t) t->tile_gemm(d, bq, bk2, 1.0f, vtw, (size_t)bk2, 1, pw, (size_t)bq, 1, ob, (size_t)bq, NULL);
    else t->tile_gemm(bq, d, bk2, 1.0f, pw, 1, (size_t)bq, vw, (size_t)d, 1, ob, (size_t)d, NULL);
}

/* The bf16 table's pieces alone, on the forward's shapes (fwd_bq queries x fwd_bk keys, head_dim
 * d): S = K Q^T (rows A), the softmax step that packs P, and the product with V the forward runs
 * with this table: O^T += V^T P (rows A, the tables with fwd_acc_transposed: AMX) or O += P^T V
 * (transposed A), accumulating; GFLOPS (elements per ns for the softmax) per CPU-second, best of 20
 * calls after a tenth of a second of warm-up. */
static void bf16_pieces(const AttnBf16Tiles *t, int d) {
    const int bq = t->fwd_bq, bk = t->fwd_bk, d2 = (d + 1) / 2, bk2 = (bk + 1) / 2;
    Rng rng;
    rng_seed(&rng, 7);
    float *kf = rnd((size_t)bk * d, &rng), *qf = rnd((size_t)bq * d, &rng), *vf = rnd((size_t)bk * d, &rng);
    float *st = xmalloc_aligned((size_t)bk * bq * 4), *ob = xmalloc_aligned((size_t)bq * d * 4), m[1024], sum[1024];
    bf16_pair *kw = xmalloc_aligned((size_t)bk * d2 * 4), *qw = xmalloc_aligned((size_t)d2 * bq * 4);
    bf16_pair *vw = xmalloc_aligned((size_t)bk2 * d * 4), *pw = xmalloc_aligned((size_t)bk2 * bq * 4);
    t->pack_rows(bk, d, kf, (size_t)d, kw, (size_t)d2);
    for (int i = 0; i < bq; i++) /* Q^T as pairs: (d2, bq) */
        for (int c = 0; c < d; c++) st[(size_t)c * bq + i] = qf[(size_t)i * d + c];
    t->pack_pairs(d, bq, st, (size_t)bq, qw, (size_t)bq);
    t->pack_pairs(bk, d, vf, (size_t)d, vw, (size_t)d);
    const int acc_t = t->fwd_acc_transposed;
    bf16_pair *vtw = xmalloc_aligned((size_t)d * bk2 * 4); /* V^T as rows: (d, bk2) */
    float *vt = xmalloc_aligned((size_t)d * bk * 4);
    for (int j = 0; j < bk; j++)
        for (int c = 0; c < d; c++) vt[(size_t)c * bk + j] = vf[(size_t)j * d + c];
    t->pack_rows(d, bk, vt, (size_t)bk, vtw, (size_t)bk2);
    for (int i = 0; i < bq && i < 1024; i++) m[i] = 0;
    /* a tenth of a second of the three first: on the AMX Xeon the tile products of a cold unit ran
     * at half the rate (bench/amx_probe.c) */
    for (const double t_end = cpu_seconds() + 0.1; cpu_seconds() < t_end;) {
        t->tile_gemm(bk, bq, d2, 1.0f, kw, (size_t)d2, 1, qw, (size_t)bq, 0, st, (size_t)bq, NULL);
        t->col_exp2_pairs(st, bk, bq, (size_t)bq, 0.125f, m, sum, pw, (size_t)bq, NULL);
        pv_product(t, acc_t, bq, bk2, d, pw, vw, vtw, ob);
    }
    double best[3] = {0, 0, 0};
    for (int r = 0; r <= 20; r++) {
        double t0 = cpu_seconds();
        t->tile_gemm(bk, bq, d2, 1.0f, kw, (size_t)d2, 1, qw, (size_t)bq, 0, st, (size_t)bq, NULL);
        double t1 = cpu_seconds();
        t->col_exp2_pairs(st, bk, bq, (size_t)bq, 0.125f, m, sum, pw, (size_t)bq, NULL);
        double t2 = cpu_seconds();
        pv_product(t, acc_t, bq, bk2, d, pw, vw, vtw, ob);
        double t3 = cpu_seconds();
        const double g[3] = {2.0 * bk * bq * d / (t1 - t0), (double)bk * bq / (t2 - t1), 2.0 * bk * bq * d / (t3 - t2)};
        for (int j = 0; j < 3 && r; j++)
            if (g[j] > best[j]) best[j] = g[j];
    }
    printf("  %s pieces, %d x %d block, d=%d: S = K Q^T %.1f GFLOPS, softmax+pack %.2f elements/ns, "
           "%s %.1f GFLOPS per CPU-second\n", t->name, bk, bq, d, best[0] * 1e-9, best[1] * 1e-9,
           acc_t ? "O^T += V^T P" : "O += P^T V", best[2] * 1e-9);
    xfree(vt); xfree(vtw); xfree(kf); xfree(qf); xfree(vf); xfree(st); xfree(ob); xfree(kw); xfree(qw); xfree(vw); xfree(pw);
}

int main(int argc, char **argv) {
    char err[200], blas[300];
    if (blas_core_reexec_if_weak(argv, err, sizeof err)) { /* as the CLI: OpenBLAS's own kernels at their best */
        fprintf(stderr, "kernel_rates: %s\n", err);
        return 2;
    }
    blas_describe(blas, sizeof blas);
    printf("BLAS: %s\n", blas);
    int S = argc > 1 ? atoi(argv[1]) : 4096, d = argc > 2 ? atoi(argv[2]) : 64;
    int H = argc > 3 ? atoi(argv[3]) : 8, reps = argc > 4 ? atoi(argv[4]) : 3;
    omp_set_num_threads(1);
    AttnShape s = {S, S, H, H, d, 1.0f / sqrtf((float)d), ATTN_CAUSAL, 0, PRECISION_FP32, NULL, NULL, NULL, NULL, NULL};
    size_t n = (size_t)S * H * d;
    Rng rng;
    rng_seed(&rng, 1);
    float *q = rnd(n, &rng), *k = rnd(n, &rng), *v = rnd(n, &rng), *dout = rnd(n, &rng);
    float *o = xmalloc_aligned(n * 4), *dq = xmalloc_aligned(n * 4), *dk = xmalloc_aligned(n * 4), *dv = xmalloc_aligned(n * 4);
    float *lse = xmalloc_aligned((size_t)S * H * 4), *delta = xmalloc_aligned((size_t)S * H * 4);
    int *pos = xmalloc((size_t)S * sizeof(int));
    for (int i = 0; i < S; i++) pos[i] = i;
    double flops = attn_forward_flops(&s, pos, pos);
    /* sgemm per CPU second, best of reps */
    int m = 1024;
    float *a = rnd((size_t)m * m, &rng), *b = rnd((size_t)m * m, &rng), *c = xmalloc_aligned((size_t)m * m * 4);
    double best_g = 0;
    for (int r = 0; r <= reps; r++) {
        double t0 = cpu_seconds();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, m, m, 1.0f, a, m, b, m, 0.0f, c, m);
        double g = 2.0 * m * m * (double)m / (cpu_seconds() - t0) * 1e-9;
        if (r && g > best_g) best_g = g;
    }
    printf("sgemm %d^3, 1 thread: %.1f GFLOPS per CPU-second (best of %d)\n", m, best_g, reps);
    const IsaLevel only = isa_active(); /* with SEQPAR_ISA set, only that path */
    for (int l = 0; l < ISA_COUNT; l++) {
        if (getenv("SEQPAR_ISA") && l != (int)only) continue;
        if (!isa_force((IsaLevel)l)) {
            printf("%-7s: this CPU cannot run it\n", isa_name((IsaLevel)l));
            continue;
        }
        if (l == ISA_SCALAR && !getenv("SEQPAR_ISA") && S > 2048) {
            printf("%-7s: skipped above S = 2048 (minutes; SEQPAR_ISA=scalar runs it)\n", isa_name((IsaLevel)l));
            continue;
        }
        double bf, bb;
        /* KR_F32_TILES="fbq,fbk,bbk,bbq;...": this path's attention with other tile sizes first, for tuning */
        const char *tiles = getenv("KR_F32_TILES");
        while (tiles && *tiles) {
            const size_t len = strcspn(tiles, ";");
            char one[64];
            int t[4];
            snprintf(one, sizeof one, "%.*s", (int)(len < sizeof one ? len : sizeof one - 1), tiles);
            const char *err = len < sizeof one ? simd_attn_tiles_parse(one, t) : "an entry is too long";
            if (err) {
                fprintf(stderr, "kernel_rates: KR_F32_TILES entry '%s': %s\n", one, err);
                return 2;
            }
            const SimdKernels keep = *simd();
            simd_set_attn_tiles(t[0], t[1], t[2], t[3]);
            attn_rates(&s, q, k, v, dout, pos, o, lse, delta, dq, dk, dv, n, flops, reps, &bf, &bb);
            simd_set_attn_tiles(keep.fwd_bq, keep.fwd_bk, keep.bwd_bk, keep.bwd_bq);
            printf("  tiles forward %d x %d, backward %d x %d: forward %.1f, backward %.1f GFLOPS per CPU-second\n", t[0],
                   t[1], t[2], t[3], bf * 1e-9, bb * 1e-9);
            fflush(stdout);
            tiles += len;
            if (*tiles == ';') tiles++;
        }
        attn_rates(&s, q, k, v, dout, pos, o, lse, delta, dq, dk, dv, n, flops, reps, &bf, &bb);
        printf("%-7s: attention S=%d d=%d H=%d causal: forward %.1f (%.0f%% of sgemm), backward %.1f (%.0f%%) GFLOPS per CPU-second\n",
               isa_name((IsaLevel)l), S, d, H, bf * 1e-9, 100 * bf * 1e-9 / best_g, bb * 1e-9, 100 * bb * 1e-9 / best_g);
        fflush(stdout);
    }
    if (!getenv("SEQPAR_ISA")) { /* the best path again, AMX tiles included where the CPU grants them */
        isa_force(isa_best());
        isa_force_amx(1);
    }
    /* bf16: the bf16 GEMM per CPU second (1024^3, best of reps), then attention on bf16 values */
    bf16_t *ab = xmalloc((size_t)m * m * sizeof(bf16_t)), *bb16 = xmalloc((size_t)m * m * sizeof(bf16_t));
    bf16_pack(ab, a, (size_t)m * m);
    bf16_pack(bb16, b, (size_t)m * m);
    double best_b = 0;
    for (int r = 0; r <= reps; r++) {
        double t0 = cpu_seconds();
        bf16_kernels()->gemm(0, 0, m, m, m, 1.0f, ab, m, bb16, m, 0.0f, c, m);
        double g = 2.0 * m * m * (double)m / (cpu_seconds() - t0) * 1e-9;
        if (r && g > best_b) best_b = g;
    }
    printf("bf16 GEMM %d^3 (%s path), 1 thread: %.1f GFLOPS per CPU-second (best of %d)\n", m,
           bf16_path_name(bf16_kernels()->path), best_b, reps);
    bf16_round(q, n);
    bf16_round(k, n);
    bf16_round(v, n);
    bf16_round(dout, n);
    s.precision = PRECISION_BF16;
    double bf, bb;
    attn_rates(&s, q, k, v, dout, pos, o, lse, delta, dq, dk, dv, n, flops, reps, &bf, &bb);
    printf("bf16 (%s): attention S=%d d=%d H=%d causal: forward %.1f (%.0f%% of bf16 GEMM), backward %.1f (%.0f%%) "
           "GFLOPS per CPU-second\n", attn_kernel_name(PRECISION_BF16), S, d, H, bf * 1e-9, 100 * bf * 1e-9 / best_b,
           bb * 1e-9, 100 * bb * 1e-9 / best_b);
    /* KR_BF16_TILES="fbq,fbk,bbk,bbq;...": the same bf16 attention on the best table with other tile
     * sizes (forward queries x keys, backward keys x queries; even, at most 512), for tuning */
    const char *sweep = getenv("KR_BF16_TILES");
    const AttnBf16Tiles *best = attn_bf16_tiles();
    while (sweep && *sweep && best) {
        int fq, fk, bk, bq, used = 0;
        if (sscanf(sweep, "%d,%d,%d,%d%n", &fq, &fk, &bk, &bq, &used) != 4 || fq < 2 || fk < 2 || bk < 2 || bq < 2 ||
            fq % 2 || fk % 2 || bk % 2 || bq % 2 || fq > 512 || fk > 512 || bk > 512 || bq > 512) {
            fprintf(stderr, "kernel_rates: KR_BF16_TILES: give fbq,fbk,bbk,bbq (even, 2..512) separated by ';'\n");
            return 2;
        }
        AttnBf16Tiles t = *best;
        t.fwd_bq = fq, t.fwd_bk = fk, t.bwd_bk = bk, t.bwd_bq = bq;
        attn_bf16_tiles_use(&t);
        attn_rates(&s, q, k, v, dout, pos, o, lse, delta, dq, dk, dv, n, flops, reps, &bf, &bb);
        attn_bf16_tiles_use(NULL);
        printf("  tiles forward %d x %d, backward %d x %d: forward %.1f, backward %.1f GFLOPS per CPU-second\n", fq, fk,
               bk, bq, bf * 1e-9, bb * 1e-9);
        fflush(stdout);
        sweep += used;
        if (*sweep == ';') sweep++;
    }
    for (int kind = 0; kind < ATTN_BF16_KINDS; kind++) {
        const AttnBf16Tiles *t = attn_bf16_tiles_for((AttnBf16Kind)kind);
        if (t && kind != ATTN_BF16_AMX_EMULATED) bf16_pieces(t, d);
    }
    xfree(ab);
    xfree(bb16);
    return 0;
}
