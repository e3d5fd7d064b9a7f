build-m/src/model/config.o: src/model/config.c src/model/config.h \
 src/core/common.h
src/model/config.h:
src/core/common.h:
