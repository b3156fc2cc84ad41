//go:build !kvfenceunsafe

package main

import "github.com/kvfence/kvfence/plugins/tcp"

// applyBuildVariant: a normal build cannot select a known-unsafe variant.
func applyBuildVariant(cfg tcp.Config) tcp.Config { return cfg }
