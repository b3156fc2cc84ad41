# The agent and the demo (issue 4).
#   make demo        the README's main command: 1,024 requests, concurrency 256
#   make demo-smoke  a small safe run (corrupt_pages 0, aborts > 0), the same
#                    with the synchronous Post (KVFENCE_ASYNC_POST=off), a small
#                    --unsafe release-on-abort run (corrupt_pages > 0), from a
#                    build with -tags kvfenceunsafe (a default build refuses
#                    --unsafe), the restart fence's control arm
#                    (release-before-reap lets a write land in freed memory,
#                    over the masked TCP plugin and the Mooncake plugin's
#                    fake library), and a restart-fence run over the Mooncake
#                    plugin and its fake library in which prefill rank 2 is
#                    killed with -9 mid-run (holds end fenced, never by
#                    timeout; corrupt_pages 0); ~45 s
.PHONY: demo demo-smoke

demo:
	$(GO) run ./cmd/kvfence demo

demo-smoke:
	$(GO) build -o $(BIN)/kvfence ./cmd/kvfence
	$(BIN)/kvfence demo --json --quiet --requests 128 --concurrency 32 --report none > $(BIN)/demo-smoke-safe.json
	grep -q '"corrupt_pages":0,' $(BIN)/demo-smoke-safe.json && grep -Eq '"aborts":[1-9]' $(BIN)/demo-smoke-safe.json || { cat $(BIN)/demo-smoke-safe.json; exit 1; }
	@echo "demo-smoke safe: corrupt_pages 0 with aborts"
	KVFENCE_ASYNC_POST=off $(BIN)/kvfence demo --json --quiet --requests 128 --concurrency 32 --report none > $(BIN)/demo-smoke-sync.json
	grep -q '"corrupt_pages":0,' $(BIN)/demo-smoke-sync.json && grep -Eq '"aborts":[1-9]' $(BIN)/demo-smoke-sync.json || { cat $(BIN)/demo-smoke-sync.json; exit 1; }
	@echo "demo-smoke synchronous Post (KVFENCE_ASYNC_POST=off): corrupt_pages 0 with aborts"
	$(GO) test -count=1 -tags kvfenceunsafe ./core/knownunsafe
	$(GO) test -count=1 -tags kvfenceunsafe ./agent -run '^TestRestartFenceControlReleaseBeforeReap$$'
	$(GO) build -o $(BIN)/kvfence-plugin-mooncake ./plugins/mooncake/cmd/kvfence-plugin-mooncake
	$(CC) -shared -fPIC -O1 -pthread -Iplugins/kit/nocancel/testdata -o $(BIN)/libfake_transfer_engine.so \
	  plugins/mooncake/testdata/fake_transfer_engine.c plugins/kit/nocancel/testdata/fakewire.c
	KVFENCE_MOONCAKE_LIB=$(abspath $(BIN))/libfake_transfer_engine.so $(BIN)/kvfence demo --json --quiet --plugin mooncake \
	  --restart-fence-instances 2 --restart-fence-after 1s --kill-prefill-after 2s --decode-for 100ms \
	  --requests 300 --concurrency 16 --report none > $(BIN)/demo-smoke-restart.json
	grep -q '"corrupt_pages":0,' $(BIN)/demo-smoke-restart.json && grep -q '"released_timeout":0,' $(BIN)/demo-smoke-restart.json && \
	  grep -Eq '"released_fenced":[1-9]' $(BIN)/demo-smoke-restart.json && grep -Eq '"target_restarts":[1-9]' $(BIN)/demo-smoke-restart.json || \
	  { cat $(BIN)/demo-smoke-restart.json; exit 1; }
	@echo "demo-smoke restart fence (mooncake fake, prefill rank killed): holds fenced, corrupt_pages 0"
	$(GO) build -tags kvfenceunsafe -o $(BIN)/kvfence-unsafe ./cmd/kvfence
	$(BIN)/kvfence-unsafe demo --json --quiet --requests 128 --concurrency 32 --report none --unsafe release-on-abort > $(BIN)/demo-smoke-unsafe.json
	grep -Eq '"corrupt_pages":[1-9]' $(BIN)/demo-smoke-unsafe.json || { cat $(BIN)/demo-smoke-unsafe.json; exit 1; }
	@echo "demo-smoke unsafe release-on-abort: corrupt pages caught"

TEST_STEPS += demo-smoke
