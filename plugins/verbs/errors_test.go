package verbs

import (
	"bufio"
	"context"
	"encoding/json"
	"net"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/sdk"
)

// Every configuration error is invalid-argument: from validate, from the
// environment and from New (which validates before it opens a device, so
// this holds with and without -tags rdma).
func TestConfigErrorsAreInvalidArgument(t *testing.T) {
	configs := map[string]Config{
		"timeout 32":           {Timeout: 32},
		"retry_cnt 7":          {RetryCnt: 7},
		"queue depth":          {QueueDepth: 20000},
		"batch over depth":     {MaxBatch: 1000, QueueDepth: 10},
		"negative tail margin": {TailMargin: -1},
		"revoke mode":          {Revoke: "mw9"},
		"poll mode":            {Poll: "busy"},
		"GID":                  {GID: "not-a-gid"},
		"listen without port":  {Listen: "127.0.0.1"},
	}
	for name, c := range configs {
		if err := c.withDefaults().validate(); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%s: validate: %v (class %v), want invalid-argument", name, err, errdefs.ClassOf(err))
		}
		if _, err := New(c, nil); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%s: New: %v (class %v), want invalid-argument", name, err, errdefs.ClassOf(err))
		}
	}
	envs := map[string]string{
		"KVFENCE_VERBS_TIMEOUT":     "x",
		"KVFENCE_VERBS_RETRY_CNT":   "7",
		"KVFENCE_VERBS_QUEUE_DEPTH": "deep",
		"KVFENCE_VERBS_MAX_BATCH":   "-",
		"KVFENCE_VERBS_TAIL_MARGIN": "soon",
		"KVFENCE_VERBS_GID":         "fe80::zz",
		"KVFENCE_VERBS_POLL":        "busy",
		"KVFENCE_VERBS_LISTEN":      "nowhere",
	}
	for k, v := range envs {
		_, err := ConfigFromEnv(func(name string) string {
			if name == k {
				return v
			}
			return ""
		})
		if !errdefs.IsInvalidArgument(err) {
			t.Errorf("%s=%q: %v (class %v), want invalid-argument", k, v, err, errdefs.ClassOf(err))
		}
	}
}

// fakeReceiver listens on loopback and answers each handshake with answer
// (raw bytes; empty: close without answering) after reading the sender's
// line. It returns the address.
func fakeReceiver(t *testing.T, answer string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = bufio.NewReader(c).ReadBytes('\n')
			if answer != "" {
				_, _ = c.Write([]byte(answer))
			}
			c.Close()
		}
	}()
	return ln.Addr().String()
}

func helloLine(t *testing.T, h hello) string {
	t.Helper()
	b, err := json.Marshal(h)
	if err != nil {
		t.Fatal(err)
	}
	return string(b) + "\n"
}

// The sender's half of the handshake returns a classified error for every
// way it can fail, and a receiver's refusal keeps the receiver's class.
func TestHandshakeErrorsAreClassified(t *testing.T) {
	full := refusal(errdefs.Errorf(errdefs.ResourceExhausted, "verbs: ibv_create_qp: no QPs left"))
	cases := []struct {
		name   string
		answer string
		want   errdefs.Class
		text   string
	}{
		{"refused with a class", helloLine(t, full), errdefs.ResourceExhausted, "no QPs left"},
		{"refused by an older receiver (no class)", helloLine(t, hello{Err: "closed"}), errdefs.Unavailable, "closed"},
		{"closed without an answer", "", errdefs.Unavailable, "read"},
		{"answered garbage", "not json\n", errdefs.Unavailable, "not a hello"},
		{"answered a line too long", `{"err":"` + strings.Repeat("x", 5000) + "\"}\n", errdefs.Unavailable, "at most 4096"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			addr := fakeReceiver(t, tc.answer)
			nc, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			_, err = exchangeHellos(nc, addr, hello{qpAttrs: qpAttrs{QPN: 7}, From: "127.0.0.1:1"})
			if got := errdefs.ClassOf(err); got != tc.want || !strings.Contains(err.Error(), tc.text) {
				t.Fatalf("err %v (class %v), want class %v and %q", err, got, tc.want, tc.text)
			}
		})
	}
	t.Run("accepted", func(t *testing.T) {
		addr := fakeReceiver(t, helloLine(t, hello{qpAttrs: qpAttrs{QPN: 42, PSN: 9}}))
		nc, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		h, err := exchangeHellos(nc, addr, hello{qpAttrs: qpAttrs{QPN: 7}})
		if err != nil || h.QPN != 42 || h.PSN != 9 {
			t.Fatalf("hello %+v, err %v", h, err)
		}
	})
}

