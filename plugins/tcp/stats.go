package tcp

import (
	"os"
	"sync"
)

var errDeadline = os.ErrDeadlineExceeded

// Counter names reported through sdk.StatsReporter.
const (
	statApplied       = "tcp.writes_applied"
	statBytesApplied  = "tcp.bytes_applied"
	statDropped       = "tcp.writes_dropped"
	statExpired       = "tcp.writes_cut_at_deadline"
	statGarbage       = "tcp.garbage_frames"
	statBatchesOK     = "tcp.batches_succeeded"
	statBatchesFailed = "tcp.batches_failed_definite"
	statBatchesDoubt  = "tcp.batches_in_doubt"

	statAcceptErrors   = "tcp.accept_errors"        // Accept failed (fd exhaustion...); retried with backoff
	statConnsRefused   = "tcp.conns_refused_at_cap" // closed on accept: MaxConns reached
	statHandshakeFail  = "tcp.handshakes_failed"    // TLS handshake failed or timed out
	statIdleClosed     = "tcp.sessions_closed_idle" // no write for IdleTimeout
	statGuessesClosed  = "tcp.sessions_closed_unknown_keys"
	statQuiesceRefused = "tcp.quiesce_refused" // a Quiesce for another identity's session
	statNotWriter      = "tcp.writes_refused_not_writer"
	statHelloRefused   = "tcp.hellos_refused"          // HELLO named no key usable here (admission.go)
	statSessionsCapped = "tcp.sessions_refused_at_cap" // the identity holds MaxSessionsPerWriter
	statSilentEvicted  = "tcp.silent_conns_evicted"    // evicted at MaxConns: never wrote
	// statMostSessionsPerWriter is a high-water mark, not a counter: the
	// most sessions one identity held at once (admission.go).
	statMostSessionsPerWriter = "tcp.most_sessions_one_writer_held"
)

type stats struct {
	mu sync.Mutex
	m  map[string]uint64
}

func (s *stats) add(name string, n uint64) {
	s.mu.Lock()
	if s.m == nil {
		s.m = map[string]uint64{}
	}
	s.m[name] += n
	s.mu.Unlock()
}

// max raises name to v if it is lower (a high-water mark).
func (s *stats) max(name string, v uint64) {
	s.mu.Lock()
	if s.m == nil {
		s.m = map[string]uint64{}
	}
	s.m[name] = max(s.m[name], v)
	s.mu.Unlock()
}

func (s *stats) snapshot() map[string]uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]uint64, len(s.m))
	for k, v := range s.m {
		out[k] = v
	}
	return out
}
