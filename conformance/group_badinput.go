package conformance

import (
	"context"
	"fmt"

	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/sdk"
)

func badInputGroup() group {
	return group{name: "bad-inputs", needs: needsGranter, checks: []check{
		{"exact-error-classes", PromiseErrorClass, checkBadInputs},
		{"alive-afterwards", PromiseErrorClass, checkAliveAfter},
	}}
}

type badCase struct {
	name string
	want errdefs.Class
	call func() error
}

// checkBadInputs: every refusal carries its exact class (callers branch on
// classes: "not found" and "internal" lead to different decisions).
func checkBadInputs(ctx context.Context, s *suite, r *Result) error {
	se := s.main
	k, err := se.grant(ctx, 4096, 8192, 0)
	if err != nil {
		return err
	}
	defer se.tgt.g.Revoke(ctx, k)
	dup := se.write(k, 0, 0, 16)
	if c, err := se.postWait(ctx, dup); err != nil || c.Status != sdk.Succeeded {
		return healthy("a good write", c, err)
	}
	post := func(mut func(*sdk.Batch)) func() error {
		return func() error {
			b := se.write(k, 0, 0, 16)
			mut(&b)
			return se.ini.t.Post(ctx, b)
		}
	}
	caps := s.info.Capabilities
	cases := []badCase{
		{"zero-length op", errdefs.InvalidArgument, post(func(b *sdk.Batch) { b.Ops[0].Length = 0 })},
		{"empty batch", errdefs.InvalidArgument, post(func(b *sdk.Batch) { b.Ops = nil })},
		{"duplicate batch id", errdefs.AlreadyExists, post(func(b *sdk.Batch) { b.ID = dup.ID })},
		{"more ops than MaxBatch", errdefs.InvalidArgument, post(func(b *sdk.Batch) {
			for len(b.Ops) <= caps.MaxBatch {
				b.Ops = append(b.Ops, b.Ops[0])
			}
		})},
		{"op longer than MaxOpBytes", errdefs.InvalidArgument, post(func(b *sdk.Batch) { b.Ops[0].Length = caps.MaxOpBytes + 1 })},
		{"unknown op kind", errdefs.InvalidArgument, post(func(b *sdk.Batch) { b.Ops[0].Kind = 99 })},
		{"unregistered local region", errdefs.NotFound, post(func(b *sdk.Batch) { b.Ops[0].LocalRegion = se.srcID + 1000 })},
		{"local range out of bounds", errdefs.InvalidArgument, post(func(b *sdk.Batch) { b.Ops[0].LocalOffset = se.size - 1 })},
		{"local offset overflows", errdefs.InvalidArgument, post(func(b *sdk.Batch) { b.Ops[0].LocalOffset = ^uint64(0) - 4 })},
		{"unknown peer", errdefs.NotFound, post(func(b *sdk.Batch) { b.Peer = "no-such-peer" })},
		{"grant on unregistered memory", errdefs.NotFound, func() error {
			_, err := se.tgt.g.Grant(ctx, sdk.Window{Region: se.dstID + 1000, Length: 1})
			return err
		}},
		{"revoke unknown key", revokeRefusalClass(s), func() error {
			_, err := se.tgt.g.Revoke(ctx, sdk.Key(0x0bad0bad0bad0bad))
			return err
		}},
		{"deregister unknown region", errdefs.NotFound, func() error { return se.ini.t.DeregisterMemory(ctx, se.srcID+1000) }},
		{"register memory that does not exist", errdefs.NotFound, func() error {
			_, err := se.ini.t.RegisterMemory(ctx, sdk.MemoryDesc{Kind: sdk.MemoryHostShared, Path: "/nonexistent/kvfence-conformance", Size: 4096})
			return err
		}},
		{"connect to a malformed endpoint", errdefs.InvalidArgument, func() error {
			_, err := se.ini.t.Connect(ctx, sdk.Endpoint{Transport: s.info.Name, Address: "::not an address::"})
			return err
		}},
		{"disconnect unknown peer", errdefs.NotFound, func() error { return se.ini.t.Disconnect(ctx, "no-such-peer") }},
	}
	if !hasKind(caps.MemoryKinds, sdk.MemoryDMABuf) {
		cases = append(cases, badCase{"register a memory kind not declared", errdefs.Unimplemented, func() error {
			_, err := se.ini.t.RegisterMemory(ctx, sdk.MemoryDesc{Kind: sdk.MemoryDMABuf, Path: se.src.Desc().Path, Size: 4096})
			return err
		}})
	}
	for _, c := range cases {
		err := c.call()
		if e := wantClass(c.name, err, c.want); e != nil {
			return e
		}
	}
	r.Notes = append(r.Notes, fmt.Sprintf("%d bad inputs refused with their exact class", len(cases)))
	return nil
}

func hasKind(ks []sdk.MemoryKind, k sdk.MemoryKind) bool {
	for _, x := range ks {
		if x == k {
			return true
		}
	}
	return false
}

// checkAliveAfter: both processes still answer, and a write still lands.
func checkAliveAfter(ctx context.Context, s *suite, _ *Result) error {
	se := s.main
	for _, p := range []*proc{se.ini, se.tgt} {
		if err := p.alive(ctx); err != nil {
			return err
		}
	}
	k, err := se.grant(ctx, 4096, 4096, 0x44)
	if err != nil {
		return err
	}
	defer se.tgt.g.Revoke(ctx, k)
	c, err := se.postWait(ctx, se.write(k, 17, 0, 4096))
	if err != nil {
		return fmt.Errorf("write after the bad inputs: %w", err)
	}
	return broke(PromiseSucceeded, verifyWrite(se, c, 4096, 17, 4096, 0x44))
}

// revokeRefusalClass: Revoke of an unknown key is not found where the plugin
// claims Revoke, unimplemented where it declares it cannot revoke.
func revokeRefusalClass(s *suite) errdefs.Class {
	if s.info.Capabilities.Revoke {
		return errdefs.NotFound
	}
	return errdefs.Unimplemented
}
