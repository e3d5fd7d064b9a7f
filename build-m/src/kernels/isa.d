build-m/src/kernels/isa.o: src/kernels/isa.c src/kernels/isa.h \
 src/core/common.h
src/kernels/isa.h:
src/core/common.h:
