# The two commands:  make bench  (main job: benchmark with its correctness
# check)  and  make test  (C++ and Python tests).  Both create what they need:
# a python with torch (the current one if it has torch, else .venv with torch
# from PyPI), the extension, and the CMake build of the C++ tests.

PY ?= python3
VENV ?= .venv
MAX_JOBS ?= $(shell nproc)
PYTHON := $(shell if [ -x $(VENV)/bin/python ]; then echo $(VENV)/bin/python; \
	elif $(PY) -c "import torch" >/dev/null 2>&1; then echo $(PY); else echo $(VENV)/bin/python; fi)

.PHONY: test bench gpu-check env build cpp-test py-test clean

test: cpp-test py-test

bench: build
	$(PYTHON) -m fused_layernorm.bench $(BENCH_ARGS)

# One command on a GPU machine: build, every test on CUDA, compute-sanitizer,
# the benchmark, and bench/results/<date>-<gpu>.json.  On a copy of the tree
# without git history, pass FLN_GIT_COMMIT (and FLN_GIT_DIRTY=0|1).
gpu-check:
	PYTHON=$(PY) MAX_JOBS=$(MAX_JOBS) bash scripts/gpu_check.sh

env: $(PYTHON)

$(VENV)/bin/python:
	$(PY) -m venv $(VENV)
	$(VENV)/bin/pip install --upgrade pip
	$(VENV)/bin/pip install -r requirements-dev.txt

build: env
	MAX_JOBS=$(MAX_JOBS) $(PYTHON) -m pip install --no-build-isolation -e . 

cpp-test:
	cmake -S . -B build-cpp -DCMAKE_BUILD_TYPE=Release
	cmake --build build-cpp -j $(MAX_JOBS)
	ctest --test-dir build-cpp --output-on-failure

# pytest exits 5 when it collects no test; make treats that as a failure too.
py-test: build
	$(PYTHON) -m pytest tests/python -q -rs $(PYTEST_ARGS)

clean:
	rm -rf build build-cpp *.egg-info fused_layernorm/*.so
