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

func (s *stats) snapshot() map[string]uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]uint64, len(s.m))
	for k, v := range s.m {
		out[k] = v
	}
	return out
}
