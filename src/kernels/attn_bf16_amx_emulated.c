/* The AMX-BF16 tiles of bf16 attention on the C emulation of the tile instructions
 * (amx_emulate.c): the kernel of attn_bf16_amx_body.h, the same source as the hardware table
 * (attn_bf16_amx.c), built on amx_tiles.h's emulated operations, so that every CPU with
 * AVX512_BF16 (which the shared packers need) runs and tests the AMX kernel's indexing, padding,
 * transposition and edges. Far slower than either real kernel: tests only, never dispatched
 * (attn_bf16_tiles_for(ATTN_BF16_AMX_EMULATED)). */
#include "kernels/amx_tiles.h"

#define TILE_CONFIG(cfg) amx_emu_ldtilecfg(cfg)
#define TILE_ZERO(t) amx_emu_tilezero(t)
#define TILE_LOAD(t, base, stride) amx_emu_tileloadd(t, base, stride)
#define TILE_DP(dst, a, b) amx_emu_tdpbf16ps(dst, a, b)
#define TILE_STORE(t, base, stride) amx_emu_tilestored(t, base, stride)
#define TILE_RELEASE() amx_emu_tilerelease()
#define AMX_TABLE attn_bf16_tiles_amx_emulated
#define AMX_TABLE_NAME "bf16 tiles (AMX, emulated)"

#include "kernels/attn_bf16_amx_body.h"
