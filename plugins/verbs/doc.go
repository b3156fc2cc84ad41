// Package verbs is the kvfence transport plugin on raw libibverbs (cgo): RC
// queue pairs, batched RDMA WRITE/READ with signalled completions, and
// receiver-side fencing with memory windows or MR rotation.
//
// It owns: opening an RDMA device (by name or GID), the protection domain,
// registration of shared host memory (sdk.MapMemory) and of dma-buf memory
// (ibv_reg_dmabuf_mr), one RC queue pair per peer connected through a small
// TCP handshake (qpn, psn, gid) on the address LocalEndpoint returns, the
// completion-polling loop, Quiesce, and Grant/Revoke of per-exposure keys.
//
// The verbs-to-contract rules live in pure Go (wc.go, tracker.go, config.go,
// key.go) and are unit-tested everywhere; the cgo layer (ibv.go, build tag
// "rdma", needs libibverbs-dev) only moves values in and out of libibverbs.
// Without the tag the package builds a stub device that reports
// Unavailable, so `go vet ./...` and `go test ./...` work on machines with no
// RDMA headers; the tests that need a device skip and say why.
//
// Mapping of work completions (see wc.go): IBV_WC_SUCCESS for every work
// request of a batch → Succeeded; flush errors after the plugin itself moved
// the queue pair to ERROR and harvested every completion → FailedDefinite;
// retry-exceeded, remote-access and every other error → InDoubt, which only a
// Quiesce (QP → ERROR, harvest all, evidence endpoint-flushed) resolves.
// MaxTail is derived from the QP's own timeout and retry_cnt; retry_cnt 7
// (infinite retry on rxe) is refused.
//
// It must never: claim quiescence before every completion of a queue pair was
// harvested after the queue pair was moved to ERROR (or it was destroyed);
// report Succeeded for a batch with any non-success completion; post on a
// queue pair it has moved to ERROR; expose memory outside a granted window
// (every key is its own MR or memory window covering exactly the window); or
// return from Revoke before the device refuses the old key.
package verbs
