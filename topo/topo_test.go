//go:build cgo

package topo

import (
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

// DGX H100 GPU bus ids (NVML spells the domain with 8 digits).
var h100Bus = []string{"18", "2a", "3a", "5d", "9a", "ab", "ba", "db"}

// dgx is go-nvml's own DGX H100 mock, with the PCI bus ids of a real DGX
// H100 (the mock leaves PciInfo.BusId empty).
func dgx(t *testing.T) *server.Server {
	s := dgxh100.New()
	if len(s.Devices) != 8 {
		t.Fatalf("mock has %d GPUs", len(s.Devices))
	}
	for i, d := range s.Devices {
		md := d.(*server.Device)
		id := "00000000:" + strings.ToUpper(h100Bus[i]) + ":00.0"
		md.PciBusID = id
		md.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) {
			var p nvml.PciInfo
			for j, c := range id {
				p.BusId[j] = int8(c)
			}
			return p, nvml.SUCCESS
		}
	}
	return s
}

// On go-nvml's DGX H100 mock, every GPU pairs with the NIC behind its own
// PCIe switch (same NUMA node, 4 PCI hops via the switch), never with the storage NIC or the
// software device.
func TestDGXH100Pairing(t *testing.T) {
	r, err := Scan(dgx(t), fakeSys)
	if err != nil {
		t.Fatal(err)
	}
	if r.GPUNote != "" || len(r.GPUs) != 8 {
		t.Fatalf("GPUs: %q %+v", r.GPUNote, r.GPUs)
	}
	for i, g := range r.GPUs {
		if g.PCI != "0000:"+h100Bus[i]+":00.0" || g.NUMA != i/4 || len(g.PCIPath) != 5 || !strings.Contains(g.Name, "H100") {
			t.Fatalf("gpu %d: %+v", i, g)
		}
	}
	if len(r.Pairs) != 8 {
		t.Fatalf("pairs: %+v", r.Pairs)
	}
	for i, p := range r.Pairs {
		if p.GPU != i || p.NIC != "mlx5_"+string(rune('0'+i)) || !p.SameNUMA || p.Hops != 4 {
			t.Fatalf("pair %d: %+v", i, p)
		}
	}
	out := r.Format()
	for _, want := range []string{"gpu0  NVIDIA H100", "gpu7  -> mlx5_7", "rxe0", "(no PCI device)"} {
		if !strings.Contains(out, want) {
			t.Fatalf("output lacks %q:\n%s", want, out)
		}
	}
}

// Without a GPU driver the report says so and still lists the NICs.
func TestNoDriverStillListsNICs(t *testing.T) {
	lib := &mock.Interface{
		InitFunc:        func() nvml.Return { return nvml.ERROR_LIBRARY_NOT_FOUND },
		ErrorStringFunc: func(r nvml.Return) string { return "NVML Shared Library Not Found" },
	}
	r, err := Scan(lib, fakeSys)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.GPUs) != 0 || !strings.Contains(r.GPUNote, "Not Found") || len(r.NICs) != 10 || len(r.Pairs) != 0 {
		t.Fatalf("%+v", r)
	}
	if out := r.Format(); !strings.Contains(out, "GPUs: none (NVML unavailable") || !strings.Contains(out, "mlx5_8") {
		t.Fatal(out)
	}
}
