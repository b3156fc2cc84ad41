package nocancel

import (
	"testing"

	"github.com/kvfence/kvfence/sdk"
)

// dialTestDirectory serves lookup on loopback and returns a client of it;
// both are closed when the test ends (the client first).
func dialTestDirectory(t *testing.T, lookup func(sdk.Key) (window, bool)) *dirClient {
	t.Helper()
	d, err := listenDirectory("127.0.0.1:0", "v2", func() []byte { return nil }, lookup)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	dc, _, err := dialDirectory(d.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(dc.Close)
	return dc
}

// A lookup that times out must not leave its late answer on the
// connection: the next key would read it and get the first key's window
// (its writes would land in memory the request never named). The client
// drops the connection after a failed exchange and redials.
func TestDirectoryLateAnswerIsNotTheNextKeys(t *testing.T) {
	release := make(chan struct{})
	slowKey, nextKey := sdk.Key(7), sdk.Key(8)
	dc := dialTestDirectory(t, func(k sdk.Key) (window, bool) {
		if k == slowKey {
			<-release
			return window{addr: 0x7000, n: 7}, true
		}
		return window{addr: 0x8000, n: 8}, true
	})
	if w, err := dc.resolve(slowKey); err == nil {
		t.Fatalf("the slow lookup answered %+v within the directory timeout", w)
	}
	close(release) // its answer now goes out on the connection the request used
	w, err := dc.resolve(nextKey)
	if err != nil {
		t.Fatalf("the directory is unusable after one failed lookup: %v", err)
	}
	if w.addr != 0x8000 || w.n != 8 {
		t.Fatalf("key %d resolved to %+v: the late answer for key %d", nextKey, w, slowKey)
	}
}

// A connection kept from an earlier lookup may have died since (a blackhole
// outlasting TCP's retransmissions, a socket the kernel aborted with ss -K);
// once the link is healthy again the next lookup must succeed on a fresh
// connection, not fail the Post that asked (seen across two hosts against
// real Mooncake: the warm-up write after link-stalled and after link-reset).
func TestDirectoryLookupSurvivesADeadKeptConnection(t *testing.T) {
	dc := dialTestDirectory(t, func(k sdk.Key) (window, bool) {
		return window{addr: uintptr(k) << 12, n: uint64(k)}, true
	})
	if _, err := dc.resolve(5); err != nil {
		t.Fatal(err)
	}
	// The kept connection dies under the client, as the kernel's abort
	// of the local socket does: its next write fails.
	_ = dc.c.Close()
	w, err := dc.resolve(6)
	if err != nil {
		t.Fatalf("a lookup on a healthy link failed because the kept connection had died: %v", err)
	}
	if w.addr != 6<<12 || w.n != 6 {
		t.Fatalf("key 6 resolved to %+v", w)
	}
}
