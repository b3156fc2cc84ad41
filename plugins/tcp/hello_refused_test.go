package tcp

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/kvfence/kvfence/sdk"
	"github.com/kvfence/kvfence/sdk/sdktest"
)

// A session's HELLO names the key of the batch that started it; batches of
// other requests queue behind it while it dials. When that key is revoked
// before the HELLO (decode fences an aborted request at once), only the
// batches under that key fail: the others never left this process and get
// a HELLO of their own. Before, every batch on the session failed "revoked",
// and in an abort storm with eager revocation the demo lost a fifth of its
// requests that way.
func TestRefusedHelloFailsOnlyItsKeysBatches(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	e, err := sdktest.NewEnv(ctx, sdktest.Pair{Sender: newTCP(t, Config{}), Receiver: newTCP(t, Config{})})
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
	for _, b := range []sdk.Batch{e.Write(first, revoked, 0, 0, n), e.Write(other, live, n, 0, n), e.Write(again, revoked, 2*n, 0, n)} {
		if err := e.Sender.Post(ctx, b); err != nil {
			t.Fatal(err)
		}
	}
	<-reached // the session dials with the first batch's key, the others queued behind it
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
		t.Fatalf("batch under a live key, queued behind a refused HELLO: %+v, %v; want Succeeded", c, err)
	}
	if got, want := e.Dst.Bytes()[n:2*n], e.Src.Bytes()[n:2*n]; !bytes.Equal(got, want) {
		t.Fatal("the live key's bytes did not land")
	}
	if !bytes.Equal(e.Dst.Bytes()[:n], before) {
		t.Fatal("bytes landed under the revoked key")
	}
}