// What a receiver reads from a sender is classified too: a malformed or
// oversized line is invalid-argument, a connection that ends is
// unavailable. The refusal names its class once, in Class, not in the text.
func TestReadHelloClassifies(t *testing.T) {
	for line, want := range map[string]errdefs.Class{
		"{\"qpn\":\n":                      errdefs.InvalidArgument,
		strings.Repeat(" ", 5000) + "{}\n": errdefs.InvalidArgument,
		"{\"qpn\":1":                       errdefs.Unavailable, // no newline: the connection ends
		helloLine(t, hello{qpAttrs: qpAttrs{QPN: 1}}): errdefs.Unknown, // a hello: no error
	} {
		a, b := net.Pipe()
		go func() { _, _ = a.Write([]byte(line)); a.Close() }()
		_, err := readHello(bufio.NewReader(b), b)
		b.Close()
		if got := errdefs.ClassOf(err); got != want {
			t.Errorf("%.30q: err %v (class %v), want %v", line, err, got, want)
		}
	}
	r := refusal(errdefs.Errorf(errdefs.Unavailable, "verbs: closed"))
	if r.Class != errdefs.Unavailable || r.Err != "verbs: closed" {
		t.Fatalf("refusal %+v", r)
	}
	var back hello
	if err := json.Unmarshal([]byte(helloLine(t, r)), &back); err != nil || back.Class != errdefs.Unavailable {
		t.Fatalf("refusal after the wire: %+v %v", back, err)
	}
}

// refusalTransport is a Transport with no device, no listener and no
// goroutines: enough for the paths that refuse a call before they touch the
// device. One peer ("verbs://p") and one 4 KiB region (1) are known.
func refusalTransport(t *testing.T) *Transport {
	t.Helper()
	tr := newTransport(Config{}.withDefaults(), nil, nil, devInfo{}, RevokeMR, nil)
	tr.log = hclog.NewNullLogger()
	tr.peers["verbs://p"] = &peer{id: "verbs://p", addr: closedAddr(t), cur: &conn{ep: newEpoch()}}
	tr.regions[1] = &region{desc: sdk.MemoryDesc{Size: 4096}, grants: map[sdk.Key]bool{}}
	tr.used[9] = true
	return tr
}

// closedAddr is a loopback address nothing listens on any more.
func closedAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// Every refusal of Post, Grant, Quiesce, Connect and the memory calls has
// its class, checked in order of the checks (the first that applies wins).
func TestRefusalsAreClassified(t *testing.T) {
	write := func(mod func(*sdk.Op)) sdk.Batch {
		op := sdk.Op{Kind: sdk.OpWrite, LocalRegion: 1, Length: 64, RemoteKey: makeKey(5, 0, 1)}
		if mod != nil {
			mod(&op)
		}
		return sdk.Batch{ID: 1, Peer: "verbs://p", Ops: []sdk.Op{op}}
	}
	ctx := context.Background()
	tr := refusalTransport(t)
	posts := []struct {
		name string
		b    sdk.Batch
		want errdefs.Class
	}{
		{"empty", sdk.Batch{ID: 1, Peer: "verbs://p"}, errdefs.InvalidArgument},
		{"too many ops", sdk.Batch{ID: 1, Peer: "verbs://p", Ops: make([]sdk.Op, tr.cfg.MaxBatch+1)}, errdefs.InvalidArgument},
		{"reused id", sdk.Batch{ID: 9, Peer: "verbs://p", Ops: write(nil).Ops}, errdefs.AlreadyExists},
		{"unknown peer", sdk.Batch{ID: 1, Peer: "verbs://q", Ops: write(nil).Ops}, errdefs.NotFound},
		{"kind", write(func(o *sdk.Op) { o.Kind = 7 }), errdefs.InvalidArgument},
		{"zero length", write(func(o *sdk.Op) { o.Length = 0 }), errdefs.InvalidArgument},
		{"unknown region", write(func(o *sdk.Op) { o.LocalRegion = 2 }), errdefs.NotFound},
		{"past the region", write(func(o *sdk.Op) { o.LocalOffset = 4090 }), errdefs.InvalidArgument},
		{"no remote key", write(func(o *sdk.Op) { o.RemoteKey = 0 }), errdefs.InvalidArgument},
		{"remote offset wraps", write(func(o *sdk.Op) { o.RemoteOffset = ^uint64(0) - 8 }), errdefs.InvalidArgument},
	}
	for _, tc := range posts {
		if err := tr.Post(ctx, tc.b); errdefs.ClassOf(err) != tc.want {
			t.Errorf("Post %s: %v, want %v", tc.name, err, tc.want)
		}
	}
	grants := map[string]struct {
		w    sdk.Window
		want errdefs.Class
	}{
		"pieced":         {sdk.Window{Region: 1, Length: 64, Stride: 128, Piece: 64}, errdefs.Unimplemented},
		"unknown region": {sdk.Window{Region: 2, Length: 64}, errdefs.NotFound},
		"empty":          {sdk.Window{Region: 1}, errdefs.InvalidArgument},
		"past region":    {sdk.Window{Region: 1, Offset: 4000, Length: 200}, errdefs.InvalidArgument},
	}
	for name, tc := range grants {
		if _, err := tr.Grant(ctx, tc.w); errdefs.ClassOf(err) != tc.want {
			t.Errorf("Grant %s: %v, want %v", name, err, tc.want)
		}
	}
	if _, err := tr.Revoke(ctx, 77); !errdefs.IsNotFound(err) {
		t.Errorf("Revoke of an unknown key: %v", err)
	}
	if _, err := tr.Quiesce(ctx, "verbs://q", nil); !errdefs.IsNotFound(err) {
		t.Errorf("Quiesce of an unknown peer: %v", err)
	}
	if res, err := tr.Quiesce(ctx, "verbs://p", []sdk.BatchID{3}); err != nil || res.Evidence != sdk.EvidenceCompletionsHarvested {
		t.Errorf("Quiesce with nothing in flight: %+v %v", res, err)
	}
	if err := tr.Disconnect(ctx, "verbs://q"); !errdefs.IsNotFound(err) {
		t.Errorf("Disconnect of an unknown peer: %v", err)
	}
	if err := tr.DeregisterMemory(ctx, 2); !errdefs.IsNotFound(err) {
		t.Errorf("DeregisterMemory of an unknown region: %v", err)
	}
	if _, err := tr.RegisterMemory(ctx, sdk.MemoryDesc{}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("RegisterMemory of nothing: %v", err)
	}
	for _, ep := range []sdk.Endpoint{{Transport: "tcp", Address: "127.0.0.1:1"}, {Transport: "verbs", Address: "no-port"}} {
		if _, err := tr.Connect(ctx, ep); !errdefs.IsInvalidArgument(err) {
			t.Errorf("Connect %+v: %v", ep, err)
		}
	}
	tr.closed = true
	if err := tr.Post(ctx, write(nil)); !errdefs.IsUnavailable(err) {
		t.Errorf("Post after Close: %v", err)
	}
}

// A valid batch to a peer whose QP is in error reconnects first; a peer
// that cannot be dialled fails the Post as unavailable, and the broken QP
// stays among the peer's old ones until a flush destroys it. (Without a
// device only: building the work request reads the region's MR.)
func TestPostToBrokenPeerReconnects(t *testing.T) {
	if haveVerbs {
		t.Skip("built with -tags rdma: the region's MR would be a real one (device tests cover reconnects)")
	}
	tr := refusalTransport(t)
	p := tr.peers["verbs://p"]
	broken := p.cur
	broken.broken = true
	b := sdk.Batch{ID: 1, Peer: "verbs://p", Ops: []sdk.Op{{Kind: sdk.OpWrite, LocalRegion: 1, Length: 64, RemoteKey: makeKey(5, 0, 1)}}}
	err := tr.Post(context.Background(), b)
	if !errdefs.IsUnavailable(err) || !strings.Contains(err.Error(), "dial") {
		t.Fatalf("Post to an undiallable peer: %v", err)
	}
	if p.cur != nil || len(p.old) != 1 || p.old[0] != broken || tr.used[1] {
		t.Fatalf("after the failed reconnect: cur %v, old %v, id used %v", p.cur, p.old, tr.used[1])
	}
}
