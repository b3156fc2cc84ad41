// Package tcp is the kvfence reference transport: one-sided writes over plain
// TCP sockets, in pure Go. It is the embedded default (it runs anywhere) and
// the worked example vendors copy when they wrap their own backend.
//
// It owns both sides of a transfer. The receiving side listens, validates
// every write against a granted window of registered memory (key known, not
// revoked, bounds checked, deadline not passed) and only then reads the
// payload straight from the socket into the shared mapping, acknowledging
// each write after its bytes are in memory. The sending side posts batches
// (one writev per operation, straight from the shared mapping), and reports
// Succeeded only on acknowledgements, InDoubt when one did not arrive in
// time or the connection broke, and FailedDefinite only with proof (the
// receiver refused the write, it never left this process, or a Quiesce got
// evidence: the receiver confirmed it, or — no longer able to answer — it
// had closed the connection first: closed.go).
//
// It must never: apply a byte outside a granted window, apply a byte under a
// revoked key after Revoke returned, report Succeeded without an
// acknowledgement, report FailedDefinite on a timeout or a broken connection,
// take its own close of a connection (or a timeout, or an unreachable peer)
// for the receiver's close, or copy payload bytes through gRPC or an
// intermediate buffer.
//
// The wire format (wire.go) is decoded from untrusted peers; it is fuzzed.
package tcp
