/* Runtime instruction-set dispatch for seqpar's own hot loops (flash-attention tile products and
 * softmax, RMSNorm, RoPE, SwiGLU, cross-entropy, AdamW). The same loops are compiled three times
 * (simd_scalar.c, simd_avx2.c, simd_avx512.c include simd_body.h with different instruction sets)
 * into three tables of function pointers; the table is chosen once, at the first call of simd(),
 * from CPUID (__builtin_cpu_supports), and SEQPAR_ISA=scalar|avx2|avx512 forces a lower one.
 * Dense matrix products stay in OpenBLAS, which does its own dispatch.
 *
 * AMX is one more step of the same ladder, above avx512: `amx` runs the avx512 kernels of this
 * file plus AMX-BF16 tiles for bf16 attention (kernels/attn_bf16.h) and lets oneDNN's bf16 GEMM use
 * AMX. It is on by default where amx_available() (CPUID AMX-TILE + AMX-BF16 + AVX512_BF16, the OS
 * enables the tile state in XCR0, and Linux grants the process the tile-data permission, asked
 * once with arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)); any other SEQPAR_ISA value turns
 * it off (SEQPAR_ISA=avx512 on an AMX CPU: the VDPBF16PS tiles, oneDNN capped at avx512_core_bf16),
 * SEQPAR_ISA=amx where it is unavailable is refused with the reason. A refused permission means no
 * tile instruction ever runs (never SIGILL).
 *
 * Everything else in the binary is compiled for a baseline (x86-64-v2), so one binary runs on
 * every x86-64 machine the project meets and uses what each offers. bf16 (--precision bf16) has
 * its own table in kernels/bf16.h, chosen from the same capability bits (avx512_bf16, amx_bf16);
 * attention's tile products here stay fp32. */
#ifndef SEQPAR_ISA_H
#define SEQPAR_ISA_H

#include <stddef.h>
#include <string.h>

typedef enum { ISA_SCALAR = 0, ISA_AVX2 = 1, ISA_AVX512 = 2, ISA_COUNT = 3 } IsaLevel;

/* What the CPU reports (queried once). avx512 means F, BW, DQ and VL; avx2 means AVX2 and FMA;
 * amx_bf16 means AMX-TILE and AMX-BF16 (CPUID only: see amx_available for the rest). */
typedef struct {
    int avx2, avx512, avx512_bf16, amx_bf16;
} CpuFeatures;
const CpuFeatures *cpu_features(void);

/* The best level this CPU can run. */
IsaLevel isa_best(void);
/* "scalar", "avx2", "avx512". */
const char *isa_name(IsaLevel l);
/* Parses a name; -1 when unknown. */
int isa_parse(const char *name);
/* SEQPAR_ISA and SEQPAR_ATTN_TILES checked at start-up (the CLI, before MPI starts), with the
 * messages the first kernel call would end the process with: 0, or 1 with one line in err. */
int isa_env_check(char *err, size_t n);

/* Prefetch of the next key/value tiles while a product runs (rows of up to two strided tiles,
 * a few 64-byte lines per micro-kernel call). Zero-initialise the fields after total. */
typedef struct {
    const char *base[2];
    size_t stride;     /* bytes between rows */
    int rows;          /* rows per tile */
    int lines_per_row; /* 64-byte lines per row, counting a possibly straddled one */
    int next, total;   /* next line to fetch, out of 2 * rows * lines_per_row (0 total: nothing) */
    int tile, row, line; /* where line `next` lies (kept by prefetch_some, so that it never divides) */
} Prefetch;

/* For every tile_gemm (here and attn_bf16.h): 1 when there is nothing to multiply (M or N empty;
 * or an empty contraction, after C = 0 unless accumulating), else 0. */
static inline int tile_gemm_trivial(int M, int N, int K, int accumulate, float *C, size_t ldc) {
    if (M <= 0 || N <= 0) return 1;
    if (K > 0) return 0;
    if (!accumulate)
        for (int m = 0; m < M; m++) memset(C + (size_t)m * ldc, 0, (size_t)N * sizeof(float));
    return 1;
}

/* p covers two contiguous ranges of `bytes` each from a and b (either may be NULL: then only the
 * other; both NULL: nothing), 64-byte lines from the start of each, fetched a's first. */
static inline void prefetch_pair(Prefetch *p, const void *a, const void *b, size_t bytes) {
    *p = (Prefetch){.stride = 64, .lines_per_row = 1, .rows = (int)((bytes + 63) / 64)};
    if (!a) a = b, b = NULL;
    p->base[0] = (const char *)a;
    p->base[1] = (const char *)b;
    p->total = a ? (b ? 2 : 1) * p->rows : 0;
}

/* Up to n more of p's lines toward L2 (prefetcht1), for every kernel's products alike. Walks the
 * lines in order with a cursor: the earlier form found each line by two integer divisions, which
 * cost about 5% of the fp32 forward's products (perf, S = 8192, d = 64). */
static inline void prefetch_some(Prefetch *p, int n) {
    int next = p->next, tile = p->tile, row = p->row, line = p->line;
    for (; n > 0 && next < p->total; n--, next++) {
        __builtin_prefetch(p->base[tile] + (size_t)row * p->stride + (size_t)line * 64, 0, 2);
        if (++line == p->lines_per_row) {
            line = 0;
            if (++row == p->rows) row = 0, tile++;
        }
    }
    p->next = next, p->tile = tile, p->row = row, p->line = line;
}

/* One AdamW update's constants (see adamw.c). */
typedef struct {
    float b1, b2, omb1, omb2, eps, step_size, inv_bc2_sqrt, decay_mul, grad_scale;
} AdamWConsts;

/* The kernels of one instruction set. All are single-threaded; callers parallelise. */
typedef struct {
    IsaLevel level;
    /* Flash-attention tile sizes for this kernel's block shape: forward queries x keys, backward
     * keys x queries (multiples of the micro-kernel's rows and columns waste nothing). simd() gives
     * the table's own (tuned on 1-2 MiB of L2 per core), or small_l2's where the L2 per core is
     * under ATTN_SMALL_L2_BYTES, or SEQPAR_ATTN_TILES' (see simd_attn_tiles_describe). */
    int fwd_bq, fwd_bk, bwd_bk, bwd_bq;
    /* the four sizes for an L2 per core under ATTN_SMALL_L2_BYTES (all 0: the same as above) */
    int small_l2[4];
    /* C (M, N; ldc) = alpha A B [+ C when accumulate], A(m, k) = A[m ars + k aks] (one of ars,
     * aks is 1), B(k, n) = B[k ldb + n]. pf may be NULL. */
    void (*tile_gemm)(int M, int N, int K, float alpha, const float *A, size_t ars, size_t aks, const float *B,
                      size_t ldb, int accumulate, float *C, size_t ldc, Prefetch *pf);
    /* The same product with A in panels (pack_panels): rows r0 .. r0 + gemm_mr - 1 of A for steps
     * 0 .. K-1 at Ap + r0 K, step k's gemm_mr values contiguous; one sequential stream, where a
     * row-major A read in place streams gemm_mr rows at once. */
    void (*tile_gemm_panels)(int M, int N, int K, float alpha, const float *Ap, const float *B, size_t ldb,
                             int accumulate, float *C, size_t ldc, Prefetch *pf);
    /* dst = the panels of src (rows, cols; ld): ceil(rows / gemm_mr) panels of cols x gemm_mr floats,
     * the rows past `rows` zero */
    void (*pack_panels)(int rows, int cols, const float *src, size_t ld, float *dst);
    int gemm_mr; /* rows per panel */
    /* dst (cols, ld_dst) = src (rows, cols; ld_src)^T, on 4-byte words (floats or bf16 pair words:
     * the bits are copied, never converted) */
    void (*transpose32)(int rows, int cols, const void *src, size_t ld_src, void *dst, size_t ld_dst);
    /* mx[i] = max over rows j of s[j ld + i], i < n */
    void (*col_max)(const float *s, int rows, int n, size_t ld, float *mx);
    /* s[j][i] = 2^(s[j][i] - m[i]); sum[i] = sum over j of the new values */
    void (*col_exp2_sum)(float *s, int rows, int n, size_t ld, const float *m, float *sum);
    /* s[j] = 2^(s[j] - m); returns their sum */
    float (*row_exp2_sum)(float *s, int n, float m);
    /* p[j] = p[j] (dp[j] - delta) */
    void (*ds_row)(float *p, const float *dp, int n, float delta);
    /* x[j] *= a */
    void (*scale_row)(float *x, int n, float a);
    /* x[r ld + j] *= a[j] for r < rows, j < n (the bf16 forward's transposed accumulator, whose
     * columns are queries, rescaled by each query's correction) */
    void (*scale_cols)(float *x, int rows, int n, size_t ld, const float *a);
    /* y[j] += x[j] */
    void (*add_row)(float *y, const float *x, size_t n);
    /* RMSNorm of one row: out = x r w with r = 1 / sqrt(mean(x^2) + eps); returns r */
    float (*rmsnorm_row)(float *out, const float *x, const float *w, int D, float eps);
    /* dx += r dout w - x r^3 / D sum(dout w x); dw_acc (may be NULL) += dout x r */
    void (*rmsnorm_bwd_row)(float *dx, float *dw_acc, const float *dout, const float *x, const float *w, float r,
                            int D);
    /* one head of RoPE: (x1, x2) -> (x1 c - x2 sign s, x2 c + x1 sign s), half = head_dim / 2 */
    void (*rope_head)(float *x, const float *c, const float *s, int half, float sign);
    void (*swiglu_fwd)(float *h, const float *gate, const float *up, size_t n);
    /* dgate = dh up silu'(gate), dup = dh silu(gate): written, not accumulated; in place allowed
     * (dgate == gate, dup == up): each element is read before it is written */
    void (*swiglu_bwd)(float *dgate, float *dup, const float *dh, const float *gate, const float *up, size_t n);
    /* Cross-entropy of one row of logits li (V): returns lse - li[t] (0 when t < 0), stores the
     * argmax in *arg; with grad, li becomes scale (softmax - onehot(t)) (0 when t < 0). */
    double (*xent_row)(float *li, int V, int t, float scale, int grad, int *arg);
    /* AdamW over n elements (m, v indexed like p and g) */
    void (*adamw)(float *p, const float *g, float *m, float *v, size_t n, const AdamWConsts *k);
    /* dst = float(bf16(src)) over n elements (in place allowed): round to nearest even, NaN
     * quieted, denormals to signed zero, overflow to infinity, bit for bit as bf16_from_float
     * (kernels/bf16.h) and VCVTNE2PS2BF16; branch-free integer lanes */
    void (*bf16_round)(float *dst, const float *src, size_t n);
} SimdKernels;

/* The table chosen for this process: the best level, or SEQPAR_ISA's if set (dies with one line
 * if it names an unknown level or one this CPU cannot run). Thread-safe; chosen at the first call. */
const SimdKernels *simd(void);
/* The level simd() uses. */
IsaLevel isa_active(void);
/* L2 per core below which the tables' small_l2 tiles are used (simd_avx2.c says why) */
#define ATTN_SMALL_L2_BYTES (1L << 20)
/* SEQPAR_ATTN_TILES="fwd_bq,fwd_bk,bwd_bk,bwd_bq" sets every table's fp32 attention tiles (for
 * tuning on a new CPU): multiples of 8 from 16 to 512. NULL when `s` is valid, else a one-line
 * message (static storage). */
const char *simd_attn_tiles_parse(const char *s, int out[4]);
/* The active table's tiles and the L2 per core, and why when not the table's own: "forward 192 x
 * 120, backward 144 x 120 (L2 512 KiB per core; the small-L2 tiles)" or "...; SEQPAR_ATTN_TILES)". */
void simd_attn_tiles_describe(char *buf, size_t n);
/* For benchmarks: the active table's flash-attention tile sizes. Not thread-safe. */
void simd_set_attn_tiles(int fwd_bq, int fwd_bk, int bwd_bk, int bwd_bq);
/* For tests and benchmarks: switch to a level; returns 0 (and changes nothing) if this CPU cannot
 * run it. Not thread-safe: call between parallel regions. */
int isa_force(IsaLevel l);
/* One line for run headers: "avx512 (CPU: avx2 avx512 avx512_bf16, no amx)", "avx512 + amx (CPU:
 * ... amx_bf16)", "forced by SEQPAR_ISA" when so, and why AMX is unavailable on a CPU that reports
 * it (e.g. the permission refused). */
void isa_describe(char *buf, size_t n);

/* 1 when this process can run AMX-BF16 tile instructions (see the top): the first call checks
 * CPUID and XCR0 and asks Linux for the tile-data permission; later calls return its answer.
 * Otherwise 0 and, if why is not NULL, the reason in why (n bytes): "CPU lacks amx_bf16", "the OS
 * does not enable the AMX tile state (XCR0)", "Linux refused the AMX tile-data permission
 * (arch_prctl ARCH_REQ_XCOMP_PERM: <error>)". Thread-safe. */
int amx_available(char *why, size_t n);
/* The permission request itself, for tests: 1 when Linux grants it (or already had), else 0 with
 * the error in why. Asking on a CPU without AMX is harmless: Linux refuses. */
int amx_request_permission(char *why, size_t n);
/* 1 when AMX tiles are in use: amx_available(), the kernel path is avx512, and SEQPAR_ISA is unset or
 * `amx` (or isa_force_amx(1) said so). */
int isa_amx(void);
/* For tests and benchmarks: turn the AMX tiles on or off; returns 0 (and changes nothing) when
 * asked to turn them on where !amx_available(). Not thread-safe: call between parallel regions. */
int isa_force_amx(int on);
/* "amx" when isa_amx(), else isa_name(isa_active()): the name SEQPAR_ISA takes for this path. */
const char *isa_path_name(void);

#endif
