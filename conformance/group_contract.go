package conformance

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/kvfence/kvfence/sdk/sdktest"
)

// contractGroup runs the sdk's own contract checks (sdk/sdktest) on a fresh
// pair of processes: the suite builds on them rather than restating them.
func contractGroup() group {
	g := group{name: "sdk-contract", needs: needsGranter}
	for _, c := range sdktest.Checks() {
		g.checks = append(g.checks, check{c.Name, PromiseContract, func(ctx context.Context, s *suite, r *Result) error {
			if c.NeedsRevoke {
				if err := notRevoking(s); err != nil {
					return err
				}
			}
			e, err := s.contractEnv(ctx)
			if err != nil {
				return err
			}
			err = c.Run(ctx, e)
			if errors.Is(err, sdktest.ErrNotApplicable) {
				return errNotApplicable("%s", strings.TrimPrefix(err.Error(), sdktest.ErrNotApplicable.Error()+": "))
			}
			return err
		}})
	}
	return g
}

// contractPair is the fresh pair the sdktest checks run on (sdktest.Env
// reads the initiator's completion stream itself, so it cannot share ours).
type contractPair struct {
	ini, tgt *proc
	env      *sdktest.Env
	err      error
}

func (s *suite) contractEnv(ctx context.Context) (*sdktest.Env, error) {
	if s.contract != nil {
		return s.contract.env, s.contract.err
	}
	cp := &contractPair{}
	s.contract = cp
	// sdktest reads the receiver's memory in its own process, so on two
	// hosts this pair's target runs here, in the target's namespace.
	if cp.tgt, cp.err = s.openLocal(ctx, "target", s.cfg.TargetEnv); cp.err != nil {
		return nil, cp.err
	}
	if cp.ini, cp.err = s.open(ctx, "initiator", s.cfg.InitiatorEnv); cp.err != nil {
		return nil, cp.err
	}
	if cp.env, cp.err = sdktest.NewEnv(ctx, sdktest.Pair{Sender: cp.ini.t, Receiver: cp.tgt.t}); cp.err != nil {
		cp.err = fmt.Errorf("sdktest env: %w", cp.err)
	}
	return cp.env, cp.err
}

func (cp *contractPair) close() {
	if cp == nil {
		return
	}
	if cp.env != nil {
		cp.env.Close()
	}
	cp.ini.close()
	cp.tgt.close()
}
