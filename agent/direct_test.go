package agent

import (
	"bytes"
	"testing"

	"github.com/kvfence/kvfence/core"
	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/sdk"
)

// engineMemory is 32 engine pages of 4 KiB the engine owns (host memory
// here: the TCP plugin process maps it), lent 8 at a time.
func engineMemory(t *testing.T) (*sdk.SharedMemory, func(*DecodeConfig)) {
	t.Helper()
	mem, err := sdk.NewSharedMemory("engine-kv", 32*4096)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = mem.Close() })
	return mem, func(c *DecodeConfig) {
		c.Slots = 8
		c.Engine = &EngineMemory{Desc: mem.Desc(), Pages: 32, View: mem.Bytes()}
	}
}

// TestDirectLandsAtEnginePages: in direct mode a request's pages land in
// the engine's memory at the page indices the engine named, in its order,
// through real plugin processes; nothing else in the engine's memory is
// touched; the pool-picked Init is refused.
func TestDirectLandsAtEnginePages(t *testing.T) {
	mem, tweak := engineMemory(t)
	d, p := startPair(t, tweak, nil, nil)
	key := core.RequestKey{Room: 5, Gen: 1}
	if _, err := d.NewReceiver(key).Init(3, []core.RankID{1}); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("pool-picked Init in direct mode: %v, want FailedPrecondition", err)
	}
	idx := []int{17, 2, 30}
	rv := d.NewReceiver(key)
	if _, err := rv.InitAt(idx, []core.RankID{1}); err != nil {
		t.Fatal(err)
	}
	snd := transfer(t, p, rv, key, len(idx)) // reads them back through Pages
	defer snd.Close()
	view := mem.Bytes()
	for i, pg := range idx {
		if !bytes.Equal(view[pg*4096:(pg+1)*4096], snd.Page(i)) {
			t.Fatalf("engine page %d does not hold the request's page %d", pg, i)
		}
	}
	for pg := range 32 {
		if pg != 17 && pg != 2 && pg != 30 && !bytes.Equal(view[pg*4096:(pg+1)*4096], make([]byte, 4096)) {
			t.Fatalf("engine page %d, lent to nobody, was written", pg)
		}
	}
	rv.Finish()
	waitFor(t, "exposure released", rv.Released)
	if s := d.Stats(); s.CorruptPages != 0 || s.Core.AssignedSlots+s.Core.HeldSlots+s.Core.HandedSlots != 0 {
		t.Fatalf("corrupt %d, pages still lent %+v", s.CorruptPages, s.Core)
	}
}

// TestDirectRefusesLentPage: an engine page lent to a live exposure, or
// to an aborted one not yet drained, is refused (FailedPrecondition), and
// the refused request exposes nothing; after the release it is accepted.
func TestDirectRefusesLentPage(t *testing.T) {
	_, tweak := engineMemory(t)
	d, _ := startPair(t, tweak, nil, nil)
	first := d.NewReceiver(core.RequestKey{Room: 1, Gen: 1})
	if _, err := first.InitAt([]int{4, 5}, []core.RankID{1}); err != nil {
		t.Fatal(err)
	}
	first.Abort() // prefill never opened it: held until the rank drains or the bound
	second := d.NewReceiver(core.RequestKey{Room: 2, Gen: 1})
	if _, err := second.InitAt([]int{6, 5}, []core.RankID{1}); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("page 5 still lent: %v, want FailedPrecondition", err)
	}
	if _, err := second.InitAt([]int{40}, []core.RankID{1}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("page 40 of 32: %v, want InvalidArgument", err)
	}
	if s := d.Stats(); s.Core.AssignedSlots != 0 || s.Core.HeldSlots != 2 {
		t.Fatalf("after refusals: %+v, want only the 2 held pages", s.Core)
	}
	waitFor(t, "the aborted exposure released", first.Released)
	if _, err := second.InitAt([]int{6, 5}, []core.RankID{1}); err != nil {
		t.Fatalf("after the release: %v", err)
	}
}
