package tcp

import "time"

// Config tunes a TCP transport. Zero values take the defaults below.
type Config struct {
	// ListenAddr is where the receiving side listens. Default 127.0.0.1:0.
	ListenAddr string
	// AckTimeout: a batch not fully acknowledged this long after Post
	// completes InDoubt. Default 10s.
	AckTimeout time.Duration
	// WriteTTL: every write carries a deadline of (send time + WriteTTL) on
	// the sender's clock; the receiver never starts applying it later and
	// cuts off a payload still arriving at the deadline. This is what makes
	// MaxTail finite even if a receiver stalls with bytes in its socket
	// buffer. Default 10s.
	WriteTTL time.Duration
	// ClockSkew is the most the two hosts' clocks may differ. It is added to
	// MaxTail. Default 0 (loopback / one host); set it for real networks.
	ClockSkew time.Duration
	// MaxBatch is the most operations in one batch. Default 4096.
	MaxBatch int
	// MaxOpBytes is the most bytes in one operation. Default 64 MiB.
	MaxOpBytes uint64
	// QueueDepth is how many batches may wait per connection before Post
	// says ResourceExhausted. Default 1024.
	QueueDepth int

	// The data port's bounds (receiver side). MaxConns is the most
	// connections open at once, handshaking or not; more are closed on
	// accept. Default 1024.
	MaxConns int
	// HandshakeTimeout: a new connection must finish its TLS handshake and
	// send its first frame within this, or it is closed. Default 10s.
	HandshakeTimeout time.Duration
	// IdleTimeout: a data session that starts no write this long is closed
	// (its sender reconnects on its next Post). Default 5m.
	IdleTimeout time.Duration
	// FirstWriteTimeout: a session whose first write does not start this
	// long after its HELLO is closed (admission.go). Default 5s.
	FirstWriteTimeout time.Duration
	// MaxSessionsPerWriter is the most sessions one writer identity holds
	// at once; more are refused at HELLO (admission.go). Default 64.
	MaxSessionsPerWriter int
	// RevokeGrace: a write whose payload is still arriving when its key is
	// revoked may finish for this long (Revoke returns after it, so its
	// bytes land while the window is still held); then its connection is
	// cut. Cutting at once cost every other write on that connection
	// (another request's) an InDoubt and a Quiesce. Default 20ms.
	RevokeGrace time.Duration

	// unsafe selects a deliberately broken behaviour, for tests that prove
	// the contract tests can fail. Unexported: settable only by this
	// package's tests and by a binary built with the kvfenceunsafe tag.
	unsafe unsafeMode
}

// tailSlack covers what the deadline arithmetic cannot: a read syscall that
// began just before the deadline, and a write that raced an InDoubt report.
const tailSlack = time.Second

func (c Config) withDefaults() Config {
	if c.ListenAddr == "" {
		c.ListenAddr = "127.0.0.1:0"
	}
	if c.AckTimeout <= 0 {
		c.AckTimeout = 10 * time.Second
	}
	if c.WriteTTL <= 0 {
		c.WriteTTL = 10 * time.Second
	}
	if c.MaxBatch <= 0 {
		c.MaxBatch = 4096
	}
	if c.MaxOpBytes == 0 || c.MaxOpBytes > maxWireBytes {
		c.MaxOpBytes = 64 << 20
	}
	if c.QueueDepth <= 0 {
		c.QueueDepth = 1024
	}
	if c.MaxConns <= 0 {
		c.MaxConns = 1024
	}
	if c.HandshakeTimeout <= 0 {
		c.HandshakeTimeout = 10 * time.Second
	}
	if c.IdleTimeout <= 0 {
		c.IdleTimeout = 5 * time.Minute
	}
	if c.FirstWriteTimeout <= 0 {
		c.FirstWriteTimeout = 5 * time.Second
	}
	if c.MaxSessionsPerWriter <= 0 {
		c.MaxSessionsPerWriter = 64
	}
	if c.RevokeGrace <= 0 {
		c.RevokeGrace = 20 * time.Millisecond
	}
	return c
}

// maxTail is the honest bound on how long after a batch's completion (or a
// failure report) bytes of it may still land, absent Quiesce: a write is
// never applied past its deadline (send time + WriteTTL, sender clock), the
// receiver's clock may lag by ClockSkew, and tailSlack covers the rest.
func (c Config) maxTail() time.Duration {
	if c.unsafe == unsafeUnderstateTail {
		return tailSlack / 20 // KNOWN-UNSAFE: declares far less than the deadline allows
	}
	return c.WriteTTL + c.ClockSkew + tailSlack
}

// unsafeMode names the known-unsafe variants the tests must catch.
type unsafeMode uint8

const (
	safe unsafeMode = iota
	// unsafeSucceedBeforeAck: the sender reports Succeeded once the bytes
	// are handed to the socket, without waiting for acknowledgements.
	unsafeSucceedBeforeAck
	// unsafeApplyAfterRevoke: the receiver ignores revocation.
	unsafeApplyAfterRevoke
	// unsafeAckBeforeApply: the receiver acknowledges a write when its
	// header arrives and applies a large payload later (a NIC that acks on
	// receipt and DMAs afterwards).
	unsafeAckBeforeApply
	// unsafeFailedOnTimeout: an ack timeout is reported FailedDefinite
	// although the bytes may still be on their way (the "timeout is a
	// label" behaviour of several RDMA libraries).
	unsafeFailedOnTimeout
	// unsafeQuiesceEarly: Quiesce claims receiver-confirmed evidence
	// without asking the receiver.
	unsafeQuiesceEarly
	// unsafeDuplicateCompletion: every completion is sent twice.
	unsafeDuplicateCompletion
	// unsafeLoseCompletion: every fifth completion is never sent.
	unsafeLoseCompletion
	// unsafeWrongErrorClass: Post's refusals lose their class (they cross
	// the wire as Internal instead of invalid-argument, not-found, ...).
	unsafeWrongErrorClass
	// unsafeOwnCloseIsReceiverClosed: Quiesce closes the sender's own side
	// of the connection and reports receiver-closed evidence, taking its
	// reader's end for the receiver's close, while the receiver is alive
	// and may still read and apply what sits in its socket buffer.
	unsafeOwnCloseIsReceiverClosed
	// unsafeCleartext: the data plane of version 1 — no TLS, no
	// identities: anyone who sees the traffic learns keys and session
	// tokens, anyone who reaches the port may use them, and an initiator
	// talks to whoever answers at the address. Also the baseline of the
	// encryption cost benchmark.
	unsafeCleartext
	// unsafeUnderstateTail: Info declares a MaxTail (50 ms) far shorter
	// than the write deadline lets bytes land after a failure report.
	unsafeUnderstateTail
	// unsafeWrongRefusalClass: a batch the receiver refused (unknown key,
	// revoked key, out of window) completes FailedDefinite with class
	// Internal instead of the refusal's class.
	unsafeWrongRefusalClass
	// unsafeConfirmBeforeStopped: the receiver confirms a QUIESCE without
	// ending the session, which goes on applying what it still reads.
	unsafeConfirmBeforeStopped
	// unsafeIgnorePieces: the receiver checks a write against its key's
	// whole span, not its pieces: a rank's key reaches its co-ranks'
	// shards (pieces.go).
	unsafeIgnorePieces
	// unsafeAdmitAny: the data port of wire version 2 — a session for any
	// client that completes a handshake, whatever its HELLO names, idle up
	// to IdleTimeout before its first write, no cap per identity, and new
	// connections refused (not silent ones evicted) at MaxConns.
	unsafeAdmitAny
	// unsafeBatchRevokeAllOK: RevokeMany reports every key of the batch
	// revoked, also those it failed to revoke (an unknown key).
	unsafeBatchRevokeAllOK
	// unsafeRefusalCutsSession: a refused write ends its whole session, as
	// an RC queue pair's remote access error does, while Info still
	// declares RefusalsIsolated: every other batch on the session fails
	// with it (the old HELLO refusal's blast radius, for every write).
	unsafeRefusalCutsSession
)

// unsafeModeByName is how the kvfenceunsafe build of the binary picks one.
var unsafeModeByName = map[string]unsafeMode{
	"succeed-before-ack":           unsafeSucceedBeforeAck,
	"apply-after-revoke":           unsafeApplyAfterRevoke,
	"batch-revoke-all-ok":          unsafeBatchRevokeAllOK,
	"refusal-cuts-session":         unsafeRefusalCutsSession,
	"ack-before-apply":             unsafeAckBeforeApply,
	"failed-on-timeout":            unsafeFailedOnTimeout,
	"quiesce-early":                unsafeQuiesceEarly,
	"duplicate-completion":         unsafeDuplicateCompletion,
	"lose-completion":              unsafeLoseCompletion,
	"wrong-error-class":            unsafeWrongErrorClass,
	"own-close-is-receiver-closed": unsafeOwnCloseIsReceiverClosed,
	"cleartext":                    unsafeCleartext,
	"understate-tail":              unsafeUnderstateTail,
	"wrong-refusal-class":          unsafeWrongRefusalClass,
	"confirm-before-stopped":       unsafeConfirmBeforeStopped,
	"ignore-pieces":                unsafeIgnorePieces,
	"admit-any":                    unsafeAdmitAny,
}
