# grpod — one Makefile.
#   make            ./grpod (CPU backend; CUDA joins when nvcc is found, CUDA=0 forces CPU only)
#   make test       every test; ends with "N passed, N failed"
#   make run        the daemon on the embedded default model (flags: make run ARGS="--listen 127.0.0.1:9000")
#   make deps       Debian + Python packages the build and tests need (idempotent)
#   make bench      CPU benchmarks
#   make sanitize   ASan+UBSan and TSan over the tests (CPU backend, build/asan and build/tsan)
#   make install    PREFIX=/usr/local DESTDIR=
# Sources are found by wildcard: a new file in common/, engine/, kernels/, api/, store/, daemon/
# or tests/unit/ joins the build without touching this file. common/ (errors, log, clock, files)
# is the bottom floor and joins the engine library, so programs linking only libengine.a build.

CC       ?= cc
COMMA    := ,
NVCC     ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
PREFIX   ?= /usr/local
BUILD    := build
CFLAGS   ?= -O2 -g
CFLAGS   += -std=gnu11 -Wall -Wextra -Wno-unused-parameter -fopenmp -pthread -I. -MMD -MP
# one rounding per operation everywhere (kernels/dot_cpu.h: a row's bits must not depend on the code shape)
CFLAGS   += -ffp-contract=off
LDLIBS   := -fopenmp -pthread -lm
# SAN: sanitizer flags for compiling and linking alike (make sanitize sets it, with its own BUILD)
SAN      ?=
CFLAGS   += $(SAN)
LDLIBS   += $(SAN)
APPLIBS  := -lmicrohttpd -ljson-c -luv -lsqlite3 -lpcre2-8

ifeq ($(CUDA),0)
  NVCC :=
endif
ifneq ($(NVCC),)
  CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
  CFLAGS    += -DGRPOD_CUDA -I$(CUDA_HOME)/include
  NVFLAGS   ?= -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -I. -Xcompiler -Wall,-fPIC -MMD -MP
  LDLIBS    += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublasLt -lcublas -lcudart -lstdc++
  CUDA_SRC  := $(wildcard kernels/*.cu engine/*.cu engine/*/*.cu)
  # NCCL (engine/dist/comm_nccl.cu) joins when its header is found (NCCL_HOME first: a
  # directory with include/nccl.h and lib/libnccl.so); without it the NCCL comm says it is not
  # built (engine/dist/comm.c). tests/gpu/run.sh links its programs with `make nccl-flags`.
  NCCL_H    := $(firstword $(wildcard $(if $(NCCL_HOME),$(NCCL_HOME)/include/nccl.h) $(CUDA_HOME)/include/nccl.h \
                 /usr/include/nccl.h /usr/local/include/nccl.h))
  ifneq ($(NCCL_H),)
    NCCL_CFLAGS := -DGRPOD_NCCL -I$(patsubst %/nccl.h,%,$(NCCL_H))
    NCCL_LIBS   := $(if $(NCCL_HOME),-L$(NCCL_HOME)/lib -Wl$(COMMA)-rpath$(COMMA)$(NCCL_HOME)/lib) -lnccl
    CFLAGS  += $(NCCL_CFLAGS)
    NVFLAGS += -I$(patsubst %/nccl.h,%,$(NCCL_H))
    LDLIBS  += $(NCCL_LIBS)
  else
    CUDA_SRC := $(filter-out engine/dist/comm_nccl.cu,$(CUDA_SRC))
  endif
endif

ENGINE_SRC := $(wildcard common/*.c engine/*.c engine/*/*.c) $(wildcard kernels/*_cpu.c)
APP_SRC    := $(filter-out daemon/main.c,$(wildcard daemon/*.c api/*.c store/*.c))
TEST_SRC   := $(wildcard tests/unit/test_*.c)

ENGINE_OBJ := $(ENGINE_SRC:%.c=$(BUILD)/%.o) $(CUDA_SRC:%.cu=$(BUILD)/%.cu.o)
APP_OBJ    := $(APP_SRC:%.c=$(BUILD)/%.o)
TEST_BIN   := $(TEST_SRC:tests/unit/%.c=$(BUILD)/tests/%)
HOOKS_BIN  := $(BUILD)/grpod-test-hooks

.PHONY: all deps test run bench install clean gpu-tests fuzz nccl-flags sanitize format
all: grpod

# The compile and link flags of NCCL as this Makefile found it ("|" between; empty without it).
nccl-flags:
	@echo "$(NCCL_CFLAGS)|$(NCCL_LIBS)"

$(BUILD)/libengine.a: $(ENGINE_OBJ)
	@rm -f $@; ar rcs $@ $^
$(BUILD)/libapp.a: $(APP_OBJ)
	@rm -f $@; ar rcs $@ $^

# $(BUILD)/grpod: the same daemon inside another build directory (make sanitize's variants)
grpod $(BUILD)/grpod: $(BUILD)/daemon/main.o $(BUILD)/libapp.a $(BUILD)/libengine.a
	$(CC) -o $@ $^ $(APPLIBS) $(LDLIBS)

# The daemon with its test hooks compiled in (-DGRPOD_TEST_HOOKS: daemon/worker.c's engine-hang
# hook for tests/deploy/test_notify.py, daemon/test_hooks.h's kill points for
# tests/integration/torture.py); make test builds it, nothing installs it.
$(BUILD)/hooks/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -DGRPOD_TEST_HOOKS -c -o $@ $<
$(HOOKS_BIN): $(BUILD)/daemon/main.o $(BUILD)/hooks/daemon/worker.o $(BUILD)/hooks/daemon/jobs.o $(BUILD)/hooks/daemon/ranks.o \
		$(BUILD)/hooks/daemon/follow.o \
		$(BUILD)/libapp.a $(BUILD)/libengine.a
	$(CC) -o $@ $^ $(APPLIBS) $(LDLIBS)

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c -o $@ $<
# api/dashboard.c embeds the page with .incbin, which -MMD does not see
$(BUILD)/api/dashboard.o: api/dashboard.html
# sqrtf without errno: the host AdamW loops vectorize (same bits; kernels/adamw_cpu.c)
$(BUILD)/kernels/adamw_cpu.o: CFLAGS += -fno-math-errno

$(BUILD)/%.cu.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -c -o $@ $<

# Unit tests link the app and the engine; tests/unit/check.h is their harness; their scratch
# files go under $(BUILD)/tmp (TEST_TMP), one folder a checkout and build.
$(BUILD)/tests/%: tests/unit/%.c $(BUILD)/libapp.a $(BUILD)/libengine.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -DTEST_TMP='"$(abspath $(BUILD))/tmp"' -o $@ $(filter %.c %.a,$^) $(APPLIBS) $(LDLIBS)

deps:
	@bash tools/deps.sh --test

# run and test install missing packages first (tools/deps.sh is a no-op when all are present),
# then build in a second make so the build sees the installed headers.
test: deps
	@$(MAKE) --no-print-directory grpod $(HOOKS_BIN) $(TEST_BIN)
	@bash tests/run.sh $(TEST_BIN)

# libFuzzer targets (tests/fuzz/fuzz_*.c; clang, ASan + UBSan), each with a seed corpus in
# tests/fuzz/corpus/NAME: request validation, reward verifiers, safetensors, config.json,
# tokenizer; tests/fuzz/NAME.dict, where there is one, is its dictionary. tests/run.sh runs each
# briefly; `make fuzz` runs each for FUZZ_SECONDS (default 600).
FUZZ_NAMES := request reward safetensors config tokenizer
FUZZ_BIN   := $(FUZZ_NAMES:%=$(BUILD)/fuzz_%)
FUZZ_CC    := clang -std=gnu11 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -I.
FUZZ_TOK   := engine/text/tokenizer.c engine/text/tok_encode.c engine/text/tok_text.c engine/text/unicode_data.c engine/text/chat.c engine/format/json.c
FUZZ_SRC_request     := api/validate.c api/fields.c api/packed.c api/params.c api/status.c api/reward.c common/err.c engine/train/loss.c engine/params.c
FUZZ_SRC_reward      := api/reward.c common/err.c
FUZZ_SRC_safetensors := engine/format/safetensors.c engine/format/json.c common/err.c
FUZZ_SRC_config      := engine/format/config.c engine/format/json.c common/err.c
FUZZ_SRC_tokenizer   := $(FUZZ_TOK) common/err.c
$(BUILD)/fuzz_%: tests/fuzz/fuzz_%.c $(wildcard api/*.c api/*.h common/*.c common/*.h engine/*.c engine/*.h engine/*/*.c engine/*/*.h) Makefile
	@mkdir -p $(dir $@)
	$(FUZZ_CC) -o $@ $< $(FUZZ_SRC_$*) -ljson-c -lpcre2-8 -lm -lpthread
FUZZ_SECONDS ?= 600
fuzz: $(FUZZ_BIN)
	@for n in $(FUZZ_NAMES); do mkdir -p $(BUILD)/fuzz-long/$$n; \
	  $(BUILD)/fuzz_$$n -max_total_time=$(FUZZ_SECONDS) -max_len=65536 -timeout=20 -rss_limit_mb=2048 \
	    $$([ -f tests/fuzz/$$n.dict ] && echo -dict=tests/fuzz/$$n.dict) \
	    -print_final_stats=1 $(BUILD)/fuzz-long/$$n tests/fuzz/corpus/$$n >$(BUILD)/fuzz-long/$$n.log 2>&1; rc=$$?; \
	  echo "fuzz_$$n: exit $$rc, $$(grep -E '^stat::number_of_executed_units' $(BUILD)/fuzz-long/$$n.log | cut -d: -f4) runs," \
	    "$$(grep -oE 'cov: [0-9]+' $(BUILD)/fuzz-long/$$n.log | tail -1) (log $(BUILD)/fuzz-long/$$n.log)"; \
	  [ $$rc = 0 ] || { grep -m3 -E 'ERROR|SUMMARY|runtime error' $(BUILD)/fuzz-long/$$n.log; exit 1; }; done

# Sanitizers over the tests (tests/sanitize.sh runs them and fails on any report), CPU backend
# only (CUDA=0), built by clang (GCC 12's UBSan beside ASan ignores log_path, and a daemon's
# stderr is a file no test reads), each variant in its own build directory so it never mixes
# with the normal build:
#   build/asan  ASan + UBSan + LeakSanitizer: every unit test, and every integration test but
#               test_torture (kill -9 at random points, with the normal build's hooks binary;
#               `make test` runs it).
#   build/tsan  TSan over the code with threads: unit tests test_comm (cpu comm ranks),
#               test_comm_tcp (TCP comm ranks, two processes), test_dp (engines on rank threads),
#               test_update_atomic (the safety copy's thread), test_store (SQLite from threads),
#               test_moe_ep (expert-parallel ranks on threads);
#               integration tests test_ranks (rank threads), test_batching (the worker thread
#               beside the HTTP threads), test_lifecycle (signals, drain, shutdown), test_join
#               (a leader's cluster calls and a follower's poller thread).
# CI runs it after `make test` (.ci/run). On a shared two-core machine, from nothing: about 12
# minutes (builds 1, ASan 7.5, TSan 4; the budget is 20): test_learns under ASan (2.5 min) and
# test_dp under TSan (1.5 min) are the largest pieces, and the first to leave if it grows.
SAN_ASAN   := -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
SAN_TSAN   := -fsanitize=thread
ASAN_TESTS := $(filter-out %/test_torture.py,$(wildcard tests/integration/test_*.py))
TSAN_UNITS := test_comm test_comm_tcp test_dp test_update_atomic test_store test_moe_ep
TSAN_TESTS := $(addprefix tests/integration/,test_ranks.py test_batching.py test_lifecycle.py test_join.py)
# -Wno-pass-failed: clang says each `omp simd` loop it leaves scalar under the sanitizers
SAN_CFLAGS := -O2 -g -Wno-pass-failed
# the layout .clang-format writes down, over every C, CUDA and header file but the generated
# unicode tables
format:
	clang-format -i $$(git ls-files '*.c' '*.h' '*.cu' '*.cuh' | grep -v 'engine/text/unicode_data.c')

sanitize: deps
	@CFLAGS="$(SAN_CFLAGS)" $(MAKE) --no-print-directory CC=clang BUILD=build/asan CUDA=0 SAN="$(SAN_ASAN)" \
	  build/asan/grpod $(TEST_SRC:tests/unit/%.c=build/asan/tests/%)
	@CFLAGS="$(SAN_CFLAGS)" $(MAKE) --no-print-directory CC=clang BUILD=build/tsan CUDA=0 SAN="$(SAN_TSAN)" \
	  build/tsan/grpod $(TSAN_UNITS:%=build/tsan/tests/%)
	@ASAN_TESTS="$(ASAN_TESTS)" TSAN_UNITS="$(TSAN_UNITS)" TSAN_TESTS="$(TSAN_TESTS)" bash tests/sanitize.sh

run:
	@bash tools/deps.sh
	@$(MAKE) --no-print-directory grpod
	./grpod serve $(ARGS)

$(BUILD)/bench/%: tests/bench/%.c $(BUILD)/libengine.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $(filter %.c %.a,$^) $(LDLIBS)

bench: grpod $(patsubst tests/bench/%.c,$(BUILD)/bench/%,$(wildcard tests/bench/*.c))
	@bash tests/bench/run.sh

# The unit names /usr/local/bin/grpod; installed under another PREFIX it names that binary.
install: grpod
	install -Dm755 grpod $(DESTDIR)$(PREFIX)/bin/grpod
	install -d $(DESTDIR)$(PREFIX)/lib/systemd/system
	sed 's#/usr/local/bin/grpod#$(PREFIX)/bin/grpod#g; s#/usr/local/share/#$(PREFIX)/share/#g' \
	  deploy/grpod.service >$(DESTDIR)$(PREFIX)/lib/systemd/system/grpod.service
	chmod 644 $(DESTDIR)$(PREFIX)/lib/systemd/system/grpod.service
	install -Dm644 deploy/grpod.sysusers $(DESTDIR)$(PREFIX)/lib/sysusers.d/grpod.conf
	install -Dm644 deploy/grpod.conf $(DESTDIR)$(PREFIX)/share/doc/grpod/grpod.conf.example
	install -Dm644 docs/deploy.md $(DESTDIR)$(PREFIX)/share/doc/grpod/deploy.md
	install -Dm644 docs/grpod.1 $(DESTDIR)$(PREFIX)/share/man/man1/grpod.1

clean:
	rm -rf $(BUILD) grpod

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
