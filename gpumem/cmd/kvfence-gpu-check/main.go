// Command kvfence-gpu-check is the GPU half of `make gpu-check`.
//
//	kvfence-gpu-check probe      exit 0 when a CUDA driver and device are usable;
//	                             otherwise print one line saying what is skipped
//	                             and why, and exit 10 (the make target exits 0)
//	kvfence-gpu-check bandwidth  device↔host bandwidth of the staged mode as a
//	                             ratio of cuMemcpy of the same bytes, same run,
//	                             arms interleaved (goal ≥ 0.9)
//	kvfence-gpu-check direct PLUGIN
//	                             direct mode (direct.go) through PLUGIN, a verbs
//	                             plugin built with -tags rdma, on the RDMA NIC
//	                             nearest GPU 0; one skip line (exit 10) where
//	                             this host has no NIC, no dma-buf export or no
//	                             dma-buf registration
//
// The driver is $KVFENCE_CUDA_LIB, else libcuda.so.1. Usage errors exit 2.
package main

import (
	"flag"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/gpumem"
)

const exitSkipped = 10

func main() {
	fs := flag.NewFlagSet("kvfence-gpu-check", flag.ContinueOnError)
	size := fs.Int64("bytes", 256<<20, "bytes per copy (bandwidth)")
	page := fs.Int64("page", 64<<10, "bytes per KV page (bandwidth)")
	rounds := fs.Int("rounds", 7, "interleaved rounds per arm (bandwidth)")
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: kvfence-gpu-check probe|bandwidth [flags] | direct PLUGIN")
		os.Exit(2)
	}
	if os.Args[1] == "direct" {
		if len(os.Args) != 3 {
			fmt.Fprintln(os.Stderr, "usage: kvfence-gpu-check direct PLUGIN")
			os.Exit(2)
		}
		os.Exit(direct(os.Args[2]))
	}
	if err := fs.Parse(os.Args[2:]); err != nil || *size <= 0 || *page <= 0 || *size%*page != 0 || *rounds < 1 {
		fmt.Fprintln(os.Stderr, "kvfence-gpu-check: --bytes must be a positive multiple of --page, --rounds ≥ 1")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "probe":
		os.Exit(probe())
	case "bandwidth":
		if err := bandwidth(*size, *page, *rounds); err != nil {
			fmt.Fprintln(os.Stderr, "kvfence-gpu-check:", err)
			os.Exit(1)
		}
	default:
		fmt.Fprintf(os.Stderr, "kvfence-gpu-check: unknown command %q (probe, bandwidth, direct)\n", os.Args[1])
		os.Exit(2)
	}
}

func probe() int {
	d, err := gpumem.Open(gpumem.Options{})
	if errdefs.IsFailedPrecondition(err) {
		fmt.Printf("gpu-check: skipped staged-mode page integrity, copy bandwidth and direct mode on a real GPU: %v\n", err)
		return exitSkipped
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "gpu-check:", err)
		return 1
	}
	defer d.Close()
	fmt.Printf("gpu-check: CUDA driver %s usable\n", d.Library())
	return 0
}

// bandwidth times cuMemcpy and the staged gather/scatter of the same bytes
// between one device buffer and one (pageable) host buffer, arms interleaved.
func bandwidth(size, page int64, rounds int) error {
	d, err := gpumem.Open(gpumem.Options{})
	if err != nil {
		return err
	}
	defer d.Close()
	dev, err := d.Alloc(size)
	if err != nil {
		return err
	}
	defer d.Free(dev)
	host := make([]byte, size)
	for i := range host {
		host[i] = byte(i * 7)
	}
	var pieces []gpumem.Piece
	for off := int64(0); off < size; off += page {
		pieces = append(pieces, gpumem.Piece{Device: dev + uintptr(off), Host: host[off : off+page]})
	}
	arms := []struct {
		name string
		run  func() error
	}{
		{"cuMemcpyHtoD", func() error { return d.CopyToDevice(dev, host) }},
		{"staged scatter", func() error { return wait(d.Scatter(pieces)) }},
		{"cuMemcpyDtoH", func() error { return d.CopyFromDevice(host, dev) }},
		{"staged gather", func() error { return wait(d.Gather(pieces)) }},
	}
	times := make([][]time.Duration, len(arms))
	for r := 0; r < rounds+1; r++ { // round 0 warms up
		for i, a := range arms {
			t0 := time.Now()
			if err := a.run(); err != nil {
				return fmt.Errorf("%s: %w", a.name, err)
			}
			if r > 0 {
				times[i] = append(times[i], time.Since(t0))
			}
		}
	}
	med := func(ts []time.Duration) time.Duration { slices.Sort(ts); return ts[len(ts)/2] }
	for i := 0; i < len(arms); i += 2 {
		base, staged := med(times[i]), med(times[i+1])
		gbps := func(t time.Duration) float64 { return float64(size) / t.Seconds() / 1e9 }
		fmt.Printf("gpu-check bandwidth: %s %.2f GB/s, %s %.2f GB/s, ratio %.2f (goal ≥ 0.9; %d MiB, %d KiB pages, median of %d)\n",
			arms[i].name, gbps(base), arms[i+1].name, gbps(staged), float64(base)/float64(staged), size>>20, page>>10, rounds)
	}
	return nil
}

func wait(op *gpumem.Op, err error) error {
	if err != nil {
		return err
	}
	return op.Wait()
}
