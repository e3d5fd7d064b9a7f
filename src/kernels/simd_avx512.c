/* The AVX-512 kernel table (isa.h): simd_body.h on 16-lane __m512 vectors with mask registers
 * for the tails, a 6 x 64 micro-kernel (24 accumulators of the 32 registers: four B loads and
 * six broadcasts per 24 FMAs; on Zen 4 it measured a little ahead of 12 x 32, whose A block
 * and B panel of the P V product do not fit L1 together, and well ahead of 8 x 48). Built with -mavx512f -mavx512bw -mavx512dq -mavx512vl (Makefile);
 * only reached through isa.c when the CPU reports them and the OS saves their state. */
#include <immintrin.h>

#include "kernels/isa.h"

typedef __m512 V;
typedef __mmask16 VM;
#define VL 16
#define vzero() _mm512_setzero_ps()
#define vset1(x) _mm512_set1_ps(x)
#define vload(p) _mm512_loadu_ps(p)
#define vstore(p, x) _mm512_storeu_ps((p), (x))
#define vmask(n) ((__mmask16)((1u << (n)) - 1u))
#define vload_m(p, m) _mm512_maskz_loadu_ps((m), (p))
#define vstore_m(p, m, x) _mm512_mask_storeu_ps((p), (m), (x))
#define vsel_m(m, x) _mm512_maskz_mov_ps((m), (x))
#define vadd _mm512_add_ps
#define vsub _mm512_sub_ps
#define vmul _mm512_mul_ps
#define vdiv _mm512_div_ps
#define vfma _mm512_fmadd_ps
#define vmax _mm512_max_ps
#define vmin _mm512_min_ps
#define vsqrt _mm512_sqrt_ps
#define vhsum _mm512_reduce_add_ps
#define vhmax _mm512_reduce_max_ps
#ifndef GEMM_MR /* overridable for tuning experiments */
#define GEMM_MR 6
#define GEMM_NV 4
#endif
#ifndef SIMD_FWD_BQ /* forward 256 queries: measured ~7% ahead of 192 at S = 8192 (fewer K/V passes) */
#define SIMD_FWD_BQ 256
#define SIMD_FWD_BK 192
#define SIMD_BWD_BK 192
#define SIMD_BWD_BQ 96
#endif
#define SIMD_TABLE simd_kernels_avx512
#define SIMD_LEVEL ISA_AVX512

#include "kernels/avx512_exp2.h" /* vexp2 */

#include "kernels/simd_body.h"
