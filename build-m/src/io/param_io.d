build-m/src/io/param_io.o: src/io/param_io.c src/io/param_io.h \
 src/core/common.h src/core/param_table.h src/io/safetensors.h
src/io/param_io.h:
src/core/common.h:
src/core/param_table.h:
src/io/safetensors.h:
