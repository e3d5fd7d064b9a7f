build-m/src/data/recall.o: src/data/recall.c src/data/recall.h \
 src/core/common.h
src/data/recall.h:
src/core/common.h:
