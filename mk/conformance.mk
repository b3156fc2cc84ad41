# Conformance: certify a transport plugin (issue 5). `make conformance` runs
# over loopback with the in-path TCP fault proxy (any user); `make
# conformance-netns` runs the target and initiator in their own network
# namespaces over a veth pair with kernel faults on it, and tc netem where
# the kernel has it (root). Each writes junit.xml,
# result.json, summary.md and certificate.json under $(CONFORMANCE_OUT).
# The broken-variant proof (every known-unsafe TCP variant fails) is a Go
# test in conformance/: `make unit` runs the quicker variants, `make
# unit-long` (in `make test-long`) all of them. `make conformance` is a
# long step (`make test-long`, which CI runs): `make unit` already
# certifies the reference plugin with shorter windows (TestTCPPluginPasses).
PLUGIN          ?= tcp
CONFORMANCE_OUT ?= out/conformance
# The TCP plugin's write deadline and ack timeout, shortened so that the
# guard windows (2 x MaxTail = 2 x (WRITE_TTL + 1 s)) keep each run to a
# couple of minutes; the ack timeout must stay below the write deadline so
# a dishonest FailedDefinite is visible.
CONFORMANCE_ENV ?= --env KVFENCE_TCP_WRITE_TTL=2s --env KVFENCE_TCP_ACK_TIMEOUT=1s
# The guard floor (--guard-floor, default 3 s) is the shortest window the
# suite watches memory after a promise, whatever MaxTail the plugin claims.
# With the settings above MaxTail is 3 s, so guard windows are 6 s anyway;
# the floor mostly sets how long each tail check watches after the declared
# tail (3 offsets x ~7 s per tail check). It is left at its default here:
# CI certifies with the same floor a vendor's certificate would get.
CONFORMANCE_FLAGS ?=
# The soak group (one plugin pair kept busy, every byte checked): the CLI
# defaults are 5000 batches and 2 minutes; CI runs a small count. The
# certificate records what ran.
CONFORMANCE_SOAK ?= --soak-batches 1000 --soak-for 0s
# conformance-netns must certify: its link-fault checks run with the
# kernel's faults on the veth (tbf, TCP blackhole, nftables reject, socket
# abort), which need no sch_netem (CI's Firecracker kernel has none); the
# two netem checks then say why they did not run and are not required.
# nftables is installed when missing (link-lossy is NOT RUN without it).
# conformance-soak: the reference plugin, the whole suite SOAK_FULL times
# and the memory-registration group SOAK_REG times; every run must pass.
# Not part of CI (about 2.5 min per full run on an idle 2-core machine).
SOAK_FULL ?= 20
SOAK_REG  ?= 200
SOAK_OUT  ?= $(CONFORMANCE_OUT)/soak

# conformance-example: the minimal example plugin of docs/writing-a-plugin.md
# is its own Go module (examples/minimal-plugin: a vendor's layout, public
# packages only, go.sum committed so CI's -mod=readonly holds). It is vetted
# and built inside its module, then certified by the CLI as a vendor would
# certify theirs; a short soak keeps the step to a couple of minutes (the
# certificate records what ran). The root module's `go test ./...` does not
# reach a nested module, so this step is what keeps the example certified.
EXAMPLE_DIR  ?= examples/minimal-plugin
EXAMPLE_OUT  ?= $(CONFORMANCE_OUT)/example
EXAMPLE_FLAGS ?= --env KVFENCE_EXAMPLE_TTL=1s --soak-batches 300 --soak-for 0s --repeat 5 \
  --max-write 1048576 --perf-bytes 8388608

.PHONY: conformance conformance-netns conformance-build conformance-soak conformance-example

conformance-build:
	$(GO) build -o $(BIN)/kvfence-plugin-$(PLUGIN) ./plugins/$(PLUGIN)/cmd/kvfence-plugin-$(PLUGIN)
	$(GO) build -o $(BIN)/kvfence ./cmd/kvfence

conformance: conformance-build
	$(BIN)/kvfence conformance --plugin $(BIN)/kvfence-plugin-$(PLUGIN) $(CONFORMANCE_ENV) \
	  --out $(CONFORMANCE_OUT)/$(PLUGIN)-loopback $(CONFORMANCE_SOAK) $(CONFORMANCE_FLAGS)

conformance-example:
	$(GO) build -o $(BIN)/kvfence ./cmd/kvfence
	cd $(EXAMPLE_DIR) && $(GO) vet ./... && $(GO) build -o $(CURDIR)/$(BIN)/kvfence-plugin-example .
	rm -f $(EXAMPLE_OUT)/certificate.json
	$(BIN)/kvfence conformance --plugin $(BIN)/kvfence-plugin-example $(EXAMPLE_FLAGS) --out $(EXAMPLE_OUT)
	@test -s $(EXAMPLE_OUT)/certificate.json || { echo "conformance-example: no certificate written" >&2; exit 1; }

conformance-netns: conformance-build
	@command -v ip >/dev/null 2>&1 && command -v tc >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq iproute2 >/dev/null; \
	  else echo "need iproute2 (ip, tc) and root" >&2; exit 1; fi; }
	@command -v nft >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nftables >/dev/null || true; fi; }
	rm -f $(CONFORMANCE_OUT)/$(PLUGIN)-netns/certificate.json
	$(BIN)/kvfence conformance --plugin $(BIN)/kvfence-plugin-$(PLUGIN) --netns $(CONFORMANCE_ENV) \
	  --out $(CONFORMANCE_OUT)/$(PLUGIN)-netns $(CONFORMANCE_SOAK) $(CONFORMANCE_FLAGS)

conformance-soak: conformance-build
	@mkdir -p $(SOAK_OUT); start=$$(date +%s); \
	for i in $$(seq 1 $(SOAK_REG)); do \
	  $(BIN)/kvfence conformance --plugin $(BIN)/kvfence-plugin-$(PLUGIN) $(CONFORMANCE_ENV) --group memory-registration \
	    --partial --out $(SOAK_OUT)/reg >$(SOAK_OUT)/reg.log 2>&1 || { cat $(SOAK_OUT)/reg.log; echo "memory-registration run $$i/$(SOAK_REG) FAILED" >&2; exit 1; }; \
	done; echo "memory-registration: $(SOAK_REG)/$(SOAK_REG) passed in $$(( $$(date +%s) - start )) s"; \
	for i in $$(seq 1 $(SOAK_FULL)); do \
	  t0=$$(date +%s); \
	  $(BIN)/kvfence conformance --plugin $(BIN)/kvfence-plugin-$(PLUGIN) $(CONFORMANCE_ENV) \
	    --out $(SOAK_OUT)/full $(CONFORMANCE_FLAGS) >$(SOAK_OUT)/full.log 2>&1 || { cat $(SOAK_OUT)/full.log; echo "full run $$i/$(SOAK_FULL) FAILED" >&2; exit 1; }; \
	  echo "full run $$i/$(SOAK_FULL) certified in $$(( $$(date +%s) - t0 )) s"; \
	done

LONG_STEPS += conformance conformance-example
ROOT_STEPS += conformance-netns
