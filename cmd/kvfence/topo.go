package main

import (
	"encoding/json"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/topo"
)

func init() { register(newTopoCommand) }

// newTopoCommand: `kvfence topo` lists RDMA devices (sysfs) and GPUs (NVML)
// and pairs each GPU with its nearest NIC. Read-only; needs no GPU.
func newTopoCommand() *cobra.Command {
	var sysfs string
	var asJSON, noGPU bool
	c := &cobra.Command{
		Use:   "topo",
		Short: "List RDMA NICs and GPUs and pair each GPU with its nearest NIC (NUMA, then PCI path)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runTopo(cmd.OutOrStdout(), sysfs, asJSON, noGPU)
		},
	}
	c.Flags().StringVar(&sysfs, "sysfs", "/sys", "sysfs root to read (a fake tree in tests)")
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	c.Flags().BoolVar(&noGPU, "no-gpu", false, "skip NVML (GPU discovery)")
	return c
}

// runTopo is kvfence topo: scan the host and print what it found.
func runTopo(w io.Writer, sysfs string, asJSON, noGPU bool) error {
	r, err := topo.ScanHost(sysfs, !noGPU)
	if errdefs.IsInvalidArgument(err) {
		return usagef("--sysfs: %v", err) // a mistyped root is the command line's fault
	}
	if err != nil {
		return err
	}
	if noGPU {
		r.GPUNote = "GPU discovery disabled (--no-gpu)"
	}
	if asJSON {
		b, err := json.MarshalIndent(r, "", "  ")
		if err != nil {
			return err
		}
		fmt.Fprintln(w, string(b))
		return nil
	}
	fmt.Fprint(w, r.Format())
	return nil
}
