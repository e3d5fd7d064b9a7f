build-san/tests/test_dist_attention: tests/test_dist_attention.c \
 /usr/lib/x86_64-linux-gnu/openmpi/include/mpi.h \
 /usr/lib/x86_64-linux-gnu/openmpi/include/mpi_portable_platform.h \
 src/attention/flash_attention.h src/comm/comm.h src/comm/topology.h \
 src/core/common.h src/strategies/dist_attention.h \
 src/attention/seq_attention.h src/strategies/layout.h tests/testlib.h
/usr/lib/x86_64-linux-gnu/openmpi/include/mpi.h:
/usr/lib/x86_64-linux-gnu/openmpi/include/mpi_portable_platform.h:
src/attention/flash_attention.h:
src/comm/comm.h:
src/comm/topology.h:
src/core/common.h:
src/strategies/dist_attention.h:
src/attention/seq_attention.h:
src/strategies/layout.h:
tests/testlib.h:
