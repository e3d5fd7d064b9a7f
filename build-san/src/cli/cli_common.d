build-san/src/cli/cli_common.o: src/cli/cli_common.c src/cli/cli_common.h \
 src/model/llama.h src/attention/seq_attention.h src/core/param_table.h \
 src/model/config.h /usr/include/x86_64-linux-gnu/openblas-openmp/cblas.h \
 /usr/include/x86_64-linux-gnu/openblas-openmp/openblas_config.h \
 src/core/common.h src/io/config_json.h src/io/param_io.h
src/cli/cli_common.h:
src/model/llama.h:
src/attention/seq_attention.h:
src/core/param_table.h:
src/model/config.h:
/usr/include/x86_64-linux-gnu/openblas-openmp/cblas.h:
/usr/include/x86_64-linux-gnu/openblas-openmp/openblas_config.h:
src/core/common.h:
src/io/config_json.h:
src/io/param_io.h:
