build-m/src/attention/attention_bench.o: src/attention/attention_bench.c \
 src/attention/attention_bench.h src/attention/flash_attention.h \
 src/core/common.h src/kernels/sgemm_bench.h
src/attention/attention_bench.h:
src/attention/flash_attention.h:
src/core/common.h:
src/kernels/sgemm_bench.h:
