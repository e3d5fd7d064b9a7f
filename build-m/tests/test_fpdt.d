build-m/tests/test_fpdt: tests/test_fpdt.c \
 /usr/lib/x86_64-linux-gnu/openmpi/include/mpi.h \
 /usr/lib/x86_64-linux-gnu/openmpi/include/mpi_portable_platform.h \
 src/comm/comm.h src/comm/topology.h src/core/common.h \
 src/strategies/chunk_tier.h src/strategies/registry.h \
 src/attention/seq_attention.h src/strategies/context_schedule.h \
 src/strategies/block_attention.h src/strategies/layout.h \
 tests/attn_reference.h src/attention/flash_attention.h tests/testlib.h
/usr/lib/x86_64-linux-gnu/openmpi/include/mpi.h:
/usr/lib/x86_64-linux-gnu/openmpi/include/mpi_portable_platform.h:
src/comm/comm.h:
src/comm/topology.h:
src/core/common.h:
src/strategies/chunk_tier.h:
src/strategies/registry.h:
src/attention/seq_attention.h:
src/strategies/context_schedule.h:
src/strategies/block_attention.h:
src/strategies/layout.h:
tests/attn_reference.h:
src/attention/flash_attention.h:
tests/testlib.h:
