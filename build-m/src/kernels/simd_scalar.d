build-m/src/kernels/simd_scalar.o: src/kernels/simd_scalar.c \
 src/kernels/isa.h src/kernels/simd_body.h
src/kernels/isa.h:
src/kernels/simd_body.h:
