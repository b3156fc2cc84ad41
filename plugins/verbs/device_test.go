package verbs

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/kvfence/kvfence/sdk"
	"github.com/kvfence/kvfence/sdk/sdktest"
)

// Device tests run against real RDMA devices: in CI, inside the Soft-RoCE VM
// (make rxe-vm-test). KVFENCE_VERBS_TEST_DEVICES="rxe0,rxe1" names the
// sending and receiving device (default: the first device, for both);
// KVFENCE_VERBS_PLUGIN names a prebuilt plugin binary for the
// out-of-process test.

func deviceConfigs(t testing.TB, mode RevokeMode) (snd, rcv Config) {
	t.Helper()
	if !haveVerbs {
		t.Skip("skipped: built without -tags rdma (no libibverbs binding); device tests run in the Soft-RoCE VM: make rxe-vm-test")
	}
	s, r := "", ""
	if v := os.Getenv("KVFENCE_VERBS_TEST_DEVICES"); v != "" {
		s, r, _ = strings.Cut(v, ",")
		if r == "" {
			r = s
		}
	}
	snd, rcv = Config{Device: s, Revoke: mode}, Config{Device: r, Revoke: mode}
	d, err := openDevice(s, nil)
	if err != nil {
		t.Skipf("skipped: no usable RDMA device (%v); device tests run in the Soft-RoCE VM: make rxe-vm-test", err)
	}
	d.close()
	return snd, rcv
}

func newT(t testing.TB, c Config) *Transport {
	t.Helper()
	tr, err := New(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tr.Close() })
	return tr
}

func TestDeviceContract(t *testing.T) {
	for _, mode := range []RevokeMode{RevokeMW1, RevokeMR} {
		t.Run(string(mode), func(t *testing.T) {
			s, r := deviceConfigs(t, mode)
			sdktest.RunContract(t, sdktest.Pair{Sender: newT(t, s), Receiver: newT(t, r)})
		})
	}
}

func TestDeviceContractOutOfProcess(t *testing.T) {
	s, r := deviceConfigs(t, RevokeAuto)
	bin := os.Getenv("KVFENCE_VERBS_PLUGIN")
	if bin == "" {
		t.Skip("skipped: KVFENCE_VERBS_PLUGIN (a plugin binary built with -tags rdma) not set")
	}
	sp := sdktest.Subprocess(t, bin, sdk.OpenOptions{Env: []string{"KVFENCE_VERBS_DEVICE=" + s.Device}})
	rp := sdktest.Subprocess(t, bin, sdk.OpenOptions{Env: []string{"KVFENCE_VERBS_DEVICE=" + r.Device}})
	sdktest.RunContract(t, sdktest.Pair{Sender: sp.Transport(), Receiver: rp.Transport()})
}

func newEnv(t *testing.T, s, r Config) (*sdktest.Env, *Transport, *Transport) {
	t.Helper()
	st, rt := newT(t, s), newT(t, r)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	e, err := sdktest.NewEnv(ctx, sdktest.Pair{Sender: st, Receiver: rt})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	return e, st, rt
}

func fill(b []byte, v byte) {
	for i := range b {
		b[i] = v
	}
}

// The verbs results map onto the contract: success → Succeeded with the
// bytes there; a remote access error (bad key) → InDoubt, which Quiesce
// resolves with endpoint-flushed; the peer reconnects lazily afterwards.
func TestDeviceCompletionMapping(t *testing.T) {
	s, r := deviceConfigs(t, RevokeAuto)
	e, st, _ := newEnv(t, s, r)
	ctx := context.Background()
	k, err := e.Granter.Grant(ctx, sdk.Window{Region: e.DstID, Offset: 0, Length: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	id := e.NewBatchID()
	if err := st.Post(ctx, e.Write(id, k, 0, 0, 64<<10)); err != nil {
		t.Fatal(err)
	}
	c, err := e.Wait(id)
	if err != nil || c.Status != sdk.Succeeded || c.BytesLanded != 64<<10 || !bytes.Equal(e.Dst.Bytes()[:64<<10], e.Src.Bytes()[:64<<10]) {
		t.Fatalf("good write: %+v %v", c, err)
	}
	bad := e.NewBatchID()
	if err := st.Post(ctx, e.Write(bad, k^0xff, 0, 0, 4096)); err != nil { // wrong rkey
		t.Fatal(err)
	}
	c, err = e.Wait(bad)
	if err != nil || c.Status != sdk.InDoubt {
		t.Fatalf("bad key: %+v %v, want InDoubt", c, err)
	}
	t.Logf("bad key: %v class=%v %s", c.Status, c.Class, c.Detail)
	res, err := st.Quiesce(ctx, e.Peer, []sdk.BatchID{bad})
	if err != nil || res.Evidence != sdk.EvidenceEndpointFlushed {
		t.Fatalf("Quiesce after an error: %+v %v, want endpoint-flushed", res, err)
	}
	again := e.NewBatchID()
	if err := st.Post(ctx, e.Write(again, k, 4096, 0, 4096)); err != nil {
		t.Fatal(err)
	}
	if c, err = e.Wait(again); err != nil || c.Status != sdk.Succeeded {
		t.Fatalf("after quiesce (lazy reconnect): %+v %v", c, err)
	}
	stats, _ := st.Stats(ctx)
	if stats["verbs.reconnects"] == 0 {
		t.Fatalf("no reconnect counted: %v", stats)
	}
}

// Selective signalling on the device: in a batch of three writes only the
// last is signalled; the second uses a wrong key. Its error completion
// settles the first (it completed before, so it succeeded: its bytes count
// and are there), the third is flushed, and the batch is InDoubt until a
// Quiesce.
func TestDeviceErrorMidBatch(t *testing.T) {
	s, r := deviceConfigs(t, RevokeAuto)
	e, st, _ := newEnv(t, s, r)
	ctx := context.Background()
	k, err := e.Granter.Grant(ctx, sdk.Window{Region: e.DstID, Offset: 0, Length: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	fill(e.Src.Bytes()[:12<<10], 0x3C)
	fill(e.Dst.Bytes()[:64<<10], 0)
	id := e.NewBatchID()
	b := sdk.Batch{ID: id, Peer: e.Peer, Ops: []sdk.Op{
		{Kind: sdk.OpWrite, LocalRegion: e.SrcID, LocalOffset: 0, RemoteKey: k, RemoteOffset: 0, Length: 4096},
		{Kind: sdk.OpWrite, LocalRegion: e.SrcID, LocalOffset: 4096, RemoteKey: k ^ 0xff, RemoteOffset: 4096, Length: 4096},
		{Kind: sdk.OpWrite, LocalRegion: e.SrcID, LocalOffset: 8192, RemoteKey: k, RemoteOffset: 8192, Length: 4096},
	}}
	if err := st.Post(ctx, b); err != nil {
		t.Fatal(err)
	}
	c, err := e.Wait(id)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("error mid-batch: %v landed=%d %s", c.Status, c.BytesLanded, c.Detail)
	if c.Status != sdk.InDoubt || c.BytesLanded != 4096 || !strings.Contains(c.Detail, WCRemAccessErr.String()) {
		t.Fatalf("got %+v, want InDoubt with the first write's 4096 bytes landed", c)
	}
	if noByte(e.Dst.Bytes()[:4096], 0x3C) != nil {
		t.Fatal("the first write's bytes are not there")
	}
	if res, err := st.Quiesce(ctx, e.Peer, []sdk.BatchID{id}); err != nil || res.Evidence != sdk.EvidenceEndpointFlushed {
		t.Fatalf("Quiesce: %+v %v", res, err)
	}
	if n := e.Count(id); n != 1 {
		t.Fatalf("%d completions", n)
	}
}

// Quiesce in the middle of a transfer: the plugin moves the QP to ERROR,
// harvests every completion (flushes included) and only then returns
// endpoint-flushed; every batch gets exactly one completion, Succeeded only
// with its bytes in place, the rest FailedDefinite.
func TestDeviceQuiesceMidTransfer(t *testing.T) {
	s, r := deviceConfigs(t, RevokeAuto)
	e, st, _ := newEnv(t, s, r)
	ctx := context.Background()
	k, err := e.Granter.Grant(ctx, sdk.Window{Region: e.DstID, Offset: 0, Length: sdktest.EnvSize})
	if err != nil {
		t.Fatal(err)
	}
	var ids []sdk.BatchID
	for i := 0; i < 16; i++ {
		b := sdk.Batch{ID: e.NewBatchID(), Peer: e.Peer}
		for j := uint64(0); j < 16; j++ {
			// 64 KiB writes (16 MiB in all, overlapping): enough that the
			// Quiesce below usually lands mid-transfer.
			off := (uint64(i)*16 + j) * (64 << 10) % sdktest.EnvSize
			b.Ops = append(b.Ops, sdk.Op{Kind: sdk.OpWrite, LocalRegion: e.SrcID, LocalOffset: off, RemoteKey: k, RemoteOffset: off, Length: 64 << 10})
		}
		if err := st.Post(ctx, b); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, b.ID)
	}
	res, err := st.Quiesce(ctx, e.Peer, ids)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("quiesce: %s %s", res.Evidence, res.Detail)
	counts := map[sdk.Status]int{}
	for _, id := range ids {
		c, err := e.Wait(id)
		if err != nil {
			t.Fatal(err)
		}
		if c.Status == sdk.InDoubt {
			t.Fatalf("batch %d InDoubt after a successful Quiesce: %s", id, c.Detail)
		}
		counts[c.Status]++
	}
	for _, id := range ids {
		if n := e.Count(id); n != 1 {
			t.Fatalf("batch %d: %d completions", id, n)
		}
	}
	t.Logf("statuses after mid-transfer quiesce: %v", counts)
	if counts[sdk.FailedDefinite] > 0 && res.Evidence != sdk.EvidenceEndpointFlushed {
		t.Fatalf("flushed batches but evidence %s", res.Evidence)
	}
}

// The late-write test: a transfer is aborted mid-way, the receiver revokes
// the exposure, and the memory is proved untouched from then on; a late
// write through the old key fails at the sender (remote access error,
// or retry-exceeded under loss) and lands nowhere.
func TestDeviceLateWriteAfterRevoke(t *testing.T) {
	for _, variant := range []string{"mw1", "mr", "mw2"} {
		t.Run(variant, func(t *testing.T) {
			mode := RevokeMode(variant)
			if variant == "mw2" { // type-2 windows: the same test with keys bound to the writer
				mode = RevokeAuto
			}
			s, r := deviceConfigs(t, mode)
			e, st, rt := newEnv(t, s, r)
			writer := ""
			if variant == "mw2" {
				if !rt.writerBound() {
					t.Skipf("skipped: device %s has no type-2 memory windows", rt.Device())
				}
				writer = st.ln.Addr().String()
			} else if rt.RevokeMode() != mode {
				t.Fatalf("mode %s", rt.RevokeMode())
			}
			ctx := context.Background()
			const win, guard = 512 << 10, 64 << 10
			dst := e.Dst.Bytes()
			fill(dst, 0x5A)
			k, err := e.Granter.Grant(ctx, sdk.Window{Region: e.DstID, Offset: guard, Length: win, Writer: writer})
			if err != nil {
				t.Fatal(err)
			}
			// The "request": 32 batches of 4 × 16 KiB writes (the window
			// four times over), aborted mid-way.
			var ids []sdk.BatchID
			for i := uint64(0); i < 32; i++ {
				b := sdk.Batch{ID: e.NewBatchID(), Peer: e.Peer}
				for j := uint64(0); j < 4; j++ {
					off := (i*4 + j) * (16 << 10) % win
					b.Ops = append(b.Ops, sdk.Op{Kind: sdk.OpWrite, LocalRegion: e.SrcID, LocalOffset: off, RemoteKey: k, RemoteOffset: off, Length: 16 << 10})
				}
				if err := st.Post(ctx, b); err != nil {
					t.Fatal(err)
				}
				ids = append(ids, b.ID)
			}
			// Abort: decode revokes at once, while writes are in flight.
			if _, err := e.Granter.Revoke(ctx, k); err != nil {
				t.Fatal(err)
			}
			snap := append([]byte(nil), dst...)
			statuses := map[sdk.Status]int{}
			for _, id := range ids {
				c, err := e.Wait(id)
				if err != nil {
					t.Fatal(err)
				}
				statuses[c.Status]++
			}
			t.Logf("aborted request: %v", statuses)
			// The late write, through the old key.
			late := e.NewBatchID()
			fill(e.Src.Bytes()[:16<<10], 0xEE)
			if err := st.Post(ctx, e.Write(late, k, 0, 0, 16<<10)); err != nil {
				t.Fatal(err)
			}
			c, err := e.Wait(late)
			if err != nil {
				t.Fatal(err)
			}
			if c.Status == sdk.Succeeded {
				t.Fatal("late write through a revoked key reported Succeeded")
			}
			if !strings.Contains(c.Detail, WCRemAccessErr.String()) && !strings.Contains(c.Detail, WCRetryExcErr.String()) {
				t.Fatalf("late write ended with %v (%s), want a remote access or retry-exceeded error at the sender", c.Status, c.Detail)
			}
			t.Logf("late write: %v %s", c.Status, c.Detail)
			if _, err := st.Quiesce(ctx, e.Peer, append(ids, late)); err != nil {
				t.Fatal(err)
			}
			time.Sleep(st.cfg.MaxTail()) // let any tail run out, then look
			if !bytes.Equal(snap, dst) {
				for i := range dst {
					if dst[i] != snap[i] {
						t.Fatalf("target memory changed after Revoke returned, first at byte %d", i)
					}
				}
			}
			if err := noByte(dst[:guard], 0x5A); err != nil {
				t.Fatal("guard before the window:", err)
			}
			if err := noByte(dst[guard+win:], 0x5A); err != nil {
				t.Fatal("guard after the window:", err)
			}
			if bytes.Contains(dst, bytes.Repeat([]byte{0xEE}, 64)) {
				t.Fatal("the late write's bytes are in the target memory")
			}
			if variant == "mw2" {
				stats, _ := rt.Stats(ctx)
				if stats["verbs.grants_mw2"] != 1 || stats["verbs.revokes_mw2"] != 1 {
					t.Fatalf("type-2 path not taken: %v", stats)
				}
			}
		})
	}
}

func noByte(b []byte, want byte) error {
	for i, v := range b {
		if v != want {
			return fmt.Errorf("byte %d is %#x, want %#x", i, v, want)
		}
	}
	return nil
}

// benchPair: two transports (rxe0 → rxe1 in the VM), a source region and a
// granted destination window of size bytes, connected.
func benchPair(b *testing.B, size uint64) (st *Transport, sid sdk.RegionID, k sdk.Key, peer sdk.PeerID) {
	s, r := deviceConfigs(b, RevokeAuto)
	s.Poll = PollMode(os.Getenv("KVFENCE_VERBS_POLL")) // the sender's loop waits for the completions
	st, rt := newT(b, s), newT(b, r)
	ctx := context.Background()
	src, err := sdk.NewSharedMemory("bsrc", size)
	if err != nil {
		b.Fatal(err)
	}
	dstm, err := sdk.NewSharedMemory("bdst", size)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { src.Close(); dstm.Close() })
	if sid, err = st.RegisterMemory(ctx, src.Desc()); err != nil {
		b.Fatal(err)
	}
	did, err := rt.RegisterMemory(ctx, dstm.Desc())
	if err != nil {
		b.Fatal(err)
	}
	if k, err = rt.Grant(ctx, sdk.Window{Region: did, Length: size}); err != nil {
		b.Fatal(err)
	}
	ep, _ := rt.LocalEndpoint(ctx)
	if peer, err = st.Connect(ctx, ep); err != nil {
		b.Fatal(err)
	}
	return st, sid, k, peer
}

// BenchmarkDeviceWrite: the plugin's RDMA WRITE bandwidth, 64 KiB writes,
// 16 per batch, 8 batches in flight: 128 work requests outstanding, like
// ib_write_bw's default tx depth. -test.benchtime 128x moves 2048 messages:
// compare with `ib_write_bw -s 65536 -n 2048` on the same device pair, in
// the same run (vm/guest.sh, step bandwidth). The clock runs from the first
// post to the last completion, as ib_write_bw's does. The writes cycle
// through 8 MiB each side; KVFENCE_VERBS_BENCH_SPAN=64k reuses one 64 KiB
// buffer each side, as ib_write_bw does. KVFENCE_VERBS_POLL selects the
// sender's poll mode; KVFENCE_VERBS_BENCH_PER=n puts n writes in a batch
// (128/n batches in flight; run 2048/n iterations for 2048 messages).
func BenchmarkDeviceWrite(b *testing.B) {
	const size, op, depth = 8 << 20, 64 << 10, 128
	per := 16 // KVFENCE_VERBS_BENCH_PER: writes per batch (batches in flight: 128 / per)
	if v, err := strconv.Atoi(os.Getenv("KVFENCE_VERBS_BENCH_PER")); err == nil && v >= 1 && v <= depth {
		per = v
	}
	inflight := depth / per
	st, sid, k, peer := benchPair(b, size)
	ctx := context.Background()
	next := sdk.BatchID(0)
	ops := make([]sdk.Op, per)
	span := uint64(size) // source and destination bytes the writes cycle through
	if os.Getenv("KVFENCE_VERBS_BENCH_SPAN") == "64k" {
		span = op // one 64 KiB buffer each side, as ib_write_bw uses
	}
	post := func() {
		next++
		for j := range ops {
			off := (uint64(next)*uint64(per) + uint64(j)) * op % span
			ops[j] = sdk.Op{Kind: sdk.OpWrite, LocalRegion: sid, LocalOffset: off, RemoteKey: k, RemoteOffset: off, Length: op}
		}
		if err := st.Post(ctx, sdk.Batch{ID: next, Peer: peer, Ops: ops}); err != nil {
			b.Fatal(err)
		}
	}
	b.SetBytes(int64(op * per))
	b.ResetTimer()
	start := time.Now()
	out := 0
	for i := 0; i < b.N; i++ {
		for out >= inflight {
			c := <-st.Completions()
			if c.Status != sdk.Succeeded {
				b.Fatalf("batch %d: %v %s", c.Batch, c.Status, c.Detail)
			}
			out--
		}
		post()
		out++
	}
	for ; out > 0; out-- {
		if c := <-st.Completions(); c.Status != sdk.Succeeded {
			b.Fatalf("batch %d: %v %s", c.Batch, c.Status, c.Detail)
		}
	}
	el := time.Since(start)
	b.ReportMetric(float64(b.N*op*per)/el.Seconds()/(1<<20), "MiB/s")
	stats, _ := st.Stats(ctx)
	fmt.Printf("KVFENCE_VERBS_BW_MIBPS %.2f (%d x %d B in %v; %d work requests, %d work completions)\n",
		float64(b.N*op*per)/el.Seconds()/(1<<20), b.N*per, op, el, stats["verbs.wrs_posted"], stats["verbs.cqes"])
}

// BenchmarkDeviceBatchLatency: one small batch (one 4 KiB RDMA WRITE)
// posted, its completion awaited, b.N times; reports p50/p99/mean of the
// post → completion time, and the p50 of Post's own duration. Compare
// (vm/guest.sh, step latency, same device pair) with `ib_write_bw -t 1 -Q 1
// -s 4096`, one signalled write outstanding at a time, whose 1 / msg rate
// is the same post → completion time (~1 is parity), and with `ib_write_lat
// -s 4096`, which reports half of a write ping-pong's round trip (the peer
// polls its memory; no ACK or completion waited for), so ~2 is parity
// there. BenchmarkDeviceRawLatency is the floor without the transport.
func BenchmarkDeviceBatchLatency(b *testing.B) {
	const size, op = 1 << 20, 4 << 10
	st, sid, k, peer := benchPair(b, size)
	ctx := context.Background()
	lat := make([]time.Duration, 0, b.N)
	posted := make([]time.Duration, 0, b.N) // post → Post returned
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		id := sdk.BatchID(i + 1)
		off := uint64(i) * op % size
		t0 := time.Now()
		if err := st.Post(ctx, sdk.Batch{ID: id, Peer: peer, Ops: []sdk.Op{{Kind: sdk.OpWrite, LocalRegion: sid,
			LocalOffset: off, RemoteKey: k, RemoteOffset: off, Length: op}}}); err != nil {
			b.Fatal(err)
		}
		posted = append(posted, time.Since(t0))
		c := <-st.Completions()
		lat = append(lat, time.Since(t0))
		if c.Status != sdk.Succeeded || c.Batch != id {
			b.Fatalf("batch %d: %+v", id, c)
		}
	}
	b.StopTimer()
	p50, p99, mean, lo := latStats(lat)
	pp50, _, _, _ := latStats(posted)
	b.ReportMetric(p50, "p50-µs")
	fmt.Printf("KVFENCE_VERBS_LAT_US p50=%.2f p99=%.2f min=%.2f mean=%.2f post_p50=%.2f n=%d (%d B, one-op batch, post to completion)\n",
		p50, p99, lo, mean, pp50, len(lat), op)
}

// latStats: p50, p99, mean and min of ds in µs (sorts ds).
func latStats(ds []time.Duration) (p50, p99, mean, lo float64) {
	if len(ds) == 0 {
		return
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	us := func(q float64) float64 { return float64(ds[int(q*float64(len(ds)-1))]) / 1e3 }
	var sum time.Duration
	for _, d := range ds {
		sum += d
	}
	return us(0.5), us(0.99), float64(sum) / float64(len(ds)) / 1e3, us(0)
}

// BenchmarkDeviceRawLatency: the floor under BenchmarkDeviceBatchLatency,
// without the transport: one signalled 4 KiB RDMA WRITE posted straight on
// a QP (the cgo layer), its completion polled without sleeping, b.N times,
// as `ib_write_bw -t 1` does in C. Sub-benchmark inline polls in the posting
// goroutine; handoff polls in a second goroutine that hands each completion
// over a channel (the transport's shape: pollLoop → Completions()).
func BenchmarkDeviceRawLatency(b *testing.B) {
	const size, op = 1 << 20, 4 << 10
	s, r := deviceConfigs(b, RevokeAuto)
	sd, err := openDevice(s.Device, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer sd.close()
	rd, err := openDevice(r.Device, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer rd.close()
	src, err := sdk.NewSharedMemory("rsrc", size)
	if err != nil {
		b.Fatal(err)
	}
	defer src.Close()
	dst, err := sdk.NewSharedMemory("rdst", size)
	if err != nil {
		b.Fatal(err)
	}
	defer dst.Close()
	sa, da := uint64(uintptr(unsafe.Pointer(&src.Bytes()[0]))), uint64(uintptr(unsafe.Pointer(&dst.Bytes()[0])))
	smr, err := sd.regMR(uintptr(sa), size, sa, accLocalWrite)
	if err != nil {
		b.Fatal(err)
	}
	defer smr.dereg()
	dmr, err := rd.regMR(uintptr(da), size, da, accLocalWrite|accRemoteWrite)
	if err != nil {
		b.Fatal(err)
	}
	defer dmr.dereg()
	sq, err := sd.newQP(16)
	if err != nil {
		b.Fatal(err)
	}
	defer sq.destroy()
	rq, err := rd.newQP(16)
	if err != nil {
		b.Fatal(err)
	}
	defer rq.destroy()
	const spsn, rpsn = 0x1234, 0x4321
	if err := sq.connect(qpAttrs{QPN: rq.num(), PSN: rpsn, GID: rd.info().GID}, spsn, defaultTimeout, defaultRetryCnt); err != nil {
		b.Fatal(err)
	}
	if err := rq.connect(qpAttrs{QPN: sq.num(), PSN: spsn, GID: sd.info().GID}, rpsn, defaultTimeout, defaultRetryCnt); err != nil {
		b.Fatal(err)
	}
	next := uint64(0)
	post := func(i int) {
		next++
		off := uint64(i) * op % size
		w := []wr{{LAddr: sa + off, Len: op, LKey: smr.lkey(), RAddr: da + off, RKey: dmr.rkey(), Signal: true, ID: next}}
		if n, _, err := sq.post(w, 0); n != 1 {
			b.Fatal("post:", err)
		}
	}
	pollOne := func(buf []wc) wc {
		for {
			n, err := sd.poll(buf[:1])
			if err != nil {
				b.Error(err)
				return wc{Status: WCGeneralErr}
			}
			if n == 1 {
				return buf[0]
			}
		}
	}
	report := func(name string, lat []time.Duration, el time.Duration) {
		p50, p99, mean, lo := latStats(lat)
		fmt.Printf("KVFENCE_VERBS_RAWLAT_US %s p50=%.2f p99=%.2f min=%.2f mean=%.2f per_msg=%.2f n=%d (%d B, one signalled write, no transport)\n",
			name, p50, p99, lo, mean, float64(el)/float64(len(lat))/1e3, len(lat), op)
	}
	b.Run("inline", func(b *testing.B) {
		buf := make([]wc, 1)
		lat := make([]time.Duration, 0, b.N)
		start := time.Now()
		for i := 0; i < b.N; i++ {
			t0 := time.Now()
			post(i)
			if w := pollOne(buf); w.Status != WCSuccess || w.ID != next {
				b.Fatalf("completion %+v, want id %d success", w, next)
			}
			lat = append(lat, time.Since(t0))
		}
		report("inline", lat, time.Since(start))
	})
	b.Run("handoff", func(b *testing.B) {
		ch, stop := make(chan wc, 16), make(chan struct{})
		go func() {
			buf := make([]wc, 1)
			for {
				select {
				case <-stop:
					return
				default:
				}
				n, _ := sd.poll(buf)
				if n == 1 {
					ch <- buf[0]
				}
			}
		}()
		defer close(stop)
		lat := make([]time.Duration, 0, b.N)
		start := time.Now()
		for i := 0; i < b.N; i++ {
			t0 := time.Now()
			post(i)
			if w := <-ch; w.Status != WCSuccess || w.ID != next {
				b.Fatalf("completion %+v, want id %d success", w, next)
			}
			lat = append(lat, time.Since(t0))
		}
		report("handoff", lat, time.Since(start))
	})
}

// RDMA READ: the sender pulls a granted window into its own memory; after
// Revoke a read through the old key fails at the sender and moves nothing.
func TestDeviceRead(t *testing.T) {
	for _, mode := range []RevokeMode{RevokeMW1, RevokeMR} {
		t.Run(string(mode), func(t *testing.T) {
			s, r := deviceConfigs(t, mode)
			e, st, _ := newEnv(t, s, r)
			ctx := context.Background()
			const off, n = 256 << 10, 32 << 10
			for i := range e.Dst.Bytes()[off : off+n] {
				e.Dst.Bytes()[off+i] = byte(i*13 + 5)
			}
			k, err := e.Granter.Grant(ctx, sdk.Window{Region: e.DstID, Offset: off, Length: n})
			if err != nil {
				t.Fatal(err)
			}
			read := func(id sdk.BatchID) sdk.Completion {
				t.Helper()
				fill(e.Src.Bytes()[:n], 0)
				b := sdk.Batch{ID: id, Peer: e.Peer, Ops: []sdk.Op{{Kind: sdk.OpRead, LocalRegion: e.SrcID, RemoteKey: k, Length: n}}}
				if err := st.Post(ctx, b); err != nil {
					t.Fatal(err)
				}
				c, err := e.Wait(id)
				if err != nil {
					t.Fatal(err)
				}
				return c
			}
			if c := read(e.NewBatchID()); c.Status != sdk.Succeeded || !bytes.Equal(e.Src.Bytes()[:n], e.Dst.Bytes()[off:off+n]) {
				t.Fatalf("read: %+v, or the bytes did not arrive", c)
			}
			if _, err := e.Granter.Revoke(ctx, k); err != nil {
				t.Fatal(err)
			}
			if c := read(e.NewBatchID()); c.Status == sdk.Succeeded || noByte(e.Src.Bytes()[:n], 0) != nil {
				t.Fatalf("read after Revoke: %+v (or bytes moved)", c)
			}
		})
	}
}
