/* The oneDNN library's one-time set-up, shared by its two users (the fp32 sgemm of sgemm.c and the bf16
 * matmul of bf16_gemm_onednn.c): its ISA cap, its version and the CPU engine and stream. */
#include "kernels/onednn.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/common.h"
#include "kernels/isa.h"

#define CHECK_DNNL(call) do { dnnl_status_t st_ = (call); \
    if (st_ != dnnl_success) die("oneDNN: %s failed with status %d", #call, (int)st_); } while (0)

static pthread_once_t g_setup_once = PTHREAD_ONCE_INIT;
static char g_version[32];
static dnnl_engine_t g_engine;
static dnnl_stream_t g_stream;

/* Before any other oneDNN call: cap its ISA below AMX when seqpar's AMX is off (SEQPAR_ISA), unless
 * the user set oneDNN's own variable; then the engine and stream. */
static void onednn_setup(void) {
    if (!isa_amx() && !getenv("DNNL_MAX_CPU_ISA") && !getenv("ONEDNN_MAX_CPU_ISA"))
        (void)dnnl_set_max_cpu_isa(dnnl_cpu_isa_avx512_core_bf16); /* refused only after an earlier oneDNN
                                                                     call (a benchmark's): onednn_isa() tells */
    const dnnl_version_t *v = dnnl_version();
    snprintf(g_version, sizeof g_version, "%d.%d.%d", v->major, v->minor, v->patch);
    CHECK_DNNL(dnnl_engine_create(&g_engine, dnnl_cpu, 0));
    CHECK_DNNL(dnnl_stream_create(&g_stream, g_engine, dnnl_stream_default_flags));
}

const char *onednn_version(void) {
    pthread_once(&g_setup_once, onednn_setup);
    return g_version;
}

const char *onednn_isa(void) {
    pthread_once(&g_setup_once, onednn_setup);
    switch (dnnl_get_effective_cpu_isa()) {
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
    case dnnl_cpu_isa_avx2: return "avx2";
    case dnnl_cpu_isa_avx: return "avx";
    case dnnl_cpu_isa_sse41: return "sse41";
    default: return "other";
    }
}

void onednn_engine(dnnl_engine_t *engine, dnnl_stream_t *stream) {
    pthread_once(&g_setup_once, onednn_setup);
    *engine = g_engine;
    *stream = g_stream;
}
