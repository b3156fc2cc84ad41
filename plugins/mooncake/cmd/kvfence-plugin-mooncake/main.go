// Command kvfence-plugin-mooncake is the Mooncake Transfer Engine transport
// as a kvfence plugin binary. It loads libtransfer_engine.so at run time
// (KVFENCE_MOONCAKE_LIB, else the library path); without it, or with a
// library it cannot drive, it prints one classified line naming the
// variable and exits before the handshake. Settings: see package mooncake.
//
// It owns only wiring (environment, library, sdk.Serve).
package main

import (
	"fmt"
	"os"

	"github.com/kvfence/kvfence/plugins/internal/dl"
	"github.com/kvfence/kvfence/plugins/mooncake"
	"github.com/kvfence/kvfence/sdk"
)

func main() {
	log := sdk.NewPluginLogger("kvfence-plugin-mooncake")
	cfg, err := mooncake.ConfigFromEnv(os.Getenv)
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
	be, err := mooncake.Load(cfg, os.Getenv)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	t, err := mooncake.New(cfg, be, log)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	sdk.Serve(t, sdk.ServeOptions{Logger: log})
}
