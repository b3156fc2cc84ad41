package tcp

import (
	"bytes"
	"strings"
	"sync"
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/sdk"
)

// syncBuffer is a bytes.Buffer safe for go-plugin's logging goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// A clean Close logs no warning: go-plugin's "plugin failed to exit
// gracefully" used to follow every one.
func TestCloseIsQuiet(t *testing.T) {
	var log syncBuffer
	p, err := sdk.Open(pluginBin, sdk.OpenOptions{Logger: hclog.New(&hclog.LoggerOptions{Name: "host", Level: hclog.Warn, Output: &log})})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if got := log.String(); got != "" {
		t.Fatalf("a clean Close logged:\n%s", got)
	}
}

// A plugin that cannot start is refused with its own reason (its last
// line on stderr), not only go-plugin's generic handshake error.
func TestOpenCarriesThePluginsReason(t *testing.T) {
	_, err := sdk.Open(pluginBin, sdk.OpenOptions{Env: []string{"KVFENCE_TCP_MAX_CONNS=lots"},
		Logger: hclog.New(&hclog.LoggerOptions{Level: hclog.Off})})
	if err == nil || !strings.Contains(err.Error(), `KVFENCE_TCP_MAX_CONNS="lots": not a positive integer`) {
		t.Fatalf("Open of a plugin that exits with a reason: %v", err)
	}
	if !errdefs.Is(err, errdefs.Unavailable) {
		t.Fatalf("class %v, want unavailable", errdefs.ClassOf(err))
	}
}
