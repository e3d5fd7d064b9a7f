/* A portable C emulation of the AMX tile instructions the bf16 attention tiles use (amx_tiles.h),
 * so that the AMX kernel (attn_bf16_amx_body.h) runs and is tested on CPUs without AMX. It follows
 * the instructions' documented operation (Intel SDM vol. 2; Intrinsics Guide):
 *   LDTILECFG   checks the configuration (#GP: palette other than 0 or 1, reserved bytes not 0,
 *               rows > 16 or colsb > 64, a tile with rows but no colsb or the reverse, entries of
 *               tiles 8-15 not 0), zeroes every tile; palette 0 is the init state (no tiles).
 *   TILERELEASE back to the init state.
 *   TILEZERO    zeroes a tile.
 *   TILELOADD   rows[t] rows of colsb[t] bytes from base + row * stride; the rest of each row and
 *               the rows beyond rows[t] read as zero.
 *   TILESTORED  rows[t] rows of colsb[t] bytes to base + row * stride.
 *   TDPBF16PS   #UD unless dst.colsb, src1.colsb are multiples of 4, src1.colsb / 4 == src2.rows,
 *               dst.rows == src1.rows, dst.colsb == src2.colsb, and the three tiles differ; then
 *               per row m of dst, two fp32 sums per column n, from zero, over the pair steps k:
 *                 even[n] += bf16(src1[m][2k])   * bf16(src2[k][2n])
 *                 odd[n]  += bf16(src1[m][2k+1]) * bf16(src2[k][2n+1])
 *               (fused multiply-adds), then dst[m][n] += even[n] + odd[n]; every step in fp32,
 *               round to nearest even, denormal inputs read as zero (DAZ), denormal results
 *               flushed to zero (FTZ), MXCSR ignored; the bytes of dst beyond colsb and the rows
 *               beyond rows are zeroed. This is the SDM's operation; the Intrinsics Guide's shorter
 *               text adds both products straight into dst[m][n], a different order of the same
 *               sums (within every tolerance this project's tests state).
 * Every tile operation without a loaded configuration, or on a tile with no rows, is #UD. A fault
 * ends the process with one line (die) naming the instruction and the reason.
 *
 * The product of two bf16 values (8 significant bits each) is exact in fp32 unless it leaves the
 * normal range, so each step is one rounding: the emulation computes it as a product then a sum,
 * which equals the fused operation for every product in the normal fp32 range (the products of
 * attention's operands: |values| far from 2^-126). Not here: AMX-INT8, AMX-FP16, start_row restarts. */
#include "kernels/amx_tiles.h"

#include <float.h>
#include <math.h>
#include <string.h>

#include "core/common.h"

typedef struct {
    int configured;
    AmxTileConfig cfg;
    _Alignas(64) unsigned char tile[AMX_TILES][AMX_MAX_ROWS][AMX_MAX_COLSB];
} AmxEmuState;

static _Thread_local AmxEmuState g_emu; /* one tile state per thread, as the hardware's */

static void check_tile(const char *insn, int t) {
    if (!g_emu.configured) die("AMX emulation: %s without a tile configuration (#UD: LDTILECFG first)", insn);
    if (t < 0 || t >= AMX_TILES) die("AMX emulation: %s names tmm%d (palette 1 has tmm0-tmm7)", insn, t);
    if (!g_emu.cfg.rows[t]) die("AMX emulation: %s on tmm%d, which the configuration leaves unused (#UD)", insn, t);
}

void amx_emu_ldtilecfg(const void *config) {
    AmxTileConfig c;
    memcpy(&c, config, sizeof c);
    if (c.palette_id == 0) { /* the init state */
        amx_emu_tilerelease();
        return;
    }
    if (c.palette_id != 1) die("AMX emulation: LDTILECFG palette %d (#GP: this CPU model has palette 1)", c.palette_id);
    if (c.start_row != 0) die("AMX emulation: LDTILECFG start_row %d (this project never restarts a load)", c.start_row);
    for (int i = 0; i < 14; i++)
        if (c.reserved[i]) die("AMX emulation: LDTILECFG reserved byte %d is %d (#GP: must be 0)", i + 2, c.reserved[i]);
    for (int t = 0; t < 16; t++) {
        if (t >= AMX_TILES) {
            if (c.rows[t] || c.colsb[t])
                die("AMX emulation: LDTILECFG tile %d has rows %d colsb %d (#GP: palette 1 has 8 tiles)", t, c.rows[t],
                    c.colsb[t]);
            continue;
        }
        if (c.rows[t] > AMX_MAX_ROWS || c.colsb[t] > AMX_MAX_COLSB)
            die("AMX emulation: LDTILECFG tile %d: %d rows of %d bytes (#GP: at most 16 of 64)", t, c.rows[t], c.colsb[t]);
        if ((c.rows[t] == 0) != (c.colsb[t] == 0))
            die("AMX emulation: LDTILECFG tile %d: %d rows of %d bytes (#GP: both 0 or neither)", t, c.rows[t], c.colsb[t]);
    }
    g_emu.cfg = c;
    g_emu.configured = 1;
    memset(g_emu.tile, 0, sizeof g_emu.tile);
}

