/* The AMX-BF16 tiles of bf16 attention on the C emulation of the tile instructions
 * (amx_emulate.c): the kernel of attn_bf16_amx_body.h, the same source as the hardware table
 * (attn_bf16_amx.c), built on kernels/amx_tile_ops.h's emulated operations, so that every CPU with
 * AVX512_BF16 (which the shared packers need) runs and tests the AMX kernel's indexing, padding,
 * transposition and edges. Far slower than either real kernel: tests only, never dispatched
 * (attn_bf16_tiles_for(ATTN_BF16_AMX_EMULATED)). */
#define AMX_TILE_OPS_EMULATED
#include "kernels/amx_tile_ops.h"

#define AMX_TABLE attn_bf16_tiles_amx_emulated
#define AMX_TABLE_NAME "bf16 tiles (AMX, emulated)"

#include "kernels/attn_bf16_amx_body.h"
