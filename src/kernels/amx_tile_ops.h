/* The tile operations the AMX kernels are written against (TILE_CONFIG, TILE_ZERO, TILE_LOAD,
 * TILE_DP, TILE_STORE, TILE_RELEASE; tile numbers literal constants, strides in bytes), as macros
 * over one of the two implementations of kernels/amx_tiles.h: the instructions themselves (gcc's
 * intrinsics; the including file must be compiled with -mamx-tile -mamx-bf16) or, where the
 * includer defines AMX_TILE_OPS_EMULATED first, their C emulation (amx_emulate.c). Included by the
 * attention tiles (attn_bf16_amx.c, attn_bf16_amx_emulated.c) and bench/amx_probe.c.
 *
 * gcc 12's TILELOADD and LDTILECFG intrinsics are asm statements that tell the compiler they read
 * only their address registers (LDTILECFG: 8 bytes of the configuration), not the memory behind
 * them: a compiler barrier before each keeps the stores that fill the configuration, an A panel
 * or an edge tile in front of the instruction that reads them, and one after each load keeps the
 * next refill of a scratch tile behind it. TILESTORED clobbers memory itself. */
#ifndef SEQPAR_AMX_TILE_OPS_H
#define SEQPAR_AMX_TILE_OPS_H

#include "kernels/amx_tiles.h"

#ifdef AMX_TILE_OPS_EMULATED
#define TILE_CONFIG(cfg) amx_emu_ldtilecfg(cfg)
#define TILE_ZERO(t) amx_emu_tilezero(t)
#define TILE_LOAD(t, base, stride) amx_emu_tileloadd(t, base, (long)(stride))
#define TILE_DP(dst, a, b) amx_emu_tdpbf16ps(dst, a, b)
#define TILE_STORE(t, base, stride) amx_emu_tilestored(t, base, (long)(stride))
#define TILE_RELEASE() amx_emu_tilerelease()
#else
#include <immintrin.h>
#define TILE_BARRIER() __asm__ volatile("" ::: "memory")
#define TILE_CONFIG(cfg) do { TILE_BARRIER(); _tile_loadconfig(cfg); } while (0)
#define TILE_ZERO(t) _tile_zero(t)
#define TILE_LOAD(t, base, stride) do { TILE_BARRIER(); _tile_loadd(t, base, stride); TILE_BARRIER(); } while (0)
#define TILE_DP(dst, a, b) _tile_dpbf16ps(dst, a, b)
#define TILE_STORE(t, base, stride) _tile_stored(t, base, stride)
#define TILE_RELEASE() _tile_release()
#endif

#endif
