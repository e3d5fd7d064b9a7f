/* The AMX-BF16 tile_gemm of attn_bf16.h, written once against the tile operations of
 * kernels/amx_tile_ops.h and compiled twice: with the instructions (attn_bf16_amx.c, the table
 * attn_bf16_tiles_amx) and with their C emulation (attn_bf16_amx_emulated.c, the table
 * attn_bf16_tiles_amx_emulated, which the tests run on every CPU with AVX512_BF16), so that the
 * indexing, padding, transposition and edges the hardware path runs are the ones tested.
 *
 * The including file defines AMX_TABLE (the table's symbol) and AMX_TABLE_NAME (its name) and
 * includes kernels/amx_tile_ops.h first (the operations TILE_CONFIG, TILE_ZERO, TILE_LOAD, TILE_DP
 * (TDPBF16PS), TILE_STORE, TILE_RELEASE on the instructions or on their emulation).
 *
 * TDPBF16PS computes C (16 x 16 fp32) += A (16 rows of 16 pair words) B (16 pair steps of 16 pair
 * words): A's rows are the rows layout of attn_bf16.h and B's rows its pairs layout, so B is
 * loaded straight from the caller's operand. The block of C is 32 x 32: four accumulator tiles
 * (tmm0-3), two A tiles (tmm4-5) and two B tiles (tmm6-7), each A and B tile used twice per load;
 * a contraction of one or two k-tiles (head_dim up to 64) goes row block by row block instead, A
 * held in tiles (amx_short_row).
 * One configuration for the whole call: every tile 16 rows of 64 bytes; ragged edges are padded
 * with zeros in scratch blocks instead:
 *   A     a whole 32-row block of a rows-layout A (aks == 1) whose pair steps fill whole tiles
 *         (K2 a multiple of 16) is loaded in place (stride ars); any other block is copied, for
 *         every pair step, into a zeroed panel of 16 x 16 word tiles (rows past M and pair steps
 *         past K2 stay 0). This is also where a transposed A (aks != 1, the backward's P^T and
 *         dS^T operands) becomes rows: the panel is always rows layout. On the AMX Xeon (one
 *         thread, 192 x 192 block, d = 64) the copy took S = K Q^T from 5.5 to 7.2 us, the
 *         transposition of P^T in the forward's old O += P V 1.9 us of 8.1 (bench/amx_probe.c).
 *   B     a 16 x 16 word tile wholly inside K2 x N is loaded from B itself (stride ldb); an edge
 *         tile is copied into a zeroed scratch tile first (rows past K2 and columns past N 0), so
 *         no load reads past the operand and no padding product meets a non-zero (or NaN) value.
 *   C     a whole 32 x 32 block of C with alpha 1 is loaded into the accumulators (accumulate) or
 *         they start at zero, and they are stored straight to C; any other block's accumulators
 *         start at zero, are stored to a 32 x 32 fp32 scratch block, and its M x N part is written
 *         as alpha AB (+ C when accumulate), as the VDPBF16PS kernel does. (So a whole block sums
 *         C into the products as TDPBF16PS goes; an edge block adds C once at the end.)
 * A contraction longer than AMX_KMAX pair words runs in passes of AMX_KMAX, each after the first
 * accumulating into C (the panel stays within 16 KiB of stack). Each pass loads its configuration
 * (LDTILECFG) and ends with TILERELEASE: the tile state is per thread, and OpenMP threads call this
 * concurrently. Nothing is read from A past row M - 1 (the table's mr is 0). */
#include <string.h>

#include "kernels/amx_tiles.h"
#include "kernels/attn_bf16.h"

#define AMX_KMAX 128 /* pair words of the contraction per pass: 8 k-tiles, a 16 KiB A panel */
#define TM_C00 0     /* accumulators: rows 0-15 / 16-31 x columns 0-15 / 16-31 of the block */
#define TM_C01 1
#define TM_C10 2
#define TM_C11 3
#define TM_A0 4 /* rows 0-15 of the A block */
#define TM_A1 5 /* rows 16-31 */
#define TM_B0 6 /* columns 0-15 of the B block */
#define TM_B1 7 /* columns 16-31 */
#define TILE_BYTES 64 /* bytes per tile row: 16 pair words or 16 fp32 */

typedef bf16_pair AmxWordTile[16][16]; /* 16 rows of 16 pair words: one A or B tile */

/* The rows of A m0 .. m0 + mrows - 1 (mrows <= 32), pair steps 0 .. K2 - 1, as rows-layout tiles
 * panel[kt][half] (half 0: rows 0-15 of the block, 1: rows 16-31), zero outside. */
static void amx_pack_a(AmxWordTile (*panel)[2], int K2, int mrows, const bf16_pair *A, size_t ars, size_t aks) {
    const int kt_n = (K2 + 15) / 16;
    memset(panel, 0, sizeof(AmxWordTile) * 2 * (size_t)kt_n);
    if (aks == 1) { /* rows layout: each row's pair steps are contiguous */
        for (int r = 0; r < mrows; r++) {
            const bf16_pair *src = A + (size_t)r * ars;
            for (int kt = 0; kt < kt_n; kt++) {
                const int k0 = kt * 16, kc = K2 - k0 < 16 ? K2 - k0 : 16;
                memcpy(panel[kt][r / 16][r % 16], src + k0, sizeof(bf16_pair) * (size_t)kc);
            }
        }
    } else { /* transposed (ars == 1): each pair step's rows are contiguous; whole 16 x 16 blocks are
              * transposed in registers, edge blocks word by word */
        for (int kt = 0; kt < kt_n; kt++) {
            const int k0 = kt * 16, kc = K2 - k0 < 16 ? K2 - k0 : 16;
            for (int h = 0; h * 16 < mrows; h++) {
                const int r0 = h * 16, rc = mrows - r0 < 16 ? mrows - r0 : 16;
                const bf16_pair *src = A + (size_t)k0 * aks + r0;
                if (kc == 16 && rc == 16) {
                    attn_bf16_transpose16_avx512(src, aks, panel[kt][h]);
                    continue;
                }
                for (int k = 0; k < kc; k++)
                    for (int r = 0; r < rc; r++) panel[kt][h][r][k] = src[(size_t)k * aks + r];
            }
        }
    }
}

/* Where B's tile of pair steps k0 .. k0 + 15 and columns n0 .. n0 + 15 loads from: B itself when
 * the tile lies inside K2 x N, else `edge` filled with its part of B and zeros. */
static const bf16_pair *amx_b_tile(const bf16_pair *B, size_t ldb, int K2, int N, int k0, int n0, AmxWordTile edge,
                                   long *stride) {
    const int kc = K2 - k0 < 16 ? K2 - k0 : 16, nc = N - n0 < 16 ? N - n0 : 16;
    if (kc == 16 && nc == 16) {
        *stride = (long)(ldb * sizeof(bf16_pair));
        return B + (size_t)k0 * ldb + n0;
    }
    memset(edge, 0, sizeof(AmxWordTile));
    for (int k = 0; k < kc; k++) memcpy(edge[k], B + (size_t)(k0 + k) * ldb + n0, sizeof(bf16_pair) * (size_t)nc);
    *stride = TILE_BYTES;
    return &edge[0][0];
}

/* A row block of C against a contraction of one or two k-tiles (K2 <= 32 pair words: head_dim up to
 * 64, as in the forward's S = K Q^T and the backward's S and dP there): A's tiles (both halves, both
 * k-tiles) stay in tmm4-7 for the whole row, and C goes 16 columns at a time as two accumulators
 * (tmm0-1, the block's two halves) from one or two B tiles (tmm2-3). Half a tile load per product,
 * where the 32 x 32 blocks' 2 x 2 scheme loads a tile per product and stores its four accumulators
 * after only eight products at d = 64: on the AMX Xeon (one thread, the forward's 192 x 192 S = K
 * Q^T at d = 64) 865-899 -> 938-971 GFLOPS in a harness of both. The same products in the same
 * order per element, and C taken in at the same point, so bit for bit the same C. */
static void amx_short_row(int mrows, int N, int K2, int kt_n, const bf16_pair *a_base, size_t a_half, size_t a_kt,
                          long a_stride, const bf16_pair *B, size_t ldb, float alpha, int accumulate, float *Cm,
                          size_t ldc, AmxWordTile bedge[2], float (*cblock)[32], Prefetch *pf, int pf_per_call) {
    const int two_m = mrows > 16, two_k = kt_n > 1;
    const long cstride = (long)(ldc * sizeof(float));
    TILE_LOAD(4, a_base, a_stride);
    if (two_k) TILE_LOAD(5, a_base + a_kt, a_stride);
    if (two_m) {
        TILE_LOAD(6, a_base + a_half, a_stride);
        if (two_k) TILE_LOAD(7, a_base + a_half + a_kt, a_stride);
    }
    for (int n0 = 0; n0 < N; n0 += 16) {
        const int ncols = N - n0 < 16 ? N - n0 : 16;
        if (pf && n0 % 32 == 0) prefetch_some(pf, pf_per_call);
        float *cb = Cm + n0;
        /* C in place (its tiles loaded, accumulated into and stored) exactly where amx_gemm_pass's
         * 32 x 32 blocks do it, a whole block with alpha 1, so that every element's sum is the one
         * that path makes; elsewhere the products start at zero and alpha AB (+ C) is added after */
        const int direct = alpha == 1.0f && mrows == 32 && (n0 & ~31) + 32 <= N;
        if (direct && accumulate) {
            TILE_LOAD(0, cb, cstride);
            if (two_m) TILE_LOAD(1, cb + 16 * ldc, cstride);
        } else {
            TILE_ZERO(0);
            if (two_m) TILE_ZERO(1);
        }
        long s0, s1;
        const bf16_pair *b0 = amx_b_tile(B, ldb, K2, N, 0, n0, bedge[0], &s0);
        TILE_LOAD(2, b0, s0);
        TILE_DP(0, 4, 2);
        if (two_m) TILE_DP(1, 6, 2);
        if (two_k) {
            const bf16_pair *b1 = amx_b_tile(B, ldb, K2, N, 16, n0, bedge[1], &s1);
            TILE_LOAD(3, b1, s1);
            TILE_DP(0, 5, 3);
            if (two_m) TILE_DP(1, 7, 3);
        }
        if (direct) {
            TILE_STORE(0, cb, cstride);
            if (two_m) TILE_STORE(1, cb + 16 * ldc, cstride);
            continue;
        }
        TILE_STORE(0, &cblock[0][0], 32 * sizeof(float));
        if (two_m) TILE_STORE(1, &cblock[16][0], 32 * sizeof(float));
        for (int r = 0; r < mrows; r++) {
            float *cr = cb + (size_t)r * ldc;
            const float *br = cblock[r];
            if (accumulate)
                for (int c = 0; c < ncols; c++) cr[c] = alpha * br[c] + cr[c];
            else
                for (int c = 0; c < ncols; c++) cr[c] = alpha * br[c];
        }
    }
}

