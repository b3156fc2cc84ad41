// Command kvfence-plugin-mori is the MORI-IO transport
// as a kvfence plugin binary. It loads kvfence's MORI shim at run time
// (KVFENCE_MORI_SHIM, else the library path); without it, or with a
// library it cannot drive, it prints one classified line naming the
// variable and exits before the handshake. Settings: see package mori.
//
// It owns only wiring (environment, library, sdk.Serve).
package main

import (
	"fmt"
	"os"

	"github.com/kvfence/kvfence/plugins/internal/dl"
	"github.com/kvfence/kvfence/plugins/mori"
	"github.com/kvfence/kvfence/sdk"
)

func main() {
	log := sdk.NewPluginLogger("kvfence-plugin-mori")
	cfg, err := mori.ConfigFromEnv(os.Getenv)
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
	be, err := mori.Load(cfg, os.Getenv)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	t, err := mori.New(cfg, be, log)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	sdk.Serve(t, sdk.ServeOptions{Logger: log})
}
