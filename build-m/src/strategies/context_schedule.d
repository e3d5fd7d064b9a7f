build-m/src/strategies/context_schedule.o: \
 src/strategies/context_schedule.c src/strategies/context_schedule.h \
 src/comm/comm.h /usr/lib/x86_64-linux-gnu/openmpi/include/mpi.h \
 /usr/lib/x86_64-linux-gnu/openmpi/include/mpi_portable_platform.h \
 src/comm/topology.h src/strategies/block_attention.h \
 src/strategies/layout.h
src/strategies/context_schedule.h:
src/comm/comm.h:
/usr/lib/x86_64-linux-gnu/openmpi/include/mpi.h:
/usr/lib/x86_64-linux-gnu/openmpi/include/mpi_portable_platform.h:
src/comm/topology.h:
src/strategies/block_attention.h:
src/strategies/layout.h:
