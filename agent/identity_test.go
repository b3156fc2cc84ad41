package agent

import (
	"context"
	"crypto/tls"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/internal/demo/pki"
)

// testPKI makes a throwaway CA with certificates for the router, decode
// ranks 0 and 1 and prefill ranks 1 and 2; load gives one's TLS config.
func testPKI(t *testing.T) (load func(name string) *tls.Config) {
	t.Helper()
	dir := t.TempDir()
	if err := pki.WriteThrowaway(dir, []string{"router", "decode-0", "decode-1", "prefill-1", "prefill-2"}, ServerName); err != nil {
		t.Fatal(err)
	}
	return func(name string) *tls.Config {
		c, err := pki.Load(dir, name, ServerName)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
}

// impostor serves the control plane with the certificate of cert and
// welcomes everyone as welcome; hellos counts the Hellos it got.
func impostor(t *testing.T, cfg *tls.Config, welcome peerHello) (addr string, hellos *atomic.Int32) {
	t.Helper()
	hellos = new(atomic.Int32)
	srv, err := newServer("127.0.0.1:0", cfg, Limits{}.withDefaults(16), func(peerHello) (peerHello, error) {
		hellos.Add(1)
		return welcome, nil
	}, func(l *link) { <-l.closed() })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	return srv.Addr(), hellos
}

var asDecode0 = peerHello{Role: RoleDecode, Rank: 0, Version: ControlVersion, SlotBytes: 4096, ShardBytes: 4096,
	DataTransport: "tcp", DataAddress: "127.0.0.1:1"}

// Finding 5 (issue 15): a prefill rank sent KV pages to an impostor that
// held another prefill rank's certificate (every certificate was valid for
// the one shared name, and nobody checked whom it named). Now prefill rank
// 1, meaning decode rank 0, refuses the impostor in the TLS handshake: it
// never links, so no Assign is taken and no page is written, and the
// impostor never even sees a Hello.
func TestPrefillRefusesImpostorDecode(t *testing.T) {
	load := testPKI(t)
	addr, hellos := impostor(t, load("prefill-2"), asDecode0)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, _, err := dial(ctx, addr, load("prefill-1"), identity{RoleDecode, 0},
		peerHello{Role: RolePrefill, Rank: 1, ShardBytes: 4096, Version: ControlVersion, Caps: peerCaps{Quiesce: true}})
	if !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("prefill linked to an impostor holding prefill-2's certificate, or misclassified: %v", err)
	}
	p := startPrefill(t, addr, func(c *PrefillConfig) { c.TLS = load("prefill-1") })
	time.Sleep(500 * time.Millisecond)
	if p.Linked() || hellos.Load() != 0 {
		t.Fatalf("the running prefill rank reached the impostor: linked %v, hellos %d", p.Linked(), hellos.Load())
	}
}

// Every client checks whom it reached, one mismatch at a time: the wrong
// rank of the right role, the wrong role, and (without TLS) a Welcome that
// names another peer than meant. The server side checks the client's
// certificate against its Hello.
func TestIdentityMismatchesAreRefused(t *testing.T) {
	load := testPKI(t)
	// One budget per dial, never one for all: a loaded machine spends it
	// on the first cases and the last is refused for want of time.
	dialOnce := func(addr string, cliTLS *tls.Config, meant identity, hello peerHello) (*link, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		l, _, err := dial(ctx, addr, cliTLS, meant, hello)
		return l, err
	}
	prefill1 := peerHello{Role: RolePrefill, Rank: 1, ShardBytes: 4096, Version: ControlVersion, Caps: peerCaps{Quiesce: true}}
	for _, tc := range []struct {
		what   string
		server string // its certificate ("" = plaintext)
		as     peerHello
		client string
		meant  identity
		hello  peerHello
	}{
		{"prefill meant decode-0, reached decode-1", "decode-1", asDecode0, "prefill-1", identity{RoleDecode, 0}, prefill1},
		{"router meant prefill-1, reached prefill-2", "prefill-2", peerHello{Role: RolePrefill, Rank: 1, Version: ControlVersion},
			"router", identity{RolePrefill, 1}, peerHello{Role: RoleRouter, Version: ControlVersion}},
		{"router meant decode-0, reached prefill-1", "prefill-1", asDecode0,
			"router", identity{RoleDecode, 0}, peerHello{Role: RoleRouter, Version: ControlVersion}},
		{"plaintext: meant decode-0, welcomed as decode-3", "", peerHello{Role: RoleDecode, Rank: 3, Version: ControlVersion},
			"", identity{RoleDecode, 0}, prefill1},
		{"the client's certificate names prefill-2, its Hello prefill-1", "decode-0", asDecode0,
			"prefill-2", identity{RoleDecode, 0}, prefill1},
	} {
		var srvTLS, cliTLS *tls.Config
		if tc.server != "" {
			srvTLS, cliTLS = load(tc.server), load(tc.client)
		}
		addr, _ := impostor(t, srvTLS, tc.as)
		if _, err := dialOnce(addr, cliTLS, tc.meant, tc.hello); !errdefs.IsFailedPrecondition(err) {
			t.Errorf("%s: linked, or misclassified: %v", tc.what, err)
		}
	}
	// And the matching identities link.
	addr, _ := impostor(t, load("decode-0"), asDecode0)
	l, err := dialOnce(addr, load("prefill-1"), identity{RoleDecode, 0}, prefill1)
	if err != nil {
		t.Fatalf("the right peer: %v", err)
	}
	l.close()
}
