package verbs

import (
	"strings"
	"testing"
	"time"

	"github.com/kvfence/kvfence/sdk"
)

func TestAllSuccessIsSucceeded(t *testing.T) {
	e := newEpoch()
	e.add(1, []uint64{10, 11, 12}, []uint64{4096, 4096, 100}, 8292, false)
	for _, id := range []uint64{10, 11} {
		if out, ok := e.harvest(id, WCSuccess); !ok || len(out) != 0 {
			t.Fatalf("early completion %v", out)
		}
	}
	out, _ := e.harvest(12, WCSuccess)
	if len(out) != 1 || out[0].Status != sdk.Succeeded || out[0].BytesLanded != 8292 {
		t.Fatalf("got %+v", out)
	}
	if e.outstanding != 0 || e.pending(1) {
		t.Fatal("batch still tracked")
	}
}

// A remote access error (unknown/revoked key) or retry-exceeded leaves the
// batch in doubt: the device gave up, but nothing proves that no
// retransmission is still in the fabric until the QP is quiesced.
func TestDeviceErrorsAreInDoubt(t *testing.T) {
	for _, st := range []WCStatus{WCRemAccessErr, WCRetryExcErr, WCRemOpErr, WCGeneralErr, WCFatalErr, WCLocProtErr, WCStatus(99)} {
		e := newEpoch()
		e.add(7, []uint64{1, 2}, []uint64{10, 10}, 20, false)
		out1, _ := e.harvest(1, st)
		out2, _ := e.harvest(2, WCWRFlushErr) // the device flushes the rest
		out := append(out1, out2...)
		if len(out) != 1 || out[0].Status != sdk.InDoubt {
			t.Fatalf("%v: got %+v, want one InDoubt", st, out)
		}
		if !e.hwError {
			t.Fatalf("%v: QP not marked in error", st)
		}
		if !strings.Contains(out[0].Detail, st.String()) {
			t.Fatalf("detail %q does not name %v", out[0].Detail, st)
		}
	}
}

// A flush that the plugin did not cause (the device moved the QP to ERROR
// after another batch's error) is not proof: InDoubt.
func TestUnrequestedFlushIsInDoubt(t *testing.T) {
	e := newEpoch()
	e.add(1, []uint64{1}, []uint64{8}, 8, false)
	e.add(2, []uint64{2}, []uint64{8}, 8, false)
	a, _ := e.harvest(1, WCRetryExcErr)
	b, _ := e.harvest(2, WCWRFlushErr)
	if len(a) != 1 || len(b) != 1 || a[0].Status != sdk.InDoubt || b[0].Status != sdk.InDoubt {
		t.Fatalf("got %+v %+v", a, b)
	}
}

// After the plugin moved the QP to ERROR itself, flushed batches are held
// until every completion of the QP is harvested, then FailedDefinite;
// batches whose requests all succeeded stay Succeeded.
func TestPluginFlushThenDrainIsFailedDefinite(t *testing.T) {
	e := newEpoch()
	e.add(1, []uint64{1, 2}, []uint64{100, 100}, 200, false)
	e.add(2, []uint64{3}, []uint64{50}, 50, false)
	e.add(3, []uint64{4}, []uint64{70}, 70, false)
	if out := e.beginFlush(); len(out) != 0 {
		t.Fatalf("beginFlush with work outstanding returned %v", out)
	}
	var got []sdk.Completion
	h := func(id uint64, st WCStatus) {
		out, ok := e.harvest(id, st)
		if !ok {
			t.Fatalf("wr %d unknown", id)
		}
		got = append(got, out...)
	}
	h(1, WCSuccess)
	h(3, WCSuccess) // batch 2 finished successfully during the flush
	h(2, WCWRFlushErr)
	if len(got) != 1 || got[0].Batch != 2 || got[0].Status != sdk.Succeeded {
		t.Fatalf("before drain: %+v", got)
	}
	if e.drained() {
		t.Fatal("drained with a request outstanding")
	}
	h(4, WCRetryExcErr) // even a device error during our flush: QP is ours, in ERROR, drained
	if !e.drained() {
		t.Fatal("not drained")
	}
	byID := map[sdk.BatchID]sdk.Completion{}
	for _, c := range got {
		byID[c.Batch] = c
	}
	if len(got) != 3 || byID[1].Status != sdk.FailedDefinite || byID[1].BytesLanded != 100 || byID[3].Status != sdk.FailedDefinite {
		t.Fatalf("after drain: %+v", got)
	}
}

func TestPartialPostIsFailedDefinite(t *testing.T) {
	e := newEpoch()
	e.add(9, []uint64{1}, []uint64{10}, 30, true)
	out, _ := e.harvest(1, WCSuccess)
	if len(out) != 1 || out[0].Status != sdk.FailedDefinite || out[0].BytesLanded != 10 {
		t.Fatalf("got %+v", out)
	}
}

func TestAbandonIsInDoubtAndExactlyOnce(t *testing.T) {
	e := newEpoch()
	e.add(1, []uint64{1, 2}, []uint64{1, 1}, 2, false)
	e.add(2, []uint64{3}, []uint64{1}, 1, false)
	if out, _ := e.harvest(3, WCSuccess); len(out) != 1 {
		t.Fatal("batch 2 not completed")
	}
	out := e.abandon("closed")
	if len(out) != 1 || out[0].Batch != 1 || out[0].Status != sdk.InDoubt {
		t.Fatalf("got %+v", out)
	}
	if out, ok := e.harvest(1, WCSuccess); ok || len(out) != 0 {
		t.Fatal("a late completion after abandon produced a second completion")
	}
}

func TestUnknownWRIgnored(t *testing.T) {
	e := newEpoch()
	if out, ok := e.harvest(42, WCSuccess); ok || out != nil {
		t.Fatal("unknown wr accepted")
	}
}

func TestWCStatusClassAndNames(t *testing.T) {
	if WCRemAccessErr.class() != sdk.ClassFailedPrecondition || WCRetryExcErr.class() != sdk.ClassUnavailable {
		t.Fatal("class mapping changed")
	}
	for s := WCSuccess; s <= wcStatusLastKnown; s++ {
		if strings.HasPrefix(s.String(), "wc-status(") {
			t.Fatalf("%d has no name", s)
		}
	}
	if !strings.Contains(WCStatus(77).String(), "77") {
		t.Fatal("unknown status name")
	}
}

func TestMaxTail(t *testing.T) {
	// 4.096 µs × 2^14 × (6+1) = 469.76 ms: the ~0.47 s measured on rxe.
	if got := RetryTail(14, 6); got < 469*time.Millisecond || got > 470*time.Millisecond {
		t.Fatalf("RetryTail(14,6) = %v", got)
	}
	c := Config{}.withDefaults()
	if c.MaxTail() != RetryTail(14, 6)+time.Second {
		t.Fatalf("MaxTail %v", c.MaxTail())
	}
	if c.validate() != nil {
		t.Fatal(c.validate())
	}
}

func TestConfigRefusesInfiniteRetry(t *testing.T) {
	for _, c := range []Config{{RetryCnt: 7}, {Timeout: 32}, {Revoke: "mw9"}, {MaxBatch: 1000, QueueDepth: 10}, {GID: "not-a-gid"}} {
		if err := c.withDefaults().validate(); err == nil {
			t.Fatalf("%+v accepted", c)
		}
	}
	env := map[string]string{"KVFENCE_VERBS_RETRY_CNT": "7"}
	if _, err := ConfigFromEnv(func(k string) string { return env[k] }); err == nil || !strings.Contains(err.Error(), "forever") {
		t.Fatalf("retry_cnt 7 from env: %v", err)
	}
	env = map[string]string{"KVFENCE_VERBS_DEVICE": "rxe1", "KVFENCE_VERBS_TIMEOUT": "12", "KVFENCE_VERBS_RETRY_CNT": "3",
		"KVFENCE_VERBS_REVOKE": "mr", "KVFENCE_VERBS_GID": "::ffff:169.254.7.2", "KVFENCE_VERBS_TAIL_MARGIN": "250ms"}
	c, err := ConfigFromEnv(func(k string) string { return env[k] })
	if err != nil || c.Device != "rxe1" || c.Timeout != 12 || c.RetryCnt != 3 || c.Revoke != RevokeMR || c.TailMargin != 250*time.Millisecond {
		t.Fatalf("%+v %v", c, err)
	}
	if g, _ := parseGID("169.254.7.2"); g[10] != 0xff || g[15] != 2 {
		t.Fatalf("IPv4 GID %x", g)
	}
}

func TestKeyCodec(t *testing.T) {
	k := makeKey(0xdeadbeef, 0x1234, 0)
	if keyRKey(k) != 0xdeadbeef || keyIOVA(k) != 0x234 || keyNonce(k) != 1 || k == 0 {
		t.Fatalf("key %#x", uint64(k))
	}
	k = makeKey(7, 0xfff, 0xabcde)
	if keyNonce(k) != 0xabcde || keyIOVA(k) != 0xfff {
		t.Fatalf("key %#x", uint64(k))
	}
	if a, ok := remoteAddr(k, 10, 5); !ok || a != 0xfff+10 {
		t.Fatalf("remoteAddr %d %v", a, ok)
	}
	if _, ok := remoteAddr(k, ^uint64(0)-5, 100); ok {
		t.Fatal("overflow accepted")
	}
}

func TestWithoutVerbsSaysWhy(t *testing.T) {
	if haveVerbs {
		t.Skip("built with -tags rdma")
	}
	_, err := New(Config{}, nil)
	if !sdk.IsClass(err, sdk.ClassUnavailable) || !strings.Contains(err.Error(), "-tags rdma") {
		t.Fatalf("New without verbs: %v", err)
	}
}
