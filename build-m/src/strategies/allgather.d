build-m/src/strategies/allgather.o: src/strategies/allgather.c \
 src/attention/flash_attention.h src/core/common.h \
 src/strategies/registry.h src/attention/seq_attention.h \
 src/strategies/chunk_tier.h src/strategies/context_schedule.h \
 src/comm/comm.h /usr/lib/x86_64-linux-gnu/openmpi/include/mpi.h \
 /usr/lib/x86_64-linux-gnu/openmpi/include/mpi_portable_platform.h \
 src/comm/topology.h src/strategies/block_attention.h \
 src/strategies/layout.h
src/attention/flash_attention.h:
src/core/common.h:
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
