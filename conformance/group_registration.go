package conformance

import (
	"bufio"
	"context"
	"fmt"
	"math"
	"os"
	"strings"

	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/sdk"
)

func registrationGroup() group {
	return group{name: "memory-registration", needs: needsGranter, checks: []check{
		{"bounds", PromiseRegistration, checkRegBounds},
		{"overlap", PromiseRegistration, checkRegOverlap},
		{"deregister-with-live-keys", PromiseDeregister, checkDeregLive},
		{"repeat-and-release", PromiseCleanup, checkRegRepeat},
	}}
}

func wantClass(what string, err error, want errdefs.Class) error {
	if err == nil {
		return fmt.Errorf("%s: accepted, want %v", what, want)
	}
	if got := errdefs.ClassOf(err); got != want {
		return fmt.Errorf("%s: class %v (%v), want %v", what, got, err, want)
	}
	return nil
}

func checkRegBounds(ctx context.Context, s *suite, r *Result) error {
	se := s.main
	d := se.dst.Desc()
	cases := []struct {
		what string
		desc sdk.MemoryDesc
	}{
		{"region past the end of the memory", sdk.MemoryDesc{Kind: d.Kind, Path: d.Path, Offset: 4096, Size: d.Size}},
		{"zero-size region", sdk.MemoryDesc{Kind: d.Kind, Path: d.Path, Size: 0}},
		{"offset+size overflows", sdk.MemoryDesc{Kind: d.Kind, Path: d.Path, Offset: math.MaxUint64 - 10, Size: 4096}},
	}
	for _, c := range cases {
		id, err := se.tgt.t.RegisterMemory(ctx, c.desc)
		if err == nil {
			_ = se.tgt.t.DeregisterMemory(ctx, id)
		}
		if e := wantClass("RegisterMemory "+c.what, err, errdefs.InvalidArgument); e != nil {
			r.Promise = PromiseErrorClass
			return e
		}
	}
	grants := []struct {
		what string
		w    sdk.Window
	}{
		{"window past the region", sdk.Window{Region: se.dstID, Offset: se.size - 10, Length: 11}},
		{"window offset+length overflows", sdk.Window{Region: se.dstID, Offset: math.MaxUint64 - 10, Length: 100}},
		{"zero-length window", sdk.Window{Region: se.dstID, Offset: 0, Length: 0}},
	}
	for _, g := range grants {
		k, err := se.tgt.g.Grant(ctx, g.w)
		if err == nil {
			_, _ = se.tgt.g.Revoke(ctx, k)
		}
		if e := wantClass("Grant "+g.what, err, errdefs.InvalidArgument); e != nil {
			r.Promise = PromiseErrorClass
			return e
		}
	}
	// The last byte of the region is grantable and writable.
	k, err := se.grant(ctx, se.size-1, 1, 0x77)
	if err != nil {
		return err
	}
	defer se.tgt.g.Revoke(ctx, k)
	c, err := se.postWait(ctx, se.write(k, 5, 0, 1))
	if err != nil || c.Status != sdk.Succeeded {
		return healthy("write to the last byte of the region", c, err)
	}
	if got := se.dstAt(se.size-1, se.size-1+1)[0]; got != se.src.Bytes()[5] {
		return broke(PromiseSucceeded, fmt.Errorf("last byte is %#x after Succeeded, want %#x", got, se.src.Bytes()[5]))
	}
	return nil
}

// checkRegOverlap: two regions over the same memory and overlapping
// windows are legal; writes through either land where they say.
func checkRegOverlap(ctx context.Context, s *suite, _ *Result) error {
	se := s.main
	d := se.dst.Desc()
	const base, n = 1 << 20, 64 << 10
	d.Offset, d.Size = base, 2*n
	second, err := se.tgt.t.RegisterMemory(ctx, d)
	if err != nil {
		return fmt.Errorf("registering a second region over registered memory: %w", err)
	}
	defer se.tgt.t.DeregisterMemory(ctx, second)
	se.fillDst(base-4096, base+2*n+4096, 0x11)
	kA, err := se.tgt.g.Grant(ctx, sdk.Window{Region: se.dstID, Offset: base, Length: n})
	if err != nil {
		return err
	}
	defer se.tgt.g.Revoke(ctx, kA)
	kB, err := se.tgt.g.Grant(ctx, sdk.Window{Region: second, Offset: n / 2, Length: n}) // overlaps A's second half
	if err != nil {
		return err
	}
	defer se.tgt.g.Revoke(ctx, kB)
	for _, w := range []struct {
		k      sdk.Key
		srcOff uint64
	}{{kA, 1000}, {kB, 5000}} {
		c, err := se.postWait(ctx, se.write(w.k, w.srcOff, 0, n))
		if err != nil || c.Status != sdk.Succeeded {
			return healthy("write through overlapping window", c, err)
		}
	}
	mem, src := se.dstAt(0, se.size), se.src.Bytes()
	if err := mismatch(mem[base:base+n/2], src[1000:1000+n/2]); err != nil {
		return broke(PromiseSucceeded, fmt.Errorf("first window's own half: %w", err))
	}
	if err := mismatch(mem[base+n/2:base+n/2+n], src[5000:5000+n]); err != nil {
		return broke(PromiseSucceeded, fmt.Errorf("second region's window (written last): %w", err))
	}
	if err := untouched(mem[base+n/2+n:base+2*n+4096], 0x11); err != nil {
		return fmt.Errorf("past both windows: %w", err)
	}
	return nil
}

// checkDeregLive: deregistering target memory with a live key revokes it:
// a write under the key afterwards is not Succeeded and lands nowhere.
func checkDeregLive(ctx context.Context, s *suite, _ *Result) error {
	se := s.main
	d := se.dst.Desc()
	const base, n = 2 << 20, 16 << 10
	d.Offset, d.Size = base, n
	id, err := se.tgt.t.RegisterMemory(ctx, d)
	if err != nil {
		return err
	}
	se.fillDst(base, base+n, 0x22)
	k, err := se.tgt.g.Grant(ctx, sdk.Window{Region: id, Length: n})
	if err != nil {
		return err
	}
	if c, err := se.postWait(ctx, se.write(k, 0, 0, n)); err != nil || c.Status != sdk.Succeeded {
		return healthy("write before deregistration", c, err)
	}
	if !s.info.Capabilities.Revoke {
		// A plugin that cannot revoke must not pretend that deregistration
		// stops writers: it refuses while keys are live.
		if err := se.tgt.t.DeregisterMemory(ctx, id); !errdefs.Is(err, errdefs.FailedPrecondition) {
			return fmt.Errorf("DeregisterMemory with a live key on a plugin that cannot revoke: want failed-precondition, got %v", err)
		}
		return nil
	}
	if err := se.tgt.t.DeregisterMemory(ctx, id); err != nil {
		return fmt.Errorf("DeregisterMemory with a live key: %w (it must revoke the key, not refuse)", err)
	}
	se.fillDst(base, base+n, 0x23)
	b := se.write(k, 4096, 0, n)
	if err := se.ini.t.Post(ctx, b); err == nil {
		c, err := se.wait(b.ID, s.cfg.CompletionTimeout)
		if err != nil {
			return err
		}
		if c.Status == sdk.Succeeded {
			return fmt.Errorf("write under a key of deregistered memory reported Succeeded")
		}
	}
	if ch := se.dst.watch(base, n).until(s.guard / 4); ch != nil {
		return fmt.Errorf("deregistered memory changed: %v", ch)
	}
	return untouched(se.dstAt(base, base+n), 0x23)
}

// checkRegRepeat: register, grant, write, revoke, deregister N times; the
// same operations give the same answers every time, repeated releases are
// classified, and the plugins hold no more mappings of our memory after.
func checkRegRepeat(ctx context.Context, s *suite, r *Result) error {
	if err := notRevoking(s); err != nil {
		return err
	}
	se := s.main
	before := [2]int{se.ini.memfdMaps(), se.tgt.memfdMaps()}
	for i := 0; i < s.cfg.Repeat; i++ {
		sd, dd := se.src.Desc(), se.dst.Desc()
		sd.Offset, sd.Size = uint64(i)*4096, 8192
		dd.Offset, dd.Size = 3<<20+uint64(i)*4096, 8192
		sid, err := se.ini.t.RegisterMemory(ctx, sd)
		if err != nil {
			return fmt.Errorf("cycle %d: RegisterMemory: %w", i, err)
		}
		did, err := se.tgt.t.RegisterMemory(ctx, dd)
		if err != nil {
			return fmt.Errorf("cycle %d: RegisterMemory: %w", i, err)
		}
		k, err := se.tgt.g.Grant(ctx, sdk.Window{Region: did, Length: 8192})
		if err != nil {
			return fmt.Errorf("cycle %d: Grant: %w", i, err)
		}
		b := sdk.Batch{ID: se.id(), Peer: se.peer, Ops: []sdk.Op{{Kind: sdk.OpWrite, LocalRegion: sid, RemoteKey: k, Length: 8192}}}
		c, err := se.postWait(ctx, b)
		if err != nil || c.Status != sdk.Succeeded {
			return healthy(fmt.Sprintf("cycle %d: write", i), c, err)
		}
		if err := mismatch(se.dstAt(dd.Offset, dd.Offset+8192), se.src.Bytes()[sd.Offset:sd.Offset+8192]); err != nil {
			return broke(PromiseSucceeded, fmt.Errorf("cycle %d: Succeeded but %w", i, err))
		}
		for j := 0; j < 2; j++ {
			if _, err := se.tgt.g.Revoke(ctx, k); err != nil {
				return fmt.Errorf("cycle %d: Revoke #%d: %w (a second Revoke is a no-op)", i, j+1, err)
			}
		}
		if err := se.tgt.t.DeregisterMemory(ctx, did); err != nil {
			return fmt.Errorf("cycle %d: DeregisterMemory(target): %w", i, err)
		}
		if err := se.ini.t.DeregisterMemory(ctx, sid); err != nil {
			return fmt.Errorf("cycle %d: DeregisterMemory(initiator): %w", i, err)
		}
		if err := wantClass("second DeregisterMemory", se.ini.t.DeregisterMemory(ctx, sid), errdefs.NotFound); err != nil {
			r.Promise = PromiseErrorClass
			return fmt.Errorf("cycle %d: %w", i, err)
		}
	}
	after := [2]int{se.ini.memfdMaps(), se.tgt.memfdMaps()}
	r.Notes = append(r.Notes, fmt.Sprintf("%d cycles; mappings of suite memory (initiator, target): before %v, after %v", s.cfg.Repeat, before, after))
	if before[0] >= 0 && (after[0] > before[0] || after[1] > before[1]) {
		return fmt.Errorf("after %d register/deregister cycles the plugins map more of our memory than before: %v -> %v (a leak)", s.cfg.Repeat, before, after)
	}
	return nil
}

// memfdMaps counts a process's mappings of the suite's shared memory
// (-1 if /proc is unreadable).
func memfdMaps(pid int) int {
	f, err := os.Open(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		return -1
	}
	defer f.Close()
	n := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if strings.Contains(sc.Text(), "kvfence-conformance-") {
			n++
		}
	}
	return n
}
