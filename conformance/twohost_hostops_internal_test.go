package conformance

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/sdk"
	"github.com/kvfence/kvfence/sdk/sdktest"
)

// serveTargetForTest starts a target host over loopback (no root) and
// returns an authenticated client.
func serveTargetForTest(t *testing.T) *ctlConn {
	t.Helper()
	addr, secret, done := startTestTarget(t)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	cc, err := ctlClient(c, secret)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = cc.call(ctlRequest{Op: "bye"})
		_ = c.Close()
		<-done
	})
	return cc
}

// startTestTarget runs ServeTarget over loopback with the TCP plugin and
// returns its control address, its secret and the channel its result
// comes on (it is cancelled at cleanup).
func startTestTarget(t *testing.T) (string, []byte, chan error) {
	t.Helper()
	bin, err := sdktest.BuildPlugin(t.TempDir(), "github.com/kvfence/kvfence/plugins/tcp/cmd/kvfence-plugin-tcp")
	if err != nil {
		t.Fatal(err)
	}
	secret := []byte("0123456789abcdef0123456789abcdef")
	ready, done := make(chan string, 1), make(chan error, 1)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go func() {
		done <- ServeTarget(ctx, TargetConfig{Plugin: bin, Listen: "127.0.0.1:0", Secret: secret, Size: 1 << 20,
			Ready: func(a string) { ready <- a }})
	}()
	select {
	case addr := <-ready:
		return addr, secret, done
	case err := <-done:
		t.Fatalf("target did not start: %v", err)
	}
	return "", nil, nil
}

// The full suite's target on another host: a plugin process opened there
// on request, its calls forwarded with their error class intact (a
// refusal judged by class on the other host is judged as on this one),
// its memory filled, read and watched there, and a watch answered while
// other requests go on (a watch that held up the channel would hide the
// change made during it). Over loopback: no root.
func TestTargetHostServesTheSuite(t *testing.T) {
	cc := serveTargetForTest(t)
	ctx := context.Background()
	s := &suite{remote: cc}
	tgt, err := s.openRemote(ctx, []string{"KVFENCE_TCP_WRITE_TTL=2s"})
	if err != nil {
		t.Fatal(err)
	}
	defer tgt.close()
	if tgt.info.Name == "" || tgt.g == nil || tgt.neg == 0 {
		t.Fatalf("remote target: info %+v, granter %v, negotiated %d", tgt.info, tgt.g != nil, tgt.neg)
	}
	const size = 1 << 20
	mem, err := s.targetMemory(tgt, size)
	if err != nil {
		t.Fatal(err)
	}
	id, err := tgt.t.RegisterMemory(ctx, mem.Desc())
	if err != nil {
		t.Fatalf("RegisterMemory of the target host's own memory: %v", err)
	}
	_, err = tgt.g.Grant(ctx, sdk.Window{Region: id, Offset: size - 10, Length: 11})
	if !errdefs.Is(err, errdefs.InvalidArgument) {
		t.Fatalf("Grant past the region: %v (class %v), want the plugin's InvalidArgument", err, errdefs.ClassOf(err))
	}
	if _, err := tgt.g.Grant(ctx, sdk.Window{Region: id, Length: 4096}); err != nil {
		t.Fatalf("Grant: %v", err)
	}
	mem.fill(0, 4096, 0x5A)
	if err := untouched(mem.read(0, 4096), 0x5A); err != nil {
		t.Fatalf("fill then read: %v", err)
	}
	w := mem.watch(0, 4096)
	go func() { time.Sleep(100 * time.Millisecond); mem.fill(100, 1, 0x01) }()
	if ch := w.until(time.Minute); ch == nil || ch.Offset != 100 || ch.Now != 0x01 {
		t.Fatalf("the watch did not see the fill made while it watched: %v", ch)
	}
	if err := s.memErr.take(); err != nil {
		t.Fatalf("memory operations failed: %v", err)
	}
	_ = mem.read(size, 1)
	if err := s.memErr.take(); err == nil {
		t.Fatal("a read outside the target's memory did not fail the check it was made in")
	}
	if err := tgt.kill(10 * time.Second); err != nil {
		t.Fatalf("kill on the target host: %v", err)
	}
	if err := tgt.alive(ctx); err == nil {
		t.Fatal("the killed target plugin is reported alive")
	}
}
