# The agent and the demo (issue 4).
#   make demo        the README's main command: 1,024 requests, concurrency 256
#   make demo-smoke  a small safe run (corrupt_pages 0, aborts > 0) and a small
#                    --unsafe release-on-abort run (corrupt_pages > 0), from a
#                    build with -tags kvfenceunsafe (a default build refuses
#                    --unsafe), and the restart fence's control arm
#                    (release-before-reap lets a write land in freed memory); ~25 s
.PHONY: demo demo-smoke

demo:
	$(GO) run ./cmd/kvfence demo

demo-smoke:
	$(GO) build -o $(BIN)/kvfence ./cmd/kvfence
	$(BIN)/kvfence demo --json --quiet --requests 128 --concurrency 32 --report none > $(BIN)/demo-smoke-safe.json
	grep -q '"corrupt_pages":0,' $(BIN)/demo-smoke-safe.json && grep -Eq '"aborts":[1-9]' $(BIN)/demo-smoke-safe.json || { cat $(BIN)/demo-smoke-safe.json; exit 1; }
	@echo "demo-smoke safe: corrupt_pages 0 with aborts"
	$(GO) test -count=1 -tags kvfenceunsafe ./internal/knownunsafe
	$(GO) test -count=1 -tags kvfenceunsafe ./agent -run '^TestRestartFenceControlReleaseBeforeReap$$'
	$(GO) build -tags kvfenceunsafe -o $(BIN)/kvfence-unsafe ./cmd/kvfence
	$(BIN)/kvfence-unsafe demo --json --quiet --requests 128 --concurrency 32 --report none --unsafe release-on-abort > $(BIN)/demo-smoke-unsafe.json
	grep -Eq '"corrupt_pages":[1-9]' $(BIN)/demo-smoke-unsafe.json || { cat $(BIN)/demo-smoke-unsafe.json; exit 1; }
	@echo "demo-smoke unsafe release-on-abort: corrupt pages caught"

TEST_STEPS += demo-smoke
