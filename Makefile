# The two commands:  make bench  (main job: benchmark with its correctness
# check)  and  make test  (C++ and Python tests).  Both create what they need:
# a python with torch (the current one if it has torch, else .venv with torch
# from PyPI), the extension, and the CMake build of the C++ tests.
#
# The extension is built in place (fused_layernorm/_C*.so, objects under
# build/) and only when a source under csrc/, setup.py or the build settings
# changed; ninja then recompiles only the objects whose inputs changed, so a
# second run with nothing changed builds nothing.

PY ?= python3
VENV ?= .venv
MAX_JOBS ?= $(shell nproc)
PYTHON := $(shell if [ -x $(VENV)/bin/python ]; then echo $(VENV)/bin/python; \
	elif $(PY) -c "import torch" >/dev/null 2>&1; then echo $(PY); else echo $(VENV)/bin/python; fi)

EXT_STAMP := build/.fln-ext.stamp
EXT_CONFIG := build/.fln-ext.config
EXT_SOURCES := setup.py $(shell find csrc -type f \( -name '*.cpp' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \))

.PHONY: test bench gpu-check env build cpp-test py-test clean FORCE

test: cpp-test py-test

bench: build
	$(PYTHON) -m fused_layernorm.bench $(BENCH_ARGS)

# One command on a GPU machine: build, every test on CUDA, compute-sanitizer,
# the benchmark, and bench/results/<date>-<gpu>.json.  On a copy of the tree
# without git history, pass FLN_GIT_COMMIT (and FLN_GIT_DIRTY=0|1).
gpu-check:
	PYTHON=$(PY) MAX_JOBS=$(MAX_JOBS) bash scripts/gpu_check.sh

# Only a .venv of our own is made; a python that already has torch is used as is.
ifeq ($(PYTHON),$(VENV)/bin/python)
env: $(VENV)/bin/python
else
env: ;
endif

$(VENV)/bin/python:
	$(PY) -m venv $(VENV)
	$(VENV)/bin/pip install --upgrade pip
	$(VENV)/bin/pip install -r requirements-dev.txt

build: $(EXT_STAMP)

# The settings that change what is built; rewritten only when they differ, so
# that its timestamp moves (and the extension rebuilds) only then.
$(EXT_CONFIG): FORCE
	@mkdir -p build
	@echo "python=$(PYTHON) FLN_NO_CUDA=$(FLN_NO_CUDA) TORCH_CUDA_ARCH_LIST=$(TORCH_CUDA_ARCH_LIST)" \
		| cmp -s - $@ || echo "python=$(PYTHON) FLN_NO_CUDA=$(FLN_NO_CUDA) TORCH_CUDA_ARCH_LIST=$(TORCH_CUDA_ARCH_LIST)" > $@

# --force: setuptools alone would skip the extension when only a header
# changed; ninja still skips every object that is up to date.  The stamp
# takes the time the build started, so a source edited during it is newer.
$(EXT_STAMP): $(EXT_SOURCES) $(EXT_CONFIG) | env
	@echo "== building fused_layernorm._C in place ($(MAX_JOBS) jobs; a cold build compiles every source:" \
		"minutes, each line below is one finished object)"
	@touch $@.start
	MAX_JOBS=$(MAX_JOBS) $(PYTHON) setup.py -q build_ext --inplace --force
	@mv $@.start $@

cpp-test:
	@[ -f build-cpp/CMakeCache.txt ] || cmake -S . -B build-cpp -DCMAKE_BUILD_TYPE=Release
	cmake --build build-cpp -j $(MAX_JOBS)
	ctest --test-dir build-cpp --output-on-failure

# pytest exits 5 when it collects no test; make treats that as a failure too.
py-test: build
	$(PYTHON) -m pytest tests/python -q -rs $(PYTEST_ARGS)

clean:
	rm -rf build build-cpp *.egg-info fused_layernorm/*.so
