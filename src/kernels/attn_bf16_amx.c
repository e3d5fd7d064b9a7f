/* The AMX-BF16 tiles of bf16 attention on hardware: the kernel of attn_bf16_amx_body.h built on the
 * tile instructions themselves (kernels/amx_tile_ops.h; this file alone is compiled with -mamx-tile
 * -mamx-bf16 and AVX-512, see the Makefile). Reached only through attn_bf16_tiles() when the CPU
 * reports AMX-BF16, Linux granted the tile-data permission (kernels/isa.h: amx_available) and the
 * kernel path allows it (SEQPAR_ISA unset or amx). The same source built on the C emulation of the
 * instructions is attn_bf16_amx_emulated.c, which the tests run everywhere. */
#include "kernels/amx_tile_ops.h"

#define AMX_TABLE attn_bf16_tiles_amx
#define AMX_TABLE_NAME "bf16 tiles (AMX)"

#include "kernels/attn_bf16_amx_body.h"
