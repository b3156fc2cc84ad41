package conformance

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
)

// netnsPair is two network namespaces made for one run, joined by a veth
// pair: the initiator runs in one, the target in the other. Nothing is
// created, addressed or changed in the host's own namespace, and the only
// addresses used are 10.213.213.0/30, inside these namespaces only: a
// private range, not link-local, because UCX ignores IPv4 link-local
// addresses (169.254.0.0/16) and NIXL could not connect over them.
// tc netem on the initiator's veth end shapes the data path.
type netnsPair struct {
	ini, tgt     string // namespace names
	iniIf, tgtIf string
	cleanup      []string
	shaper       *shaper // netem on the initiator's veth end
}

const (
	nsIniAddr = "10.213.213.1"
	nsTgtAddr = "10.213.213.2"
)

func newNetnsPair() (*netnsPair, error) {
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("--netns needs root (ip netns add)")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return nil, fmt.Errorf("--netns needs iproute2 (ip, tc): apt-get install iproute2")
	}
	id := os.Getpid() % 100000
	n := &netnsPair{ini: fmt.Sprintf("kvfc-i-%d", id), tgt: fmt.Sprintf("kvfc-t-%d", id),
		iniIf: fmt.Sprintf("kvfi%d", id), tgtIf: fmt.Sprintf("kvft%d", id)}
	steps := [][]string{
		{"netns", "add", n.ini},
		{"netns", "add", n.tgt},
		{"-n", n.ini, "link", "add", n.iniIf, "type", "veth", "peer", "name", n.tgtIf, "netns", n.tgt},
		{"-n", n.ini, "addr", "add", nsIniAddr + "/30", "dev", n.iniIf},
		{"-n", n.tgt, "addr", "add", nsTgtAddr + "/30", "dev", n.tgtIf},
		{"-n", n.ini, "link", "set", "lo", "up"},
		{"-n", n.tgt, "link", "set", "lo", "up"},
		{"-n", n.ini, "link", "set", n.iniIf, "up"},
		{"-n", n.tgt, "link", "set", n.tgtIf, "up"},
	}
	for i, st := range steps {
		if out, err := exec.Command("ip", st...).CombinedOutput(); err != nil {
			n.close()
			return nil, fmt.Errorf("ip %s: %v: %s", strings.Join(st, " "), err, out)
		}
		if i < 2 {
			n.cleanup = append(n.cleanup, st[2])
		}
	}
	n.shaper = newShaper([]string{"ip", "netns", "exec", n.ini}, n.iniIf)
	return n, nil
}

func (n *netnsPair) nsFor(role string) string {
	if role == "target" {
		return n.tgt
	}
	return n.ini
}

func (n *netnsPair) addrFor(role string) string {
	if role == "target" {
		return nsTgtAddr
	}
	return nsIniAddr
}

func (n *netnsPair) describe() string {
	return fmt.Sprintf("veth %s (%s, netns %s) <-> %s (%s, netns %s)", n.iniIf, nsIniAddr, n.ini, n.tgtIf, nsTgtAddr, n.tgt)
}

// close deletes the namespaces (which destroys the veth pair).
func (n *netnsPair) close() {
	for _, ns := range n.cleanup {
		_ = exec.Command("ip", "netns", "del", ns).Run()
	}
	n.cleanup = nil
}
