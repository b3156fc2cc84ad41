// Command kvfence-plugin-nixl is the NIXL transport (UCX backend)
// as a kvfence plugin binary. It loads libnixl_capi.so at run time
// (KVFENCE_NIXL_LIB, else the library path); without it, or with a
// library it cannot drive, it prints one classified line naming the
// variable and exits before the handshake. Settings: see package nixl.
//
// It owns only wiring (environment, library, sdk.Serve).
package main

import (
	"fmt"
	"os"

	"github.com/kvfence/kvfence/plugins/internal/dl"
	"github.com/kvfence/kvfence/plugins/nixl"
	"github.com/kvfence/kvfence/sdk"
)

func main() {
	log := sdk.NewPluginLogger("kvfence-plugin-nixl")
	cfg, err := nixl.ConfigFromEnv(os.Getenv)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	// Vendor C libraries print on stdout (UCX logs there by default), which
	// is the handshake's channel: send their writes to stderr.
	if err := dl.ProtectStdout(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	be, err := nixl.Load(cfg, os.Getenv, log)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	t, err := nixl.New(cfg, be, log)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	sdk.Serve(t, sdk.ServeOptions{Logger: log})
}
