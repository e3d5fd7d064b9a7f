build-m/tests/test_model: tests/test_model.c \
 src/attention/seq_attention.h src/io/param_io.h src/core/common.h \
 src/core/param_table.h src/data/tokens.h src/io/config_json.h \
 src/model/config.h src/io/safetensors.h src/model/llama.h \
 tests/testlib.h
src/attention/seq_attention.h:
src/io/param_io.h:
src/core/common.h:
src/core/param_table.h:
src/data/tokens.h:
src/io/config_json.h:
src/model/config.h:
src/io/safetensors.h:
src/model/llama.h:
tests/testlib.h:
