build-m/tests/test_isa: tests/test_isa.c src/core/common.h \
 src/kernels/isa.h tests/testlib.h
src/core/common.h:
src/kernels/isa.h:
tests/testlib.h:
