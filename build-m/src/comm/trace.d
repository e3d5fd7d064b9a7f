build-m/src/comm/trace.o: src/comm/trace.c src/comm/trace.h \
 /usr/lib/x86_64-linux-gnu/openmpi/include/mpi.h \
 /usr/lib/x86_64-linux-gnu/openmpi/include/mpi_portable_platform.h \
 src/core/common.h src/io/atomic_file.h
src/comm/trace.h:
/usr/lib/x86_64-linux-gnu/openmpi/include/mpi.h:
/usr/lib/x86_64-linux-gnu/openmpi/include/mpi_portable_platform.h:
src/core/common.h:
src/io/atomic_file.h:
