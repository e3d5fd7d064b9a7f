build-m/src/io/read_file.o: src/io/read_file.c src/io/read_file.h \
 src/core/common.h
src/io/read_file.h:
src/core/common.h:
