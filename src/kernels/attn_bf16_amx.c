/* The AMX-BF16 tiles of bf16 attention on hardware: the kernel of attn_bf16_amx_body.h built on the
 * tile instructions themselves (gcc's intrinsics; this file alone is compiled with -mamx-tile
 * -mamx-bf16 and AVX-512, see the Makefile). Reached only through attn_bf16_tiles() when the CPU
 * reports AMX-BF16, Linux granted the tile-data permission (kernels/isa.h: amx_available) and the
 * kernel path allows it (SEQPAR_ISA unset or amx). The same source built on the C emulation of the
 * instructions is attn_bf16_amx_emulated.c, which the tests run everywhere.
 *
 * gcc 12's TILELOADD and LDTILECFG intrinsics are asm statements that tell the compiler they read
 * only their address registers (LDTILECFG: 8 bytes of the configuration), not the memory behind
 * them: a compiler barrier before each keeps the stores that fill the configuration, the A panel
 * and the edge tiles in front of the instruction that reads them, and one after each load keeps
 * the next refill of an edge tile behind it. TILESTORED clobbers memory itself. */
#include <immintrin.h>

#define TILE_BARRIER() __asm__ volatile("" ::: "memory")
#define TILE_CONFIG(cfg) do { TILE_BARRIER(); _tile_loadconfig(cfg); } while (0)
#define TILE_ZERO(t) _tile_zero(t)
#define TILE_LOAD(t, base, stride) do { TILE_BARRIER(); _tile_loadd(t, base, stride); TILE_BARRIER(); } while (0)
#define TILE_DP(dst, a, b) _tile_dpbf16ps(dst, a, b)
#define TILE_STORE(t, base, stride) _tile_stored(t, base, stride)
#define TILE_RELEASE() _tile_release()
#define AMX_TABLE attn_bf16_tiles_amx
#define AMX_TABLE_NAME "bf16 tiles (AMX)"

#include "kernels/attn_bf16_amx_body.h"
