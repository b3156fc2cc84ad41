package sdktest

import (
	"bytes"
	"context"
	"fmt"

	"github.com/kvfence/kvfence/sdk"
)

// Where checkRefusalIsolated grants: a live window and a revoked one, past
// every other check's.
const isolatedOff, isolatedLen = 960 << 10, 8192

// isolatedRounds: each round posts a refused write and a good one back to
// back (in both orders), so the good one travels beside the refusal.
const isolatedRounds = 8

// checkRefusalIsolated holds a plugin declaring RefusalsIsolated to it: a
// write under a revoked key fails and nothing else does; a good write
// posted right beside it lands and succeeds. A host revokes an aborted
// request's keys at the abort on this promise, while that request's writes
// still arrive and other requests' writes share their connections.
func checkRefusalIsolated(ctx context.Context, e *Env) error {
	if !e.Info.Capabilities.RefusalsIsolated {
		return notApplicable("the transport does not declare RefusalsIsolated")
	}
	good, err := e.grant(ctx, isolatedOff, isolatedLen, 0)
	if err != nil {
		return err
	}
	bad, err := e.grant(ctx, isolatedOff+isolatedLen, isolatedLen, 0x5A)
	if err != nil {
		return err
	}
	if _, err := e.Granter.Revoke(ctx, bad); err != nil {
		return fmt.Errorf("Revoke: %w", err)
	}
	for round := range isolatedRounds {
		if err := refusedBesideGood(ctx, e, good, bad, round); err != nil {
			return fmt.Errorf("round %d: %w", round, err)
		}
	}
	return nil
}

// refusedBesideGood posts a write under bad and one under good without
// waiting between them (refused first in even rounds), then judges both.
func refusedBesideGood(ctx context.Context, e *Env, good, bad sdk.Key, round int) error {
	src := uint64(round+1) * isolatedLen // a new pattern each round
	gb := e.Write(e.NewBatchID(), good, src, 0, isolatedLen)
	bb := e.Write(e.NewBatchID(), bad, src, 0, isolatedLen)
	order := []sdk.Batch{bb, gb}
	if round%2 == 1 {
		order = []sdk.Batch{gb, bb}
	}
	for _, b := range order {
		if err := e.Sender.Post(ctx, b); err != nil {
			return fmt.Errorf("Post(%d): %w", b.ID, err)
		}
	}
	cb, err := e.Wait(bb.ID)
	if err != nil {
		return err
	}
	cg, err := e.Wait(gb.ID)
	if err != nil {
		return err
	}
	dst := e.Dst.Bytes()[isolatedOff : isolatedOff+2*isolatedLen]
	switch {
	case cb.Status == sdk.Succeeded:
		return fmt.Errorf("a write under a revoked key reported Succeeded")
	case !bytes.Equal(dst[isolatedLen:], bytes.Repeat([]byte{0x5A}, isolatedLen)):
		return fmt.Errorf("a write under a revoked key changed its window")
	case cg.Status != sdk.Succeeded:
		return fmt.Errorf("a good write posted beside a refused one ended %v (%s): the refusal was not isolated", cg.Status, cg.Detail)
	case !bytes.Equal(dst[:isolatedLen], e.Src.Bytes()[src:src+isolatedLen]):
		return fmt.Errorf("a good write posted beside a refused one succeeded without landing")
	}
	return nil
}
