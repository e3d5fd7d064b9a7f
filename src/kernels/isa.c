/* CPU feature detection and the choice of kernel table (see isa.h): CPUID through
 * __builtin_cpu_supports (which also checks that the OS saves the AVX and AVX-512 state), the
 * SEQPAR_ISA override, and the tables that simd_scalar.c, simd_avx2.c and simd_avx512.c define. */
#include "kernels/isa.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include "core/common.h"

extern const SimdKernels simd_kernels_scalar, simd_kernels_avx2, simd_kernels_avx512;

static const SimdKernels *const TABLES[ISA_COUNT] = {&simd_kernels_scalar, &simd_kernels_avx2, &simd_kernels_avx512};
static const char *const NAMES[ISA_COUNT] = {"scalar", "avx2", "avx512"};

static CpuFeatures g_features;
static pthread_once_t g_features_once = PTHREAD_ONCE_INIT;

static void detect(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    g_features.avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    g_features.avx512 = g_features.avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
    unsigned a, b, c, d;
    if (g_features.avx512 && __get_cpuid_count(7, 1, &a, &b, &c, &d)) g_features.avx512_bf16 = (a >> 5) & 1;
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) g_features.amx_bf16 = ((d >> 22) & 1) && ((d >> 24) & 1);
#endif
}

const CpuFeatures *cpu_features(void) {
    pthread_once(&g_features_once, detect);
    return &g_features;
}

IsaLevel isa_best(void) {
    const CpuFeatures *f = cpu_features();
    return f->avx512 ? ISA_AVX512 : f->avx2 ? ISA_AVX2 : ISA_SCALAR;
}

const char *isa_name(IsaLevel l) { return l >= 0 && l < ISA_COUNT ? NAMES[l] : "unknown"; }

int isa_parse(const char *name) {
    for (int i = 0; i < ISA_COUNT; i++)
        if (!strcmp(name, NAMES[i])) return i;
    return -1;
}

static const SimdKernels *g_table;
static int g_forced; /* SEQPAR_ISA chose the level */
static pthread_once_t g_table_once = PTHREAD_ONCE_INIT;

static void choose(void) {
    IsaLevel best = isa_best(), l = best;
    const char *env = getenv("SEQPAR_ISA");
    if (env && *env) {
        int p = isa_parse(env);
        if (p < 0) die("SEQPAR_ISA=%s is not a kernel path: use scalar, avx2 or avx512", env);
        if (p > (int)best)
            die("SEQPAR_ISA=%s: this CPU cannot run it (best available: %s)", env, isa_name(best));
        l = (IsaLevel)p;
        g_forced = 1;
    }
    g_table = TABLES[l];
}

const SimdKernels *simd(void) {
    pthread_once(&g_table_once, choose);
    return g_table;
}

IsaLevel isa_active(void) { return simd()->level; }

int isa_force(IsaLevel l) {
    simd();
    if (l < 0 || l >= ISA_COUNT || l > isa_best()) return 0;
    g_table = TABLES[l];
    return 1;
}

void isa_describe(char *buf, size_t n) {
    const CpuFeatures *f = cpu_features();
    IsaLevel l = isa_active();
    snprintf(buf, n, "%s%s (CPU: %s%s%s%s)", isa_name(l), g_forced ? ", forced by SEQPAR_ISA" : "",
             f->avx512 ? "avx2 avx512" : f->avx2 ? "avx2" : "no avx2", f->avx512_bf16 ? " avx512_bf16" : "",
             f->amx_bf16 ? " amx_bf16" : "", f->amx_bf16 ? "" : ", no amx");
}
