//go:build cgo

package topo

import (
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// ScanGPUs lists GPUs through lib (nvml.New() on a real host, a mock in
// tests). A missing driver or library is not an error: note says why there
// are no GPUs. PCI paths and (when NVML has none) NUMA nodes come from sysfs
// under root.
func ScanGPUs(lib nvml.Interface, root string) (gpus []GPU, note string) {
	if ret := lib.Init(); ret != nvml.SUCCESS {
		return nil, fmt.Sprintf("NVML unavailable: %s", lib.ErrorString(ret))
	}
	defer lib.Shutdown()
	n, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Sprintf("NVML device count: %s", lib.ErrorString(ret))
	}
	if n == 0 {
		return nil, "NVML reports no GPU"
	}
	for i := 0; i < n; i++ {
		d, ret := lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			continue
		}
		g := GPU{Index: i, NUMA: -1}
		g.Name, _ = d.GetName()
		g.UUID, _ = d.GetUUID()
		if pi, ret := d.GetPciInfo(); ret == nvml.SUCCESS {
			id := cstr(pi.BusId[:])
			if id == "" {
				id = cstr(pi.BusIdLegacy[:])
			}
			g.PCI = NormalizeBusID(id)
		}
		if g.PCI != "" {
			g.PCIPath = PCIPathOf(root, g.PCI)
			g.NUMA = NUMAOf(root, g.PCI)
		}
		if g.NUMA < 0 {
			if node, ret := d.GetNumaNodeId(); ret == nvml.SUCCESS {
				g.NUMA = node
			}
		}
		gpus = append(gpus, g)
	}
	return gpus, ""
}

func cstr(b []int8) string {
	out := make([]byte, 0, len(b))
	for _, c := range b {
		if c == 0 {
			break
		}
		out = append(out, byte(c))
	}
	return string(out)
}

// Scan builds the whole report with GPUs from lib (nil: no NVML).
func Scan(lib nvml.Interface, root string) (Report, error) {
	if lib == nil {
		return scan(root, func(string) ([]GPU, string) { return nil, "no NVML library" })
	}
	return scan(root, func(root string) ([]GPU, string) { return ScanGPUs(lib, root) })
}

// ScanHost builds the report for this host: NVML from the driver's
// libnvidia-ml.so (dlopened; its absence is reported, not an error).
func ScanHost(root string, gpus bool) (Report, error) {
	if !gpus {
		return scan(root, func(string) ([]GPU, string) { return nil, "GPU discovery disabled" })
	}
	return Scan(nvml.New(), root)
}
