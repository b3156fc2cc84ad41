package knownunsafe

import (
	"fmt"
	"strings"
	"sync/atomic"
)

// The agents (the runtime an engine embeds) run a known-unsafe core only in
// a binary built with -tags kvfenceunsafe (Compiled, gate_*.go): in a
// default build ForAgents refuses every unsafe name and AgentVariant is the
// safe core whatever was asked. The in-process simulation (package
// core/sim, kvfence sim) is not an agent: it moves no real memory and
// keeps every variant in every build.

var agentVariant atomic.Pointer[Variant]

// compiledOutHint is the reason ForAgents gives in a default build.
const compiledOutHint = "known-unsafe core variants are compiled out of this build; " +
	"build with -tags kvfenceunsafe (for example: go run -tags kvfenceunsafe ./cmd/kvfence demo --unsafe release-on-abort)"

// ForAgents parses a variant name for an agent: "" and "safe" are the real
// core; an unsafe name is accepted only when Compiled.
func ForAgents(name string) (Variant, error) {
	v, ok := Parse(name)
	if !ok {
		return Safe, fmt.Errorf("unknown core variant %q (known: %s)", name, strings.Join(Names(), ", "))
	}
	if !v.IsSafe() && !Compiled {
		return Safe, fmt.Errorf("--unsafe %s refused: %s", name, compiledOutHint)
	}
	return v, nil
}

// SelectForAgents makes every agent this process starts from now on run
// variant name (ForAgents decides whether it may).
func SelectForAgents(name string) error {
	v, err := ForAgents(name)
	if err != nil {
		return err
	}
	agentVariant.Store(&v)
	return nil
}

// AgentVariant is the core variant an agent runs: always Safe in a default
// build.
func AgentVariant() Variant {
	if !Compiled {
		return Safe
	}
	if v := agentVariant.Load(); v != nil {
		return *v
	}
	return Safe
}

// Names lists the unsafe variants' names, in All's order.
func Names() []string {
	n := make([]string, len(All))
	for i, v := range All {
		n[i] = v.name
	}
	return n
}
