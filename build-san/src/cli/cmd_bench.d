build-san/src/cli/cmd_bench.o: src/cli/cmd_bench.c \
 src/attention/attention_bench.h src/attention/flash_attention.h \
 src/cli/cli_common.h src/model/llama.h src/attention/seq_attention.h \
 src/core/param_table.h src/model/config.h src/cli/commands.h \
 src/core/common.h src/kernels/sgemm_bench.h src/optim/adamw.h
src/attention/attention_bench.h:
src/attention/flash_attention.h:
src/cli/cli_common.h:
src/model/llama.h:
src/attention/seq_attention.h:
src/core/param_table.h:
src/model/config.h:
src/cli/commands.h:
src/core/common.h:
src/kernels/sgemm_bench.h:
src/optim/adamw.h:
