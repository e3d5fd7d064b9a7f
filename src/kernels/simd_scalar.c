/* The portable kernel table (isa.h): simd_body.h with one-lane "vectors", plain C that runs on
 * any CPU (the compiler may still use the baseline's SSE). The reference the other paths are
 * tested against besides the double-precision references of the tests. */
#include <math.h>

#include "kernels/isa.h"

typedef float V;
typedef int VM;
#define VL 1
#define vzero() 0.0f
#define vset1(x) ((float)(x))
#define vload(p) (*(p))
#define vstore(p, x) (*(p) = (x))
#define vmask(n) ((n) > 0)
#define vload_m(p, m) ((m) ? *(p) : 0.0f)
#define vstore_m(p, m, x) do { if (m) *(p) = (x); } while (0)
#define vsel_m(m, x) ((m) ? (x) : 0.0f)
#define vadd(a, b) ((a) + (b))
#define vsub(a, b) ((a) - (b))
#define vmul(a, b) ((a) * (b))
#define vdiv(a, b) ((a) / (b))
#define vfma(a, b, c) ((a) * (b) + (c))
#define vmax(a, b) ((b) > (a) ? (b) : (a))
#define vmin(a, b) ((b) < (a) ? (b) : (a))
#define vsqrt(a) sqrtf(a)
#define vhsum(a) (a)
#define vhmax(a) (a)
#define vexp2(x) sb_exp2f(x)
#define vexp2_bounded(x) sb_exp2f(x)
#define GEMM_MR 4
#define GEMM_NV 4
#define SIMD_FWD_BQ 256
#define SIMD_FWD_BK 192
#define SIMD_BWD_BK 144
#define SIMD_BWD_BQ 120
#define SIMD_TABLE simd_kernels_scalar
#define SIMD_LEVEL ISA_SCALAR
static inline float sb_exp2f(float x);

#include "kernels/simd_body.h"
