build-m/src/kernels/simd_avx2.o: src/kernels/simd_avx2.c \
 src/kernels/isa.h src/kernels/simd_body.h
src/kernels/isa.h:
src/kernels/simd_body.h:
