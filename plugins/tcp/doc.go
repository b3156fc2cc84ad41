// Package tcp is the kvfence reference transport: one-sided writes over
// TCP sockets, in pure Go. It is the embedded default (it runs anywhere) and
// the worked example vendors copy when they wrap their own backend.
// Registered memory is host-shared memory, or a dma-buf the CPU can map
// (direct mode in CI: udmabuf, the fake CUDA driver's memfd; memory.go);
// it never takes a dma-buf it cannot map.
//
// It owns both sides of a transfer. The receiving side listens, validates
// every write against a granted window of registered memory (key known, not
// revoked, bounds checked, deadline not passed, and for a writer-bound key
// the writer's own connection) and only then reads the payload from the
// socket into the shared mapping, acknowledging each write after its bytes
// are in memory. The sending side posts batches (one header and payload per
// operation, straight from the shared mapping), and reports Succeeded only
// on acknowledgements, InDoubt when one did not arrive in time or the
// connection broke, and FailedDefinite only with proof (the receiver
// refused the write, it never left this process, or a Quiesce got
// evidence: the receiver confirmed it, or — no longer able to answer — it
// had closed the connection first: closed.go).
//
// Authentication and encryption (identity.go). Each transport instance
// makes an ephemeral P-256 key and self-signed certificate at start; its
// LocalEndpoint address carries the certificate's SHA-256
// ("host:port#sha256=<hex>"). Hosts exchange these addresses over their own
// authenticated control plane (kvfence agents: mutual TLS), so nothing new
// needs distributing. Every data connection is TLS 1.3, both sides
// presenting their certificate: the initiator accepts only the pinned
// receiver (Connect refuses an address without a pin); the receiver accepts
// any client certificate but binds what the handshake proved to the
// session. Hence: keys, payloads and session tokens never cross the wire in
// cleartext; session tokens are 128 random bits; a Quiesce is obeyed only
// from the identity that opened the session; Capabilities.WriterBound — a
// key granted with Window.Writer (the writer's LocalEndpoint address, pin
// included) is usable only on data connections that prove that writer's
// certificate, and dies when the writer's last connection here closes
// (receiver.go: presence). Unlike verbs (one queue pair per key), a writer
// with several connections here (lanes) is not ambiguous: the key binds to
// the proven identity, not to one socket. An unbound key is a bearer capability: whoever holds it may
// write, so it must travel only over authenticated, encrypted channels (the
// agents' control plane); keys are 64 random bits (the width of sdk.Key),
// guessing online is capped per connection (maxUnknownKeyWrites) and by the
// connection bounds below. Encryption costs bandwidth: the cleartext
// variant is kept, under the kvfenceunsafe build tag only, as the baseline
// of BenchmarkEncryptionCost and as the variant the sniffer tests catch.
//
// Capabilities.Bounds is pieces (pieces.go): a key's window may be pieced
// (sdk.Window.Stride/Piece: one rank's shard in each slot of a run), and
// each write is checked against its key's window, piece by piece, before a
// byte of its payload is read; a write outside is refused (out of bounds)
// and its payload discarded. The known-unsafe ignore-pieces variant checks
// the span only.
//
// Bounds on the data port (receiver.go, admission.go): Accept errors
// (descriptor or memory exhaustion) are retried with backoff, never fatal;
// a client certificate alone earns nothing — a session opens only for a
// HELLO naming a key this receiver granted (not revoked; a writer-bound
// key, revoked or not, only for its writer), unknown and revoked keys
// getting one answer;
// at most MaxSessionsPerWriter sessions per identity; at most MaxConns
// connections at once, the oldest silent one evicted for a newcomer (more
// are closed on accept only when every connection has written); a
// connection must finish its handshake and first frame within
// HandshakeTimeout, and its first write within FirstWriteTimeout; a
// session that starts no write for IdleTimeout is closed; refusals are
// logged at most once a second; a write's payload
// is at most MaxOpBytes; acknowledgements a sender does not read time out;
// a revoked key is forgotten after twice MaxTail (retention.go), so the key
// table of a receiver granting a key per request stays bounded. Keys are
// also granted and revoked many a call (sdk.KeyBatcher, batch_keys.go: a
// batch revoke stops every key before waiting for any). A write whose
// payload is still arriving when its key is revoked may finish within
// RevokeGrace (Revoke returns after it); past that its connection is cut.
// A sender whose session's HELLO is refused (its key revoked while it
// dialled) fails only the batches under that key; the others queued behind
// them dial again under their own keys (sender_dial.go).
//
// It must never: apply a byte outside a granted window, apply a byte under a
// revoked key after Revoke returned (or RevokeMany reported it revoked),
// report a key revoked that it did not revoke, apply a byte after its close of a
// connection is visible to the sender (TLS buffers a record: recvSession's
// abort), report Succeeded without an acknowledgement, report
// FailedDefinite on a timeout or a broken connection, take its own close of
// a connection (or a timeout, or an unreachable peer) for the receiver's
// close, send a frame to a receiver whose certificate is not the pinned
// one, obey a Quiesce from another identity, let a read that starts as its
// session is aborted wait for its own deadline (the receiver's Quiesce
// confirmation waits for the abort), or copy payload bytes through
// gRPC or an intermediate buffer (the TLS record layer's ciphertext, the
// cork's copy of small sealed records, and the one decrypted record are the
// only copies).
//
// Small operations (BenchmarkSmallOps). While a sender's writer has more
// batches queued it gathers the small sealed records (frame headers, small
// payloads) and sends them with the next large one in one vectored write
// (cork.go), flushing before it waits; a batch's sources stay pinned until
// it is handed to the socket. A receiver holds each acknowledgement after
// the write is applied until the sender asks for them (writeAckNow: the
// write that ends a batch with nothing queued behind it) or the hold is
// full (64 acknowledgements, 1 MiB of writes), then sends them in one
// record: itself after a write of 32 KiB and more, else through a
// per-session writer with a bounded backlog (acks.go). At 4 KiB
// operations gathering records and acknowledgements cut the CPU per byte
// from about 2.2 to 1.4 times that of plain Go TLS 1.3 over loopback. From
// 64 KiB up what remains is TLS: the plugin spends 0.87 to 1.10 times the CPU
// per byte of plain Go TLS (BenchmarkVsRawTLS; figures and what encryption
// costs in README.md, noisy: a loaded 2-core machine).
//
// The wire format (wire.go) is decoded from untrusted peers; it is fuzzed.
package tcp
