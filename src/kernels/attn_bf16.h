/* The bf16 tile products of flash attention under --precision bf16 (attention/flash_attention.c):
 * bf16 operands, fp32 accumulation, with VDPBF16PS (AVX512_BF16).
 *
 * VDPBF16PS multiplies PAIRS of bf16 values along the contraction dimension and adds both
 * products to one fp32 lane: c[n] += a[2kk] b[2kk][n] + a[2kk+1] b[2kk+1][n]. So every operand is
 * a matrix of 32-bit "pair words", each holding two bf16 values adjacent in the contraction
 * dimension (the lower-addressed, low half: element 2kk; the high half: element 2kk+1):
 *   rows layout   of X (M, K): word[m][kk] = (X[m][2kk], X[m][2kk+1])   (X's bf16 rows as stored)
 *   pairs layout  of X (K, N): word[kk][n] = (X[2kk][n], X[2kk+1][n])   (two rows interleaved)
 * An odd K is padded with a zero element. The rows layout of X is the pairs layout of X^T read
 * transposed, so one product kernel serves every operand orientation the attention loop needs.
 *
 * The same layouts are the operands of AMX's TDPBF16PS: a tile of A is 16 rows of rows-layout pair
 * words, a tile of B 16 pair steps of pairs-layout words. So there are two product kernels behind
 * one table type: VDPBF16PS (attn_bf16_avx512.c) and AMX-BF16 tiles (attn_bf16_amx_body.h, built
 * on the instructions in attn_bf16_amx.c and on their C emulation in attn_bf16_amx_emulated.c, the
 * latter for tests only), sharing the AVX512_BF16 packers.
 *
 * Not here: the softmax, the running max / sum / lse and the rescaling, which stay fp32 in
 * flash_attention.c. */
#ifndef SEQPAR_ATTN_BF16_H
#define SEQPAR_ATTN_BF16_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/isa.h"

typedef uint32_t bf16_pair; /* two bf16 values adjacent along the contraction dimension */

