build-m/src/data/tokens.o: src/data/tokens.c src/data/tokens.h \
 src/core/common.h src/io/atomic_file.h src/io/read_file.h
src/data/tokens.h:
src/core/common.h:
src/io/atomic_file.h:
src/io/read_file.h:
