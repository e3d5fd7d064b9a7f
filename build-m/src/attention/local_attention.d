build-m/src/attention/local_attention.o: src/attention/local_attention.c \
 src/attention/seq_attention.h src/attention/flash_attention.h \
 src/core/common.h
src/attention/seq_attention.h:
src/attention/flash_attention.h:
src/core/common.h:
