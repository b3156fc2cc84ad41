package topo

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/kvfence/kvfence/errdefs"
)

// NIC is one RDMA device as sysfs describes it.
type NIC struct {
	Name    string   `json:"name"`
	PCI     string   `json:"pci,omitempty"`      // bus id, e.g. 0000:17:00.0 ("" for software devices such as rxe)
	PCIPath []string `json:"pci_path,omitempty"` // root complex first, the device last
	NUMA    int      `json:"numa"`               // -1: unknown
	Netdevs []string `json:"netdevs,omitempty"`
	GIDs    []string `json:"gids,omitempty"` // non-zero GIDs of every port, "port/index gid"
}

// GPU is one GPU as NVML (and sysfs, for its PCI path) describes it.
type GPU struct {
	Index   int      `json:"index"`
	Name    string   `json:"name"`
	UUID    string   `json:"uuid,omitempty"`
	PCI     string   `json:"pci"`
	PCIPath []string `json:"pci_path,omitempty"`
	NUMA    int      `json:"numa"`
}

// Pairing is a GPU's nearest NIC and why.
type Pairing struct {
	GPU      int    `json:"gpu"`
	NIC      string `json:"nic"`
	SameNUMA bool   `json:"same_numa"`
	Hops     int    `json:"pci_hops"` // -1: no PCI path known for one of them
}

// Report is everything `kvfence topo` prints.
type Report struct {
	NICs    []NIC     `json:"nics"`
	GPUs    []GPU     `json:"gpus"`
	Pairs   []Pairing `json:"pairs"`
	GPUNote string    `json:"gpu_note,omitempty"` // why there are no GPUs
}

