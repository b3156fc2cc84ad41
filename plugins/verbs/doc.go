// Package verbs is the kvfence transport plugin on raw libibverbs (cgo): RC
// queue pairs, batched RDMA WRITE/READ (one ibv_post_send chain per batch,
// only its last work request signalled), and receiver-side fencing with
// memory windows or MR rotation.
//
// It owns: opening an RDMA device (by name or GID), the protection domain,
// registration of shared host memory (sdk.MapMemory) and of dma-buf memory
// (received over SCM_RIGHTS by sdk.ImportDMABuf, kept open while registered;
// ibv_reg_dmabuf_mr), one RC queue pair per peer connected through a small
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
// The transport is split by job, as plugins/tcp is: transport.go (New,
// Info, Stats, Close, delivering completions), memory.go (regions),
// exposure.go (Grant, Revoke), receiver.go (the handshake listener and the
// responder QPs), sender.go (peers, Post), sender_dial.go (a sender QP's
// handshake and destruction), poll.go (the completion loop), quiesce.go.
//
// Mapping of work completions (see wc.go, tracker.go): only the last work
// request of a batch is signalled; an RC send queue completes in order, so a
// completion retires every request posted before it (tracker.go, epoch):
// before a success or a non-flush error they succeeded, before a flush
// their fate is unknown (succeeded or flushed silently: bytes not counted).
// IBV_WC_SUCCESS of the batch's last request → Succeeded; flush errors after
// the plugin itself moved the queue pair to ERROR and harvested every
// completion → FailedDefinite; retry-exceeded, remote-access and every other
// error → InDoubt, which only a Quiesce (QP → ERROR, harvest all, evidence
// endpoint-flushed) resolves. If ibv_post_send cuts a batch's chain, the
// posted part is closed with a signalled copy of its last request (same
// bytes, same place) and the batch ends FailedDefinite once that completes.
//
// Polling: one loop harvests the shared CQ, 64 completions at a time. After
// each harvest it yields (runtime.Gosched), so the goroutine waiting on
// Completions runs at once on the same thread; with nothing in flight it
// waits for the next Post instead of polling alongside it. Config.Poll
// (KVFENCE_VERBS_POLL) says how it waits for work in flight after 64 empty
// polls: event (default: arm the CQ and block on its completion channel),
// nap (sleeps of 50 µs doubling to 1 ms; Go makes each ~1 ms on Linux) or
// spin (poll without sleeping while work is outstanding, as perftest does).
//
// Measured in the TCG VM against perftest on the same rxe pair (vm/guest.sh,
// steps bandwidth and latency; 2 vCPUs on a 2-core host another VM shares,
// so figures drift between runs). Bandwidth, 2048 × 64 KiB, 128 in flight
// (BenchmarkDeviceWrite vs ib_write_bw): median ratio 0.97 (rounds
// 0.94-1.04) with event; nap was 31-33 MiB/s where event gave 33-37 and
// ib_write_bw 33-37 (ratio ~0.90); spin 10-15% below nap (the spinning vCPU
// is the one rxe needs); one write per batch (128 batches in flight) or 4
// below 16 per batch; 64 per batch and one reused 64 KiB buffer each side
// (as ib_write_bw) within the noise. Latency, one 4 KiB write per batch,
// post → completion received (BenchmarkDeviceBatchLatency): the
// like-for-like baseline is ib_write_bw -t 1 -Q 1 (one signalled write
// outstanding, its completion polled before the next post), 130-145 µs per
// message; the same write posted through the cgo layer and polled in the
// posting goroutine, no transport (BenchmarkDeviceRawLatency), has a p50 of
// 130-145 µs too, so cgo costs nothing visible. The plugin's p50 is
// 240-280 µs (~2 × the baseline), its mean ~2.8 × (millisecond tails of a
// vCPU waiting for the host). The rest is mostly Post itself, which returns
// after ~190 µs: rxe does the sending, and through the veth much of the
// responder's work and the ACK, inside ibv_post_send's doorbell system call,
// so the transport's bookkeeping and a second thread's wake-up land on the
// critical path. Before the yield after each harvest the p50 was 480-550 µs
// (nap) and 1-1.5 ms (event: the completion sat in the channel until the
// loop's next polls or sleep were done, or another vCPU was woken up for
// its receiver); before the wait for a Post when idle, event's p50 was
// 360-430 µs (the loop's 64 polls ran out during the Post's system call).
// ib_write_lat (half a write ping-pong; the peer polls memory, no
// completion waited for) is ~110 µs: ~2.5 × is the plugin's ratio there.
//
// Memory windows: unbound keys (sdk.Window without Writer) are type-1
// windows (ibv_bind_mw on a private QP pair) or MR rotation (Config.Revoke).
// A key granted to one writer (sdk.Window.Writer = that writer's
// LocalEndpoint address, which its handshake carries) is a type-2 window,
// bound by an IBV_WR_BIND_MW work request on the responder QP of that
// writer's connection, so the device accepts its rkey on that QP only;
// Revoke posts IBV_WR_LOCAL_INV (on the private QP: any QP of the PD may)
// and then frees the window and its MR. Capabilities.WriterBound says the
// device has type-2 windows (rxe: 2B). A type-2 window holds its QP, so when
// a writer's connection closes every window bound through it is invalidated
// before the QP is destroyed (the key dies with the connection); bound-ness
// is tracked per window because invalidating an unbound type-2 window is an
// error (and dereferences NULL in rxe on Linux 6.1). A rank writing over
// several QPs cannot use a key bound to one of them, so the agent's keys
// over verbs are mostly not writer-bound; binding would also make every
// Quiesce of a peer (QP → ERROR, reconnect) kill the keys of requests that
// had nothing in flight on it.
//
// Capabilities.Bounds is window: every key is its own MR or memory window
// over exactly its range, so the device refuses a write past it, and the
// agent grants each prefill rank one key per shard of each slot (issue 19).
// A pieced window (sdk.Window.Stride) would need one memory window per
// piece: Grant refuses it (Unimplemented).
//
// MaxTail is derived from the QP's own timeout and retry_cnt; retry_cnt 7
// (infinite retry on rxe) is refused.
//
// Errors are classified (errdefs): a bad setting is InvalidArgument, from
// ConfigFromEnv and from New alike (the command exits 2 on it); the
// handshake's are classified in handshake.go, and a receiver that refuses a
// sender sends its error's class, which the sender's Connect or Post returns.
//
// It must never: claim quiescence before every completion of a queue pair was
// harvested after the queue pair was moved to ERROR (or it was destroyed);
// report Succeeded for a batch with any non-success completion; post on a
// queue pair it has moved to ERROR; expose memory outside a granted window
// (every key is its own MR or memory window covering exactly the window); or
// return from Revoke before the device refuses the old key.
package verbs
