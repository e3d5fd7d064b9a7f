build-m/src/io/config_json.o: src/io/config_json.c src/io/config_json.h \
 src/core/common.h src/model/config.h src/io/atomic_file.h \
 src/io/read_file.h
src/io/config_json.h:
src/core/common.h:
src/model/config.h:
src/io/atomic_file.h:
src/io/read_file.h:
