build-m/src/kernels/simd_avx512.o: src/kernels/simd_avx512.c \
 src/kernels/isa.h src/kernels/simd_body.h
src/kernels/isa.h:
src/kernels/simd_body.h:
