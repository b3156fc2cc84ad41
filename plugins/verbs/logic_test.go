package verbs

import (
	"strings"
	"testing"
	"time"

	"github.com/kvfence/kvfence/errdefs"
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
// batches whose requests all succeeded stay Succeeded. Completions arrive in
// post order (one RC send queue); only the last request of a batch is
// signalled, unsignalled ones report only when they fail (or, on some
// devices, are flushed).
func TestPluginFlushThenDrainIsFailedDefinite(t *testing.T) {
	e := newEpoch()
	e.add(1, []uint64{1}, []uint64{50}, 50, false)
	e.add(2, []uint64{2, 3, 4}, []uint64{100, 100, 100}, 300, false)
	e.add(3, []uint64{5}, []uint64{70}, 70, false)
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
	h(1, WCSuccess)    // batch 1 finished successfully during the flush
	h(3, WCWRFlushErr) // an unsignalled request reports its flush (rxe does); 2 before it: unknown
	if len(got) != 1 || got[0].Batch != 1 || got[0].Status != sdk.Succeeded {
		t.Fatalf("before drain: %+v", got)
	}
	h(4, WCWRFlushErr)
	if e.drained() || len(got) != 1 {
		t.Fatalf("drained with a request outstanding, or batch 2 released early: %+v", got)
	}
	h(5, WCRetryExcErr) // even a device error during our flush: QP is ours, in ERROR, drained
	if !e.drained() {
		t.Fatal("not drained")
	}
	byID := map[sdk.BatchID]sdk.Completion{}
	for _, c := range got {
		byID[c.Batch] = c
	}
	if len(got) != 3 || byID[2].Status != sdk.FailedDefinite || byID[2].BytesLanded != 0 || byID[3].Status != sdk.FailedDefinite {
		t.Fatalf("after drain: %+v", got)
	}
}

// Selective signalling: the one completion of a batch's last request
// retires the whole batch, its bytes and its send-queue slots.
func TestSignalledLastRetiresBatch(t *testing.T) {
	e := newEpoch()
	e.add(1, []uint64{1, 2, 3}, []uint64{10, 20, 30}, 60, false)
	e.add(2, []uint64{4, 5}, []uint64{1, 2}, 3, false)
	if e.outstanding != 5 {
		t.Fatalf("outstanding %d", e.outstanding)
	}
	out, ok := e.harvest(3, WCSuccess)
	if !ok || len(out) != 1 || out[0].Batch != 1 || out[0].Status != sdk.Succeeded || out[0].BytesLanded != 60 {
		t.Fatalf("got %+v", out)
	}
	if e.outstanding != 2 || len(e.wrs) != 2 {
		t.Fatalf("outstanding %d, %d tracked: the batch's send-queue slots were not freed", e.outstanding, len(e.wrs))
	}
	if out, ok := e.harvest(1, WCSuccess); ok || out != nil {
		t.Fatal("a retired unsignalled request was accepted again")
	}
	out, _ = e.harvest(5, WCSuccess)
	if len(out) != 1 || out[0].Batch != 2 || out[0].BytesLanded != 3 || e.outstanding != 0 || len(e.order) != 0 {
		t.Fatalf("got %+v, outstanding %d, order %v", out, e.outstanding, e.order)
	}
}

// An unsignalled request fails with a device error: the requests before it
// succeeded (they completed first, and a failure always reports), the batch
// is InDoubt with exactly those bytes, and the flush of the rest (reported
// or not) settles nothing more.
func TestUnsignalledErrorInBatch(t *testing.T) {
	for _, reportsFlush := range []bool{true, false} {
		e := newEpoch()
		e.add(1, []uint64{1, 2, 3, 4, 5}, []uint64{10, 20, 40, 80, 160}, 310, false)
		var got []sdk.Completion
		out, _ := e.harvest(3, WCRemAccessErr)
		got = append(got, out...)
		if !e.hwError || len(got) != 0 {
			t.Fatalf("after the error: hwError=%v %+v", e.hwError, got)
		}
		if reportsFlush { // rxe reports flushed unsignalled requests; others may not
			out, _ = e.harvest(4, WCWRFlushErr)
			got = append(got, out...)
		}
		out, _ = e.harvest(5, WCWRFlushErr) // the signalled last request always reports
		got = append(got, out...)
		if len(got) != 1 || got[0].Status != sdk.InDoubt || got[0].BytesLanded != 30 || got[0].Class != errdefs.FailedPrecondition {
			t.Fatalf("reportsFlush=%v: got %+v", reportsFlush, got)
		}
		if e.outstanding != 0 {
			t.Fatalf("outstanding %d", e.outstanding)
		}
	}
}

// The batch's last (signalled) request fails with a device error: every
// unsignalled request before it succeeded.
func TestLastRequestFails(t *testing.T) {
	e := newEpoch()
	e.add(1, []uint64{1, 2, 3}, []uint64{10, 20, 40}, 70, false)
	out, _ := e.harvest(3, WCRetryExcErr)
	if len(out) != 1 || out[0].Status != sdk.InDoubt || out[0].BytesLanded != 30 || out[0].Class != errdefs.Unavailable {
		t.Fatalf("got %+v", out)
	}
}

// The plugin flushes the QP and the device reports only the signalled
// request: the unsignalled ones before it may have succeeded or been
// flushed silently; their bytes are not counted and the batch fails
// definitely once the QP is drained, never Succeeded.
func TestFlushOfLastRequestLeavesUnsignalledUnknown(t *testing.T) {
	e := newEpoch()
	e.add(1, []uint64{1, 2, 3}, []uint64{10, 20, 40}, 70, false)
	e.add(2, []uint64{4, 5}, []uint64{5, 5}, 10, false)
	e.beginFlush()
	out, _ := e.harvest(3, WCWRFlushErr)
	if len(out) != 0 || e.drained() {
		t.Fatalf("released before the drain: %+v", out)
	}
	out, _ = e.harvest(5, WCWRFlushErr)
	if !e.drained() || len(out) != 2 {
		t.Fatalf("drained=%v %+v", e.drained(), out)
	}
	for _, c := range out {
		if c.Status != sdk.FailedDefinite || c.BytesLanded != 0 {
			t.Fatalf("got %+v", c)
		}
	}
}

// A flush the plugin did not cause, after an error in an earlier batch,
// seen only on a later batch's signalled request: InDoubt.
func TestUnrequestedFlushAfterSilentRequests(t *testing.T) {
	e := newEpoch()
	e.add(1, []uint64{1, 2}, []uint64{8, 8}, 16, false)
	e.add(2, []uint64{3, 4}, []uint64{8, 8}, 16, false)
	a, _ := e.harvest(1, WCRemAccessErr)
	b, _ := e.harvest(2, WCWRFlushErr)
	c, _ := e.harvest(4, WCWRFlushErr)
	if len(a) != 0 || len(b) != 1 || len(c) != 1 || b[0].Status != sdk.InDoubt || b[0].BytesLanded != 0 ||
		c[0].Batch != 2 || c[0].Status != sdk.InDoubt || e.outstanding != 0 {
		t.Fatalf("got %+v %+v %+v", a, b, c)
	}
}

func TestPartialPostIsFailedDefinite(t *testing.T) {
	e := newEpoch()
	e.add(9, []uint64{1}, []uint64{10}, 30, true)
	out, _ := e.harvest(1, WCSuccess)
	if len(out) != 1 || out[0].Status != sdk.FailedDefinite || out[0].BytesLanded != 10 {
		t.Fatalf("got %+v", out)
	}
	// ibv_post_send refused the chain after two unsignalled requests; the
	// transport closed the posted part with a signalled copy of the last
	// one (id 4, no bytes of its own): its success settles the batch.
	e.add(10, []uint64{2, 3, 4}, []uint64{10, 10, 0}, 40, true)
	out, _ = e.harvest(4, WCSuccess)
	if len(out) != 1 || out[0].Status != sdk.FailedDefinite || out[0].BytesLanded != 20 || e.outstanding != 0 {
		t.Fatalf("got %+v", out)
	}
}

func TestAbandonIsInDoubtAndExactlyOnce(t *testing.T) {
	e := newEpoch()
	e.add(1, []uint64{1}, []uint64{1}, 1, false)
	e.add(2, []uint64{2, 3}, []uint64{1, 1}, 2, false)
	if out, _ := e.harvest(1, WCSuccess); len(out) != 1 {
		t.Fatal("batch 1 not completed")
	}
	out := e.abandon("closed")
	if len(out) != 1 || out[0].Batch != 2 || out[0].Status != sdk.InDoubt {
		t.Fatalf("got %+v", out)
	}
	if out, ok := e.harvest(3, WCSuccess); ok || len(out) != 0 {
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
	if WCRemAccessErr.class() != errdefs.FailedPrecondition || WCRetryExcErr.class() != errdefs.Unavailable {
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
	for _, c := range []Config{{RetryCnt: 7}, {Timeout: 32}, {Revoke: "mw9"}, {MaxBatch: 1000, QueueDepth: 10}, {GID: "not-a-gid"}, {Poll: "busy"}} {
		if err := c.withDefaults().validate(); err == nil {
			t.Fatalf("%+v accepted", c)
		}
	}
	env := map[string]string{"KVFENCE_VERBS_RETRY_CNT": "7"}
	if _, err := ConfigFromEnv(func(k string) string { return env[k] }); err == nil || !strings.Contains(err.Error(), "forever") {
		t.Fatalf("retry_cnt 7 from env: %v", err)
	}
	env = map[string]string{"KVFENCE_VERBS_DEVICE": "rxe1", "KVFENCE_VERBS_TIMEOUT": "12", "KVFENCE_VERBS_RETRY_CNT": "3",
		"KVFENCE_VERBS_REVOKE": "mr", "KVFENCE_VERBS_GID": "::ffff:169.254.7.2", "KVFENCE_VERBS_TAIL_MARGIN": "250ms",
		"KVFENCE_VERBS_POLL": "spin"}
	c, err := ConfigFromEnv(func(k string) string { return env[k] })
	if err != nil || c.Device != "rxe1" || c.Timeout != 12 || c.RetryCnt != 3 || c.Revoke != RevokeMR || c.TailMargin != 250*time.Millisecond || c.Poll != PollSpin {
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
	if !errdefs.Is(err, errdefs.Unavailable) || !strings.Contains(err.Error(), "-tags rdma") {
		t.Fatalf("New without verbs: %v", err)
	}
}
