package conformance

import (
	"context"
	"fmt"

	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/sdk"
)

func handshakeGroup() group {
	return group{name: "handshake", checks: []check{
		{"protocol-version", PromiseHandshake, checkProtocolVersion},
		{"info-declares-limits", PromiseCapabilities, checkInfoLimits},
		{"revoke-claim-matches-granter", PromiseCapabilities, checkRevokeClaim},
		{"read-claim-matches-behaviour", PromiseCapabilities, checkReadClaim},
		{"max-batch-is-accepted", PromiseCapabilities, checkMaxBatch},
	}}
}

func checkProtocolVersion(_ context.Context, s *suite, _ *Result) error {
	if s.neg != sdk.ProtocolVersion {
		return fmt.Errorf("negotiated protocol version %d, this suite speaks %d", s.neg, sdk.ProtocolVersion)
	}
	if s.info.ProtocolVersion != s.neg {
		return fmt.Errorf("Info says protocol version %d, but %d was negotiated", s.info.ProtocolVersion, s.neg)
	}
	return nil
}

func checkInfoLimits(_ context.Context, s *suite, _ *Result) error {
	i, c := s.info, s.info.Capabilities
	switch {
	case i.Name == "" || i.Version == "":
		return fmt.Errorf("Info: empty name or version (%q, %q)", i.Name, i.Version)
	case c.MaxTail <= 0:
		return fmt.Errorf("MaxTail %v: every transport has a tail; the core's timeout release depends on it", c.MaxTail)
	case c.MaxBatch <= 0:
		return fmt.Errorf("MaxBatch %d", c.MaxBatch)
	case c.MaxOpBytes == 0:
		return fmt.Errorf("MaxOpBytes 0")
	}
	for _, k := range c.MemoryKinds {
		if k == sdk.MemoryHostShared {
			return nil
		}
	}
	return fmt.Errorf("memory kinds %v lack host-shared, which this suite needs to watch target memory", c.MemoryKinds)
}

// checkRevokeClaim: the Revoke capability is verified by behaviour. Claimed:
// a write under a revoked key fails at the initiator and lands nowhere (the
// revocation check, attributed to the claim). Not claimed: no Granter.
func checkRevokeClaim(ctx context.Context, s *suite, r *Result) error {
	if !s.info.Capabilities.Revoke {
		if !s.granter {
			r.Notes = append(r.Notes, "Revoke not declared and no Granter offered")
			return nil
		}
		// Grant without Revoke (profile grant-only): Revoke must say it
		// cannot, never pretend.
		se := s.main
		k, err := se.grant(ctx, 0, 4096, 0x5A)
		if err != nil {
			return err
		}
		_, err = se.tgt.g.Revoke(ctx, k)
		switch {
		case err == nil:
			return fmt.Errorf("Revoke not declared, yet Revoke returned success")
		case !errdefs.Is(err, errdefs.Unimplemented):
			return fmt.Errorf("Revoke not declared: Revoke must refuse as unimplemented, got %v (%s)", err, errdefs.ClassOf(err))
		}
		r.Notes = append(r.Notes, "Revoke not declared; Grant offered and Revoke refuses: "+err.Error())
		return nil
	}
	if !s.granter {
		return fmt.Errorf("Revoke declared, but the plugin offers no Granter")
	}
	return checkRevokeThenWrite(ctx, s, r)
}

// checkReadLands: with Read declared, a read of a granted window brings its
// bytes into local memory, exactly, by the time it reports Succeeded.
func checkReadLands(ctx context.Context, se *session) error {
	const off, n, srcOff = 128 << 10, 64<<10 + 7, 2<<20 + 3
	k, err := se.grant(ctx, off, n, 0)
	if err != nil {
		return err
	}
	defer se.tgt.g.Revoke(ctx, k)
	se.dst.pattern(off, n, 0x5D)
	local := se.src.Bytes()[srcOff : srcOff+n]
	saved := append([]byte(nil), local...) // other checks rely on the source pattern
	defer copy(local, saved)
	b := sdk.Batch{ID: se.id(), Peer: se.peer, Ops: []sdk.Op{{Kind: sdk.OpRead, LocalRegion: se.srcID, LocalOffset: srcOff,
		RemoteKey: k, Length: n}}}
	c, err := se.postWait(ctx, b)
	if err != nil || c.Status != sdk.Succeeded {
		return healthy("read of a granted window", c, err)
	}
	if err := mismatch(local, se.dstAt(off, off+n)); err != nil {
		return broke(PromiseSucceeded, fmt.Errorf("read reported Succeeded, but local memory does not hold the remote bytes: %w", err))
	}
	return nil
}

// checkReadClaim: with the Read capability, a read lands; without it, a
// read must be refused as unimplemented, not accepted.
func checkReadClaim(ctx context.Context, s *suite, r *Result) error {
	if s.main == nil {
		return errSkip("no session (Revoke not declared)")
	}
	se := s.main
	if s.info.Capabilities.Read {
		return checkReadLands(ctx, se)
	}
	b := se.write(sdk.Key(1), 0, 0, 64)
	b.Ops[0].Kind = sdk.OpRead
	err := se.ini.t.Post(ctx, b)
	if err == nil {
		_, _ = se.wait(b.ID, s.cfg.CompletionTimeout)
		return fmt.Errorf("Read not declared, but a read batch was accepted")
	}
	if errdefs.ClassOf(err) != errdefs.Unimplemented {
		r.Promise = PromiseErrorClass
		return fmt.Errorf("read without the Read capability refused with class %v (%v), want unimplemented", errdefs.ClassOf(err), err)
	}
	return nil
}

// checkMaxBatch: a batch of MaxBatch operations (at most 1024 here) is
// accepted and lands.
func checkMaxBatch(ctx context.Context, s *suite, _ *Result) error {
	if s.main == nil {
		return errSkip("no session (Revoke not declared)")
	}
	se := s.main
	n := min(s.info.Capabilities.MaxBatch, 1024)
	const each = 16
	k, err := se.grant(ctx, 8192, uint64(n*each), 0xE1)
	if err != nil {
		return err
	}
	defer se.tgt.g.Revoke(ctx, k)
	b := se.split(k, 100, 0, uint64(n*each), each)
	c, err := se.postWait(ctx, b)
	if err != nil {
		return fmt.Errorf("batch of %d ops (MaxBatch %d): %w", n, s.info.Capabilities.MaxBatch, err)
	}
	if c.Status != sdk.Succeeded {
		return fmt.Errorf("batch of %d ops on a healthy link: %v (%s)", n, c.Status, c.Detail)
	}
	return broke(PromiseSucceeded, mismatch(se.dstAt(8192, uint64(8192+n*each)), se.src.Bytes()[100:100+n*each]))
}
