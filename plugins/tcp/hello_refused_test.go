package tcp

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/kvfence/kvfence/sdk"
	"github.com/kvfence/kvfence/sdk/sdktest"
)

// A session's HELLO names the keys of the batches queued when it is said
// (the first batch's and up to three more); batches of other requests may
// queue behind them while it dials. A key revoked before the HELLO (decode
// fences an aborted request at once) fails only the batches under it: with
// a usable key among those named the session opens and the receiver
// refuses the revoked key's writes one by one; with none, the batches
// queued later never left this process and get a HELLO of their own.
// Before, every batch on a refused session failed "revoked": in an abort
// storm with eager revocation the demo lost a fifth of its requests.
func TestRefusedHelloFailsOnlyItsKeysBatches(t *testing.T) {
	for _, tc := range []struct {
		name         string
		postBefore   int // batches posted before the HELLO names its keys
		wantRefusals uint64
	}{
		{"all named in one HELLO", 3, 0},
		{"queued after a HELLO naming only the revoked key", 1, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			r := newTCP(t, Config{})
			e, err := sdktest.NewEnv(ctx, sdktest.Pair{Sender: newTCP(t, Config{}), Receiver: r})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(e.Close)
			const n = 4096
			revoked, err := e.Granter.Grant(ctx, sdk.Window{Region: e.DstID, Offset: 0, Length: n})
			if err != nil {
				t.Fatal(err)
			}
			live, err := e.Granter.Grant(ctx, sdk.Window{Region: e.DstID, Offset: n, Length: n})
			if err != nil {
				t.Fatal(err)
			}
			before := bytes.Clone(e.Dst.Bytes()[:n])
			gate, reached := make(chan struct{}), make(chan struct{}, 8)
			beforeHello = func() { reached <- struct{}{}; <-gate }
			t.Cleanup(func() { beforeHello = func() {} })

			first, other, again := e.NewBatchID(), e.NewBatchID(), e.NewBatchID()
			batches := []sdk.Batch{e.Write(first, revoked, 0, 0, n), e.Write(other, live, n, 0, n), e.Write(again, revoked, 2*n, 0, n)}
			post := func(bs []sdk.Batch) {
				for _, b := range bs {
					if err := e.Sender.Post(ctx, b); err != nil {
						t.Fatal(err)
					}
				}
			}
			if tc.postBefore > 1 {
				// Queued before the session dials: it dials when its first
				// batch is posted, so hold it there until all are in.
				beforeHello = func() { <-gate }
			}
			post(batches[:tc.postBefore])
			if tc.postBefore == 1 {
				<-reached // the HELLO names the first batch's key only
			}
			post(batches[tc.postBefore:])
			if _, err := e.Granter.Revoke(ctx, revoked); err != nil {
				t.Fatal(err)
			}
			close(gate)

			for _, id := range []sdk.BatchID{first, again} {
				c, err := e.Wait(id)
				if err != nil || c.Status != sdk.FailedDefinite || c.Class != classOfAck(ackRevoked) {
					t.Fatalf("batch under the revoked key: %+v, %v; want FailedDefinite, revoked", c, err)
				}
			}
			c, err := e.Wait(other)
			if err != nil || c.Status != sdk.Succeeded {
				t.Fatalf("batch under a live key, queued with the revoked key's: %+v, %v; want Succeeded", c, err)
			}
			if got, want := e.Dst.Bytes()[n:2*n], e.Src.Bytes()[n:2*n]; !bytes.Equal(got, want) {
				t.Fatal("the live key's bytes did not land")
			}
			if !bytes.Equal(e.Dst.Bytes()[:n], before) {
				t.Fatal("bytes landed under the revoked key")
			}
			if m, _ := r.Stats(ctx); m[statHelloRefused] != tc.wantRefusals {
				t.Fatalf("HELLOs refused: %d, want %d", m[statHelloRefused], tc.wantRefusals)
			}
		})
	}
}
