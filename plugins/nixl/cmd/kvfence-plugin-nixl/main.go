// Command kvfence-plugin-nixl is the NIXL transport (UCX backend)
// as a kvfence plugin binary. It loads libnixl_capi.so at run time
// (KVFENCE_NIXL_LIB, else the library path); without it, or with a
// library it cannot drive, it prints one classified line naming the
// variable and exits before the handshake. Settings: see package nixl.
//
// It owns nothing but its name: the wiring is package skeleton's.
package main

import (
	"github.com/kvfence/kvfence/plugins/kit/skeleton"
	"github.com/kvfence/kvfence/plugins/nixl"
)

func main() {
	skeleton.Main(skeleton.Plugin[nixl.Config]{Name: "kvfence-plugin-nixl", Config: nixl.ConfigFromEnv, Load: nixl.Load, New: nixl.New})
}
