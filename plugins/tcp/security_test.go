package tcp

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/sdk"
	"github.com/kvfence/kvfence/sdk/sdktest"
)

// Regression tests for issue 15 finding 3: a sniffer on loopback collected
// keys and injected writes; a stranger's QUIESCE tore sessions down; session
// ids were sequential; an initiator wrote to whoever answered its address.
// Each attack also runs against the known-unsafe cleartext variant (the
// data plane as it was), where it must succeed: the tests can fail.

// newPair is an in-process sender and receiver sharing cfg, prepared by
// sdktest.NewEnv (memory registered, the sender connected).
func newPair(t *testing.T, cfg Config) (*sdktest.Env, *Transport, *Transport) {
	t.Helper()
	s, r := newTCP(t, cfg), newTCP(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	e, err := sdktest.NewEnv(ctx, sdktest.Pair{Sender: s, Receiver: r})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	return e, s, r
}

// grantAll grants the whole destination memory, unbound.
func grantAll(t *testing.T, e *sdktest.Env) sdk.Key {
	t.Helper()
	k, err := e.Granter.Grant(context.Background(), sdk.Window{Region: e.DstID, Length: sdktest.EnvSize})
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// post writes n bytes from srcOff to dstOff under key through peer and
// waits for the completion.
func post(t *testing.T, e *sdktest.Env, peer sdk.PeerID, key sdk.Key, srcOff, dstOff, n uint64) sdk.Completion {
	t.Helper()
	b := e.Write(e.NewBatchID(), key, srcOff, dstOff, n)
	b.Peer = peer
	if err := e.Sender.Post(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	c, err := e.Wait(b.ID)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// recorder is an in-path TCP proxy that keeps every byte it forwards, as a
// sniffer on the path sees them.
type recorder struct {
	ln     net.Listener
	mu     sync.Mutex
	toRecv bytes.Buffer // sender → receiver
	toSend bytes.Buffer // receiver → sender
}

func newRecorder(t *testing.T, target string) *recorder {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{ln: ln}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			a, err := ln.Accept()
			if err != nil {
				return
			}
			b, err := net.Dial("tcp", target)
			if err != nil {
				_ = a.Close()
				continue
			}
			t.Cleanup(func() { _, _ = a.Close(), b.Close() })
			go rec.pump(a, b, &rec.toRecv)
			go rec.pump(b, a, &rec.toSend)
		}
	}()
	return rec
}

func (rec *recorder) pump(src, dst net.Conn, log *bytes.Buffer) {
	buf := make([]byte, 64<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			rec.mu.Lock()
			log.Write(buf[:n])
			rec.mu.Unlock()
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			_ = dst.Close()
			return
		}
	}
}

func (rec *recorder) captured() (toRecv, toSend []byte) {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return append([]byte(nil), rec.toRecv.Bytes()...), append([]byte(nil), rec.toSend.Bytes()...)
}

// sniffedKeys parses every cleartext write header in a capture.
func sniffedKeys(capture []byte) []sdk.Key {
	var keys []sdk.Key
	var magic [4]byte
	binary.LittleEndian.PutUint32(magic[:], wireMagic)
	for i := 0; ; {
		j := bytes.Index(capture[i:], magic[:])
		if j < 0 || i+j+headerSize > len(capture) {
			return keys
		}
		if h, err := decodeHeader(capture[i+j:i+j+headerSize], 0); err == nil && h.Type == frameWrite {
			keys = append(keys, sdk.Key(h.Key))
		}
		i += j + 1
	}
}

// connectAsOrPlain is connectAs, or a plain TCP connection for the
// cleartext variant (id nil).
func connectAsOrPlain(t *testing.T, addr string, id *identity) net.Conn {
	t.Helper()
	if id != nil {
		return connectAs(t, addr, id)
	}
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// inject writes 4 KiB of 0xEE under key at offset 0, as a stranger: its own
// certificate when the receiver speaks TLS.
func inject(t *testing.T, addr string, id *identity, key sdk.Key) {
	t.Helper()
	c := connectAsOrPlain(t, addr, id)
	var hb [headerSize]byte
	(&header{Type: frameHello, Key: uint64(key)}).encode(hb[:])
	_, _ = c.Write(hb[:])
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(c, hb[:]); err != nil {
		return
	}
	(&header{Type: frameWrite, Code: writeAckNow, Seq: 1, Key: uint64(key), Length: 4096, Deadline: time.Now().Add(time.Minute).UnixNano()}).encode(hb[:])
	_, _ = c.Write(append(hb[:], bytes.Repeat([]byte{0xEE}, 4096)...))
	_, _ = io.ReadFull(c, hb[:]) // the verdict
}

type sniffResult struct {
	keys         int  // keys parsed from the capture
	keyInClear   bool // the key's bytes appear anywhere in the capture
	payloadClear bool // a slice of the payload appears in the capture
	tokenClear   bool // the session token appears in the capture
	injected     bool // a stranger's write under a sniffed key landed
}

// sniffAndInject runs one honest write through a recording proxy, then
// attacks with what the capture reveals.
func sniffAndInject(t *testing.T, cfg Config) sniffResult {
	e, s, r := newPair(t, cfg)
	ctx := context.Background()
	key := grantAll(t, e)
	ep, _ := r.LocalEndpoint(ctx)
	hostPort, _, _, _ := splitPin(ep.Address)
	rec := newRecorder(t, hostPort)
	viaSniffer := rec.ln.Addr().String() + ep.Address[len(hostPort):]
	peer, err := s.Connect(ctx, sdk.Endpoint{Transport: Name, Address: viaSniffer})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rand.Read(e.Src.Bytes()[:64<<10]); err != nil {
		t.Fatal(err)
	}
	if c := post(t, e, peer, key, 0, 64<<10, 64<<10); c.Status != sdk.Succeeded {
		t.Fatalf("honest write: %+v", c)
	}
	toRecv, toSend := rec.captured()
	var res sniffResult
	var kb [8]byte
	binary.LittleEndian.PutUint64(kb[:], uint64(key))
	res.keyInClear = bytes.Contains(toRecv, kb[:])
	res.payloadClear = bytes.Contains(toRecv, e.Src.Bytes()[1000:1064])
	r.recv.mu.Lock()
	for tok := range r.recv.sessions {
		res.tokenClear = res.tokenClear || bytes.Contains(toSend, tok[:])
	}
	r.recv.mu.Unlock()
	sniffed := sniffedKeys(toRecv)
	res.keys = len(sniffed)
	var stranger *identity
	if cfg.unsafe != unsafeCleartext {
		stranger = newTestIdentity(t)
	}
	for _, k := range sniffed {
		inject(t, ep.Address, stranger, k)
	}
	res.injected = bytes.Contains(e.Dst.Bytes(), bytes.Repeat([]byte{0xEE}, 4096))
	return res
}

func TestSnifferLearnsNothing(t *testing.T) {
	res := sniffAndInject(t, Config{})
	if res.keys > 0 || res.keyInClear || res.payloadClear || res.tokenClear || res.injected {
		t.Fatalf("the sniffer learned something: %+v", res)
	}
}

func TestSnifferCatchesCleartextVariant(t *testing.T) {
	res := sniffAndInject(t, Config{unsafe: unsafeCleartext})
	if res.keys == 0 || !res.keyInClear || !res.payloadClear || !res.tokenClear || !res.injected {
		t.Fatalf("the sniffer should have learned the key, payload and token and injected a write in cleartext: %+v", res)
	}
	t.Logf("caught as expected: %+v", res)
}

// strangerQuiesce: an honest session is up; a stranger who knows its token
// (the strongest stranger: it read the receiver's memory) asks the receiver
// to end it. It reports whether the honest session was torn down.
func strangerQuiesce(t *testing.T, cfg Config) bool {
	e, s, r := newPair(t, cfg)
	ctx := context.Background()
	key := grantAll(t, e)
	if c := post(t, e, e.Peer, key, 0, 0, 4096); c.Status != sdk.Succeeded {
		t.Fatalf("honest write: %+v", c)
	}
	s.mu.Lock()
	sess := s.peers[e.Peer].sess
	s.mu.Unlock()
	r.recv.mu.Lock()
	var honest sessionToken
	for tok := range r.recv.sessions {
		honest = tok
	}
	r.recv.mu.Unlock()
	ep, _ := r.LocalEndpoint(ctx)
	var stranger *identity
	if cfg.unsafe != unsafeCleartext {
		stranger = newTestIdentity(t)
		// Its own session's token tells it nothing about the honest one.
		_, own := dialAs(t, ep.Address, stranger, grantAll(t, e))
		if own == honest || own == (sessionToken{}) {
			t.Fatalf("session tokens: honest %x, stranger's %x", honest, own)
		}
		if code := quiesceAs(t, ep.Address, stranger, honest); code != quiescedRefused {
			t.Errorf("a stranger's Quiesce of the honest session: code %d, want refused", code)
		}
	} else {
		c := connectAsOrPlain(t, ep.Address, nil)
		var hb [headerSize]byte
		q := header{Type: frameQuiesce}
		q.setToken(honest)
		q.encode(hb[:])
		_, _ = c.Write(hb[:])
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, _ = io.ReadFull(c, hb[:])
	}
	// The honest session still carries writes: same connection, applied.
	if c := post(t, e, e.Peer, key, 0, 4096, 4096); c.Status != sdk.Succeeded {
		return true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.peers[e.Peer].sess != sess
}

func TestStrangerCannotQuiesce(t *testing.T) {
	if strangerQuiesce(t, Config{}) {
		t.Fatal("a stranger's Quiesce tore the honest session down")
	}
}

func TestStrangerQuiesceCatchesCleartextVariant(t *testing.T) {
	if !strangerQuiesce(t, Config{unsafe: unsafeCleartext}) {
		t.Fatal("the cleartext variant should let a stranger end the honest session")
	}
}

// An impostor answering at the receiver's address (another identity) gets
// no frame: the initiator refuses it during the handshake, and the write
// fails definitely (nothing left the process).
func TestImpostorReceiverGetsNothing(t *testing.T) {
	e, s, r := newPair(t, Config{})
	ctx := context.Background()
	ep, _ := r.LocalEndpoint(ctx)
	hostPort, _, _, _ := splitPin(ep.Address)
	ln, impostorAddr := listenAs(t, newTestIdentity(t))
	got := make(chan int, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		n, _ := io.ReadFull(c, make([]byte, headerSize))
		got <- n
	}()
	impostorHostPort, _, _, _ := splitPin(impostorAddr)
	// The receiver's pin, the impostor's socket.
	peer, err := s.Connect(ctx, sdk.Endpoint{Transport: Name, Address: impostorHostPort + ep.Address[len(hostPort):]})
	if err != nil {
		t.Fatal(err)
	}
	c := post(t, e, peer, 12345, 0, 0, 4096)
	if c.Status != sdk.FailedDefinite {
		t.Fatalf("write to an impostor: %+v, want FailedDefinite", c)
	}
	if n := <-got; n > 0 {
		t.Fatalf("the impostor read %d bytes of a frame", n)
	}
	if _, err := s.Connect(ctx, sdk.Endpoint{Transport: Name, Address: hostPort}); !errdefs.Is(err, errdefs.InvalidArgument) {
		t.Fatalf("Connect to an address without a pin: %v, want InvalidArgument", err)
	}
}

// A writer-bound key (sdk.Window.Writer) is refused to every other
// connection, even one that holds the key; the bound writer's write lands.
func TestWriterBoundKeyRefusesStranger(t *testing.T) {
	e, s, r := newPair(t, Config{})
	ctx := context.Background()
	sep, _ := s.LocalEndpoint(ctx)
	if _, err := r.Grant(ctx, sdk.Window{Region: e.DstID, Length: 4096, Writer: sep.Address}); !errdefs.Is(err, errdefs.FailedPrecondition) {
		t.Fatalf("Grant to a writer not connected: %v, want FailedPrecondition", err)
	}
	open := grantAll(t, e)
	if c := post(t, e, e.Peer, open, 0, 0, 4096); c.Status != sdk.Succeeded {
		t.Fatalf("warm-up write: %+v", c)
	}
	bound, err := r.Grant(ctx, sdk.Window{Region: e.DstID, Offset: 64 << 10, Length: 64 << 10, Writer: sep.Address})
	if err != nil {
		t.Fatal(err)
	}
	ep, _ := r.LocalEndpoint(ctx)
	inject(t, ep.Address, newTestIdentity(t), bound)
	if bytes.Contains(e.Dst.Bytes(), bytes.Repeat([]byte{0xEE}, 4096)) {
		t.Fatal("a stranger's write landed under a writer-bound key")
	}
	// Refused at its HELLO: the key names another writer (admission.go).
	if m, _ := r.Stats(ctx); m[statHelloRefused] != 1 {
		t.Fatalf("refused at HELLO: %d, want 1", m[statHelloRefused])
	}
	if c := post(t, e, e.Peer, bound, 0, 0, 4096); c.Status != sdk.Succeeded {
		t.Fatalf("the bound writer's write: %+v", c)
	}
	// A second connection of the same writer may use it too.
	again, err := s.Connect(ctx, ep)
	if err != nil {
		t.Fatal(err)
	}
	if c := post(t, e, again, bound, 0, 4096, 4096); c.Status != sdk.Succeeded {
		t.Fatalf("the bound writer's write on its second connection: %+v", c)
	}
	// The key dies with the writer's last connection here: a reconnection
	// does not revive it.
	for _, p := range []sdk.PeerID{e.Peer, again} {
		if err := s.Disconnect(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	_, fp, _, _ := splitPin(sep.Address)
	for deadline := time.Now().Add(20 * time.Second); r.recv.presenceOf(fp) != nil; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the writer's connections are still open at the receiver")
		}
	}
	later, err := s.Connect(ctx, ep)
	if err != nil {
		t.Fatal(err)
	}
	if c := post(t, e, later, bound, 0, 8192, 4096); c.Status != sdk.FailedDefinite {
		t.Fatalf("the writer's write after it reconnected: %+v, want FailedDefinite", c)
	}
	if _, err := r.Grant(ctx, sdk.Window{Region: e.DstID, Length: 4096, Writer: "127.0.0.1:1"}); !errdefs.Is(err, errdefs.FailedPrecondition) {
		t.Fatalf("Grant to a writer without a pin: %v, want FailedPrecondition", err)
	}
}

// A revoked writer-bound key still opens a session for its own writer (its
// writes stay refused), and for nobody else: a writer whose new session
// starts with a batch of a request aborted meanwhile must not dial again
// for the batches of other requests queued behind it.
func TestRevokedWriterBoundKeyAdmitsOnlyItsWriter(t *testing.T) {
	e, s, r := newPair(t, Config{})
	ctx := context.Background()
	if c := post(t, e, e.Peer, grantAll(t, e), 0, 0, 4096); c.Status != sdk.Succeeded {
		t.Fatalf("warm-up write: %+v", c)
	}
	sep, _ := s.LocalEndpoint(ctx)
	bound, err := r.Grant(ctx, sdk.Window{Region: e.DstID, Offset: 64 << 10, Length: 64 << 10, Writer: sep.Address})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Revoke(ctx, bound); err != nil {
		t.Fatal(err)
	}
	_, writer, _, _ := splitPin(sep.Address)
	stranger := newTestIdentity(t)
	if !r.recv.helloUsable(writer, uint64(bound)) {
		t.Fatal("the bound writer's HELLO naming its revoked key is refused")
	}
	if r.recv.helloUsable(stranger.fp, uint64(bound)) {
		t.Fatal("a stranger's HELLO naming a revoked writer-bound key is admitted")
	}
	if c := post(t, e, e.Peer, bound, 0, 64<<10, 4096); c.Status != sdk.FailedDefinite {
		t.Fatalf("a write under the revoked writer-bound key: %+v, want FailedDefinite", c)
	}
}
