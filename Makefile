# kiln: `make test` sets up a fresh Debian 12 machine (packages, configure, build) and runs every
# test; `make bench [BENCH=name]` runs the benchmarks. BUILD and CMAKE_FLAGS select the build.
BUILD ?= build
CMAKE_FLAGS ?=
PYTHON := /usr/bin/python3
JOBS ?= $(shell nproc)

.PHONY: all deps configure build test test-cpp test-python demo bench clean
.PHONY: test-asan test-asan-cpp test-tsan

all: build

deps:
	@bash scripts/install-deps

configure: deps
	@cmake -S . -B $(BUILD) -G Ninja -DPython_EXECUTABLE=$(PYTHON) $(CMAKE_FLAGS) > $(BUILD).configure.log 2>&1 \
	  || { cat $(BUILD).configure.log; exit 1; }
	@grep -E "kiln:" $(BUILD).configure.log || true

build: configure
	@cmake --build $(BUILD) -j $(JOBS)

test-cpp: build
	@# CTest splits test names at ';' and cannot register names with '[': refuse them loudly.
	@if $(BUILD)/tests/cpp/kiln_tests --list-test-cases --no-version | grep -v -E '^(\[doctest\]|=+$$)' | grep -E '[][;]'; then \
	  echo "test names above contain ';', '[' or ']', which CTest cannot register; rename them"; exit 1; fi
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS) --timeout 600

test-python: build
	@PYTHONPATH=$(BUILD)/python MPLBACKEND=Agg $(PYTHON) -m pytest -q -p no:cacheprovider tests/python

test: test-cpp test-python

# Sanitizer builds, each in its own folder, without CUDA (the GPU simulator is built) and without
# benchmarks. test-asan: AddressSanitizer and UndefinedBehaviorSanitizer over every CTest test, then
# pytest with the ASan runtime preloaded (PYTHON_TESTS=0 or test-asan-cpp: CTest only, no Python
# extension). libstdc++ is preloaded beside it: python3 does not link it, and ASan's __cxa_throw
# interceptor, set up before the extension loads it, would otherwise abort at the first throw. test-tsan: ThreadSanitizer over the threaded parts (TSAN_TESTS, a CTest regex).
# Suppressions, each with its reason: tests/sanitizers/. libgomp is not instrumented, so OpenMP
# (oneDNN's threads) runs one thread under TSan; kiln's own thread pool keeps KILN_NUM_THREADS.
ASAN_BUILD ?= build-asan
TSAN_BUILD ?= build-tsan
PYTHON_TESTS ?= 1
TSAN_TESTS ?= engine|collectives|streams|lanes|executor|parallel
SAN_TIMEOUT ?= 3000
SAN_DIR := $(CURDIR)/tests/sanitizers
SAN_CMAKE := -DKILN_CUDA=OFF -DKILN_BENCH=OFF -DKILN_RELOCATABLE=OFF
# allocator_may_return_null: an impossible size returns null as glibc's malloc does (kiln turns
# that into OutOfMemoryError, and tests check it) instead of ASan aborting the process.
ASAN_COMMON := check_initialization_order=1:strict_string_checks=1:allocator_may_return_null=1
ASAN_ENV := ASAN_OPTIONS=detect_leaks=1:$(ASAN_COMMON) \
  LSAN_OPTIONS=suppressions=$(SAN_DIR)/lsan.supp:print_suppressions=0 \
  UBSAN_OPTIONS=print_stacktrace=1
TSAN_ENV := TSAN_OPTIONS=suppressions=$(SAN_DIR)/tsan.supp:second_deadlock_stack=1:history_size=4 OMP_NUM_THREADS=1

test-asan:
	@$(ASAN_ENV) $(MAKE) --no-print-directory build BUILD=$(ASAN_BUILD) \
	  CMAKE_FLAGS="$(SAN_CMAKE) -DKILN_SANITIZE=address -DKILN_PYTHON=$(if $(filter 1,$(PYTHON_TESTS)),ON,OFF) $(CMAKE_FLAGS)"
	@cd $(ASAN_BUILD) && $(ASAN_ENV) ctest --output-on-failure -j $(JOBS) --timeout $(SAN_TIMEOUT)
	@if [ "$(PYTHON_TESTS)" = 1 ]; then \
	  $(ASAN_ENV) ASAN_OPTIONS=detect_leaks=0:$(ASAN_COMMON) \
	    LD_PRELOAD="$$(g++ -print-file-name=libasan.so) $$(g++ -print-file-name=libstdc++.so)" \
	    PYTHONPATH=$(ASAN_BUILD)/python MPLBACKEND=Agg $(PYTHON) -m pytest -q -p no:cacheprovider tests/python; fi

test-asan-cpp:
	@$(MAKE) --no-print-directory test-asan PYTHON_TESTS=0

test-tsan:
	@$(MAKE) --no-print-directory configure BUILD=$(TSAN_BUILD) \
	  CMAKE_FLAGS="$(SAN_CMAKE) -DKILN_SANITIZE=thread -DKILN_PYTHON=OFF $(CMAKE_FLAGS)"
	@$(TSAN_ENV) cmake --build $(TSAN_BUILD) -j $(JOBS) --target kiln_tests
	@cd $(TSAN_BUILD) && $(TSAN_ENV) ctest --output-on-failure -j $(JOBS) --timeout $(SAN_TIMEOUT) -R '$(TSAN_TESTS)'

# Trains the d2l.ai LeNet on Fashion-MNIST, hybridized, on every device here (all GPUs, else two CPU
# devices), the batch split over them; saves the curve as lenet.png/svg, exports
# lenet-symbol.json + lenet-0000.params and checks them from C++ (no Python).
demo: build
	@PYTHONPATH=$(BUILD)/python MPLBACKEND=Agg $(PYTHON) examples/python/lenet_fashion_mnist.py --device all \
	  --hybridize --plot lenet --export lenet
	@$(BUILD)/examples/example_deploy_lenet lenet

bench: build
	@bash scripts/run-bench $(BUILD) $(BENCH)

clean:
	rm -rf $(BUILD) $(BUILD).configure.log

# The libFuzzer targets of tests/fuzz (one per reader of outside data), built by clang-19 with
# ASan and UBSan in their own build directory, each run for FUZZ_SECONDS; fails on a finding.
FUZZ_BUILD ?= build-fuzz
FUZZ_SECONDS ?= 30
.PHONY: fuzz
fuzz: deps
	@cmake -S . -B $(FUZZ_BUILD) -G Ninja -DKILN_FUZZ=ON -DCMAKE_BUILD_TYPE=Debug \
	  -DCMAKE_C_COMPILER=clang-19 -DCMAKE_CXX_COMPILER=clang++-19 > $(FUZZ_BUILD).configure.log 2>&1 \
	  || { cat $(FUZZ_BUILD).configure.log; exit 1; }
	@cmake --build $(FUZZ_BUILD) -j $(JOBS)
	@FUZZ_SECONDS=$(FUZZ_SECONDS) bash scripts/run-fuzz $(FUZZ_BUILD)
