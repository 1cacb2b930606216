# kiln: `make test` sets up a fresh Debian 12 machine (packages, configure, build) and runs every
# test; `make bench [BENCH=name]` runs the benchmarks. BUILD and CMAKE_FLAGS select the build.
BUILD ?= build
CMAKE_FLAGS ?=
PYTHON := /usr/bin/python3
JOBS ?= $(shell nproc)

.PHONY: all deps configure build test test-cpp test-python demo bench clean

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
