build-m/tests/test_io: tests/test_io.c src/core/common.h \
 src/data/recall.h src/data/tokens.h src/io/atomic_file.h \
 src/io/config_json.h src/model/config.h src/io/safetensors.h \
 tests/testlib.h
src/core/common.h:
src/data/recall.h:
src/data/tokens.h:
src/io/atomic_file.h:
src/io/config_json.h:
src/model/config.h:
src/io/safetensors.h:
tests/testlib.h:
