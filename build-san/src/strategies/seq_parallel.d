build-san/src/strategies/seq_parallel.o: src/strategies/seq_parallel.c \
 src/strategies/seq_parallel.h src/attention/seq_attention.h \
 src/comm/comm.h /usr/lib/x86_64-linux-gnu/openmpi/include/mpi.h \
 /usr/lib/x86_64-linux-gnu/openmpi/include/mpi_portable_platform.h \
 src/comm/topology.h src/model/config.h src/strategies/data_parallel.h \
 src/strategies/layout.h \
 /usr/include/x86_64-linux-gnu/openblas-openmp/cblas.h \
 /usr/include/x86_64-linux-gnu/openblas-openmp/openblas_config.h \
 src/core/common.h src/strategies/dist_attention.h
src/strategies/seq_parallel.h:
src/attention/seq_attention.h:
src/comm/comm.h:
/usr/lib/x86_64-linux-gnu/openmpi/include/mpi.h:
/usr/lib/x86_64-linux-gnu/openmpi/include/mpi_portable_platform.h:
src/comm/topology.h:
src/model/config.h:
src/strategies/data_parallel.h:
src/strategies/layout.h:
/usr/include/x86_64-linux-gnu/openblas-openmp/cblas.h:
/usr/include/x86_64-linux-gnu/openblas-openmp/openblas_config.h:
src/core/common.h:
src/strategies/dist_attention.h:
