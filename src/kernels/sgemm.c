/* The linear layers' fp32 GEMM through oneDNN or OpenBLAS (see sgemm.h). */
#include "kernels/sgemm.h"

#include <cblas.h>
#include <oneapi/dnnl/dnnl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "core/op_clock.h"
#include "kernels/blas_core.h"
#include "kernels/onednn.h"

static SgemmLib g_lib = SGEMM_ONEDNN;

int sgemm_select_from_env(char *err, size_t n) {
    const char *e = getenv("SEQPAR_SGEMM");
    if (!e || !*e || !strcmp(e, "onednn")) g_lib = SGEMM_ONEDNN;
    else if (!strcmp(e, "openblas")) g_lib = SGEMM_OPENBLAS;
    else {
        snprintf(err, n, "SEQPAR_SGEMM=%s: the fp32 GEMM libraries are onednn (the default) and openblas", e);
        return -1;
    }
    return 0;
}

SgemmLib sgemm_lib(void) { return g_lib; }

const char *sgemm_lib_name(SgemmLib lib) {
    static char names[SGEMM_LIBS][48];
    if (!names[lib][0]) {
        if (lib == SGEMM_ONEDNN) snprintf(names[lib], sizeof names[lib], "oneDNN %s", onednn_version());
        else blas_version(names[lib], sizeof names[lib]);
    }
    return names[lib];
}

void sgemm_lib_rm(SgemmLib lib, int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                  const float *B, int ldb, float beta, float *C, int ldc) {
    if (M <= 0 || N <= 0) return;
    if (lib == SGEMM_ONEDNN) {
        (void)onednn_version(); /* oneDNN's one-time set-up (its ISA cap) before its first use */
        dnnl_status_t st = dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        if (st != dnnl_success) die("oneDNN: dnnl_sgemm (%d x %d x %d) failed with status %d", M, N, K, (int)st);
        return;
    }
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda,
                B, ldb, beta, C, ldc);
}

void sgemm_rm(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B, int ldb,
              float beta, float *C, int ldc) {
    const double t0 = op_clock_now();
    sgemm_lib_rm(g_lib, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    op_clock_add(OPC_LINEAR, t0);
}
