build-m/src/attention/flash_attention.o: src/attention/flash_attention.c \
 src/attention/flash_attention.h src/core/common.h src/kernels/isa.h
src/attention/flash_attention.h:
src/core/common.h:
src/kernels/isa.h:
