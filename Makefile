# kvfence — build and test entry points. CI (.ci/run) runs `make test`,
# `make test-long` and `make ci-root`.
SHELL     := /bin/bash
.SHELLFLAGS := -eo pipefail -c
GO        ?= go
SIM_SEEDS ?= 10000
FUZZTIME  ?= 15s
BIN       := bin
# `make test` is the quick run (under 10 min on a quiet 2-core machine):
# unit tests with KVFENCE_TEST_QUICK=1, which run every fuzz target's seed
# corpus but no fuzzing. `make test-long` runs what it leaves out: the
# tests that skip under KVFENCE_TEST_QUICK with the reason "long test:
# make test-long runs it" (not -short: rapid cuts every property test's
# checks by 5 under -short, and an unsafe variant went uncaught), each fuzz
# target for LONG_FUZZTIME (FUZZTIME, as before the split; building the
# fuzzing binaries alone took a minute or two of the quick run), and the
# long steps (LONG_STEPS).
LONG_FUZZTIME  ?= $(FUZZTIME)
TEST_STEPS :=
LONG_STEPS :=
ROOT_STEPS :=

# go-nvml's cgo preamble calls NVML functions its headers mark deprecated:
# ~150 warning lines on every fresh build. They are not ours to fix; keep
# the build quiet so that a new warning is seen. An environment's own
# CGO_CFLAGS wins.
export CGO_CFLAGS ?= -O2 -g -Wno-deprecated-declarations

# Feature makefiles (conformance, agent, rxe VM, ...) add targets and steps.
include $(wildcard mk/*.mk)

.PHONY: all build plugins run vet unit unit-long fuzz sim model test test-long ci-root soak deps clean

all: build

build: plugins
	$(GO) build -o $(BIN)/kvfence ./cmd/kvfence

plugins:
	$(GO) build -o $(BIN)/kvfence-plugin-tcp ./plugins/tcp/cmd/kvfence-plugin-tcp
	$(GO) build -o $(BIN)/kvfence-plugin-mooncake ./plugins/mooncake/cmd/kvfence-plugin-mooncake
	$(GO) build -o $(BIN)/kvfence-plugin-nixl ./plugins/nixl/cmd/kvfence-plugin-nixl
	$(GO) build -o $(BIN)/kvfence-plugin-mori ./plugins/mori/cmd/kvfence-plugin-mori

# The main job: the demo on the embedded TCP transport.
run:
	$(GO) run ./cmd/kvfence demo

# Installs what a fresh Debian machine lacks for the tests (spin, a C compiler).
deps:
	@command -v spin >/dev/null 2>&1 && command -v gcc >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq spin gcc >/dev/null; \
	  else echo "need spin and gcc: sudo apt-get install spin gcc" >&2; exit 1; fi; }

vet:
	$(GO) vet ./...
	./.ci/check-links.sh
	./.ci/check-links-test.sh
	./.ci/fuzz-test.sh
	./.ci/long-tests.sh >/dev/null

unit:
	KVFENCE_TEST_QUICK=1 GO=$(GO) ./.ci/gotest.sh -race -count=1 ./...

# The long tests only (see .ci/long-tests.sh): the flood and certification
# tests that `make unit` skips (KVFENCE_TEST_QUICK). One package at a time (-p 1):
# a flood test judges whether honest peers are served while an attacker
# holds the CPU, and other packages' tests beside it only add noise to that
# (the all-in-one unit step failed TestControlPortFloodLeavesHonestServed in
# a CI run on a loaded 2-core machine, 0 of 6 honest requests served).
unit-long:
	@long=$$(./.ci/long-tests.sh); set -- $$long; run=$$1; shift; \
	echo "$(GO) test -race -count=1 -p 1 -run '$$run' $$*"; \
	GO=$(GO) ./.ci/gotest.sh -race -count=1 -p 1 -run "$$run" "$$@"

fuzz:
	GO=$(GO) ./.ci/fuzz.sh ./core FuzzDecodeMessage $(FUZZTIME)
	GO=$(GO) ./.ci/fuzz.sh ./plugins/tcp FuzzDecodeHeader $(FUZZTIME)
	GO=$(GO) ./.ci/fuzz.sh ./sdk FuzzRingRecordDecoders $(FUZZTIME)
	GO=$(GO) ./.ci/fuzz.sh ./agent FuzzDecodeControl $(FUZZTIME)
	GO=$(GO) ./.ci/fuzz.sh ./agent FuzzPrefillControl $(FUZZTIME)
	GO=$(GO) ./.ci/fuzz.sh ./cmd/libkvfence FuzzABI $(FUZZTIME)

sim:
	$(GO) test -count=1 -run '^TestSim' ./core/sim -sim.seeds=$(SIM_SEEDS) -v 2>&1 | grep -E '^(=== RUN|--- |ok|FAIL|PASS)|safe:|caught'
	$(GO) run ./cmd/kvfence sim --seeds 2000 --stop-at-first

model: deps
	./model/check.sh quick

# Every step announces itself and its time: the unit step alone runs for
# minutes without a line (go test prints a package only when it ends).
# The CPU seconds its processes used (this shell's reaped children, from
# /proc) say what a wall time measured on a loaded machine would be on a
# quiet one. $(1): the steps; $(2): make variables every step gets.
define run-steps
cpu() { awk -v hz=$$(getconf CLK_TCK) '{ printf "%d", ($$16 + $$17) / hz + 0.5 }' /proc/$$$$/stat; }; \
for step in $(1); do \
  echo "==> make $$step ($$(date -u +%H:%M:%S))"; start=$$SECONDS; c0=$$(cpu); \
  $(MAKE) --no-print-directory $$step $(2) || { echo "==> make $$step FAILED after $$((SECONDS - start)) s"; exit 1; }; \
  echo "==> make $$step done in $$((SECONDS - start)) s (CPU $$(( $$(cpu) - c0 )) s)"; \
done
endef

test: deps
	@$(call run-steps,vet unit sim model $(TEST_STEPS),)

# What `make test` leaves out; CI runs it after `make test` (any user).
test-long: deps
	@$(call run-steps,unit-long fuzz $(LONG_STEPS),FUZZTIME=$(LONG_FUZZTIME))

# Jobs that need root (network namespaces, the RDMA VM); CI runs them as root.
ci-root:
	@$(call run-steps,$(ROOT_STEPS),)
	@echo "root-only jobs done: $(ROOT_STEPS)"

soak: deps
	$(MAKE) sim SIM_SEEDS=200000
	$(MAKE) fuzz FUZZTIME=5m
	./model/check.sh full

clean:
	rm -rf $(BIN)
