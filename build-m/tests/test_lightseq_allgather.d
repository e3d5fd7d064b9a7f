build-m/tests/test_lightseq_allgather: tests/test_lightseq_allgather.c \
 /usr/lib/x86_64-linux-gnu/openmpi/include/mpi.h \
 /usr/lib/x86_64-linux-gnu/openmpi/include/mpi_portable_platform.h \
 src/attention/flash_attention.h src/comm/comm.h src/comm/topology.h \
 src/core/common.h src/strategies/block_attention.h \
 src/strategies/layout.h src/strategies/lightseq.h \
 src/strategies/context_schedule.h src/strategies/registry.h \
 src/attention/seq_attention.h src/strategies/chunk_tier.h \
 tests/attn_reference.h tests/testlib.h
/usr/lib/x86_64-linux-gnu/openmpi/include/mpi.h:
/usr/lib/x86_64-linux-gnu/openmpi/include/mpi_portable_platform.h:
src/attention/flash_attention.h:
src/comm/comm.h:
src/comm/topology.h:
src/core/common.h:
src/strategies/block_attention.h:
src/strategies/layout.h:
src/strategies/lightseq.h:
src/strategies/context_schedule.h:
src/strategies/registry.h:
src/attention/seq_attention.h:
src/strategies/chunk_tier.h:
tests/attn_reference.h:
tests/testlib.h:
