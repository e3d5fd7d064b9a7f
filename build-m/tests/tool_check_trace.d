build-m/tests/tool_check_trace: tests/tool_check_trace.c
