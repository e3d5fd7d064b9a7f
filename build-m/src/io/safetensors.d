build-m/src/io/safetensors.o: src/io/safetensors.c src/io/safetensors.h \
 src/core/common.h src/io/atomic_file.h src/io/read_file.h
src/io/safetensors.h:
src/core/common.h:
src/io/atomic_file.h:
src/io/read_file.h:
