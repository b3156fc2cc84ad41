package agent

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/kvfence/kvfence/core"
	"github.com/kvfence/kvfence/errdefs"
)

// TestDecodeRefusesTailAboveMaximum is finding 1 of issue 15 at the agent: a
// prefill Hello declaring MaxTail = MaxInt64 (or 2^62 ns) was accepted and
// broke the timeout bound. It is refused now, with the reason, and the
// decode rank keeps serving honest ranks.
func TestDecodeRefusesTailAboveMaximum(t *testing.T) {
	d := startDecode(t)
	ctx := context.Background()
	for _, tail := range []time.Duration{math.MaxInt64, 1 << 62, core.DefaultMaxDeclaredTail + 1} {
		_, _, err := dial(ctx, d.Addr(), nil, identity{RoleDecode, 0}, peerHello{Role: RolePrefill, Rank: 1, ShardBytes: 4096, Version: ControlVersion,
			Caps: peerCaps{Quiesce: true, MaxTail: int64(tail)}})
		if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "maximum") {
			t.Fatalf("tail %v: want a refusal naming the maximum, got %v", tail, err)
		}
	}
	l, _, err := dial(ctx, d.Addr(), nil, identity{RoleDecode, 0}, peerHello{Role: RolePrefill, Rank: 1, ShardBytes: 4096, Version: ControlVersion,
		Caps: peerCaps{Quiesce: true, MaxTail: int64(core.DefaultMaxDeclaredTail)}})
	if err != nil {
		t.Fatalf("a tail at the maximum was refused: %v", err)
	}
	l.close()
}
