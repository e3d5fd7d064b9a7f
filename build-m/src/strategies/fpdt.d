build-m/src/strategies/fpdt.o: src/strategies/fpdt.c \
 src/attention/flash_attention.h src/core/common.h \
 src/strategies/block_attention.h \
 /usr/lib/x86_64-linux-gnu/openmpi/include/mpi.h \
 /usr/lib/x86_64-linux-gnu/openmpi/include/mpi_portable_platform.h \
 src/comm/comm.h src/comm/topology.h src/strategies/chunk_tier.h \
 src/strategies/head_exchange.h src/strategies/registry.h \
 src/attention/seq_attention.h src/strategies/context_schedule.h \
 src/strategies/layout.h
src/attention/flash_attention.h:
src/core/common.h:
src/strategies/block_attention.h:
/usr/lib/x86_64-linux-gnu/openmpi/include/mpi.h:
/usr/lib/x86_64-linux-gnu/openmpi/include/mpi_portable_platform.h:
src/comm/comm.h:
src/comm/topology.h:
src/strategies/chunk_tier.h:
src/strategies/head_exchange.h:
src/strategies/registry.h:
src/attention/seq_attention.h:
src/strategies/context_schedule.h:
src/strategies/layout.h:
