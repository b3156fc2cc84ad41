# Soft-RoCE VM job and the cgo build of the verbs plugin (issue 6).
#
# verbs-cgo (TEST_STEPS): vets and unit-tests plugins/verbs with -tags rdma,
#   i.e. the real libibverbs binding; needs libibverbs-dev (installed here
#   when run as root). Device tests skip on a machine without RDMA devices.
# rxe-vm-test (ROOT_STEPS): vm/rxe-vm-test.sh — QEMU + Debian's kernel +
#   rdma_rxe; the plugin's device tests, late-write under netem, bandwidth
#   vs ib_write_bw, certification with real faults (netem on the rxe wire,
#   SIGSTOP, SIGKILL; the job fails if the suite does not build, a check
#   fails or a required check is skipped). KVM is used only if a 30 s boot
#   probe succeeds, else TCG; the log says which. Measured (TCG, 2 shared
#   cores, /dev/kvm present but the probe hung): 10.5 min all steps,
#   8.2 min with GUEST_ARGS=kvf.steps=device-tests,certify (certify 3-5 min).
#   GUEST_ARGS=kvf.steps=device-tests,bandwidth runs a subset.
RXE_OUT ?= /tmp/kvfence-rxe

.PHONY: verbs-cgo rxe-vm-test

verbs-cgo:
	@test -f /usr/include/infiniband/verbs.h || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libibverbs-dev >/dev/null; \
	  else echo "verbs-cgo needs libibverbs-dev: sudo apt-get install libibverbs-dev" >&2; exit 1; fi; }
	$(GO) vet -tags rdma ./plugins/verbs/...
	$(GO) test -count=1 -tags rdma ./plugins/verbs/...

rxe-vm-test:
	OUT=$(RXE_OUT) GO=$(GO) ./vm/rxe-vm-test.sh

TEST_STEPS += verbs-cgo
ROOT_STEPS += rxe-vm-test
