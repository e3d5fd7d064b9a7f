build-m/tests/tool_compare_safetensors: tests/tool_compare_safetensors.c \
 src/core/common.h src/io/safetensors.h
src/core/common.h:
src/io/safetensors.h:
