build-m/tests/test_ops: tests/test_ops.c src/core/common.h \
 src/kernels/ops.h tests/testlib.h
src/core/common.h:
src/kernels/ops.h:
tests/testlib.h:
