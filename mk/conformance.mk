# Conformance: certify a transport plugin (issue 5). `make conformance` runs
# over loopback with the in-path TCP fault proxy (any user); `make
# conformance-netns` runs the target and initiator in their own network
# namespaces over a veth pair with tc netem (root). Each writes junit.xml,
# result.json, summary.md and certificate.json under $(CONFORMANCE_OUT).
# The broken-variant proof (every known-unsafe TCP variant fails) is a Go
# test in conformance/, run by `make unit`.
PLUGIN          ?= tcp
CONFORMANCE_OUT ?= out/conformance
# The TCP plugin's write deadline and ack timeout, shortened so that the
# guard windows (2 x MaxTail = 2 x (WRITE_TTL + 1 s)) keep each run to a
# couple of minutes; the ack timeout must stay below the write deadline so
# a dishonest FailedDefinite is visible.
CONFORMANCE_ENV ?= --env KVFENCE_TCP_WRITE_TTL=2s --env KVFENCE_TCP_ACK_TIMEOUT=1s
CONFORMANCE_FLAGS ?=

.PHONY: conformance conformance-netns conformance-build

conformance-build:
	$(GO) build -o $(BIN)/kvfence-plugin-$(PLUGIN) ./plugins/$(PLUGIN)/cmd/kvfence-plugin-$(PLUGIN)
	$(GO) build -o $(BIN)/kvfence ./cmd/kvfence

conformance: conformance-build
	$(BIN)/kvfence conformance --plugin $(BIN)/kvfence-plugin-$(PLUGIN) $(CONFORMANCE_ENV) \
	  --out $(CONFORMANCE_OUT)/$(PLUGIN)-loopback $(CONFORMANCE_FLAGS)

conformance-netns: conformance-build
	@command -v ip >/dev/null 2>&1 && command -v tc >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq iproute2 >/dev/null; \
	  else echo "need iproute2 (ip, tc) and root" >&2; exit 1; fi; }
	$(BIN)/kvfence conformance --plugin $(BIN)/kvfence-plugin-$(PLUGIN) --netns $(CONFORMANCE_ENV) \
	  --out $(CONFORMANCE_OUT)/$(PLUGIN)-netns $(CONFORMANCE_FLAGS)

TEST_STEPS += conformance
ROOT_STEPS += conformance-netns
