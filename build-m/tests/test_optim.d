build-m/tests/test_optim: tests/test_optim.c src/core/common.h \
 src/core/param_table.h src/optim/adamw.h tests/testlib.h
src/core/common.h:
src/core/param_table.h:
src/optim/adamw.h:
tests/testlib.h:
