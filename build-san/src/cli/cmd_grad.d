build-san/src/cli/cmd_grad.o: src/cli/cmd_grad.c src/cli/cli_common.h \
 src/model/llama.h src/attention/seq_attention.h src/core/param_table.h \
 src/model/config.h src/cli/commands.h src/core/common.h \
 src/data/tokens.h src/io/param_io.h
src/cli/cli_common.h:
src/model/llama.h:
src/attention/seq_attention.h:
src/core/param_table.h:
src/model/config.h:
src/cli/commands.h:
src/core/common.h:
src/data/tokens.h:
src/io/param_io.h:
