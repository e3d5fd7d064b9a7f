build-m/src/kernels/sgemm_bench.o: src/kernels/sgemm_bench.c \
 src/kernels/sgemm_bench.h \
 /usr/include/x86_64-linux-gnu/openblas-openmp/cblas.h \
 /usr/include/x86_64-linux-gnu/openblas-openmp/openblas_config.h \
 src/core/common.h
src/kernels/sgemm_bench.h:
/usr/include/x86_64-linux-gnu/openblas-openmp/cblas.h:
/usr/include/x86_64-linux-gnu/openblas-openmp/openblas_config.h:
src/core/common.h:
