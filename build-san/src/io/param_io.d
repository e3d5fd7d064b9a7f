build-san/src/io/param_io.o: src/io/param_io.c src/io/param_io.h \
 src/core/param_table.h src/core/common.h src/io/safetensors.h
src/io/param_io.h:
src/core/param_table.h:
src/core/common.h:
src/io/safetensors.h:
