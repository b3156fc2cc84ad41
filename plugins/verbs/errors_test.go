package verbs

import (
	"bufio"
	"encoding/json"
	"net"
	"strings"
	"testing"

	"github.com/kvfence/kvfence/errdefs"
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
