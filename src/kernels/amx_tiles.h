/* The AMX tile operations the bf16 attention tiles use (kernels/attn_bf16_amx_body.h), as one small
 * interface with two implementations:
 *   - hardware (attn_bf16_amx.c): the instructions themselves, through gcc's intrinsics
 *     (LDTILECFG, TILEZERO, TILELOADD, TDPBF16PS, TILESTORED, TILERELEASE);
 *   - emulation (amx_emulate.c, used by attn_bf16_amx_emulated.c): portable C that follows the
 *     instructions' documented semantics (Intel SDM vol. 2, and the Intrinsics Guide's operation
 *     text), so that the same kernel source runs, and is tested, on CPUs without AMX.
 * Here: the 64-byte tile configuration LDTILECFG reads, and the emulation's entry points.
 *
 * Tile configuration (palette 1): byte 0 palette id, byte 1 start row, bytes 2-15 reserved (0),
 * bytes 16-47 colsb[16] (uint16: bytes per row of tile i), bytes 48-63 rows[16] (uint8). Palette 1
 * has 8 tiles (tmm0-tmm7) of at most 16 rows of 64 bytes; entries 8-15 must be 0. Strides of
 * loads and stores are in bytes.
 *
 * Not here: AMX-INT8 (TDPBSSD and friends), palette 0 beyond "release", start_row restarts after
 * a fault (the emulation requires start_row 0, as every configuration this project writes). */
#ifndef SEQPAR_AMX_TILES_H
#define SEQPAR_AMX_TILES_H

#include <stddef.h>
#include <stdint.h>

#define AMX_TILES 8       /* tile registers of palette 1 */
#define AMX_MAX_ROWS 16   /* rows per tile */
#define AMX_MAX_COLSB 64  /* bytes per tile row */

typedef struct {
    uint8_t palette_id;
    uint8_t start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} AmxTileConfig;

_Static_assert(sizeof(AmxTileConfig) == 64, "LDTILECFG reads 64 bytes");
_Static_assert(offsetof(AmxTileConfig, colsb) == 16, "colsb[] starts at byte 16");
_Static_assert(offsetof(AmxTileConfig, rows) == 48, "rows[] starts at byte 48");

/* Palette 1 with tiles 0 .. n-1 of `rows` rows and `colsb` bytes per row, the rest unused (0). */
static inline void amx_config_uniform(AmxTileConfig *cfg, int n, int rows, int colsb) {
    unsigned char *raw = (unsigned char *)cfg;
    for (size_t i = 0; i < sizeof *cfg; i++) raw[i] = 0;
    cfg->palette_id = 1;
    for (int t = 0; t < n; t++) {
        cfg->rows[t] = (uint8_t)rows;
        cfg->colsb[t] = (uint16_t)colsb;
    }
}

/* The emulation (amx_emulate.c): the calling thread's tile state, as the hardware keeps one per
 * thread. Each function does what its instruction does, including the checks after which the
 * instruction faults (#GP for a bad configuration, #UD for a tile operation without a
 * configuration or with operands whose shapes disagree): there the emulation ends the process with
 * one line naming the instruction and the fault, so a kernel that would fault on hardware fails its
 * test here. Memory is read and written exactly where the instruction would (rows x colsb bytes at
 * base + row * stride), so AddressSanitizer sees the kernel's real footprint. */
void amx_emu_ldtilecfg(const void *config);
void amx_emu_tilerelease(void);
void amx_emu_tilezero(int t);
void amx_emu_tileloadd(int t, const void *base, long stride);
void amx_emu_tilestored(int t, void *base, long stride);
void amx_emu_tdpbf16ps(int dst, int src1, int src2);
/* For tests: 1 when the calling thread has a tile configuration loaded (0 after TILERELEASE). */
int amx_emu_configured(void);

#endif
