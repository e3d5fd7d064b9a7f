# seqpar build: a static library of everything but the CLI, the CLI linking it, and the tests.
# `make` builds build/seqpar; `make test` builds and runs the test suite; `make SANITIZE=1` adds
# ASan/UBSan (into build-san/); `make WERROR=1` turns warnings into errors (CI).
# Everything is compiled for a baseline (x86-64-v2) so that one binary runs on every x86-64 CPU;
# the kernels in src/kernels/simd_avx2.c and simd_avx512.c get their instruction sets per file and
# are chosen at run time (src/kernels/isa.h; SEQPAR_ISA=scalar|avx2|avx512|amx forces a lower one).
CC      ?= gcc
MPICC_CFLAGS := $(shell mpicc --showme:compile 2>/dev/null)
MPICC_LIBS   := $(shell mpicc --showme:link 2>/dev/null)
BLAS_INC := /usr/include/x86_64-linux-gnu/openblas-openmp
BLAS_LIB := /usr/lib/x86_64-linux-gnu/openblas-openmp
OPT     ?= -O3 -march=x86-64-v2 -mtune=generic
ISA_AVX2_FLAGS   := -mavx2 -mfma -mf16c
ISA_AVX512_FLAGS := $(ISA_AVX2_FLAGS) -mavx512f -mavx512bw -mavx512dq -mavx512vl
CFLAGS  ?=
CFLAGS  += -std=c11 -D_GNU_SOURCE $(OPT) -fopenmp -Wall -Wextra -Isrc -I$(BLAS_INC) $(MPICC_CFLAGS) -MMD -MP
LDLIBS  += -L$(BLAS_LIB) -Wl,-rpath,$(BLAS_LIB) -lopenblas -ldnnl -ljansson -lz $(MPICC_LIBS) -lm -fopenmp
ifeq ($(WERROR),1)
CFLAGS  += -Werror
endif
ifeq ($(SANITIZE),1)
CFLAGS  += -fsanitize=address,undefined -fno-omit-frame-pointer -g
LDLIBS  += -fsanitize=address,undefined
BUILD   ?= build-san
endif
BUILD   ?= build

# the library's floors, bottom up (src/README.md): no file includes one from a floor above its own
LIB_DIRS := core kernels attention optim memory model data io parallel strategies plan bench train
LIB_SRC  := $(foreach d,$(LIB_DIRS),$(wildcard src/$(d)/*.c))
CLI_SRC  := $(wildcard src/cli/*.c)
TEST_SRC := $(wildcard tests/test_*.c)
LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/%.o) $(BUILD)/gen/cluster_presets.o
# the named cluster presets (clusters/*.json), compiled into the library so that --cluster NAME works
# from any directory (clusters/embed.sh writes them as C strings)
PRESETS  := $(sort $(wildcard clusters/*.json))
CLI_OBJ  := $(CLI_SRC:%.c=$(BUILD)/%.o)
TESTS    := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
TOOLS    := $(patsubst tests/%.c,$(BUILD)/tests/%,$(wildcard tests/tool_*.c))

all: $(BUILD)/seqpar $(TESTS) $(TOOLS)

$(BUILD)/libseqpar.a: $(LIB_OBJ)
	@mkdir -p $(dir $@)
	ar rcs $@ $^

$(BUILD)/seqpar: $(CLI_OBJ) $(BUILD)/libseqpar.a
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/tests/%: tests/%.c tests/testlib.h tests/attn_reference.h $(BUILD)/libseqpar.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests -o $@ $< $(BUILD)/libseqpar.a $(LDLIBS)

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c -o $@ $<

$(BUILD)/gen/cluster_presets.c: $(PRESETS) clusters/embed.sh clusters
	@mkdir -p $(dir $@)
	sh clusters/embed.sh $@ $(PRESETS)

$(BUILD)/gen/cluster_presets.o: $(BUILD)/gen/cluster_presets.c
	$(CC) $(CFLAGS) -c -o $@ $<

$(BUILD)/src/kernels/simd_avx2.o: CFLAGS += $(ISA_AVX2_FLAGS)
$(BUILD)/src/kernels/simd_avx512.o: CFLAGS += $(ISA_AVX512_FLAGS)
$(BUILD)/src/kernels/bf16_avx512.o: CFLAGS += $(ISA_AVX512_FLAGS) -mavx512bf16
$(BUILD)/src/kernels/attn_bf16_avx512.o: CFLAGS += $(ISA_AVX512_FLAGS) -mavx512bf16
# the AMX tiles on hardware (reached only where isa_amx()); attn_bf16_amx_emulated.c is the same kernel
# on the C emulation of the instructions and needs no flags
$(BUILD)/src/kernels/attn_bf16_amx.o: CFLAGS += $(ISA_AVX512_FLAGS) -mavx512bf16 -mamx-tile -mamx-bf16

# Benchmark helpers under bench/ (never needed by the tests)
bench-tools: $(BUILD)/bench/kernel_rates $(BUILD)/bench/fma_peak $(BUILD)/bench/packed_balance $(BUILD)/bench/attn_cpu_time $(BUILD)/bench/step_gemms $(BUILD)/bench/coll_rates $(BUILD)/bench/optimizer_step
$(BUILD)/bench/%: bench/%.c $(BUILD)/libseqpar.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $< $(BUILD)/libseqpar.a $(LDLIBS)

# The AMX tile products' pieces (bench/amx_probe.c): on the instructions (needs AMX hardware to run)
# and on their C emulation (runs on any AVX512_BF16 CPU)
bench-amx: $(BUILD)/bench/amx_probe $(BUILD)/bench/amx_probe_emu
$(BUILD)/bench/amx_probe: CFLAGS += $(ISA_AVX512_FLAGS) -mavx512bf16 -mamx-tile -mamx-bf16
$(BUILD)/bench/amx_probe_emu: bench/amx_probe.c $(BUILD)/libseqpar.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -DPROBE_EMULATED -o $@ $< $(BUILD)/libseqpar.a $(LDLIBS)

# Which bf16 GEMM --precision bf16 uses: sgemm, the conversion path and oneDNN's bf16 matmul
bench-bf16: $(BUILD)/bench/bf16_gemm_libs $(BUILD)/bench/bf16_step
# The tile-product comparison with libxsmm and oneDNN (needs libxsmm-dev and libdnnl-dev)
bench-libs: $(BUILD)/libseqpar.a
	@mkdir -p $(BUILD)/bench
	$(CC) $(CFLAGS) -Wno-unused-parameter -o $(BUILD)/bench/tile_libs bench/tile_libs.c $(BUILD)/libseqpar.a \
	    /usr/lib/libxsmm.a -ldnnl -lpthread -ldl -lrt $(LDLIBS)

test: all
	bash tests/run_tests.sh $(BUILD)

# libFuzzer targets for the file loaders (tests/fuzz/fuzz_*.c) with ASan + UBSan, built by clang
# into build-fuzz/ from the loader sources only (no BLAS, no OpenMP: its pragmas are ignored).
# `make fuzz` builds them; tests/test_fuzz.sh runs each for a few seconds on its seed corpus.
FUZZ_CC    ?= clang
FUZZ_FLAGS := -std=c11 -D_GNU_SOURCE -g -O1 -Wall -Wextra -Wno-unknown-pragmas -Isrc -Itests/fuzz $(MPICC_CFLAGS) \
              -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer \
              -DFUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION
ifeq ($(WERROR),1)
FUZZ_FLAGS += -Werror
endif
FUZZ_LIB_SRC := src/core/common.c src/io/atomic_file.c src/io/checkpoint.c src/io/config_json.c src/io/param_io.c \
                src/io/read_file.c src/io/safetensors.c src/data/tokens.c src/model/config.c src/optim/adamw.c \
                src/kernels/isa.c src/kernels/simd_scalar.c src/kernels/simd_avx2.c src/kernels/simd_avx512.c
FUZZ_LIB_OBJ := $(FUZZ_LIB_SRC:%.c=build-fuzz/obj/%.o)
# the kernel tables are linked for isa.c (the targets exercise loaders, not kernels): at -O0, since
# at -O1 with the sanitizers the AVX-512 table alone took 34 s of the suite's fuzz build (1 s now)
build-fuzz/obj/src/kernels/simd_avx2.o build-fuzz/obj/src/kernels/simd_avx512.o build-fuzz/obj/src/kernels/simd_scalar.o: FUZZ_FLAGS += -O0
build-fuzz/obj/src/kernels/simd_avx2.o: FUZZ_FLAGS += $(ISA_AVX2_FLAGS)
build-fuzz/obj/src/kernels/simd_avx512.o: FUZZ_FLAGS += $(ISA_AVX512_FLAGS)
FUZZ_TARGETS := $(patsubst tests/fuzz/%.c,build-fuzz/%,$(wildcard tests/fuzz/fuzz_*.c))

fuzz: $(FUZZ_TARGETS)
.SECONDARY: $(FUZZ_LIB_OBJ)

build-fuzz/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_FLAGS) -fsanitize=fuzzer-no-link -MMD -MP -c -o $@ $<

build-fuzz/%: tests/fuzz/%.c tests/fuzz/fuzz_common.h $(FUZZ_LIB_OBJ)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_FLAGS) -fsanitize=fuzzer -o $@ $< $(FUZZ_LIB_OBJ) -ljansson -lz $(MPICC_LIBS) -lm

clean:
	rm -rf build build-san build-fuzz

.PHONY: all test clean fuzz bench-tools bench-libs bench-bf16 bench-amx
-include $(FUZZ_LIB_OBJ:.o=.d)
-include $(LIB_OBJ:.o=.d) $(CLI_OBJ:.o=.d)
