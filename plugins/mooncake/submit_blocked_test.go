package mooncake_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kvfence/kvfence/sdk"
)

// A library that blocks inside submitTransfer (the real one does: over TCP
// it connects to the peer synchronously there, and under two-host
// conformance's link-dropped the call held for the SYN retries) still owes
// the host a completion: the batch is reported InDoubt at the report
// deadline while the call is blocked, and once it returns the batch is
// kept, polled and its bytes land. The old plugin held its lock across the
// call, so its poller stopped and no completion came until the link did.
func TestSubmitBlockedInLibrary(t *testing.T) {
	// The host waits for Post's verdict (as the conformance suite does);
	// with async posting the host's Post returns at once and would hide a
	// Post blocked in the plugin.
	t.Setenv("KVFENCE_ASYNC_POST", "off")
	gate := filepath.Join(t.TempDir(), "open")
	p := newPair(t, pluginBin, fakeEnv(), []string{"KVFENCE_FAKE_SUBMIT_GATE=" + gate})
	opened := false
	open := func() {
		if !opened {
			opened = true
			if err := os.WriteFile(gate, nil, 0o600); err != nil {
				t.Error(err)
			}
		}
	}
	defer open()
	b := p.Write(4096, 1<<20, 256<<10)
	posted := make(chan error, 1)
	go func() { posted <- p.Ini.Transport().Post(context.Background(), b) }()
	c, err := p.Wait(b.ID, 30*time.Second)
	if err != nil {
		t.Fatalf("no completion while the library's submit call blocked (report deadline 1s): %v", err)
	}
	if c.Status != sdk.InDoubt {
		t.Fatalf("reported %v while the submit call blocked, want InDoubt: %+v", c.Status, c)
	}
	// Post returns once the InDoubt went out, the library's call still
	// blocked: across two hosts real Mooncake held it for minutes.
	select {
	case err := <-posted:
		if err != nil {
			t.Fatalf("Post after its InDoubt went out: %v (one completion per batch, no error)", err)
		}
	case <-time.After(60 * time.Second): // a bound on a wait, not a speed target
		t.Fatal("Post still blocked in the library's submit call after the batch was reported InDoubt")
	}
	open()
	for i := 0; !p.Landed(4096, 1<<20); i++ {
		if i == 3000 {
			t.Fatal("the batch was dropped once the submit call returned: its bytes never landed")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := p.NoMore(500 * time.Millisecond); err != nil {
		t.Fatal(err)
	}
}
