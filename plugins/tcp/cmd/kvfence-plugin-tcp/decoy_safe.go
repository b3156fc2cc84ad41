//go:build !kvfenceunsafe

package main

import (
	"github.com/kvfence/kvfence/plugins/tcp"
	"github.com/kvfence/kvfence/sdk"
)

// wrapVariant: a normal build serves the transport as it is.
func wrapVariant(t *tcp.Transport) sdk.Transport { return t }
