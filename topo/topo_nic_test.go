package topo

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvfence/kvfence/errdefs"
)

const fakeSys = "testdata/dgxh100/sys"

func TestNICsFromFakeSysfs(t *testing.T) {
	nics, err := ScanNICs(fakeSys)
	if err != nil {
		t.Fatal(err)
	}
	if len(nics) != 10 {
		t.Fatalf("%d NICs: %+v", len(nics), nics)
	}
	n0 := nics[0]
	if n0.Name != "mlx5_0" || n0.PCI != "0000:17:00.0" || n0.NUMA != 0 || len(n0.PCIPath) != 5 ||
		n0.PCIPath[0] != "pci0000:14" || len(n0.Netdevs) != 1 || n0.Netdevs[0] != "ibp17s0" || len(n0.GIDs) != 1 {
		t.Fatalf("mlx5_0: %+v", n0)
	}
	if n := nics[4]; n.Name != "mlx5_4" || n.NUMA != 1 {
		t.Fatalf("mlx5_4: %+v", n)
	}
	rxe := nics[9]
	if rxe.Name != "rxe0" || rxe.PCI != "" || rxe.NUMA != -1 || rxe.Netdevs[0] != "eth0" || !strings.Contains(rxe.GIDs[0], "ffff:a9fe:4d01") {
		t.Fatalf("rxe0: %+v", rxe)
	}
}

// NUMA comes first: a GPU whose switch NIC is gone pairs with a NIC on its
// own NUMA node even when a NIC on the other node were closer on PCI.
func TestNUMABeforePCIDistance(t *testing.T) {
	gpus := []GPU{{Index: 0, NUMA: 1, PCIPath: []string{"pci0000:00", "0000:00:01.0", "0000:01:00.0"}}}
	nics := []NIC{
		{Name: "near-other-node", NUMA: 0, PCIPath: []string{"pci0000:00", "0000:00:01.0", "0000:02:00.0"}},
		{Name: "far-same-node", NUMA: 1, PCIPath: []string{"pci0000:80", "0000:80:01.0", "0000:81:00.0"}},
		{Name: "virtual", NUMA: -1},
	}
	p := Pair(gpus, nics)
	if len(p) != 1 || p[0].NIC != "far-same-node" || !p[0].SameNUMA || p[0].Hops != 7 {
		t.Fatalf("%+v", p)
	}
	// Without NUMA information, the PCI distance decides.
	gpus[0].NUMA = -1
	if p = Pair(gpus, nics); p[0].NIC != "near-other-node" || p[0].Hops != 2 {
		t.Fatalf("%+v", p)
	}
}

func TestNoRDMASubsystem(t *testing.T) {
	nics, err := ScanNICs(t.TempDir())
	if err != nil || nics != nil {
		t.Fatalf("%v %v", nics, err)
	}
}

func TestBusIDAndHops(t *testing.T) {
	if got := NormalizeBusID("00000000:9A:00.0"); got != "0000:9a:00.0" {
		t.Fatal(got)
	}
	if Hops(nil, []string{"x"}) != -1 || Hops([]string{"pci0000:00", "a"}, []string{"pci0000:80", "b"}) != 5 {
		t.Fatal("hops")
	}
}

// A sysfs root that is not there is refused (a mistyped --sysfs read as a
// host without RDMA devices), and empty lists are [] in JSON, not null.
func TestMissingRootRefusedAndEmptyListsAreArrays(t *testing.T) {
	if _, err := ScanHost(filepath.Join(t.TempDir(), "nonexistent"), false); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("missing root: %v, want InvalidArgument", err)
	}
	r, err := ScanHost(t.TempDir(), false)
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	if got := string(b); !strings.Contains(got, `"nics":[]`) || !strings.Contains(got, `"gpus":[]`) || !strings.Contains(got, `"pairs":[]`) {
		t.Fatalf("empty report: %s", got)
	}
}
