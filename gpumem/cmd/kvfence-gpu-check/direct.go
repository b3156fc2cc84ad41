package main

// This file: `kvfence-gpu-check direct PLUGIN` — direct mode against a real
// GPU and a real RDMA NIC: the GPU's buffer exported as a dma-buf, handed
// to a verbs plugin process over SCM_RIGHTS, registered there with
// ibv_reg_dmabuf_mr, and RDMA WRITEs from a second plugin process landing
// in the engine pages they address, and nowhere else. Whatever this host
// lacks (NIC, dma-buf export, dma-buf registration) is one skip line.

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strings"

	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/gpumem"
	"github.com/kvfence/kvfence/sdk"
	"github.com/kvfence/kvfence/sdk/sdktest"
	"github.com/kvfence/kvfence/topo"
)

const (
	directPages = 32
	directPage  = 64 << 10
)

func skipDirect(why string, args ...any) int {
	fmt.Printf("gpu-check: direct mode skipped: "+why+"\n", args...)
	return exitSkipped
}

// nearestNIC is the RDMA device topo (NVML and sysfs) pairs with the GPU
// whose PCI bus id is busID — same NUMA node first, then the shortest PCI
// path; NVML's index and CUDA's ordinal need not agree, the bus id does —
// else the first device found.
func nearestNIC(busID string) (string, string, error) {
	rep, err := topo.ScanHost("/", true)
	if err != nil {
		return "", "", err
	}
	if len(rep.NICs) == 0 {
		return "", "", nil
	}
	for _, g := range rep.GPUs {
		if topo.NormalizeBusID(g.PCI) != topo.NormalizeBusID(busID) {
			continue
		}
		for _, p := range rep.Pairs {
			if p.GPU == g.Index {
				return p.NIC, fmt.Sprintf("nearest GPU %s: same NUMA %v, %d PCI hops", busID, p.SameNUMA, p.Hops), nil
			}
		}
	}
	return rep.NICs[0].Name, fmt.Sprintf("GPU %s not paired by topo (%s): first device", busID, rep.GPUNote), nil
}

func direct(plugin string) int {
	d, err := gpumem.Open(gpumem.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "gpu-check:", err)
		return 1
	}
	defer d.Close()
	nic, why, err := nearestNIC(d.DeviceID())
	if err != nil {
		fmt.Fprintln(os.Stderr, "gpu-check: topology:", err)
		return 1
	}
	if nic == "" {
		return skipDirect("no RDMA device on this host (/sys/class/infiniband)")
	}
	if _, err := os.Stat(plugin); err != nil {
		return skipDirect("no verbs plugin built with -tags rdma (%v; needs libibverbs-dev)", err)
	}
	if d.Counter("fakecuda_async_copies") >= 0 {
		return skipDirect("%s is the fake CUDA driver, whose dma-buf is a memfd no NIC registers (the fake-driver tests cover direct mode's host side)", d.Library())
	}
	base, err := d.Alloc(directPages * directPage)
	if err != nil {
		fmt.Fprintln(os.Stderr, "gpu-check:", err)
		return 1
	}
	defer d.Free(base)
	x, err := d.ExportBuffer(gpumem.Buffer{Base: base, PageBytes: directPage}, directPages)
	if errdefs.IsFailedPrecondition(err) {
		return skipDirect("%v", err)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "gpu-check:", err)
		return 1
	}
	defer x.Close()
	fmt.Printf("gpu-check: direct mode on %s (%s)\n", nic, why)
	if err := directWrite(d, x, base, plugin, nic); err != nil {
		if strings.Contains(err.Error(), "not supported") {
			return skipDirect("%s cannot register a dma-buf: %v", nic, err)
		}
		fmt.Fprintln(os.Stderr, "gpu-check: direct mode:", err)
		return 1
	}
	return 0
}

// directWrite registers x with a receiving plugin process and writes three
// engine pages (5, 6 and 20) from a sending one; every page is then
// checked on the GPU: the written ones hold the bytes, the others the fill.
func directWrite(d *gpumem.Device, x *gpumem.DirectBuffer, base uintptr, plugin, nic string) error {
	fillB := bytes.Repeat([]byte{0xEE}, directPages*directPage)
	if err := d.CopyToDevice(base, fillB); err != nil {
		return err
	}
	env := []string{"KVFENCE_VERBS_DEVICE=" + nic}
	var pls []*sdk.Plugin
	defer func() {
		for _, p := range pls {
			_ = p.Close()
		}
	}()
	for range 2 {
		p, err := sdk.Open(plugin, sdk.OpenOptions{Env: env})
		if err != nil {
			return err
		}
		pls = append(pls, p)
	}
	ctx := context.Background()
	e, err := sdktest.NewEnv(ctx, sdktest.Pair{Sender: pls[0].Transport(), Receiver: pls[1].Transport()})
	if err != nil {
		return err
	}
	defer e.Close()
	ids, err := gpumem.RegisterDirect(ctx, pls[1].Transport(), []*gpumem.DirectBuffer{x})
	if err != nil {
		return err
	}
	written := map[int]byte{5: 0x51, 6: 0x61, 20: 0x71}
	for p, v := range written {
		if err := writePage(ctx, e, ids[0], x, p, v); err != nil {
			return fmt.Errorf("engine page %d: %w", p, err)
		}
	}
	got := make([]byte, directPages*directPage)
	if err := d.CopyFromDevice(got, base); err != nil {
		return err
	}
	for p := range directPages {
		want := byte(0xEE)
		if v, ok := written[p]; ok {
			want = v
		}
		if !bytes.Equal(got[p*directPage:(p+1)*directPage], bytes.Repeat([]byte{want}, directPage)) {
			return fmt.Errorf("GPU page %d does not hold %#x only", p, want)
		}
	}
	fmt.Printf("gpu-check: direct mode: %d RDMA WRITEs of %d bytes landed in the GPU pages they address (by engine page index) and nowhere else\n", len(written), directPage)
	return nil
}

// writePage grants a key on engine page p only and writes v over it.
func writePage(ctx context.Context, e *sdktest.Env, region sdk.RegionID, x *gpumem.DirectBuffer, p int, v byte) error {
	off, err := x.PageOffset(p)
	if err != nil {
		return err
	}
	k, err := e.Granter.Grant(ctx, sdk.Window{Region: region, Offset: off, Length: directPage})
	if err != nil {
		return err
	}
	copy(e.Src.Bytes(), bytes.Repeat([]byte{v}, directPage))
	id := e.NewBatchID()
	if err := e.Pair.Sender.Post(ctx, e.Write(id, k, 0, 0, directPage)); err != nil {
		return err
	}
	c, err := e.Wait(id)
	if err != nil {
		return err
	}
	if c.Status != sdk.Succeeded {
		return fmt.Errorf("write: %v %s", c.Status, c.Detail)
	}
	return nil
}
