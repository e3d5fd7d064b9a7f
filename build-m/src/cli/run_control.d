build-m/src/cli/run_control.o: src/cli/run_control.c \
 src/cli/run_control.h src/core/common.h
src/cli/run_control.h:
src/core/common.h:
