package main

import (
	"context"

	"github.com/kvfence/kvfence/gpumem"
	"github.com/kvfence/kvfence/sdk"
)

// checkGPUMode applies the config's gpu_mode at start-up. "staged" (the
// default) needs nothing from the transport. "direct" (opt-in: the NIC
// writes straight into the engine's GPU pages) is refused, with the
// reason, by a transport that does not declare the dmabuf memory kind
// (Mooncake, NIXL, MORI: FailedPrecondition). Verbs and TCP declare it;
// whether the engine's buffer can be registered is then decided at decode
// open, when the plugin registers it (TCP refuses a dma-buf the CPU cannot
// map, as a real GPU's usually is, FailedPrecondition). Prefill's sources
// are staged either way: direct mode is where decode's writes land.
func checkGPUMode(mode string, tr sdk.Transport) error {
	switch mode {
	case "", "staged":
		return nil
	case "direct":
	default:
		return invalid("config: gpu_mode %q is not staged or direct", mode)
	}
	info, err := tr.Info(context.Background())
	if err != nil {
		return err
	}
	return gpumem.CheckDirect(info)
}
