// Command kvfence-plugin-mooncake is the Mooncake Transfer Engine transport
// as a kvfence plugin binary. It loads libtransfer_engine.so at run time
// (KVFENCE_MOONCAKE_LIB, else the library path); without it, or with a
// library it cannot drive, it prints one classified line naming the
// variable and exits before the handshake. Settings: see package mooncake.
//
// It owns nothing but its name: the wiring is package skeleton's.
package main

import (
	"github.com/kvfence/kvfence/plugins/kit/skeleton"
	"github.com/kvfence/kvfence/plugins/mooncake"
)

func main() {
	skeleton.Main(skeleton.Plugin[mooncake.Config]{Name: "kvfence-plugin-mooncake", Config: mooncake.ConfigFromEnv, Load: mooncake.Load, New: mooncake.New})
}