// ScanNICs lists the RDMA devices under root/class/infiniband (root is
// normally /sys). No RDMA subsystem means no NICs, not an error.
func ScanNICs(root string) ([]NIC, error) {
	dir := filepath.Join(root, "class", "infiniband")
	ents, err := os.ReadDir(dir)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []NIC
	for _, e := range ents {
		d := filepath.Join(dir, e.Name())
		n := NIC{Name: e.Name(), NUMA: -1}
		if dev, err := filepath.EvalSymlinks(filepath.Join(d, "device")); err == nil {
			n.PCIPath = pciPath(root, dev)
			if len(n.PCIPath) > 0 {
				n.PCI = n.PCIPath[len(n.PCIPath)-1]
			}
			n.NUMA = readInt(filepath.Join(dev, "numa_node"), -1)
			if nets, err := os.ReadDir(filepath.Join(dev, "net")); err == nil {
				for _, x := range nets {
					n.Netdevs = appendUnique(n.Netdevs, x.Name())
				}
			}
		}
		if p := readString(filepath.Join(d, "parent")); p != "" { // rxe, siw
			n.Netdevs = appendUnique(n.Netdevs, p)
		}
		ports, _ := os.ReadDir(filepath.Join(d, "ports"))
		for _, p := range ports {
			gids, _ := os.ReadDir(filepath.Join(d, "ports", p.Name(), "gids"))
			sort.Slice(gids, func(i, j int) bool { return atoi(gids[i].Name()) < atoi(gids[j].Name()) })
			for _, g := range gids {
				v := readString(filepath.Join(d, "ports", p.Name(), "gids", g.Name()))
				if v == "" || strings.Trim(v, "0:") == "" {
					continue
				}
				n.GIDs = append(n.GIDs, p.Name()+"/"+g.Name()+" "+v)
				if nd := readString(filepath.Join(d, "ports", p.Name(), "gid_attrs", "ndevs", g.Name())); nd != "" {
					n.Netdevs = appendUnique(n.Netdevs, nd)
				}
			}
		}
		out = append(out, n)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// pciPath turns a resolved sysfs device path (root/devices/pci0000:15/
// 0000:15:01.0/0000:17:00.0) into its PCI chain: [pci0000:15 0000:15:01.0
// 0000:17:00.0]. Devices outside the PCI tree have no path.
func pciPath(root, dev string) []string {
	rel, err := filepath.Rel(filepath.Join(root, "devices"), dev)
	if err != nil || strings.HasPrefix(rel, "..") {
		return nil
	}
	parts := strings.Split(rel, string(filepath.Separator))
	if len(parts) == 0 || !strings.HasPrefix(parts[0], "pci") {
		return nil
	}
	out := []string{parts[0]}
	for _, p := range parts[1:] {
		if !isBusID(p) {
			break
		}
		out = append(out, p)
	}
	return out
}

func isBusID(s string) bool { // dddd:bb:dd.f
	return len(s) == 12 && s[4] == ':' && s[7] == ':' && s[10] == '.'
}

// NormalizeBusID turns NVML's 00000000:18:00.0 into sysfs's 0000:18:00.0.
func NormalizeBusID(s string) string {
	s = strings.ToLower(strings.TrimSpace(s))
	dom, rest, ok := strings.Cut(s, ":")
	if !ok {
		return s
	}
	if len(dom) > 4 {
		dom = dom[len(dom)-4:]
	}
	for len(dom) < 4 {
		dom = "0" + dom
	}
	return dom + ":" + rest
}

// PCIPathOf resolves root/bus/pci/devices/<busID> into its PCI chain.
func PCIPathOf(root, busID string) []string {
	dev, err := filepath.EvalSymlinks(filepath.Join(root, "bus", "pci", "devices", busID))
	if err != nil {
		return nil
	}
	return pciPath(root, dev)
}

// NUMAOf reads root/bus/pci/devices/<busID>/numa_node (-1 if unknown).
func NUMAOf(root, busID string) int {
	return readInt(filepath.Join(root, "bus", "pci", "devices", busID, "numa_node"), -1)
}

// Hops is the PCI distance between two devices: steps up from each to the
// closest common bridge. -1 when a path is unknown; different root
// complexes count the whole of both paths plus one (the host bridge hop).
func Hops(a, b []string) int {
	if len(a) == 0 || len(b) == 0 {
		return -1
	}
	common := 0
	for common < len(a) && common < len(b) && a[common] == b[common] {
		common++
	}
	if common == 0 {
		return len(a) + len(b) + 1
	}
	return len(a) + len(b) - 2*common
}

// Pair gives each GPU its nearest NIC: same NUMA node first, then fewest
// PCI hops (unknown paths last), then name. NICs without PCI (software
// devices) are paired only when nothing else exists.
func Pair(gpus []GPU, nics []NIC) []Pairing {
	var out []Pairing
	for _, g := range gpus {
		best := -1
		var bp Pairing
		for i, n := range nics {
			p := Pairing{GPU: g.Index, NIC: n.Name, SameNUMA: g.NUMA >= 0 && g.NUMA == n.NUMA, Hops: Hops(g.PCIPath, n.PCIPath)}
			if best < 0 || better(p, bp) {
				best, bp = i, p
			}
		}
		if best >= 0 {
			out = append(out, bp)
		}
	}
	return out
}

func better(a, b Pairing) bool {
	if a.SameNUMA != b.SameNUMA {
		return a.SameNUMA
	}
	ha, hb := a.Hops, b.Hops
	if ha < 0 {
		ha = 1 << 30
	}
	if hb < 0 {
		hb = 1 << 30
	}
	if ha != hb {
		return ha < hb
	}
	return a.NIC < b.NIC
}

// scan lists NICs, asks gpus for GPUs, and pairs them.
// A root that is not a directory is refused: a mistyped --sysfs would
// otherwise read as a host with no RDMA devices. The lists are never nil,
// so JSON shows none as [] rather than null.
func scan(root string, gpus func(root string) ([]GPU, string)) (Report, error) {
	if st, err := os.Stat(root); err != nil || !st.IsDir() {
		return Report{}, errdefs.Errorf(errdefs.InvalidArgument, "sysfs root %s is not a directory", root)
	}
	nics, err := ScanNICs(root)
	if err != nil {
		return Report{}, err
	}
	r := Report{NICs: nics}
	r.GPUs, r.GPUNote = gpus(root)
	r.Pairs = Pair(r.GPUs, r.NICs)
	if r.NICs == nil {
		r.NICs = []NIC{}
	}
	if r.GPUs == nil {
		r.GPUs = []GPU{}
	}
	if r.Pairs == nil {
		r.Pairs = []Pairing{}
	}
	return r, nil
}

// Format renders a report for people.
func (r Report) Format() string {
	var b strings.Builder
	fmt.Fprintf(&b, "RDMA devices: %d\n", len(r.NICs))
	for _, n := range r.NICs {
		pci := n.PCI
		if pci == "" {
			pci = "(no PCI device)"
		}
		fmt.Fprintf(&b, "  %-10s pci=%s numa=%d netdevs=%s\n", n.Name, pci, n.NUMA, strings.Join(n.Netdevs, ","))
		if len(n.PCIPath) > 0 {
			fmt.Fprintf(&b, "             path=%s\n", strings.Join(n.PCIPath, " > "))
		}
		for _, g := range n.GIDs {
			fmt.Fprintf(&b, "             gid %s\n", g)
		}
	}
	if r.GPUNote != "" {
		fmt.Fprintf(&b, "GPUs: none (%s)\n", r.GPUNote)
	} else {
		fmt.Fprintf(&b, "GPUs: %d\n", len(r.GPUs))
		for _, g := range r.GPUs {
			fmt.Fprintf(&b, "  gpu%-2d %s pci=%s numa=%d\n", g.Index, g.Name, g.PCI, g.NUMA)
		}
	}
	if len(r.Pairs) > 0 {
		fmt.Fprintf(&b, "Pairs (nearest NIC per GPU: NUMA first, then PCI hops):\n")
		for _, p := range r.Pairs {
			fmt.Fprintf(&b, "  gpu%-2d -> %-10s same_numa=%v pci_hops=%d\n", p.GPU, p.NIC, p.SameNUMA, p.Hops)
		}
	} else if len(r.GPUs) > 0 {
		fmt.Fprintf(&b, "Pairs: none (no RDMA device)\n")
	}
	return b.String()
}

func readString(p string) string {
	b, err := os.ReadFile(p)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

func readInt(p string, def int) int {
	n, err := strconv.Atoi(readString(p))
	if err != nil {
		return def
	}
	return n
}

func atoi(s string) int { n, _ := strconv.Atoi(s); return n }

func appendUnique(xs []string, x string) []string {
	for _, y := range xs {
		if y == x {
			return xs
		}
	}
	return append(xs, x)
}
