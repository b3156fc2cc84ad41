# KV in GPU memory (issue 24): the staged mode through the CUDA driver API.
#   make gpu-fake   (in `make test-long`; `make unit` runs the gpumem and
#                   cmd/libkvfence staging tests under -race on the same fake)
#                   the gpumem tests on the fake driver (gcc builds it from
#                   gpumem/testdata/fakecuda.c); the
#                   known-unsafe copy-before-success control arm, which the
#                   late-write test must catch; the gpu-check path itself
#                   over the fake (bandwidth figures there mean nothing); and
#                   gpu-check without a driver (one skip line, exit 0); the C
#                   ABI's staging of device buffers (cmd/libkvfence
#                   TestStaging*) and the SGLang scheduler-order scenarios
#                   with every KV buffer in fake GPU memory
#                   (python/tests/test_sglang_gpu.py) and the vLLM connector
#                   scenarios with every cache layer in fake GPU memory
#                   (python/tests/test_vllm_gpu.py), and SGLang's decode in
#                   direct mode with its deferred release and the
#                   released-at-abort control arm
#                   (python/tests/test_sglang_direct.py, with aux rows in
#                   host landing pages), and the landing pages' control arm
#                   (the agent's release-on-abort core: a late write lands
#                   in a landing page lent again); bindings-py leaves
#                   them to this step. ~4 min
#   make gpu-check  on a machine with an NVIDIA driver: page integrity with
#                   aborts against the real driver, then staged copy bandwidth
#                   as a ratio of cuMemcpy of the same bytes (goal >= 0.9),
#                   then direct mode (kvfence-gpu-check direct): GPU pages
#                   exported as a dma-buf, registered by a verbs plugin
#                   process on the NIC nearest GPU 0 (topo), RDMA WRITEs
#                   checked page by page on the GPU; one skip line where the
#                   host has no RDMA NIC, no dma-buf export or registration.
#                   Without a driver: prints one line saying what it skipped
#                   and why, and exits 0.
.PHONY: gpu-fake gpu-check

GPU_CHECK_TESTS := ^(TestGatherScatterEveryPageOneCopyPerRun|TestGatherLargerThanStaging|TestCancelMidCopy|TestLateWriteNeverReachesGPUPage)$$

gpu-check:
	@mkdir -p $(BIN) && $(GO) build -o $(BIN)/kvfence-gpu-check ./gpumem/cmd/kvfence-gpu-check
	@rc=0; $(BIN)/kvfence-gpu-check probe || rc=$$?; \
	if [ $$rc = 10 ]; then exit 0; fi; [ $$rc = 0 ] || exit $$rc; \
	$(GO) test -count=1 -v ./gpumem -run '$(GPU_CHECK_TESTS)' -gpumem.driver=$${KVFENCE_CUDA_LIB:-libcuda.so.1} 2>&1 | grep -E '^(---|ok|FAIL|panic)|staged_test|device_test'; \
	$(BIN)/kvfence-gpu-check bandwidth $(GPU_CHECK_FLAGS); \
	if $(GO) build -tags rdma -o $(BIN)/kvfence-plugin-verbs-rdma ./plugins/verbs/cmd/kvfence-plugin-verbs 2>/dev/null; then \
	  rc=0; $(BIN)/kvfence-gpu-check direct $(BIN)/kvfence-plugin-verbs-rdma || rc=$$?; [ $$rc = 0 ] || [ $$rc = 10 ] || exit $$rc; \
	else echo "gpu-check: direct mode skipped: the verbs plugin does not build with -tags rdma here (libibverbs-dev missing)"; fi

gpu-fake: bindings bindings-deps
	@echo "==> gpu-fake"
	mkdir -p $(BIN)
	$(GO) test -count=1 ./gpumem/...
	$(GO) test -count=1 ./cmd/libkvfence -run '^TestStaging'
	PYTHONPATH=python KVFENCE_LIB=$(BIN)/libkvfence.so KVFENCE_PLUGIN=$(BIN)/kvfence-plugin-tcp \
	  $(PYTHON) -m pytest -q -rs -p no:cacheprovider python/tests/test_sglang_gpu.py python/tests/test_sglang_direct.py \
	  python/tests/test_vllm_gpu.py
	arms=$$($(GO) test -count=1 -tags kvfenceunsafe -v ./gpumem -run '^(TestLateWriteNeverReachesGPUPage|TestDirectHoldUntilReleased)$$' 2>&1 | grep -E 'control arm caught'); \
	  printf '%s\n' "$$arms"; [ "$$(printf '%s\n' "$$arms" | grep -c .)" = 3 ] || \
	  { echo "gpu-fake: a control arm was not caught (copy before success; direct mode's pages free at abort, one buffer and one per layer)"; exit 1; }
	arm=$$($(GO) test -count=1 -tags kvfenceunsafe -v ./agent -run '^TestDirectHostLandingControlReleaseOnAbort$$' 2>&1 | grep -E 'control arm caught'); \
	  printf '%s\n' "$$arm"; [ -n "$$arm" ] || { echo "gpu-fake: the host landing pages' control arm (released at abort) was not caught"; exit 1; }
	$(CC) -Wall -shared -fPIC -O1 -pthread -o $(BIN)/libfakecuda.so gpumem/testdata/fakecuda.c
	KVFENCE_CUDA_LIB=$(abspath $(BIN))/libfakecuda.so $(MAKE) --no-print-directory gpu-check GPU_CHECK_FLAGS='--bytes 16777216 --rounds 2'
	out=$$(KVFENCE_CUDA_LIB=/nonexistent/libcuda.so.1 $(MAKE) --no-print-directory -s gpu-check); \
	  [ "$$(printf '%s\n' "$$out" | wc -l)" = 1 ] && printf '%s\n' "$$out" | grep -q '^gpu-check: skipped' || \
	  { echo "gpu-fake: gpu-check without a driver printed: $$out"; exit 1; }
	@echo "gpu-fake: staged mode on the fake driver passes (gpumem, the C ABI, the SGLang classes, the vLLM connector), and direct mode end to end over TCP plugin processes (gpumem: one buffer, and one per layer; SGLang's decode); every control arm caught (host landing pages included); gpu-check skips cleanly without a driver"

LONG_STEPS += gpu-fake
