build-m/src/strategies/merge_scatter.o: src/strategies/merge_scatter.c \
 src/strategies/merge_scatter.h \
 /usr/lib/x86_64-linux-gnu/openmpi/include/mpi.h \
 /usr/lib/x86_64-linux-gnu/openmpi/include/mpi_portable_platform.h \
 src/comm/comm.h src/comm/topology.h src/attention/flash_attention.h
src/strategies/merge_scatter.h:
/usr/lib/x86_64-linux-gnu/openmpi/include/mpi.h:
/usr/lib/x86_64-linux-gnu/openmpi/include/mpi_portable_platform.h:
src/comm/comm.h:
src/comm/topology.h:
src/attention/flash_attention.h:
