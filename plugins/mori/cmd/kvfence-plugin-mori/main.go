// Command kvfence-plugin-mori is the MORI-IO transport
// as a kvfence plugin binary. It loads kvfence's MORI shim at run time
// (KVFENCE_MORI_SHIM, else the library path); without it, or with a
// library it cannot drive, it prints one classified line naming the
// variable and exits before the handshake. Settings: see package mori.
//
// It owns nothing but its name: the wiring is package skeleton's.
package main

import (
	"github.com/kvfence/kvfence/plugins/kit/skeleton"
	"github.com/kvfence/kvfence/plugins/mori"
)

func main() {
	skeleton.Main(skeleton.Plugin[mori.Config]{Name: "kvfence-plugin-mori", Config: mori.ConfigFromEnv, Load: mori.Load, New: mori.New})
}
