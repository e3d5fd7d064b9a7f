/* Which OpenBLAS kernels (its "core") run seqpar's dense matrix products, checked against the CPU.
 *
 * OpenBLAS picks its kernels by the CPU's model number, once, in the library's constructor before
 * main. A model newer than its table gets the SSE3 "Prescott" kernels: Debian 12's OpenBLAS
 * 0.3.21 on an Intel Xeon with AVX-512 and AMX ("Intel(R) Xeon(R) Processor", 2026-11-22) ran sgemm
 * at 18 GFLOPS per core instead of about 100. Only the OPENBLAS_CORETYPE variable changes the
 * choice, so the CLI re-executes itself once with it set (blas_core_plan, then execv) before MPI
 * starts. SEQPAR_BLAS_CORE=keep turns that off; SEQPAR_BLAS_CORE=auto applies it even over an
 * OPENBLAS_CORETYPE the user set (which is otherwise respected, with a warning when it is weak). */
#ifndef SEQPAR_BLAS_CORE_H
#define SEQPAR_BLAS_CORE_H

#include <stddef.h>

#include "kernels/isa.h"

/* Instruction-set rank of an OpenBLAS core name (case-insensitive): 3 Cooperlake/SapphireRapids
 * (AVX-512 + BF16), 2 SkylakeX (AVX-512), 1 Haswell/Zen (AVX2 + FMA), 0 anything older or unknown. */
int blas_core_rank(const char *name);
/* The core this CPU deserves ("Cooperlake", "SkylakeX", "Haswell"), NULL below AVX2. */
const char *blas_core_for(const CpuFeatures *f);
/* "OpenBLAS 0.3.21": the library and its version, from its build configuration. */
void blas_version(char *buf, size_t n);
/* The core OpenBLAS runs in this process. */
const char *blas_core_name(void);

/* The decision, pure for tests: given the core OpenBLAS chose, the CPU, OPENBLAS_CORETYPE and
 * SEQPAR_BLAS_CORE (NULL when unset) and the marker of an earlier re-execution (NULL when none),
 * returns the core to re-execute with, or NULL to stay. */
const char *blas_core_plan(const char *current, const CpuFeatures *f, const char *coretype_env,
                           const char *mode_env, const char *reexec_marker);

/* For the CLI, first thing in main: when blas_core_plan says so, sets OPENBLAS_CORETYPE and a
 * marker naming the core OpenBLAS chose, and execv()s /proc/self/exe with the same arguments.
 * Returns 0 when no re-execution is needed or it failed (the reason kept for blas_core_warning),
 * -1 with a one-line message in err when SEQPAR_BLAS_CORE has a value other than keep or auto. */
int blas_core_reexec_if_weak(char **argv, char *err, size_t n);

/* One line for run headers: the core, and how it was chosen ("OpenBLAS 0.3.21 core Cooperlake
 * (OpenBLAS chose Prescott for this CPU; re-executed with OPENBLAS_CORETYPE=Cooperlake)"). */
void blas_describe(char *buf, size_t n);
/* A warning for headers when the core is below the CPU's (a user's OPENBLAS_CORETYPE, keep, a
 * failed re-execution); empty when there is nothing to say. */
void blas_core_warning(char *buf, size_t n);

#endif
