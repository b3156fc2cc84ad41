# The C ABI and the Python package (issue 12).
#   make bindings      bin/libkvfence.so + bin/kvfence.h (and the TCP plugin
#                      they start), the library python/kvfence loads
#   make bindings-c    builds and runs the C test (bindings/c), ~5 s
#   make bindings-py   the pytest suite (python/tests) with Debian's python3,
#                      as PYTEST_GROUPS pytest processes at once, ~80 s on
#                      2 cores (150 s serially); SGLang's base classes are checked only when
#                      SGLANG_SRC names a checkout of sgl-project/sglang,
#                      vLLM's base class and factory only when VLLM_SRC names
#                      a copy of vLLM (docs/vllm.md)
# PYTEST_GROUPS: pytest processes the suite runs as at once (python/tests/run_groups.py;
# 1 runs it serially).
PYTEST_GROUPS ?= 3
PYTHON ?= $(shell test -x /usr/bin/python3 && echo /usr/bin/python3 || echo python3)
.PHONY: bindings bindings-c bindings-py bindings-deps bindings-bench

bindings: plugins
	$(GO) build -buildmode=c-shared -o $(BIN)/libkvfence.so ./cmd/libkvfence
	awk -v abi=cmd/libkvfence/abi.h '/#include "abi.h"/ { if (!done) { while ((getline l < abi) > 0) print l; done = 1 } next } { print }' \
	  $(BIN)/libkvfence.h > $(BIN)/kvfence.h
	rm -f $(BIN)/libkvfence.h

bindings-c: bindings
	gcc -std=c11 -Wall -Wextra -Werror -pthread -I$(BIN) bindings/c/kvfence_test.c \
	  -L$(BIN) -lkvfence -Wl,-rpath,'$$ORIGIN' -o $(BIN)/kvfence-c-test
	KVFENCE_PLUGIN=$(BIN)/kvfence-plugin-tcp $(BIN)/kvfence-c-test

# python3, pytest and numpy from Debian (installed when run as root, as CI does).
bindings-deps:
	@$(PYTHON) -c 'import pytest, numpy' 2>/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3 python3-pytest python3-numpy >/dev/null; \
	  else echo "need python3, pytest and numpy: sudo apt-get install python3 python3-pytest python3-numpy" >&2; exit 1; fi; }

bindings-py: bindings bindings-deps
	PYTHONPATH=python $(PYTHON) -c 'from kvfence.sglang import KVFenceBackendProvider'
	PYTHONPATH=python $(PYTHON) -c 'from kvfence.vllm import KVFenceConnector'
	PYTHONPATH=python KVFENCE_LIB=$(BIN)/libkvfence.so KVFENCE_PLUGIN=$(BIN)/kvfence-plugin-tcp \
	  $(PYTHON) python/tests/run_groups.py --groups $(PYTEST_GROUPS) --ignore=python/tests/test_sglang_gpu.py \
	  --ignore=python/tests/test_sglang_direct.py --ignore=python/tests/test_vllm_gpu.py python/tests -q -rs -p no:cacheprovider
	@echo "(boundary cost: make bindings-bench)"

TEST_STEPS += bindings-c bindings-py

# The C/Python boundary's cost per call, as ratios to the same call made
# from Go in the same run (figures only; the machine may be shared).
bindings-bench: bindings
	PYTHONPATH=python KVFENCE_LIB=$(BIN)/libkvfence.so KVFENCE_PLUGIN=$(BIN)/kvfence-plugin-tcp \
	  $(PYTHON) -m pytest -q -s -p no:cacheprovider python/tests/test_boundary.py | grep boundary:

# What kvfence's SGLang classes cost SGLang's scheduler thread (send/poll per
# call for a 512-token Llama-3-8B-shaped request) and the Go gather against a
# plain copy of the same bytes (figures only; the machine may be shared).
.PHONY: sglang-bench
sglang-bench: bindings bindings-deps
	PYTHONPATH=python:python/tests KVFENCE_LIB=$(BIN)/libkvfence.so KVFENCE_PLUGIN=$(BIN)/kvfence-plugin-tcp \
	  $(PYTHON) python/tests/bench_sglang_calls.py
	$(GO) test -run XXX -bench GatherVsCopy -benchtime 20x ./internal/stage