void amx_emu_tilerelease(void) {
    memset(&g_emu, 0, sizeof g_emu);
}

int amx_emu_configured(void) { return g_emu.configured; }

void amx_emu_tilezero(int t) {
    check_tile("TILEZERO", t);
    memset(g_emu.tile[t], 0, sizeof g_emu.tile[t]);
}

void amx_emu_tileloadd(int t, const void *base, long stride) {
    check_tile("TILELOADD", t);
    const int rows = g_emu.cfg.rows[t], colsb = g_emu.cfg.colsb[t];
    memset(g_emu.tile[t], 0, sizeof g_emu.tile[t]);
    for (int r = 0; r < rows; r++) memcpy(g_emu.tile[t][r], (const char *)base + (long)r * stride, (size_t)colsb);
}

void amx_emu_tilestored(int t, void *base, long stride) {
    check_tile("TILESTORED", t);
    const int rows = g_emu.cfg.rows[t], colsb = g_emu.cfg.colsb[t];
    for (int r = 0; r < rows; r++) memcpy((char *)base + (long)r * stride, g_emu.tile[t][r], (size_t)colsb);
}

/* bf16 (the upper half of an fp32) to fp32, denormals as zero (DAZ) */
static inline float bf16_daz(uint16_t h) {
    if ((h & 0x7f80u) == 0) h &= 0x8000u;
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline float ftz(float x) { return fabsf(x) < FLT_MIN ? copysignf(0.0f, x) : x; }

void amx_emu_tdpbf16ps(int dst, int src1, int src2) {
    check_tile("TDPBF16PS", dst);
    check_tile("TDPBF16PS", src1);
    check_tile("TDPBF16PS", src2);
    const AmxTileConfig *c = &g_emu.cfg;
    if (dst == src1 || dst == src2 || src1 == src2)
        die("AMX emulation: TDPBF16PS tmm%d, tmm%d, tmm%d (#UD: the three tiles must differ)", dst, src1, src2);
    if (c->colsb[dst] % 4 || c->colsb[src1] % 4 || c->colsb[src1] / 4 != c->rows[src2] || c->rows[dst] != c->rows[src1] ||
        c->colsb[dst] != c->colsb[src2])
        die("AMX emulation: TDPBF16PS tmm%d (%dx%d B) += tmm%d (%dx%d B) tmm%d (%dx%d B): shapes disagree (#UD)", dst,
            c->rows[dst], c->colsb[dst], src1, c->rows[src1], c->colsb[src1], src2, c->rows[src2], c->colsb[src2]);
    const int M = c->rows[dst], K = c->colsb[src1] / 4, N = c->colsb[dst] / 4;
    float b[AMX_MAX_ROWS][2][16]; /* src2 as fp32: pair step k, half, column n */
    for (int k = 0; k < K; k++)
        for (int n = 0; n < N; n++) {
            uint16_t h[2];
            memcpy(h, g_emu.tile[src2][k] + 4 * n, 4);
            b[k][0][n] = bf16_daz(h[0]);
            b[k][1][n] = bf16_daz(h[1]);
        }
    for (int m = 0; m < M; m++) {
        float even[16] = {0}, odd[16] = {0}, c[16];
        for (int k = 0; k < K; k++) {
            uint16_t h[2];
            memcpy(h, g_emu.tile[src1][m] + 4 * k, 4);
            const float a0 = bf16_daz(h[0]), a1 = bf16_daz(h[1]);
            for (int n = 0; n < N; n++) {
                even[n] = ftz(even[n] + a0 * b[k][0][n]);
                odd[n] = ftz(odd[n] + a1 * b[k][1][n]);
            }
        }
        memcpy(c, g_emu.tile[dst][m], sizeof(float) * (size_t)N);
        for (int n = 0; n < N; n++) c[n] = ftz(ftz(c[n]) + ftz(even[n] + odd[n])); /* DAZ: dst is an input too */
        memset(g_emu.tile[dst][m], 0, AMX_MAX_COLSB);
        memcpy(g_emu.tile[dst][m], c, sizeof(float) * (size_t)N);
    }
    for (int m = M; m < AMX_MAX_ROWS; m++) memset(g_emu.tile[dst][m], 0, AMX_MAX_COLSB);
}
