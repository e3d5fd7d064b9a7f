build-san/src/cli/cmd_train.o: src/cli/cmd_train.c src/cli/cli_common.h \
 src/model/llama.h src/attention/seq_attention.h src/core/param_table.h \
 src/model/config.h src/cli/commands.h src/core/common.h \
 src/data/recall.h src/data/tokens.h src/io/checkpoint.h \
 src/optim/adamw.h src/io/config_json.h src/kernels/sgemm_bench.h
src/cli/cli_common.h:
src/model/llama.h:
src/attention/seq_attention.h:
src/core/param_table.h:
src/model/config.h:
src/cli/commands.h:
src/core/common.h:
src/data/recall.h:
src/data/tokens.h:
src/io/checkpoint.h:
src/optim/adamw.h:
src/io/config_json.h:
src/kernels/sgemm_bench.h:
