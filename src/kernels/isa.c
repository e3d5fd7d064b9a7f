/* CPU feature detection and the choice of kernel table (see isa.h): CPUID through
 * __builtin_cpu_supports (which also checks that the OS saves the AVX and AVX-512 state), the
 * SEQPAR_ISA override, the tables that simd_scalar.c, simd_avx2.c and simd_avx512.c define, and
 * whether AMX can run (XCR0, the Linux tile-data permission). */
#include "kernels/isa.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#if defined(__linux__) && defined(__x86_64__)
#include <sys/syscall.h>
#include <unistd.h>
#define ARCH_GET_XCOMP_PERM 0x1022 /* asm/prctl.h (Linux 5.16) */
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILECFG 17 /* XSAVE state components of AMX: the configuration, the tile data */
#define XFEATURE_XTILEDATA 18
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

int amx_request_permission(char *why, size_t n) {
#if defined(__linux__) && defined(__x86_64__)
    unsigned long mask = 0;
    if (syscall(SYS_arch_prctl, ARCH_GET_XCOMP_PERM, &mask) == 0 && (mask >> XFEATURE_XTILEDATA & 1)) return 1;
    if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0) {
        if (why)
            snprintf(why, n, "Linux refused the AMX tile-data permission (arch_prctl ARCH_REQ_XCOMP_PERM: %s%s)",
                     strerror(errno), errno == EINVAL ? "; a kernel before 5.16, or a CPU without AMX" : "");
        return 0;
    }
    mask = 0;
    if (syscall(SYS_arch_prctl, ARCH_GET_XCOMP_PERM, &mask) != 0 || !(mask >> XFEATURE_XTILEDATA & 1)) {
        if (why) snprintf(why, n, "Linux granted the AMX tile-data permission but does not report it (ARCH_GET_XCOMP_PERM)");
        return 0;
    }
    return 1;
#else
    if (why) snprintf(why, n, "AMX needs Linux on x86-64 (the tile-data permission)");
    return 0;
#endif
}

static int g_amx_ok;
static char g_amx_why[200];
static pthread_once_t g_amx_once = PTHREAD_ONCE_INIT;

static void amx_setup(void) {
    const CpuFeatures *f = cpu_features();
    if (!f->amx_bf16) {
        snprintf(g_amx_why, sizeof g_amx_why, "CPU lacks amx_bf16");
        return;
    }
    if (!f->avx512_bf16) { /* the tiles' packers are AVX512_BF16 code */
        snprintf(g_amx_why, sizeof g_amx_why, "CPU lacks avx512_bf16, which the AMX tiles' packers use");
        return;
    }
#if defined(__x86_64__)
    unsigned a, b, c, d, lo, hi;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !((c >> 27) & 1)) { /* OSXSAVE: XGETBV is allowed */
        snprintf(g_amx_why, sizeof g_amx_why, "the OS does not enable XSAVE (no XGETBV)");
        return;
    }
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    (void)hi;
    if (((lo >> 17) & 3) != 3) {
        snprintf(g_amx_why, sizeof g_amx_why, "the OS does not enable the AMX tile state (XCR0 bits 17, 18)");
        return;
    }
#endif
    g_amx_ok = amx_request_permission(g_amx_why, sizeof g_amx_why);
}

int amx_available(char *why, size_t n) {
    pthread_once(&g_amx_once, amx_setup);
    if (!g_amx_ok && why) snprintf(why, n, "%s", g_amx_why);
    return g_amx_ok;
}

static SimdKernels g_tables[ISA_COUNT]; /* copies of TABLES: their attention tiles can be set */
static const SimdKernels *g_table;
static int g_forced; /* SEQPAR_ISA chose the level */
static int g_amx_on; /* AMX tiles allowed: SEQPAR_ISA unset or amx, and amx_available() */
static pthread_once_t g_table_once = PTHREAD_ONCE_INIT;

static long g_l2;             /* L2 bytes per core as sysconf reports them (<= 0: unknown) */
static int g_tiles_env;       /* SEQPAR_ATTN_TILES set the tiles */

const char *simd_attn_tiles_parse(const char *s, int out[4]) {
    int v[4], used = -1;
    const int plain = strspn(s, "0123456789,") == strlen(s); /* sscanf alone takes spaces and signs */
    if (!plain || sscanf(s, "%d,%d,%d,%d%n", &v[0], &v[1], &v[2], &v[3], &used) != 4 || used < 0 || s[used])
        return "SEQPAR_ATTN_TILES: expected four numbers fwd_bq,fwd_bk,bwd_bk,bwd_bq, e.g. 192,120,144,120";
    for (int i = 0; i < 4; i++)
        if (v[i] < 16 || v[i] > 512 || v[i] % 8)
            return "SEQPAR_ATTN_TILES: each tile size must be a multiple of 8 from 16 to 512";
    memcpy(out, v, sizeof v);
    return NULL;
}

/* Whether table k runs its small_l2 tiles: it has them, the L2 per core is known and small, and
 * SEQPAR_ATTN_TILES did not set the tiles. */
static int uses_small_l2(const SimdKernels *k) {
    return !g_tiles_env && k->small_l2[0] && g_l2 > 0 && g_l2 < ATTN_SMALL_L2_BYTES;
}

/* The attention tiles of every table: SEQPAR_ATTN_TILES, else small_l2 where the L2 is small. */
static void choose_tiles(void) {
    g_l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
    const char *env = getenv("SEQPAR_ATTN_TILES");
    int t[4] = {0};
    if (env && *env) { /* valid: choose() checked it (isa_env_check) */
        simd_attn_tiles_parse(env, t);
        g_tiles_env = 1;
    }
    for (int i = 0; i < ISA_COUNT; i++) {
        SimdKernels *k = &g_tables[i];
        const int *src = g_tiles_env ? t : uses_small_l2(k) ? k->small_l2 : NULL;
        if (!src) continue;
        k->fwd_bq = src[0], k->fwd_bk = src[1], k->bwd_bk = src[2], k->bwd_bq = src[3];
    }
}

void simd_attn_tiles_describe(char *buf, size_t n) {
    const SimdKernels *k = simd();
    char l2[48] = "L2 per core unknown";
    if (g_l2 > 0) snprintf(l2, sizeof l2, "L2 %ld KiB per core", g_l2 / 1024);
    snprintf(buf, n, "forward %d x %d, backward %d x %d (%s%s)", k->fwd_bq, k->fwd_bk, k->bwd_bk, k->bwd_bq, l2,
             g_tiles_env ? "; SEQPAR_ATTN_TILES" : uses_small_l2(k) ? "; the small-L2 tiles" : "");
}

int isa_env_check(char *err, size_t n) {
    const char *tiles = getenv("SEQPAR_ATTN_TILES"), *isa = getenv("SEQPAR_ISA");
    int t[4];
    const char *bad = tiles && *tiles ? simd_attn_tiles_parse(tiles, t) : NULL;
    if (bad) {
        snprintf(err, n, "%s (got '%.100s')", bad, tiles);
        return 1;
    }
    if (!isa || !*isa) return 0;
    char why[200];
    if (!strcmp(isa, "amx")) {
        if (amx_available(why, sizeof why)) return 0;
        snprintf(err, n, "SEQPAR_ISA=amx: this CPU cannot run it (%s)", why);
        return 1;
    }
    const int p = isa_parse(isa);
    if (p < 0) snprintf(err, n, "SEQPAR_ISA=%.100s is not a kernel path: use scalar, avx2, avx512 or amx", isa);
    else if (p > (int)isa_best())
        snprintf(err, n, "SEQPAR_ISA=%.100s: this CPU cannot run it (best available: %s)", isa, isa_name(isa_best()));
    return p < 0 || p > (int)isa_best();
}

static void choose(void) {
    char err[400]; /* the CLI checked these at start-up; a program without that call ends here */
    if (isa_env_check(err, sizeof err)) die("%s", err);
    for (int i = 0; i < ISA_COUNT; i++) g_tables[i] = *TABLES[i];
    choose_tiles();
    IsaLevel best = isa_best(), l = best;
    const char *env = getenv("SEQPAR_ISA");
    if (env && *env) { /* a path this CPU runs (isa_env_check) */
        if (!strcmp(env, "amx")) {
            g_amx_on = 1;
            l = ISA_AVX512;
        } else {
            l = (IsaLevel)isa_parse(env);
        }
        g_forced = 1;
    } else {
        g_amx_on = best == ISA_AVX512 && amx_available(NULL, 0);
    }
    g_table = &g_tables[l];
}

const SimdKernels *simd(void) {
    pthread_once(&g_table_once, choose);
    return g_table;
}

IsaLevel isa_active(void) { return simd()->level; }

int isa_force(IsaLevel l) {
    simd();
    if (l < 0 || l >= ISA_COUNT || l > isa_best()) return 0;
    g_table = &g_tables[l];
    return 1;
}

void simd_set_attn_tiles(int fwd_bq, int fwd_bk, int bwd_bk, int bwd_bq) {
    SimdKernels *t = &g_tables[simd()->level];
    t->fwd_bq = fwd_bq, t->fwd_bk = fwd_bk, t->bwd_bk = bwd_bk, t->bwd_bq = bwd_bq;
}

int isa_amx(void) { return simd()->level == ISA_AVX512 && g_amx_on; }

int isa_force_amx(int on) {
    simd();
    if (on && !amx_available(NULL, 0)) return 0;
    g_amx_on = on != 0;
    return 1;
}

const char *isa_path_name(void) { return isa_amx() ? "amx" : isa_name(isa_active()); }

void isa_describe(char *buf, size_t n) {
    const CpuFeatures *f = cpu_features();
    char amx[240] = "";
    if (f->amx_bf16 && !isa_amx()) { /* say why a CPU with AMX does not use it */
        char why[200];
        if (!amx_available(why, sizeof why)) snprintf(amx, sizeof amx, "; AMX unavailable: %s", why);
        else snprintf(amx, sizeof amx, "; AMX off%s", g_forced ? " (SEQPAR_ISA)" : "");
    }
    snprintf(buf, n, "%s%s (CPU: %s%s%s%s%s)", isa_amx() ? "avx512 + amx" : isa_name(isa_active()),
             g_forced ? ", forced by SEQPAR_ISA" : "", f->avx512 ? "avx2 avx512" : f->avx2 ? "avx2" : "no avx2",
             f->avx512_bf16 ? " avx512_bf16" : "", f->amx_bf16 ? " amx_bf16" : "", f->amx_bf16 ? "" : ", no amx", amx);
}
