build-m/src/strategies/seq_parallel.o: src/strategies/seq_parallel.c \
 src/strategies/seq_parallel.h src/attention/seq_attention.h \
 src/comm/comm.h /usr/lib/x86_64-linux-gnu/openmpi/include/mpi.h \
 /usr/lib/x86_64-linux-gnu/openmpi/include/mpi_portable_platform.h \
 src/comm/topology.h src/model/config.h src/core/common.h \
 src/strategies/data_parallel.h src/model/llama.h src/core/param_table.h \
 src/optim/adamw.h src/strategies/layout.h src/strategies/registry.h \
 src/strategies/chunk_tier.h src/strategies/context_schedule.h \
 src/strategies/block_attention.h \
 /usr/include/x86_64-linux-gnu/openblas-openmp/cblas.h \
 /usr/include/x86_64-linux-gnu/openblas-openmp/openblas_config.h \
 src/strategies/dist_attention.h
src/strategies/seq_parallel.h:
src/attention/seq_attention.h:
src/comm/comm.h:
/usr/lib/x86_64-linux-gnu/openmpi/include/mpi.h:
/usr/lib/x86_64-linux-gnu/openmpi/include/mpi_portable_platform.h:
src/comm/topology.h:
src/model/config.h:
src/core/common.h:
src/strategies/data_parallel.h:
src/model/llama.h:
src/core/param_table.h:
src/optim/adamw.h:
src/strategies/layout.h:
src/strategies/registry.h:
src/strategies/chunk_tier.h:
src/strategies/context_schedule.h:
src/strategies/block_attention.h:
/usr/include/x86_64-linux-gnu/openblas-openmp/cblas.h:
/usr/include/x86_64-linux-gnu/openblas-openmp/openblas_config.h:
src/strategies/dist_attention.h:
