package tcp

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/sdk"
	"github.com/kvfence/kvfence/sdk/sdktest"
	"golang.org/x/sys/unix"
)

// fakeStalledReceiver answers the hello and then never reads: writes posted
// to it stay in flight (no acknowledgement can come). It returns its address
// and a channel closed once it has received payload bytes.
func fakeStalledReceiver(t *testing.T) (string, <-chan struct{}) {
	ln, addr := listenAs(t, newTestIdentity(t))
	got := make(chan struct{})
	var conns []net.Conn
	t.Cleanup(func() {
		ln.Close()
		for _, c := range conns {
			c.Close()
		}
	})
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		conns = append(conns, c)
		var hb [headerSize]byte
		if _, err := io.ReadFull(c, hb[:]); err != nil {
			return
		}
		(&header{Type: frameHelloAck, Key: 1, Offset: 1}).encode(hb[:])
		_, _ = c.Write(hb[:])
		// Read one header and a little payload, then stall.
		if _, err := io.ReadFull(c, hb[:]); err == nil {
			close(got)
		}
	}()
	return addr, got
}

// kill -9 of the plugin mid-transfer: every outstanding batch completes
// InDoubt, then the host reports process-exited evidence covering them, and
// Quiesce answers with that evidence. Synchronous Post (SyncPost); the
// default asynchronous one is TestKillPluginMidTransferAsyncPost.
func TestKillPluginMidTransfer(t *testing.T) {
	p, region, peer, got := stalledPluginSender(t, sdk.OpenOptions{SyncPost: true})
	tr := p.Transport()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var ids []sdk.BatchID
	for i := 1; i <= 8; i++ {
		id := sdk.BatchID(i)
		b := sdk.Batch{ID: id, Peer: peer, Ops: []sdk.Op{{Kind: sdk.OpWrite, LocalRegion: region, RemoteKey: 7, Length: 4 << 20}}}
		if err := tr.Post(ctx, b); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	select {
	case <-got:
	case <-ctx.Done():
		t.Fatal("no bytes reached the receiver")
	}
	killInFlight(t, p)
	seen := map[sdk.BatchID]sdk.Status{}
	for c := range tr.Completions() {
		if _, dup := seen[c.Batch]; dup {
			t.Fatalf("second completion for batch %d", c.Batch)
		}
		seen[c.Batch] = c.Status
	}
	for _, id := range ids {
		if seen[id] != sdk.InDoubt {
			t.Fatalf("batch %d: %v after the plugin died, want InDoubt", id, seen[id])
		}
	}
	var exited *sdk.Event
	for exited == nil {
		select {
		case ev := <-p.Events():
			if ev.Kind == sdk.EventPluginExited {
				exited = &ev
			}
		case <-ctx.Done():
			t.Fatal("no plugin-exited event")
		}
	}
	if exited.Evidence != sdk.EvidenceProcessExited || len(exited.Batches) != len(ids) {
		t.Fatalf("exit event %+v, want process-exited for %v", exited, ids)
	}
	res, err := tr.Quiesce(ctx, peer, ids)
	if err != nil || res.Evidence != sdk.EvidenceProcessExited {
		t.Fatalf("Quiesce after exit: %+v, %v", res, err)
	}
	if err := tr.Post(ctx, sdk.Batch{ID: 99, Peer: peer, Ops: []sdk.Op{{Kind: sdk.OpWrite, LocalRegion: region, RemoteKey: 7, Length: 1}}}); !errdefs.Is(err, errdefs.Unavailable) {
		t.Fatalf("Post to a dead plugin: %v, want unavailable", err)
	}
}

// killInFlight kills the plugin while its batches are in flight, as an
// event rather than a race: it stops the plugin first (SIGSTOP: from then
// on nothing it does can complete a batch), checks that no completion came
// (the stalled receiver acknowledges nothing, and stalledPluginSender's
// plugin never times a batch out), then kills it.
func killInFlight(t *testing.T, p *sdk.Plugin) {
	t.Helper()
	if err := syscall.Kill(p.Pid(), syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	select {
	case c := <-p.Transport().Completions():
		_ = syscall.Kill(p.Pid(), syscall.SIGKILL)
		t.Fatalf("batch %d completed %v before the kill, with nothing acknowledged", c.Batch, c.Status)
	default:
	}
	if err := syscall.Kill(p.Pid(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
}

// Killing the receiving plugin mid-transfer: the sender never says
// Succeeded or FailedDefinite for what was in flight.
func TestKillReceiverMidTransfer(t *testing.T) {
	s := newTCP(t, Config{AckTimeout: 30 * time.Second})
	rp := sdktest.Subprocess(t, pluginBin, sdk.OpenOptions{})
	e, err := sdktest.NewEnv(context.Background(), sdktest.Pair{Sender: s, Receiver: rp.Transport()})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	ctx := context.Background()
	k, err := e.Granter.Grant(ctx, sdk.Window{Region: e.DstID, Length: sdktest.EnvSize})
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(rp.Pid(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-rp.Exited()
	id := e.NewBatchID()
	if err := s.Post(ctx, e.Write(id, k, 0, 0, 4096)); err != nil {
		t.Fatal(err)
	}
	c, err := e.Wait(id)
	if err != nil {
		t.Fatal(err)
	}
	// The receiver is gone before the connection: nothing ever left, so a
	// definite failure is provable; Succeeded never is.
	if c.Status == sdk.Succeeded {
		t.Fatalf("write to a dead receiver: %v", c.Status)
	}
}

const (
	roleEnv  = "KVFENCE_TCP_TEST_ROLE"
	roleHost = "host"
)

// runAsHost is the helper host process: it loads the plugin, prints its pid
// and waits to be killed.
func runAsHost() {
	p, err := sdk.Open(os.Getenv("KVFENCE_TCP_TEST_PLUGIN"), sdk.OpenOptions{SocketDir: os.Getenv("KVFENCE_TCP_TEST_SOCKDIR")})
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	fmt.Println("plugin", p.Pid())
	time.Sleep(time.Minute)
	os.Exit(0)
}

// go-plugin alone leaves a plugin running when its host dies; ours exits.
func TestPluginExitsWhenHostDies(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// Become the orphaned plugin's new parent (a subreaper) so we can reap
	// it instead of leaving a zombie behind in a container without an init.
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		t.Fatal(err)
	}
	defer unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
	// The host dies by SIGKILL and cannot clean up: we own its socket dir.
	sockDir, err := os.MkdirTemp("/tmp", "kvft")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(sockDir)
	host := exec.Command(self, "-test.run=^$")
	host.Env = append(os.Environ(), roleEnv+"="+roleHost, "KVFENCE_TCP_TEST_PLUGIN="+pluginBin, "KVFENCE_TCP_TEST_SOCKDIR="+sockDir)
	out, err := host.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := host.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = host.Process.Kill(); _ = host.Wait() }()
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("host: %v", err)
	}
	fields := strings.Fields(line)
	if len(fields) != 2 || fields[0] != "plugin" {
		t.Fatalf("host said %q", line)
	}
	pid, _ := strconv.Atoi(fields[1])
	if !alive(pid) {
		t.Fatal("plugin not running while its host lives")
	}
	_ = host.Process.Kill()
	_ = host.Wait()
	deadline := time.Now().Add(30 * time.Second)
	for alive(pid) {
		if time.Now().After(deadline) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			t.Fatalf("plugin %d still running 30s after its host died", pid)
		}
		time.Sleep(50 * time.Millisecond)
	}
	var ws syscall.WaitStatus
	_, _ = syscall.Wait4(pid, &ws, syscall.WNOHANG, nil)
}

// alive: the process exists and is not a zombie (a container's init may not
// reap re-parented children).
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}
