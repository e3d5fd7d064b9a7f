build-m/src/strategies/head_exchange.o: src/strategies/head_exchange.c \
 src/strategies/head_exchange.h \
 /usr/lib/x86_64-linux-gnu/openmpi/include/mpi.h \
 /usr/lib/x86_64-linux-gnu/openmpi/include/mpi_portable_platform.h \
 src/comm/comm.h src/comm/topology.h src/core/common.h
src/strategies/head_exchange.h:
/usr/lib/x86_64-linux-gnu/openmpi/include/mpi.h:
/usr/lib/x86_64-linux-gnu/openmpi/include/mpi_portable_platform.h:
src/comm/comm.h:
src/comm/topology.h:
src/core/common.h:
