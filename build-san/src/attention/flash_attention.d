build-san/src/attention/flash_attention.o: \
 src/attention/flash_attention.c src/attention/flash_attention.h \
 /usr/include/x86_64-linux-gnu/openblas-openmp/cblas.h \
 /usr/include/x86_64-linux-gnu/openblas-openmp/openblas_config.h \
 src/core/common.h
src/attention/flash_attention.h:
/usr/include/x86_64-linux-gnu/openblas-openmp/cblas.h:
/usr/include/x86_64-linux-gnu/openblas-openmp/openblas_config.h:
src/core/common.h:
