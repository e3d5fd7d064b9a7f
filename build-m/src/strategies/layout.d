build-m/src/strategies/layout.o: src/strategies/layout.c \
 src/strategies/layout.h src/core/common.h
src/strategies/layout.h:
src/core/common.h:
