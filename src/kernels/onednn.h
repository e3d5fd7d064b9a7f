/* The oneDNN library's one-time set-up: before its first use, oneDNN's ISA is capped below AMX when
 * seqpar's AMX is off (SEQPAR_ISA, kernels/isa.h), unless DNNL_MAX_CPU_ISA or ONEDNN_MAX_CPU_ISA says
 * otherwise; then one CPU engine and stream are made for every caller. */
#ifndef SEQPAR_ONEDNN_H
#define SEQPAR_ONEDNN_H

#include <oneapi/dnnl/dnnl.h>

/* "2.7.3": the library's version (sets it up on the first call). */
const char *onednn_version(void);
/* The ISA oneDNN's kernels run: "avx512_core_amx", "avx512_core_bf16", ... */
const char *onednn_isa(void);
/* The engine and stream every oneDNN primitive of seqpar runs on. */
void onednn_engine(dnnl_engine_t *engine, dnnl_stream_t *stream);

#endif
