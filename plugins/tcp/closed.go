package tcp

import (
	"context"
	"errors"
	"io"
	"net"
	"syscall"
	"time"
)

// This file: how a sender tells that the receiver closed a data connection,
// which is quiescence evidence (sdk.EvidenceReceiverClosed) when the
// receiver can no longer answer a Quiesce — typically because its process
// died, and with it the memory the writes were aimed at.
//
// Why it holds. The receiver reads every write's payload straight from the
// socket into the granted window (no user-space buffer: what it has read is
// applied), and every way it ends a session is a full close of the socket
// (never a half-close): a graceful end, a revocation cutting a write off, a
// garbage frame, a deadline, its transport closing, or its process dying
// (the kernel closes the sockets of a dead process). Go's Close waits for a
// read in progress on the socket to return before the descriptor is closed,
// and no read starts after it. Once the socket is closed its kernel discards
// whatever is still unread in it and answers anything that still arrives
// with a reset. So the FIN or RST we receive was sent after the receiver's
// last read of this connection: nothing more of it can be applied.
//
// What does not count. Our own Close (the reader then sees net.ErrClosed), a
// timeout or an unreachable host (our kernel gave up; the receiver may be
// alive and still reading its socket buffer). Linux reports a connection's
// error to only one system call, and an end of stream to every later read:
// if our writer consumed a timeout, the reader then reads a plain EOF. The
// writer's errors are therefore recorded too, and any failure that is not a
// reset spoils the evidence for the session.
//
// The limits are documented on sdk.EvidenceReceiverClosed: the connection
// must be end to end (a TCP-terminating proxy's FIN speaks for the proxy),
// and a middlebox that forges FIN or RST defeats it (write deadlines still
// bound the tail: MaxTail).

type closeKind uint8

const (
	closeNeutral closeKind = iota // our own close, or already reported by another call
	closeByPeer                   // the receiver closed its socket (FIN or RST)
	closeFault                    // our side gave up: timeout, unreachable, unknown
)

// classifyClose sorts the error of a read (reading) or a write on a data
// connection. ownCloseIsPeer is the known-unsafe variant that takes our own
// close for the receiver's.
func classifyClose(err error, reading, ownCloseIsPeer bool) closeKind {
	switch {
	case err == nil:
		return closeNeutral
	case errors.Is(err, net.ErrClosed):
		if ownCloseIsPeer && reading {
			return closeByPeer // KNOWN-UNSAFE: our own close is not the receiver's
		}
		return closeNeutral
	case reading && (errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)):
		return closeByPeer // FIN: the receiver closed (it never half-closes)
	case errors.Is(err, syscall.ECONNRESET):
		return closeByPeer // RST: the receiver's socket is gone
	case !reading && errors.Is(err, syscall.EPIPE):
		// The connection was torn down and its error already reported to
		// the reader, which classified it.
		return closeNeutral
	}
	return closeFault
}

// observe records what the error of a read or write on the connection says
// about how it ended. Caller holds s.mu.
func (s *sendSession) observe(err error, reading bool) {
	switch classifyClose(err, reading, s.t.cfg.unsafe == unsafeOwnCloseIsReceiverClosed) {
	case closeByPeer:
		if s.peerClosed == nil {
			s.peerClosed = err
		}
	case closeFault:
		if s.localFault == nil {
			s.localFault = err
		}
	}
}

// receiverClosed reports whether the receiver closed this session's
// connection before we did, so that nothing written on it can still be
// applied. It waits (up to a second, or ctx) for the reader to see the end
// of a connection that is being torn down, then for the writer to finish,
// so that every error either of them met is recorded.
func (s *sendSession) receiverClosed(ctx context.Context) bool {
	select {
	case <-s.readerEnd:
	case <-time.After(time.Second):
		return false // the connection still looks open from here
	case <-ctx.Done():
		return false
	}
	select {
	case <-s.writerEnd:
	case <-ctx.Done():
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.peerClosed != nil && s.localFault == nil
}
