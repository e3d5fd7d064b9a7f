/* Where the AMX tile products of the bf16 attention forward spend their time, on the forward's own
 * shapes (one 192 x 192 block of queries x keys, head_dim d): each piece of a product timed alone
 * (tile configuration, the TDPBF16PS rate, tile loads and stores, the A panel's copy and
 * transposition) next to the library's tile_gemm (attn_bf16.h) on the same operands, and the
 * forward's P V product both ways: O += P V with P read transposed (as the forward runs it) and
 * O^T += V^T P^T, whose operands both load straight into tiles. Results are checked against the
 * library's product (max |difference| printed: 0 means bit-identical). Not a test; built by
 * `make bench-amx` twice: on the instructions (build/bench/amx_probe, needs AMX hardware) and on
 * their C emulation (build/bench/amx_probe_emu, any CPU with AVX512_BF16, for checking the probe).
 * usage: build/bench/amx_probe [d] [iterations] */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "kernels/amx_tiles.h"
#include "kernels/attn_bf16.h"
#include "kernels/isa.h"

#ifdef PROBE_EMULATED
#define AMX_TILE_OPS_EMULATED
#define PROBE_KIND ATTN_BF16_AMX_EMULATED
#else
#define PROBE_KIND ATTN_BF16_AMX
#endif
#include "kernels/amx_tile_ops.h"

#define BQ 192
#define BK 192
#define LDT (BQ + 16) /* the forward's stride of S^T, Q^T and P^T (FA_SKEW 16) */

static bf16_pair *words(size_t n, unsigned seed) {
    bf16_pair *w = xmalloc_aligned(n * sizeof *w);
    for (size_t i = 0; i < n; i++) { /* two bf16 values in [-1, 1): sign, exponent 120..127 */
        seed = seed * 1103515245u + 12345u;
        const unsigned lo = ((seed >> 8) & 0x807f) | (0x3c00u + ((seed >> 20) & 7) * 0x80), hi = lo ^ 0x8055;
        w[i] = (bf16_pair)(lo | (hi << 16));
    }
    return w;
}

static double maxdiff(const float *a, size_t lda, const float *b, size_t ldb, int rows, int cols, int transposed) {
    double m = 0;
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) {
            const float x = a[(size_t)r * lda + c], y = transposed ? b[(size_t)c * ldb + r] : b[(size_t)r * ldb + c];
            const double e = fabs((double)x - (double)y);
            if (e > m || x != x || y != y) m = x != x || y != y ? INFINITY : e;
        }
    return m;
}

/* C (M, N; ldc) (+)= A (M, K2 words, rows layout; lda) B (K2, N, pairs layout; ldb) in 32 x 32
 * blocks, every tile loaded in place (M, N multiples of 32, K2 of 16): the accumulators start from
 * C (load_c) or zero; store 0: none, 1: to C, 2: to one reused 32 x 32 block */
static void gemm_tiles(int M, int N, int K2, const bf16_pair *A, size_t lda, const bf16_pair *B, size_t ldb, float *C,
                       size_t ldc, int load_c, int store, float (*scratch)[32]) {
    for (int m0 = 0; m0 < M; m0 += 32)
        for (int n0 = 0; n0 < N; n0 += 32) {
            float *c = C + (size_t)m0 * ldc + n0;
            if (load_c) {
                TILE_LOAD(0, c, ldc * 4); TILE_LOAD(1, c + 16, ldc * 4);
                TILE_LOAD(2, c + 16 * ldc, ldc * 4); TILE_LOAD(3, c + 16 * ldc + 16, ldc * 4);
            } else {
                TILE_ZERO(0); TILE_ZERO(1); TILE_ZERO(2); TILE_ZERO(3);
            }
            for (int k0 = 0; k0 < K2; k0 += 16) {
                TILE_LOAD(4, A + (size_t)m0 * lda + k0, lda * 4);
                TILE_LOAD(5, A + (size_t)(m0 + 16) * lda + k0, lda * 4);
                TILE_LOAD(6, B + (size_t)k0 * ldb + n0, ldb * 4);
                TILE_LOAD(7, B + (size_t)k0 * ldb + n0 + 16, ldb * 4);
                TILE_DP(0, 4, 6); TILE_DP(1, 4, 7); TILE_DP(2, 5, 6); TILE_DP(3, 5, 7);
            }
            if (store == 1) {
                TILE_STORE(0, c, ldc * 4); TILE_STORE(1, c + 16, ldc * 4);
                TILE_STORE(2, c + 16 * ldc, ldc * 4); TILE_STORE(3, c + 16 * ldc + 16, ldc * 4);
            } else if (store == 2) {
                TILE_STORE(0, &scratch[0][0], 128); TILE_STORE(1, &scratch[0][16], 128);
                TILE_STORE(2, &scratch[16][0], 128); TILE_STORE(3, &scratch[16][16], 128);
            }
        }
}

/* S^T (BK, BQ; ld LDT) = K (BK, d2 words; ldk) Q^T (d2, BQ; LDT) */
static void qk_direct(int d2, const bf16_pair *K, size_t ldk, const bf16_pair *Qw, float *ST, int store,
                      float (*scratch)[32]) {
    gemm_tiles(BK, BQ, d2, K, ldk, Qw, LDT, ST, LDT, 0, store, scratch);
}

/* O^T (d, BQ; ld LDT) += V^T (d, bk2 words; ldvt) P^T pairs (bk2, BQ; LDT), accumulating in place */
static void pv_transposed(int d, int bk2, const bf16_pair *VT, size_t ldvt, const bf16_pair *Pw, float *OT) {
    gemm_tiles(d, BQ, bk2, VT, ldvt, Pw, LDT, OT, LDT, 1, 1, NULL);
}

/* The same product, 32 x 16 blocks of C (two accumulators) with the operand tiles double-buffered
 * (A rows 0-15 and 16-31 and B in tiles 2-4 for even pair-step tiles, 5-7 for odd ones), so that a
 * step's loads need not wait for the previous step's products to release their tiles. */
static void pv_transposed_db(int d, int bk2, const bf16_pair *VT, size_t ldvt, const bf16_pair *Pw, float *OT) {
    for (int m0 = 0; m0 < d; m0 += 32)
        for (int n0 = 0; n0 < BQ; n0 += 16) {
            float *c = OT + (size_t)m0 * LDT + n0;
            TILE_LOAD(0, c, LDT * 4); TILE_LOAD(1, c + 16 * LDT, LDT * 4);
            for (int k0 = 0; k0 < bk2; k0 += 32) {
                TILE_LOAD(2, VT + (size_t)m0 * ldvt + k0, ldvt * 4);
                TILE_LOAD(3, VT + (size_t)(m0 + 16) * ldvt + k0, ldvt * 4);
                TILE_LOAD(4, Pw + (size_t)k0 * LDT + n0, LDT * 4);
                TILE_DP(0, 2, 4); TILE_DP(1, 3, 4);
                if (k0 + 16 < bk2) {
                    TILE_LOAD(5, VT + (size_t)m0 * ldvt + k0 + 16, ldvt * 4);
                    TILE_LOAD(6, VT + (size_t)(m0 + 16) * ldvt + k0 + 16, ldvt * 4);
                    TILE_LOAD(7, Pw + (size_t)(k0 + 16) * LDT + n0, LDT * 4);
                    TILE_DP(0, 5, 7); TILE_DP(1, 6, 7);
                }
            }
            TILE_STORE(0, c, LDT * 4); TILE_STORE(1, c + 16 * LDT, LDT * 4);
        }
}

/* 16 x 32 blocks of C: one A tile and two B tiles per step, double-buffered (A in 2 / 3, B in 4-5 / 6-7) */
static void pv_transposed_db2(int d, int bk2, const bf16_pair *VT, size_t ldvt, const bf16_pair *Pw, float *OT) {
    for (int m0 = 0; m0 < d; m0 += 16)
        for (int n0 = 0; n0 < BQ; n0 += 32) {
            float *c = OT + (size_t)m0 * LDT + n0;
            TILE_LOAD(0, c, LDT * 4); TILE_LOAD(1, c + 16, LDT * 4);
            for (int k0 = 0; k0 < bk2; k0 += 32) {
                TILE_LOAD(2, VT + (size_t)m0 * ldvt + k0, ldvt * 4);
                TILE_LOAD(4, Pw + (size_t)k0 * LDT + n0, LDT * 4);
                TILE_LOAD(5, Pw + (size_t)k0 * LDT + n0 + 16, LDT * 4);
                TILE_DP(0, 2, 4); TILE_DP(1, 2, 5);
                if (k0 + 16 < bk2) {
                    TILE_LOAD(3, VT + (size_t)m0 * ldvt + k0 + 16, ldvt * 4);
                    TILE_LOAD(6, Pw + (size_t)(k0 + 16) * LDT + n0, LDT * 4);
                    TILE_LOAD(7, Pw + (size_t)(k0 + 16) * LDT + n0 + 16, LDT * 4);
                    TILE_DP(0, 3, 6); TILE_DP(1, 3, 7);
                }
            }
            TILE_STORE(0, c, LDT * 4); TILE_STORE(1, c + 16, LDT * 4);
        }
}

/* 32 x 32 blocks, the loads of the next step interleaved with this step's products (program order
 * as Intel's optimization manual writes AMX GEMM loops) */
static void pv_transposed_il(int d, int bk2, const bf16_pair *VT, size_t ldvt, const bf16_pair *Pw, float *OT) {
    for (int m0 = 0; m0 < d; m0 += 32)
        for (int n0 = 0; n0 < BQ; n0 += 32) {
            float *c = OT + (size_t)m0 * LDT + n0;
            TILE_LOAD(0, c, LDT * 4); TILE_LOAD(1, c + 16, LDT * 4);
            TILE_LOAD(2, c + 16 * LDT, LDT * 4); TILE_LOAD(3, c + 16 * LDT + 16, LDT * 4);
            TILE_LOAD(4, VT + (size_t)m0 * ldvt, ldvt * 4);
            TILE_LOAD(6, Pw + n0, LDT * 4);
            for (int k0 = 0; k0 < bk2; k0 += 16) {
                TILE_LOAD(7, Pw + (size_t)k0 * LDT + n0 + 16, LDT * 4);
                TILE_DP(0, 4, 6);
                TILE_LOAD(5, VT + (size_t)(m0 + 16) * ldvt + k0, ldvt * 4);
                TILE_DP(1, 4, 7);
                TILE_DP(2, 5, 6);
                if (k0 + 16 < bk2) {
                    TILE_LOAD(4, VT + (size_t)m0 * ldvt + k0 + 16, ldvt * 4);
                    TILE_DP(3, 5, 7);
                    TILE_LOAD(6, Pw + (size_t)(k0 + 16) * LDT + n0, LDT * 4);
                } else {
                    TILE_DP(3, 5, 7);
                }
            }
            TILE_STORE(0, c, LDT * 4); TILE_STORE(1, c + 16, LDT * 4);
            TILE_STORE(2, c + 16 * LDT, LDT * 4); TILE_STORE(3, c + 16 * LDT + 16, LDT * 4);
        }
}

/* O += P V, P as rows (P^T transposed once per call into rows, ld ldpr words) and V pairs in place */
static void pv_rows(int d, int bk2, const bf16_pair *Pr, size_t ldpr, const bf16_pair *Vw, size_t ldv, float *O) {
    gemm_tiles(BQ, d, bk2, Pr, ldpr, Vw, ldv, O, (size_t)d, 1, 1, NULL);
}

#define TIME(label, flops, iters, body)                                                                   \
    do {                                                                                                  \
        double best_ = 1e30;                                                                              \
        for (int rep_ = 0; rep_ < 5; rep_++) {                                                            \
            const double t0_ = now_seconds();                                                             \
            for (int it_ = 0; it_ < (iters); it_++) { body; }                                             \
            const double dt_ = (now_seconds() - t0_) / (iters);                                           \
            if (dt_ < best_) best_ = dt_;                                                                 \
        }                                                                                                 \
        printf("  %-58s %9.3f us", label, best_ * 1e6);                                                   \
        if ((flops) > 0) printf("  %7.1f GFLOPS", (flops) / best_ * 1e-9);                               \
        printf("\n");                                                                                     \
        fflush(stdout);                                                                                   \
    } while (0)

int main(int argc, char **argv) {
    const int d = argc > 1 ? atoi(argv[1]) : 64, iters = argc > 2 ? atoi(argv[2]) : 200;
    if (d < 32 || d % 32 || d > 256) {
        fprintf(stderr, "amx_probe: head_dim %d: give a multiple of 32 in 32..256\n", d);
        return 2;
    }
    char why[200] = "";
#ifndef PROBE_EMULATED
    if (!amx_available(why, sizeof why)) {
        fprintf(stderr, "amx_probe: AMX unavailable: %s (build/bench/amx_probe_emu runs the emulation)\n", why);
        return 2;
    }
#endif
    const AttnBf16Tiles *t = attn_bf16_tiles_for(PROBE_KIND);
    if (!t) {
        fprintf(stderr, "amx_probe: this CPU cannot run %s\n", PROBE_KIND == ATTN_BF16_AMX ? "AMX" : "AVX512_BF16");
        return 2;
    }
    const int d2 = d / 2, bk2 = BK / 2;
    const size_t ldk = (size_t)d2 + 8, ldvt = (size_t)bk2 + 8, ldv = (size_t)d + 8;
    bf16_pair *K = words((size_t)BK * ldk, 1), *Qw = words((size_t)d2 * LDT, 2), *Pw = words((size_t)bk2 * LDT, 3);
    bf16_pair *Vw = words((size_t)bk2 * ldv, 4), *VT = xmalloc_aligned((size_t)d * ldvt * sizeof *VT);
    for (int c = 0; c < d; c++) /* V^T rows = the pairs layout of V read transposed */
        for (int kk = 0; kk < bk2; kk++) VT[(size_t)c * ldvt + kk] = Vw[(size_t)kk * ldv + c];
    float *ST = xmalloc_aligned((size_t)BK * LDT * 4), *ST2 = xmalloc_aligned((size_t)BK * LDT * 4);
    float *O = xmalloc_aligned((size_t)BQ * d * 4), *OT = xmalloc_aligned((size_t)d * LDT * 4);
    _Alignas(64) float scratch[32][32];
    _Alignas(64) AmxTileConfig cfg;
    amx_config_uniform(&cfg, AMX_TILES, 16, 64);
    const double f_qk = 2.0 * BK * BQ * d, f_pv = 2.0 * BQ * BK * d;
    printf("amx_probe: %s, %d x %d block, d = %d, best of 5 x %d calls, one thread\n", t->name, BQ, BK, d, iters);

    /* results first: the probe's products against the library's */
    t->tile_gemm(BK, BQ, d2, 1.0f, K, ldk, 1, Qw, LDT, 0, ST, LDT, NULL);
    TILE_CONFIG(&cfg);
    qk_direct(d2, K, ldk, Qw, ST2, 1, scratch);
    TILE_RELEASE();
    printf("  check S = K Q^T, tiles in place vs tile_gemm: max |diff| %g\n", maxdiff(ST, LDT, ST2, LDT, BK, BQ, 0));
    memset(O, 0, (size_t)BQ * d * 4);
    memset(OT, 0, (size_t)d * LDT * 4);
    t->tile_gemm(BQ, d, bk2, 1.0f, Pw, 1, LDT, Vw, ldv, 1, O, (size_t)d, NULL);
    TILE_CONFIG(&cfg);
    pv_transposed(d, bk2, VT, ldvt, Pw, OT);
    TILE_RELEASE();
    printf("  check O += P V vs O^T += V^T P^T: max |diff| %g\n", maxdiff(O, (size_t)d, OT, LDT, BQ, d, 1));
    void (*const variants[3])(int, int, const bf16_pair *, size_t, const bf16_pair *, float *) = {
        pv_transposed_db, pv_transposed_db2, pv_transposed_il};
    for (int v = 0; v < 3; v++) {
        memset(OT, 0, (size_t)d * LDT * 4);
        TILE_CONFIG(&cfg);
        variants[v](d, bk2, VT, ldvt, Pw, OT);
        TILE_RELEASE();
        printf("  check O^T += V^T P^T variant %d: max |diff| %g\n", v, maxdiff(O, (size_t)d, OT, LDT, BQ, d, 1));
    }
    const size_t ldpr = (size_t)bk2 + 8;
    bf16_pair *Pr = xmalloc_aligned((size_t)BQ * ldpr * sizeof *Pr);
    for (int i = 0; i < BQ; i++)
        for (int kk = 0; kk < bk2; kk++) Pr[(size_t)i * ldpr + kk] = Pw[(size_t)kk * LDT + i];
    {
        float *O2 = xmalloc_aligned((size_t)BQ * d * 4);
        memset(O2, 0, (size_t)BQ * d * 4);
        TILE_CONFIG(&cfg);
        pv_rows(d, bk2, Pr, ldpr, Vw, ldv, O2);
        TILE_RELEASE();
        printf("  check O += P V, P rows in place: max |diff| %g\n", maxdiff(O, (size_t)d, O2, (size_t)d, BQ, d, 0));
        xfree(O2);
    }
    {
        const int n_dp = 4 * (BK / 32) * (BQ / 32) * (d2 / 16);
        TILE_CONFIG(&cfg); /* warm-up: a tenth of a second of products, so that the unit and the clock settle */
        TILE_LOAD(4, K, ldk * 4); TILE_LOAD(5, K + 16 * ldk, ldk * 4);
        TILE_LOAD(6, Qw, LDT * 4); TILE_LOAD(7, Qw + 16, LDT * 4);
        for (double t0 = now_seconds(); now_seconds() - t0 < 0.1;)
            for (int i = 0; i < n_dp / 4; i++) { TILE_DP(0, 4, 6); TILE_DP(1, 4, 7); TILE_DP(2, 5, 6); TILE_DP(3, 5, 7); }
        TILE_STORE(0, &scratch[0][0], 128);
        TILE_RELEASE();
    }

    TIME("LDTILECFG + TILEZERO + TILERELEASE", 0, iters * 10, {
        TILE_CONFIG(&cfg);
        TILE_ZERO(0);
        TILE_RELEASE();
    });
    {
        const int n_dp = 4 * (BK / 32) * (BQ / 32) * (d2 / 16); /* as many TDPBF16PS as the S product */
        TILE_CONFIG(&cfg);
        TILE_LOAD(4, K, ldk * 4); TILE_LOAD(5, K + 16 * ldk, ldk * 4);
        TILE_LOAD(6, Qw, LDT * 4); TILE_LOAD(7, Qw + 16, LDT * 4);
        TIME("TDPBF16PS alone, 4 accumulators (as many as S)", f_qk, iters, {
            for (int i = 0; i < n_dp / 4; i++) { TILE_DP(0, 4, 6); TILE_DP(1, 4, 7); TILE_DP(2, 5, 6); TILE_DP(3, 5, 7); }
        });
        TILE_STORE(0, &scratch[0][0], 128); /* keep the products alive */
        TILE_RELEASE();
    }
    TILE_CONFIG(&cfg);
    TIME("S: tiles in place, no stores", f_qk, iters, qk_direct(d2, K, ldk, Qw, ST2, 0, scratch));
    TIME("S: tiles in place, stores to one 32 x 32 block", f_qk, iters, qk_direct(d2, K, ldk, Qw, ST2, 2, scratch));
    TIME("S: tiles in place, stores to S^T", f_qk, iters, qk_direct(d2, K, ldk, Qw, ST2, 1, scratch));
    TILE_RELEASE();
    TIME("S: library tile_gemm (configured per call)", f_qk, iters,
         t->tile_gemm(BK, BQ, d2, 1.0f, K, ldk, 1, Qw, LDT, 0, ST, LDT, NULL));
    TIME("O += P V: library tile_gemm (P transposed into the A panel)", f_pv, iters,
         t->tile_gemm(BQ, d, bk2, 1.0f, Pw, 1, LDT, Vw, ldv, 1, O, (size_t)d, NULL));
    TILE_CONFIG(&cfg);
    TIME("O^T += V^T P^T: tiles in place", f_pv, iters, pv_transposed(d, bk2, VT, ldvt, Pw, OT));
    TIME("O^T += V^T P^T: 32 x 16 blocks, double-buffered", f_pv, iters, pv_transposed_db(d, bk2, VT, ldvt, Pw, OT));
    TIME("O^T += V^T P^T: 16 x 32 blocks, double-buffered", f_pv, iters, pv_transposed_db2(d, bk2, VT, ldvt, Pw, OT));
    TIME("O^T += V^T P^T: 32 x 32, loads interleaved", f_pv, iters, pv_transposed_il(d, bk2, VT, ldvt, Pw, OT));
    TIME("O += P V: P rows, tiles in place", f_pv, iters, pv_rows(d, bk2, Pr, ldpr, Vw, ldv, O));
    TIME("S: tiles in place, stores to S^T (again)", f_qk, iters, qk_direct(d2, K, ldk, Qw, ST2, 1, scratch));
    TILE_RELEASE();
    {
        _Alignas(64) bf16_pair blk[16][16];
        TIME("P^T -> rows: the A panel's transpositions alone", 0, iters, {
            for (int kt = 0; kt < bk2; kt += 16)
                for (int r0 = 0; r0 < BQ; r0 += 16) {
                    attn_bf16_transpose16_avx512(Pw + (size_t)kt * LDT + r0, LDT, blk);
                    __asm__ volatile("" ::"r"(blk) : "memory");
                }
        });
    }
    {
        float m[BQ], sum[BQ], mx[BQ];
        for (int i = 0; i < BQ; i++) m[i] = 0;
        const SimdKernels *sk = simd();
        TIME("softmax: column max of S^T", 0, iters, sk->col_max(ST, BK, BQ, LDT, mx));
        TIME("softmax: exp2, column sums, P^T packed (col_exp2_pairs)", 0, iters,
             t->col_exp2_pairs(ST, BK, BQ, LDT, 0.01f, m, sum, Pw, LDT, NULL));
    }
    (void)why;
    xfree(K); xfree(Qw); xfree(Pw); xfree(Vw); xfree(VT); xfree(ST); xfree(ST2); xfree(O); xfree(OT); xfree(Pr);
    return 0;
}
