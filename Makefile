# kvcm: `make demo` runs the main job, `make test` runs every check.
GO ?= go
GOFLAGS_TEST ?= -race -count=1

.PHONY: all demo test fmt-check vet go-test fuzz fuzz-short build generate generate-check lib

all: build

build:
	$(GO) build ./...

demo:
	$(GO) run ./cmd/kvcm demo

# make test starts one local Redis Cluster (scripts/redis-cluster.sh: three
# masters on 127.0.0.1, redis-server installed with apt where missing) for the
# whole run, exports its seeds to the tests in KVCM_REDIS_CLUSTER, and stops it
# at the end, also when a step fails. Without it the shared tier's cluster
# tests skip, so go test ./... alone still passes.
REDIS_CLUSTER ?= scripts/redis-cluster.sh
TEST_STEPS := generate-check fmt-check vet go-test fuzz-short py-test cpp-test

.PHONY: test-steps
test:
	@addrs="$$($(REDIS_CLUSTER) start)" || { $(REDIS_CLUSTER) stop; exit 1; }; \
	echo "make test: Redis Cluster at $$addrs"; \
	KVCM_REDIS_CLUSTER="$$addrs" $(MAKE) --no-print-directory test-steps; rc=$$?; \
	$(REDIS_CLUSTER) stop; exit $$rc

test-steps: $(TEST_STEPS)

fmt-check:
	@out="$$(gofmt -l .)"; \
	if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet ./...

go-test:
	$(GO) test $(GOFLAGS_TEST) ./...

# The manager's bookkeeping benchmark (EVALUATION.md §2): CPU time and
# allocations per request on issue 11's trace, the ratio to the SHA-256
# hashing of the same blocks, and the decode-step cost at 1k and 128k tokens.
# BENCH_BOOKKEEPING_ARGS passes flags (kvcm bench bookkeeping -h).
.PHONY: bench-bookkeeping
bench-bookkeeping:
	$(GO) run ./cmd/kvcm bench bookkeeping $(BENCH_BOOKKEEPING_ARGS)

# The fault harnesses (core.FuzzSessions, and abitest.FuzzABI over the C ABI):
# go-test runs their committed seed corpora (testdata/fuzz/<target>); these
# explore new inputs, and a failing one is written there. fuzz-short is the
# bounded run of make test.
FUZZTIME ?= 60s
FUZZ_SHORT_TIME ?= 30s
FUZZ_SHORT_ABI_TIME ?= 10s
FUZZ_PARALLEL ?= 2
fuzz:
	$(GO) test ./core -run '^$$' -fuzz '^FuzzSessions$$' -fuzztime $(FUZZTIME) -parallel $(FUZZ_PARALLEL)
	$(GO) test ./capi/abitest -run '^$$' -fuzz '^FuzzABI$$' -fuzztime $(FUZZTIME) -parallel $(FUZZ_PARALLEL)

fuzz-short:
	$(GO) test ./core -run '^$$' -fuzz '^FuzzSessions$$' -fuzztime $(FUZZ_SHORT_TIME) -parallel $(FUZZ_PARALLEL)
	$(GO) test ./capi/abitest -run '^$$' -fuzz '^FuzzABI$$' -fuzztime $(FUZZ_SHORT_ABI_TIME) -parallel $(FUZZ_PARALLEL)

# The C ABI: kvcmgen writes the public header, the cgo export shim, the C++
# declarations, the Python ctypes layer and docs/api.md from gen/abi.
generate:
	$(GO) run ./gen/cmd/kvcmgen

# Fails when a generated file differs from what kvcmgen writes now.
generate-check:
	$(GO) run ./gen/cmd/kvcmgen -check

# libkvcm.so with our generated header as its public header (cgo's own
# header is dropped).
lib:
	@mkdir -p build/include/kvcm
	$(GO) build -buildmode=c-shared -ldflags=-extldflags=-Wl,-soname,libkvcm.so -o build/libkvcm.so ./capi/libkvcm
	rm -f build/libkvcm.h
	cp include/kvcm/kvcm.h build/include/kvcm/kvcm.h

# The Python bindings' tests, against the in-tree package and build/libkvcm.so
# (built first). pytest's exit code 5 ("no tests collected") fails when test
# files exist.
PYTHON ?= python3
.PHONY: py-test
py-test: lib
	@cd bindings/python && \
	KVCM_LIBRARY="$(CURDIR)/build/libkvcm.so" \
	$(PYTHON) -m pytest -q -p no:cacheprovider tests; rc=$$?; \
	if [ $$rc -eq 5 ]; then \
		if ls tests/test_*.py >/dev/null 2>&1; then echo "py-test: pytest collected no tests, but tests exist"; exit 1; fi; \
		echo "py-test: no Python tests"; exit 0; \
	fi; exit $$rc

# The bookkeeping trace from Python (issue 11): µs per request of the binding
# against the same cycle through raw ctypes and in C, per-call overheads and
# the token conversion, all measured in the same run (docs/benchmarks.md).
# BENCH_PY_ARGS=--quick for a short run.
BENCH_PY_ARGS ?=
.PHONY: bench-python
bench-python: lib
	KVCM_LIBRARY="$(CURDIR)/build/libkvcm.so" $(PYTHON) bindings/python/bench/bookkeeping.py $(BENCH_PY_ARGS)

# C++ bindings (bindings/cpp): CMake builds libkvcm.so from the Go sources,
# the GoogleTest tests (also under AddressSanitizer) and the find_package test;
# ctest runs them. cpp-test runs everything, cpp-test-asan only the ASan runs.
# The tests are opt-in in CMake (KVCM_BUILD_TESTS, default OFF), so cpp-build
# turns them on, also in a build directory configured without them.
CMAKE ?= cmake
CTEST ?= ctest
CPP_BUILD_DIR ?= build/cmake
CMAKE_GENERATOR_FLAG := $(if $(shell command -v ninja 2>/dev/null),-G Ninja,)

.PHONY: cpp-build cpp-test cpp-test-asan
cpp-build:
	@if [ ! -f $(CPP_BUILD_DIR)/CMakeCache.txt ]; then \
		$(CMAKE) -S . -B $(CPP_BUILD_DIR) $(CMAKE_GENERATOR_FLAG) -DKVCM_BUILD_TESTS=ON; \
	elif ! grep -q '^KVCM_BUILD_TESTS:BOOL=ON$$' $(CPP_BUILD_DIR)/CMakeCache.txt; then \
		$(CMAKE) -S . -B $(CPP_BUILD_DIR) -DKVCM_BUILD_TESTS=ON; \
	fi
	$(CMAKE) --build $(CPP_BUILD_DIR)

cpp-test: cpp-build
	$(CTEST) --test-dir $(CPP_BUILD_DIR) --output-on-failure -j2

cpp-test-asan: cpp-build
	$(CTEST) --test-dir $(CPP_BUILD_DIR) --output-on-failure -j2 -L asan
