build-m/tests/test_attention: tests/test_attention.c \
 src/attention/flash_attention.h src/core/common.h tests/testlib.h
src/attention/flash_attention.h:
src/core/common.h:
tests/testlib.h:
