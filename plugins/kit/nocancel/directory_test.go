package nocancel

import (
	"testing"

	"github.com/kvfence/kvfence/sdk"
)

// A lookup that times out must not leave its late answer on the
// connection: the next key would read it and get the first key's window
// (its writes would land in memory the request never named). The client
// drops the connection after a failed exchange and redials.
func TestDirectoryLateAnswerIsNotTheNextKeys(t *testing.T) {
	release := make(chan struct{})
	slowKey, nextKey := sdk.Key(7), sdk.Key(8)
	d, err := listenDirectory("127.0.0.1:0", "v2", func() []byte { return nil }, func(k sdk.Key) (window, bool) {
		if k == slowKey {
			<-release
			return window{addr: 0x7000, n: 7}, true
		}
		return window{addr: 0x8000, n: 8}, true
	})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	dc, _, err := dialDirectory(d.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer dc.Close()
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