/* One pass: K2 in 1 .. AMX_KMAX. */
static void amx_gemm_pass(int M, int N, int K2, float alpha, const bf16_pair *A, size_t ars, size_t aks,
                          const bf16_pair *B, size_t ldb, int accumulate, float *C, size_t ldc, Prefetch *pf) {
    _Alignas(64) AmxWordTile panel[AMX_KMAX / 16][2];
    _Alignas(64) AmxWordTile bedge[2];
    _Alignas(64) float cblock[32][32];
    _Alignas(64) AmxTileConfig cfg;
    const int kt_n = (K2 + 15) / 16;
    const int n_calls = ((M + 31) / 32) * ((N + 31) / 32);
    const int pf_per_call = pf ? (pf->total - pf->next + n_calls - 1) / n_calls : 0;
    /* a rows-layout A whose pair steps fill whole tiles is loaded in place, 32 rows at a time */
    const int a_rows_whole = aks == 1 && K2 % 16 == 0;
    amx_config_uniform(&cfg, AMX_TILES, 16, TILE_BYTES);
    TILE_CONFIG(&cfg);
    for (int m0 = 0; m0 < M; m0 += 32) {
        const int mrows = M - m0 < 32 ? M - m0 : 32, two_m = mrows > 16;
        /* A's tile (kt, half) is at a_base + (half * 16 rows + kt * 16 words), rows a_stride apart */
        const int a_direct = a_rows_whole && mrows == 32;
        const bf16_pair *a_base = a_direct ? A + (size_t)m0 * ars : &panel[0][0][0][0];
        const size_t a_half = a_direct ? 16 * ars : 16 * 16, a_kt = a_direct ? 16 : 2 * 16 * 16;
        const long a_stride = a_direct ? (long)(ars * sizeof(bf16_pair)) : TILE_BYTES;
        if (!a_direct) amx_pack_a(panel, K2, mrows, A + (size_t)m0 * ars, ars, aks);
        if (kt_n <= 2) {
            amx_short_row(mrows, N, K2, kt_n, a_base, a_half, a_kt, a_stride, B, ldb, alpha, accumulate,
                          C + (size_t)m0 * ldc, ldc, bedge, cblock, pf, pf_per_call);
            continue;
        }
        for (int n0 = 0; n0 < N; n0 += 32) {
            const int ncols = N - n0 < 32 ? N - n0 : 32, two_n = ncols > 16;
            if (pf) prefetch_some(pf, pf_per_call);
            /* a whole 32 x 32 block with alpha 1 accumulates in place: the tiles start from C and
             * are stored back to C (no pass over a scratch block) */
            float *cb = C + (size_t)m0 * ldc + n0;
            const long cstride = (long)(ldc * sizeof(float));
            const int direct = alpha == 1.0f && mrows == 32 && ncols == 32;
            if (direct && accumulate) {
                TILE_LOAD(TM_C00, cb, cstride);
                TILE_LOAD(TM_C01, cb + 16, cstride);
                TILE_LOAD(TM_C10, cb + 16 * ldc, cstride);
                TILE_LOAD(TM_C11, cb + 16 * ldc + 16, cstride);
            } else {
                TILE_ZERO(TM_C00);
                if (two_n) TILE_ZERO(TM_C01);
                if (two_m) TILE_ZERO(TM_C10);
                if (two_m && two_n) TILE_ZERO(TM_C11);
            }
            if (two_m && two_n) {
                /* every tile present: the loads of the next pair step are interleaved with this
                 * step's products (each waits only for the products that read its tile before;
                 * bench/amx_probe.c on the AMX Xeon, one reading each: as fast as loading a step's
                 * four tiles up front at d = 64, 2.3x as fast at d = 128) */
                long s0, s1;
                const bf16_pair *b0 = amx_b_tile(B, ldb, K2, N, 0, n0, bedge[0], &s0);
                TILE_LOAD(TM_A0, a_base, a_stride);
                TILE_LOAD(TM_B0, b0, s0);
                for (int kt = 0; kt < kt_n; kt++) {
                    const bf16_pair *a1 = a_base + (size_t)kt * a_kt + a_half;
                    const bf16_pair *b1 = amx_b_tile(B, ldb, K2, N, kt * 16, n0 + 16, bedge[1], &s1);
                    TILE_LOAD(TM_B1, b1, s1);
                    TILE_DP(TM_C00, TM_A0, TM_B0);
                    TILE_LOAD(TM_A1, a1, a_stride);
                    TILE_DP(TM_C01, TM_A0, TM_B1);
                    TILE_DP(TM_C10, TM_A1, TM_B0);
                    if (kt + 1 < kt_n) {
                        TILE_LOAD(TM_A0, a_base + (size_t)(kt + 1) * a_kt, a_stride);
                        TILE_DP(TM_C11, TM_A1, TM_B1);
                        b0 = amx_b_tile(B, ldb, K2, N, (kt + 1) * 16, n0, bedge[0], &s0);
                        TILE_LOAD(TM_B0, b0, s0);
                    } else {
                        TILE_DP(TM_C11, TM_A1, TM_B1);
                    }
                }
            } else {
                for (int kt = 0; kt < kt_n; kt++) {
                    long s0, s1 = 0;
                    const bf16_pair *b0 = amx_b_tile(B, ldb, K2, N, kt * 16, n0, bedge[0], &s0);
                    const bf16_pair *b1 = two_n ? amx_b_tile(B, ldb, K2, N, kt * 16, n0 + 16, bedge[1], &s1) : NULL;
                    TILE_LOAD(TM_A0, a_base + (size_t)kt * a_kt, a_stride);
                    TILE_LOAD(TM_B0, b0, s0);
                    TILE_DP(TM_C00, TM_A0, TM_B0);
                    if (two_n) {
                        TILE_LOAD(TM_B1, b1, s1);
                        TILE_DP(TM_C01, TM_A0, TM_B1);
                    }
                    if (two_m) {
                        TILE_LOAD(TM_A1, a_base + (size_t)kt * a_kt + a_half, a_stride);
                        TILE_DP(TM_C10, TM_A1, TM_B0);
                        if (two_n) TILE_DP(TM_C11, TM_A1, TM_B1);
                    }
                }
            }
            if (direct) {
                TILE_STORE(TM_C00, cb, cstride);
                TILE_STORE(TM_C01, cb + 16, cstride);
                TILE_STORE(TM_C10, cb + 16 * ldc, cstride);
                TILE_STORE(TM_C11, cb + 16 * ldc + 16, cstride);
                continue;
            }
            TILE_STORE(TM_C00, &cblock[0][0], sizeof cblock[0]);
            if (two_n) TILE_STORE(TM_C01, &cblock[0][16], sizeof cblock[0]);
            if (two_m) TILE_STORE(TM_C10, &cblock[16][0], sizeof cblock[0]);
            if (two_m && two_n) TILE_STORE(TM_C11, &cblock[16][16], sizeof cblock[0]);
            for (int r = 0; r < mrows; r++) {
                float *cr = C + (size_t)(m0 + r) * ldc + n0;
                const float *br = cblock[r];
                if (accumulate)
                    for (int c = 0; c < ncols; c++) cr[c] = alpha * br[c] + cr[c];
                else
                    for (int c = 0; c < ncols; c++) cr[c] = alpha * br[c];
            }
        }
    }
    TILE_RELEASE();
}

static void amx_tile_gemm(int M, int N, int K2, float alpha, const bf16_pair *A, size_t ars, size_t aks,
                          const bf16_pair *B, size_t ldb, int accumulate, float *C, size_t ldc, Prefetch *pf) {
    if (tile_gemm_trivial(M, N, K2, accumulate, C, ldc)) return;
    for (int k0 = 0; k0 < K2; k0 += AMX_KMAX) {
        const int kc = K2 - k0 < AMX_KMAX ? K2 - k0 : AMX_KMAX;
        amx_gemm_pass(M, N, kc, alpha, A + (size_t)k0 * aks, ars, aks, B + (size_t)k0 * ldb, ldb, accumulate || k0 > 0,
                      C, ldc, k0 == 0 ? pf : NULL);
    }
}

/* Tile sizes (multiples of the 32 x 32 block) and packers: the VDPBF16PS table's
 * (ATTN_BF16_SHARED_FIELDS); the sizes are untuned on AMX. */
const AttnBf16Tiles AMX_TABLE = {
    .name = AMX_TABLE_NAME,
    .mr = 0,
    .rows_align = 16,
    .fwd_acc_transposed = 1,
    .bwd_acc_transposed = 1,
    .tile_gemm = amx_tile_gemm,
    ATTN_BF16_SHARED_FIELDS,
};
