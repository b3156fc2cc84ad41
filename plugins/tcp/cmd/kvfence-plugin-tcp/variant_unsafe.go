//go:build kvfenceunsafe

package main

import (
	"os"

	"github.com/kvfence/kvfence/plugins/tcp"
)

// applyBuildVariant: a binary built with -tags kvfenceunsafe (tests only)
// may select a known-unsafe variant with KVFENCE_TCP_UNSAFE, so tests can
// prove the contract tests catch it out of process too.
func applyBuildVariant(cfg tcp.Config) tcp.Config {
	return tcp.WithUnsafeVariant(cfg, os.Getenv("KVFENCE_TCP_UNSAFE"))
}
