package sdk

import (
	"encoding/json"
	"io"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/hashicorp/go-hclog"
)

// quietClose is the host logger go-plugin gets. On Close, go-plugin asks
// the plugin to shut down, the plugin exits at once, and go-plugin — seeing
// its own connection already closed by that exit — reports "error closing
// client during Kill" and "plugin failed to exit gracefully" before a kill
// that finds nothing left to kill: on every clean shutdown. While Close
// runs those two lines are debug, not warnings. A plugin lost outside
// Close (reap) still warns.
type quietClose struct {
	hclog.Logger
	closing *atomic.Bool
}

func (l quietClose) Warn(msg string, args ...any) {
	if l.closing.Load() && (msg == "plugin failed to exit gracefully" || msg == "error closing client during Kill") {
		l.Logger.Debug(msg, args...)
		return
	}
	l.Logger.Warn(msg, args...)
}

// stderrTail keeps the last non-empty line a plugin wrote on stderr (the
// message of a JSON log line): a plugin that cannot start says why there,
// and Open's refusal carries it instead of go-plugin's generic "failed to
// read any lines from plugin's stdout".
type stderrTail struct {
	mu   sync.Mutex
	cur  []byte
	line string
}

func (s *stderrTail) Write(b []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range b {
		if c != '\n' {
			if len(s.cur) < 4096 {
				s.cur = append(s.cur, c)
			}
			continue
		}
		if l := strings.TrimSpace(string(s.cur)); l != "" {
			s.line = l
		}
		s.cur = s.cur[:0]
	}
	return len(b), nil
}

// last is the last complete line, or the unfinished one; a JSON log line
// gives its message (and error, if any).
func (s *stderrTail) last() string {
	s.mu.Lock()
	l := s.line
	if cur := strings.TrimSpace(string(s.cur)); cur != "" {
		l = cur
	}
	s.mu.Unlock()
	var entry struct {
		Message string `json:"@message"`
		Error   string `json:"error"`
	}
	if json.Unmarshal([]byte(l), &entry) == nil && entry.Message != "" {
		if entry.Error != "" {
			return entry.Message + ": " + entry.Error
		}
		return entry.Message
	}
	return l
}

// stderrTo is where go-plugin copies the plugin's raw stderr: the caller's
// writer, if any, and the tail.
func stderrTo(w io.Writer, tail *stderrTail) io.Writer {
	if w == nil {
		return tail
	}
	return io.MultiWriter(w, tail)
}
