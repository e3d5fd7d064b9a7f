build-m/src/io/checkpoint.o: src/io/checkpoint.c src/io/checkpoint.h \
 src/core/common.h src/core/param_table.h src/model/config.h \
 src/optim/adamw.h src/io/atomic_file.h src/io/config_json.h \
 src/io/param_io.h src/io/read_file.h src/io/safetensors.h
src/io/checkpoint.h:
src/core/common.h:
src/core/param_table.h:
src/model/config.h:
src/optim/adamw.h:
src/io/atomic_file.h:
src/io/config_json.h:
src/io/param_io.h:
src/io/read_file.h:
src/io/safetensors.h:
