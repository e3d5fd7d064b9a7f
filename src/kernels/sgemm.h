/* The fp32 matrix product of the model's linear layers (ops.c), behind one call: oneDNN's
 * dnnl_sgemm (JIT kernels chosen by the CPU's features) or OpenBLAS's cblas_sgemm.
 *
 * oneDNN is the default: on the reference model's shapes (bench/step_gemms: 256 -> 256, 128, 1024
 * and 1024 -> 256 over 4-8K tokens, forward, dX and dW) it was 1.40x OpenBLAS 0.3.21 on an AMD
 * EPYC (Zen 4, 2 threads; 2.1x on the MLP's 256 -> 1024), where OpenBLAS reaches its peak only on
 * large squares. SEQPAR_SGEMM=openblas chooses OpenBLAS (sgemm_select). Row major throughout. */
#ifndef SEQPAR_SGEMM_H
#define SEQPAR_SGEMM_H

#include <stddef.h>

typedef enum { SGEMM_ONEDNN = 0, SGEMM_OPENBLAS = 1, SGEMM_LIBS = 2 } SgemmLib;

/* Reads SEQPAR_SGEMM (onednn, openblas; unset: onednn). Returns 0, or -1 with a one-line message
 * in err for any other value. The CLI calls it at start-up; without a call the default holds. */
int sgemm_select_from_env(char *err, size_t n);
SgemmLib sgemm_lib(void);
/* "oneDNN 2.6.3" / "OpenBLAS 0.3.21" */
const char *sgemm_lib_name(SgemmLib lib);

/* C (M, N; ldc) = alpha op(A) op(B) + beta C, op = transpose where ta / tb; through the selected
 * library (sgemm_lib_rm: through `lib`). */
void sgemm_rm(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B, int ldb,
              float beta, float *C, int ldc);
void sgemm_lib_rm(SgemmLib lib, int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                  const float *B, int ldb, float beta, float *C, int ldc);

#endif
