build-m/src/strategies/registry.o: src/strategies/registry.c \
 src/strategies/registry.h src/attention/seq_attention.h \
 src/strategies/chunk_tier.h src/strategies/context_schedule.h \
 src/comm/comm.h /usr/lib/x86_64-linux-gnu/openmpi/include/mpi.h \
 /usr/lib/x86_64-linux-gnu/openmpi/include/mpi_portable_platform.h \
 src/comm/topology.h src/strategies/block_attention.h \
 src/strategies/layout.h src/core/common.h \
 src/strategies/dist_attention.h src/strategies/head_exchange.h
src/strategies/registry.h:
src/attention/seq_attention.h:
src/strategies/chunk_tier.h:
src/strategies/context_schedule.h:
src/comm/comm.h:
/usr/lib/x86_64-linux-gnu/openmpi/include/mpi.h:
/usr/lib/x86_64-linux-gnu/openmpi/include/mpi_portable_platform.h:
src/comm/topology.h:
src/strategies/block_attention.h:
src/strategies/layout.h:
src/core/common.h:
src/strategies/dist_attention.h:
src/strategies/head_exchange.h:
