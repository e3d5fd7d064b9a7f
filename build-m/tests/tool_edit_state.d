build-m/tests/tool_edit_state: tests/tool_edit_state.c