typedef struct {
    /* What run headers and tests call it: "bf16 tiles (VDPBF16PS)", "bf16 tiles (AMX)",
     * "bf16 tiles (AMX, emulated)" */
    const char *name;
    /* Words a transposed A must be readable past its last row (its row stride at least M rounded
     * up to mr): the VDPBF16PS micro-kernel's rows of C per call; 0 for AMX, which reads none. */
    int mr; /* checked against the caller's strides in flash_attention.c */
    /* Flash-attention tile sizes on these kernels (as isa.h's), all even: a tile's pairs are then
     * pairs of the whole call's rows */
    int fwd_bq, fwd_bk, bwd_bk, bwd_bq;
    /* Pair words the row stride of the kernel's rows-layout copies (K's key tiles, the backward's Q
     * and dO rows: the A operands of the score products) is rounded up to (attn_bf16_rows_ld): AMX
     * 16, so that each 64-byte row of a tile load is one cache line (with the skew's stride of
     * head_dim / 2 + 8 words every other row straddled two: 2-3% of the AMX forward and backward);
     * 0: the row plus ATTN_BF16_ROW_SKEW words. */
    int rows_align;
    /* 1: the forward's second product runs transposed, acc^T += V^T P^T (V^T in rows layout, P^T
     * in pairs layout, as the softmax step packs it: every operand in place); 0: acc += P V with
     * P^T read transposed (attention/flash_attention.c). On the AMX Xeon (one 192 x 192 block,
     * d = 64, bench/amx_probe.c) 3.6 us against 8.1; on Zen 4 the VDPBF16PS tiles' forward was
     * 8-18% slower transposed (kernel_rates, d = 64), so they keep 0. The same values either way. */
    int fwd_acc_transposed;
    /* 1: the backward's dK and dV products run transposed, dK^T += Q^T dS and dV^T += dO^T P (Q^T,
     * dO^T in rows layout, dS and P in pairs layout, as the softmax steps pack them: every operand
     * in place); 0: dK += dS^T Q, dV += P^T dO with dS^T, P^T read transposed. The same values
     * either way (each product the same pairs in the same order). */
    int bwd_acc_transposed;
    /* C (M, N; ldc) = alpha A B [+ C when accumulate], contraction over K2 pairs:
     * A(m, kk) = A[m ars + kk aks] (one of ars, aks is 1), B(kk, n) = B[kk ldb + n] (pairs layout). */
    void (*tile_gemm)(int M, int N, int K2, float alpha, const bf16_pair *A, size_t ars, size_t aks,
                      const bf16_pair *B, size_t ldb, int accumulate, float *C, size_t ldc, Prefetch *pf);
    /* The same product with A in panels (pack_panels): rows r0 .. r0 + panel_mr - 1 of A for pair
     * steps 0 .. K2-1 at Ap + r0 K2, a step's panel_mr words contiguous (one sequential stream where a
     * rows-layout A read in place streams panel_mr rows at once: the forward's score product). NULL
     * (and panel_mr 0) where the table has none: the AMX tiles load a rows-layout A whole. */
    void (*tile_gemm_panels)(int M, int N, int K2, float alpha, const bf16_pair *Ap, const bf16_pair *B,
                             size_t ldb, int accumulate, float *C, size_t ldc, Prefetch *pf);
    /* dst = the panels of fp32 src (rows, cols; lds) rounded as pack_rows rounds it: ceil(rows /
     * panel_mr) panels of ceil(cols / 2) x panel_mr words, the rows past `rows` zero */
    void (*pack_panels)(int rows, int cols, const float *src, size_t lds, bf16_pair *dst);
    int panel_mr;
    /* dst (rows, ceil(cols / 2) words; ldd) = rows layout of fp32 src (rows, cols; lds), rounded to
     * nearest even; an odd last column pairs with 0. */
    void (*pack_rows)(int rows, int cols, const float *src, size_t lds, bf16_pair *dst, size_t ldd);
    /* dst (ceil(rows / 2), cols words; ldd) = pairs layout of fp32 src (rows, cols; lds); an odd last
     * row pairs with 0. */
    void (*pack_pairs)(int rows, int cols, const float *src, size_t lds, bf16_pair *dst, size_t ldd);
    /* The forward's softmax step fused with packing its probabilities: p[j][i] = 2^(alpha s[j][i] -
     * m[i]) (alpha s - m in one fused multiply-add: the scores arrive unscaled, so that their product
     * stores straight from the tiles) for rows j < rows, columns i < n of s (ld); sum[i] = the sum
     * over j of the fp32 p; dst (ceil(rows / 2), n words; ldd) = pairs layout of p; xmax (NULL:
     * not kept) [i] = the largest alpha s[j][i] - m[i] over j (-inf for a column of -inf scores),
     * so that a caller trying its current m can see whether that m still holds. s is not written. */
    void (*col_exp2_pairs)(const float *s, int rows, int n, size_t ld, float alpha, const float *m, float *sum,
                           bf16_pair *dst, size_t ldd, float *xmax);
    /* The backward's probabilities, fp32 and packed in one pass: p[r][j] = 2^(alpha p[r][j] - m[r])
     * (p holds the unscaled scores on entry; alpha s - m in one fused multiply-add, the softmax
     * step's exp2 of col_exp2_pairs: relative error 2.7e-6, 0 for -inf, 0 or an fp32 denormal below
     * -126, which the pairs hold as 0: the bf16 conversion flushes denormals) for rows
     * r < rows, columns j < n (ld), written back to p; dst (ceil(rows / 2), n words; ldd) = the
     * pairs layout of the new p (an odd last row pairs with 0). m[r] = +inf makes row r all 0. */
    void (*row_exp2_pairs)(float *p, int rows, int n, size_t ld, float alpha, const float *m, bf16_pair *dst,
                           size_t ldd);
    /* The backward's dS = scale p (dp - delta[r]) for rows r < rows, columns j < n of p and dp (ld)
     * (the softmax scale applied here, so that the dK and dQ products accumulate with alpha 1),
     * packed twice: pairs (ceil(rows / 2), n words; ldpairs) and rows (rows, ceil(n / 2) words;
     * ldrows). Nothing fp32 is written. */
    void (*ds_pack)(const float *p, const float *dp, size_t ld, int rows, int n, const float *delta, float scale,
                    bf16_pair *pairs, size_t ldpairs, bf16_pair *rows_w, size_t ldrows);
} AttnBf16Tiles;

/* Words a rows-layout row of d2 pair words is padded with where the table does not align its rows:
 * no power-of-two stride (cache-set conflicts), as flash_attention.c's FA_SKEW / 2. */
#define ATTN_BF16_ROW_SKEW 8

