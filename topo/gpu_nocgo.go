//go:build !cgo

package topo

// ScanHost without cgo: go-nvml needs cgo (it dlopens libnvidia-ml), so a
// CGO_ENABLED=0 build lists NICs only and says why.
func ScanHost(root string, gpus bool) (Report, error) {
	return scan(root, func(string) ([]GPU, string) {
		return nil, "built without cgo: NVML (GPU discovery) unavailable"
	})
}
