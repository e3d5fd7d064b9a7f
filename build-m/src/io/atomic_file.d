build-m/src/io/atomic_file.o: src/io/atomic_file.c src/io/atomic_file.h \
 src/core/common.h
src/io/atomic_file.h:
src/core/common.h:
