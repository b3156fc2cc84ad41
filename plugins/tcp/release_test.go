package tcp

import (
	"context"
	"testing"
	"time"

	"github.com/kvfence/kvfence/sdk"
	"github.com/kvfence/kvfence/sdk/sdktest"
)

// A batch's completion is reported only after the sender let go of its
// source region: the engine may deregister the region as soon as it sees
// Succeeded. The receiver's acknowledgement can beat the writer's return
// from the socket write; the test widens that window so the race is
// deterministic (it failed about one conformance run in six before).
func TestCompletionAfterSourceUnpinned(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	e, k := grantedEnv(ctx, t, sdktest.Pair{Sender: newTCP(t, Config{}), Receiver: newTCP(t, Config{})})
	afterSocketWrite = func() { time.Sleep(300 * time.Millisecond) }
	t.Cleanup(func() { afterSocketWrite = func() {} })
	id := e.NewBatchID()
	if err := e.Sender.Post(ctx, e.Write(id, k, 0, 0, 4096)); err != nil {
		t.Fatal(err)
	}
	c, err := e.Wait(id)
	if err != nil || c.Status != sdk.Succeeded {
		t.Fatalf("write: %+v, %v", c, err)
	}
	if err := e.Sender.DeregisterMemory(ctx, e.SrcID); err != nil {
		t.Fatalf("DeregisterMemory right after Succeeded: %v", err)
	}
}