/* The row stride, in pair words, of the attention kernel's rows-layout copies of d2 words a row
 * (flash_attention.c; the memory model counts the same). */
static inline size_t attn_bf16_rows_ld(const AttnBf16Tiles *t, int d2) {
    const size_t a = (size_t)t->rows_align;
    return a ? ((size_t)d2 + a - 1) / a * a : (size_t)d2 + ATTN_BF16_ROW_SKEW;
}

/* The bf16 tile kernels for this process's kernel path, or NULL where there are none: the CPU
 * lacks AVX512_BF16 or the kernel path (isa.h, SEQPAR_ISA) is below avx512. The AMX tiles where
 * isa_amx() (the CPU has AMX-BF16, Linux granted the tile-data permission, SEQPAR_ISA unset or
 * amx), else the VDPBF16PS ones. Asked at every call, so isa_force() / isa_force_amx() switch it. */
const AttnBf16Tiles *attn_bf16_tiles(void);

typedef enum {
    ATTN_BF16_VDPBF16PS = 0,    /* AVX512_BF16 */
    ATTN_BF16_AMX = 1,          /* AMX-BF16 on hardware: amx_available() */
    ATTN_BF16_AMX_EMULATED = 2, /* the AMX kernel on the C emulation of its instructions: AVX512_BF16 */
    ATTN_BF16_KINDS = 3
} AttnBf16Kind;
/* For tests and benchmarks: a table by kind, or NULL when this CPU cannot run it. */
const AttnBf16Tiles *attn_bf16_tiles_for(AttnBf16Kind kind);
/* For tests: make attn_bf16_tiles() return `t` (NULL: back to the choice above). Not thread-safe:
 * call between parallel regions. */
void attn_bf16_tiles_use(const AttnBf16Tiles *t);

/* The fields every table shares, for the tables' initialisers: the AVX512_BF16 packers (every CPU
 * with AMX-BF16 has AVX512_BF16) and the tile sizes, chosen for the VDPBF16PS tiles and untuned on
 * AMX. On Zen 4 (one thread, S = 4096, d = 64, GFLOPS per CPU-second) forward 192 x 192 measured
 * 145-149 against 144 for the fp32 kernel's 256 x 192, 137 for 384 x 192 and 134 for 256 x 384;
 * backward 192 x 96 (the fp32 kernel's) 170 against 164 for 192 x 128 and 164 for 256 x 96: within
 * the machine's noise of each other, except that larger tiles lose. */
#define ATTN_BF16_SHARED_FIELDS                                                                           \
    .fwd_bq = 192, .fwd_bk = 192, .bwd_bk = 192, .bwd_bq = 96, .pack_rows = attn_bf16_pack_rows_avx512,       \
    .pack_pairs = attn_bf16_pack_pairs_avx512, .col_exp2_pairs = attn_bf16_col_exp2_pairs_avx512,             \
    .row_exp2_pairs = attn_bf16_row_exp2_pairs_avx512, .ds_pack = attn_bf16_ds_pack_avx512

/* The AVX512_BF16 packers (attn_bf16_avx512.c), shared by every table; see the fields above. */
void attn_bf16_pack_rows_avx512(int rows, int cols, const float *src, size_t lds, bf16_pair *dst, size_t ldd);
void attn_bf16_pack_pairs_avx512(int rows, int cols, const float *src, size_t lds, bf16_pair *dst, size_t ldd);
void attn_bf16_col_exp2_pairs_avx512(const float *s, int rows, int n, size_t ld, float alpha, const float *m,
                                     float *sum, bf16_pair *dst, size_t ldd, float *xmax);
void attn_bf16_row_exp2_pairs_avx512(float *p, int rows, int n, size_t ld, float alpha, const float *m,
                                     bf16_pair *dst, size_t ldd);
/* dst[r][k] = src[k lds + r] for r, k < 16: one 16 x 16 block of 32-bit words transposed in registers
 * (the AMX tiles' A panel from a transposed operand, attn_bf16_amx_body.h). */
void attn_bf16_transpose16_avx512(const bf16_pair *src, size_t lds, bf16_pair dst[16][16]);
void attn_bf16_ds_pack_avx512(const float *p, const float *dp, size_t ld, int rows, int n, const float *delta,
                              float scale, bf16_pair *pairs, size_t ldpairs, bf16_pair *rows_w, size_t ldrows);

#endif
