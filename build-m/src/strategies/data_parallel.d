build-m/src/strategies/data_parallel.o: src/strategies/data_parallel.c \
 src/strategies/data_parallel.h \
 /usr/lib/x86_64-linux-gnu/openmpi/include/mpi.h \
 /usr/lib/x86_64-linux-gnu/openmpi/include/mpi_portable_platform.h \
 src/comm/comm.h src/comm/topology.h src/model/llama.h \
 src/attention/seq_attention.h src/core/param_table.h src/model/config.h \
 src/core/common.h src/optim/adamw.h
src/strategies/data_parallel.h:
/usr/lib/x86_64-linux-gnu/openmpi/include/mpi.h:
/usr/lib/x86_64-linux-gnu/openmpi/include/mpi_portable_platform.h:
src/comm/comm.h:
src/comm/topology.h:
src/model/llama.h:
src/attention/seq_attention.h:
src/core/param_table.h:
src/model/config.h:
src/core/common.h:
src/optim/adamw.h:
