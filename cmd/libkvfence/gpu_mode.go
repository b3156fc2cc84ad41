package main

import (
	"context"

	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/gpumem"
	"github.com/kvfence/kvfence/sdk"
)

// checkGPUMode applies the config's gpu_mode at start-up. "staged" (the
// default) needs nothing from the transport. "direct" (opt-in: the NIC
// writes straight into the engine's GPU pages) is refused, with the
// reason, by a transport that does not declare the dmabuf memory kind
// (Mooncake, NIXL, MORI: FailedPrecondition), and otherwise (verbs, and
// TCP for CPU-mappable dma-bufs) as Unimplemented: the Go agent can run
// it (agent.DecodeConfig.Engine, KVReceiver.InitAt), but this library
// does not yet export the engine's buffers or take its page indices
// (docs/gpu-direct.md), so no request may run in a mode it cannot keep.
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
	if err := gpumem.CheckDirect(info); err != nil {
		return err
	}
	return errdefs.Errorf(errdefs.Unimplemented,
		"direct mode: transport %q can register dma-bufs, but this library does not yet export the engine's buffers or take its page indices (docs/gpu-direct.md); use gpu_mode staged", info.Name)
}
