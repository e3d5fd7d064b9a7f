build-m/tests/test_checkpoint: tests/test_checkpoint.c src/core/common.h \
 src/core/param_table.h src/io/checkpoint.h src/model/config.h \
 src/optim/adamw.h src/io/param_io.h src/io/safetensors.h tests/testlib.h
src/core/common.h:
src/core/param_table.h:
src/io/checkpoint.h:
src/model/config.h:
src/optim/adamw.h:
src/io/param_io.h:
src/io/safetensors.h:
tests/testlib.h:
