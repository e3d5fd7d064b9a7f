build-m/src/kernels/ops.o: src/kernels/ops.c src/kernels/ops.h \
 src/core/common.h src/kernels/isa.h \
 /usr/include/x86_64-linux-gnu/openblas-openmp/cblas.h \
 /usr/include/x86_64-linux-gnu/openblas-openmp/openblas_config.h
src/kernels/ops.h:
src/core/common.h:
src/kernels/isa.h:
/usr/include/x86_64-linux-gnu/openblas-openmp/cblas.h:
/usr/include/x86_64-linux-gnu/openblas-openmp/openblas_config.h:
