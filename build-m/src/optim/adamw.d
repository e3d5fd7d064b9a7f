build-m/src/optim/adamw.o: src/optim/adamw.c src/optim/adamw.h \
 src/core/param_table.h src/core/common.h src/kernels/isa.h
src/optim/adamw.h:
src/core/param_table.h:
src/core/common.h:
src/kernels/isa.h:
