/* OpenBLAS's kernel choice checked against the CPU, and the CLI's one re-execution that corrects
 * it (see blas_core.h for why). */
#include "kernels/blas_core.h"

#include <cblas.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#define MARKER "SEQPAR_BLAS_REEXEC" /* set by the re-execution: the core OpenBLAS chose first */

static char g_fail[160]; /* why a wanted re-execution did not happen */

int blas_core_rank(const char *name) {
    static const struct {
        const char *name;
        int rank;
    } R[] = {{"cooperlake", 3}, {"sapphirerapids", 3}, {"skylakex", 2}, {"haswell", 1}, {"zen", 1}};
    if (!name) return 0;
    for (size_t i = 0; i < sizeof R / sizeof R[0]; i++)
        if (!strcasecmp(name, R[i].name)) return R[i].rank;
    return 0;
}

const char *blas_core_for(const CpuFeatures *f) {
    if (f->avx512 && f->avx512_bf16) return "Cooperlake";
    if (f->avx512) return "SkylakeX";
    if (f->avx2) return "Haswell";
    return NULL;
}

const char *blas_core_name(void) {
    const char *c = openblas_get_corename();
    return c ? c : "unknown";
}

const char *blas_core_plan(const char *current, const CpuFeatures *f, const char *coretype_env,
                           const char *mode_env, const char *reexec_marker) {
    if (reexec_marker) return NULL; /* once */
    if (mode_env && !strcmp(mode_env, "keep")) return NULL;
    int forced = mode_env && !strcmp(mode_env, "auto");
    if (coretype_env && *coretype_env && !forced) return NULL; /* the user's choice */
    const char *want = blas_core_for(f);
    if (!want || blas_core_rank(current) >= blas_core_rank(want)) return NULL;
    return want;
}

int blas_core_reexec_if_weak(char **argv, char *err, size_t n) {
    const char *mode = getenv("SEQPAR_BLAS_CORE");
    if (mode && strcmp(mode, "keep") && strcmp(mode, "auto")) {
        snprintf(err, n, "SEQPAR_BLAS_CORE=%s: the values are keep (OpenBLAS's own choice) and auto (the CPU's best); unset it for the default", mode);
        return -1;
    }
    const char *current = blas_core_name();
    const char *want = blas_core_plan(current, cpu_features(), getenv("OPENBLAS_CORETYPE"), mode, getenv(MARKER));
    if (!want) return 0;
    if (setenv(MARKER, current, 1) || setenv("OPENBLAS_CORETYPE", want, 1)) {
        snprintf(g_fail, sizeof g_fail, "could not set OPENBLAS_CORETYPE=%s: %s", want, strerror(errno));
        return 0;
    }
    fflush(NULL);
    execv("/proc/self/exe", argv);
    snprintf(g_fail, sizeof g_fail, "re-executing with OPENBLAS_CORETYPE=%s failed: %s", want, strerror(errno));
    unsetenv(MARKER);
    return 0;
}

void blas_version(char *buf, size_t n) { /* the first two words of the build's configuration */
    const char *cfg = openblas_get_config();
    size_t len = 0;
    for (int words = 0; cfg && cfg[len]; len++)
        if (cfg[len] == ' ' && ++words == 2) break;
    snprintf(buf, n, "%.*s", (int)(len < 40 ? len : 40), cfg ? cfg : "OpenBLAS");
}

void blas_describe(char *buf, size_t n) {
    char v[48];
    blas_version(v, sizeof v);
    const char *core = blas_core_name(), *first = getenv(MARKER);
    if (first && getenv("OPENBLAS_CORETYPE"))
        snprintf(buf, n, "%s core %s (OpenBLAS chose %s for this CPU; re-executed with OPENBLAS_CORETYPE=%s)", v, core,
                 first, getenv("OPENBLAS_CORETYPE"));
    else if (getenv("OPENBLAS_CORETYPE"))
        snprintf(buf, n, "%s core %s (OPENBLAS_CORETYPE=%s)", v, core, getenv("OPENBLAS_CORETYPE"));
    else
        snprintf(buf, n, "%s core %s", v, core);
}

void blas_core_warning(char *buf, size_t n) {
    const char *want = blas_core_for(cpu_features()), *core = blas_core_name();
    buf[0] = 0;
    if (!want || blas_core_rank(core) >= blas_core_rank(want)) return;
    if (g_fail[0])
        snprintf(buf, n, "warning: OpenBLAS runs its %s kernels, below this CPU's %s (%s): dense products run slower",
                 core, want, g_fail);
    else
        snprintf(buf, n,
                 "warning: OpenBLAS runs its %s kernels, below this CPU's %s: dense products run slower "
                 "(SEQPAR_BLAS_CORE=auto corrects it)",
                 core, want);
}
