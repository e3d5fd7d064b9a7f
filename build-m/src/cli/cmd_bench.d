build-m/src/cli/cmd_bench.o: src/cli/cmd_bench.c \
 /usr/include/x86_64-linux-gnu/openblas-openmp/cblas.h \
 /usr/include/x86_64-linux-gnu/openblas-openmp/openblas_config.h \
 /usr/lib/x86_64-linux-gnu/openmpi/include/mpi.h \
 /usr/lib/x86_64-linux-gnu/openmpi/include/mpi_portable_platform.h \
 src/attention/attention_bench.h src/attention/flash_attention.h \
 src/cli/cli_common.h src/model/llama.h src/attention/seq_attention.h \
 src/core/param_table.h src/model/config.h src/core/common.h \
 src/strategies/seq_parallel.h src/comm/comm.h src/comm/topology.h \
 src/strategies/data_parallel.h src/optim/adamw.h src/strategies/layout.h \
 src/strategies/registry.h src/strategies/chunk_tier.h \
 src/strategies/context_schedule.h src/strategies/block_attention.h \
 src/cli/commands.h src/kernels/isa.h src/kernels/sgemm_bench.h \
 src/strategies/dist_attention_bench.h
/usr/include/x86_64-linux-gnu/openblas-openmp/cblas.h:
/usr/include/x86_64-linux-gnu/openblas-openmp/openblas_config.h:
/usr/lib/x86_64-linux-gnu/openmpi/include/mpi.h:
/usr/lib/x86_64-linux-gnu/openmpi/include/mpi_portable_platform.h:
src/attention/attention_bench.h:
src/attention/flash_attention.h:
src/cli/cli_common.h:
src/model/llama.h:
src/attention/seq_attention.h:
src/core/param_table.h:
src/model/config.h:
src/core/common.h:
src/strategies/seq_parallel.h:
src/comm/comm.h:
src/comm/topology.h:
src/strategies/data_parallel.h:
src/optim/adamw.h:
src/strategies/layout.h:
src/strategies/registry.h:
src/strategies/chunk_tier.h:
src/strategies/context_schedule.h:
src/strategies/block_attention.h:
src/cli/commands.h:
src/kernels/isa.h:
src/kernels/sgemm_bench.h:
src/strategies/dist_attention_bench.h:
