build-m/src/model/llama.o: src/model/llama.c src/model/llama.h \
 src/attention/seq_attention.h src/core/param_table.h src/model/config.h \
 src/core/common.h src/kernels/ops.h
src/model/llama.h:
src/attention/seq_attention.h:
src/core/param_table.h:
src/model/config.h:
src/core/common.h:
src/kernels/ops.h:
