build-m/src/strategies/chunk_tier.o: src/strategies/chunk_tier.c \
 src/strategies/chunk_tier.h src/core/common.h
src/strategies/chunk_tier.h:
src/core/common.h:
