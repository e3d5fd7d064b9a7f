build-m/src/strategies/block_attention.o: \
 src/strategies/block_attention.c src/strategies/block_attention.h \
 /usr/lib/x86_64-linux-gnu/openmpi/include/mpi.h \
 /usr/lib/x86_64-linux-gnu/openmpi/include/mpi_portable_platform.h \
 src/comm/comm.h src/comm/topology.h src/attention/flash_attention.h
src/strategies/block_attention.h:
/usr/lib/x86_64-linux-gnu/openmpi/include/mpi.h:
/usr/lib/x86_64-linux-gnu/openmpi/include/mpi_portable_platform.h:
src/comm/comm.h:
src/comm/topology.h:
src/attention/flash_attention.h:
