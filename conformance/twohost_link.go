package conformance

import (
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// Link faults of a run with a veth data link: two hosts (--two-host), or
// the two namespaces of one (--netns). They act in the kernel on the veth
// pair between the namespaces, so they reach every
// connection the plugin opens, whatever its transport does with them — the
// in-path proxy reaches only connections made to its address. Each fault
// says whether it reached the write (qdisc drop counters, packets the
// packet filter matched, sockets the kernel aborted): a fault that touched
// nothing is NOT RUN, never a pass.
//
//   - drop:   TCP between the data addresses blackholed on both ends of the
//             veth (htb + u32 + blackhole qdiscs, no package needed);
//   - reset:  the link slowed by a tbf qdisc, then every TCP socket between
//             the data addresses aborted by the kernel (ss -K: the local end
//             fails, the peer gets an RST);
//   - reject: nftables rejects what the initiator sends to the target with
//             a TCP reset (needs the nftables package: NOT RUN without it);
//   - slow:   a tbf qdisc limits the link's rate (Succeeded must still hold);
//   - delay/loss: tc netem, where the kernel has sch_netem (NOT RUN otherwise).

// kernelFaultNames lists the kernel faults a veth link offers here, for
// the report's link description (reject only where nft is installed).
func kernelFaultNames() []string {
	names := []string{"veth tbf rate limit", "veth TCP blackhole", "kernel socket abort (ss -K)"}
	if _, err := exec.LookPath("nft"); err == nil {
		names = append(names, "nftables reject")
	}
	return names
}

// nsCmd runs a command in a network namespace and returns its output.
func nsCmd(ns string, args ...string) (string, error) {
	full := append([]string{"netns", "exec", ns}, args...)
	out, err := exec.Command("ip", full...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("ip %s: %v: %s", strings.Join(full, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

var droppedRe = regexp.MustCompile(`dropped (\d+)`)
var sentRe = regexp.MustCompile(`Sent (\d+) bytes`)

// qdiscStat reads the root qdisc's "Sent N bytes" and "dropped N" counters.
func qdiscStat(ns, dev string) (sent, dropped uint64) {
	out, err := nsCmd(ns, "tc", "-s", "qdisc", "show", "dev", dev, "root")
	if err != nil {
		return 0, 0
	}
	if m := sentRe.FindStringSubmatch(out); m != nil {
		sent, _ = strconv.ParseUint(m[1], 10, 64)
	}
	if m := droppedRe.FindStringSubmatch(out); m != nil {
		dropped, _ = strconv.ParseUint(m[1], 10, 64)
	}
	return sent, dropped
}

func (n *netnsPair) qdisc(ns, dev string, spec ...string) error {
	_, err := nsCmd(ns, append([]string{"tc", "qdisc", "replace", "dev", dev, "root"}, spec...)...)
	return err
}

func (n *netnsPair) clearQdiscs() {
	_, _ = nsCmd(n.ini, "tc", "qdisc", "del", "dev", n.iniIf, "root")
	_, _ = nsCmd(n.tgt, "tc", "qdisc", "del", "dev", n.tgtIf, "root")
}

// slowSpec is the tbf rate limit the reset and slow faults put on the
// initiator's end: 1 MiB takes about 0.4 s, long enough for a reset to
// catch the write on the link.
var slowSpec = []string{"tbf", "rate", "20mbit", "burst", "32kbit", "latency", "2s"}

// tcpBlackhole drops every TCP packet dev sends to dst and nothing else
// (ARP and other traffic pass, so the drop counter counts only what the
// plugin's connections sent): an htb root whose default class passes, and
// a class, picked by a u32 match, whose leaf is a blackhole qdisc.
func (n *netnsPair) tcpBlackhole(ns, dev, dst string) error {
	steps := [][]string{
		{"qdisc", "replace", "dev", dev, "root", "handle", "1:", "htb", "default", "20", "r2q", "100000"},
		{"class", "add", "dev", dev, "parent", "1:", "classid", "1:10", "htb", "rate", "10gbit", "quantum", "60000"},
		{"class", "add", "dev", dev, "parent", "1:", "classid", "1:20", "htb", "rate", "10gbit", "quantum", "60000"},
		{"qdisc", "add", "dev", dev, "parent", "1:10", "handle", "10:", "blackhole"},
		{"filter", "add", "dev", dev, "parent", "1:", "protocol", "ip", "prio", "1", "u32",
			"match", "ip", "dst", dst + "/32", "match", "ip", "protocol", "6", "0xff", "flowid", "1:10"},
	}
	for _, st := range steps {
		if _, err := nsCmd(ns, append([]string{"tc"}, st...)...); err != nil {
			return err
		}
	}
	return nil
}

// blackholeDrops is the drop counter of tcpBlackhole's blackhole qdisc.
func blackholeDrops(ns, dev string) uint64 {
	out, err := nsCmd(ns, "tc", "-s", "qdisc", "show", "dev", dev)
	if err != nil {
		return 0
	}
	_, rest, ok := strings.Cut(out, "qdisc blackhole 10:")
	if !ok {
		return 0
	}
	m := droppedRe.FindStringSubmatch(rest)
	if m == nil {
		return 0
	}
	d, _ := strconv.ParseUint(m[1], 10, 64)
	return d
}

// dropFault drops the TCP packets between the data addresses in both
// directions. The drop counter is read as the fault is released (deleting
// the qdisc loses it).
func (n *netnsPair) dropFault() fault {
	var dropped uint64
	var rto time.Duration
	return fault{name: "veth TCP blackhole (both ends)",
		apply: func() error {
			dropped = 0
			if err := n.tcpBlackhole(n.ini, n.iniIf, nsTgtAddr); err != nil {
				return err
			}
			return n.tcpBlackhole(n.tgt, n.tgtIf, nsIniAddr)
		},
		release: func() {
			dropped = blackholeDrops(n.ini, n.iniIf)
			rto = n.maxRTO()
			n.clearQdiscs()
		},
		settle: func() time.Duration { return rto },
		reached: func(uint64) error {
			if dropped == 0 { // still applied: read the counter live
				dropped = blackholeDrops(n.ini, n.iniIf)
			}
			if dropped == 0 {
				return errSkip("the veth blackhole dropped no TCP packet to %s during the write (the plugin sent nothing over %s)", nsTgtAddr, n.iniIf)
			}
			return nil
		},
		// Nothing crosses the blackhole: a write that completed Succeeded
		// with its bytes in place went around it.
		carried: func(sz uint64) error {
			return errSkip("a %d-byte write completed Succeeded with its bytes in place while TCP on %s was blackholed: its data did not take the faulted link", sz, n.iniIf)
		},
	}
}

// kernelFault is the kernel's version of a link fault (faults.go,
// linkFault): delay is the tbf rate limit, stall the TCP blackhole (the
// plugin's control path, its gRPC to its own host, is untouched, so
// Quiesce may be asked under it), drop the nftables reject, reset the
// kernel's socket abort while the write is on the slowed link.
func (n *netnsPair) kernelFault(kind string) (fault, func(), error) {
	switch kind {
	case "delay":
		return n.slowFault(), nil, nil
	case "stall":
		f := n.dropFault()
		f.underFault = true
		return f, nil, nil
	case "drop":
		f, err := n.rejectFault()
		return f, nil, err
	case "reset":
		f, abort := n.resetFault()
		return f, func() { time.Sleep(50 * time.Millisecond); abort() }, nil
	}
	return fault{}, nil, fmt.Errorf("no kernel fault %q", kind)
}

var rtoRe = regexp.MustCompile(`\brto:(\d+(?:\.\d+)?)`)

// maxRTO is the longest retransmission timeout of the initiator's TCP
// sockets to the target: after a blackhole, what the sockets still hold
// is sent again only when that timer fires.
func (n *netnsPair) maxRTO() time.Duration {
	out, _ := nsCmd(n.ini, "ss", "-tinH", "dst", nsTgtAddr)
	return maxRTOIn(out)
}

// maxRTOIn is the longest "rto:MS" in ss -ti output (0: none).
func maxRTOIn(out string) time.Duration {
	var worst time.Duration
	for _, m := range rtoRe.FindAllStringSubmatch(out, -1) {
		ms, err := strconv.ParseFloat(m[1], 64)
		if err == nil {
			worst = max(worst, time.Duration(ms*float64(time.Millisecond)))
		}
	}
	return worst
}

// slowFault limits the link's rate; carried checks the write crossed it
// (the counter is read as the fault is released).
func (n *netnsPair) slowFault() fault {
	var sent uint64
	return fault{name: "veth tbf " + strings.Join(slowSpec[1:], " "),
		apply: func() error {
			sent = 0
			return n.qdisc(n.ini, n.iniIf, slowSpec...)
		},
		release: func() {
			sent, _ = qdiscStat(n.ini, n.iniIf)
			n.clearQdiscs()
		},
		carried: func(sz uint64) error {
			if sent < sz {
				return errSkip("a %d-byte write completed Succeeded, but only %d bytes crossed the rate-limited %s", sz, sent, n.iniIf)
			}
			return nil
		},
	}
}

// resetFault slows the link, and abort() (called while the write is on
// it) has the kernel abort every TCP socket between the data addresses,
// on both hosts. The count of aborted sockets is the reached guard.
func (n *netnsPair) resetFault() (fault, func()) {
	f := n.slowFault()
	f.name = "veth tbf + kernel socket abort (ss -K)"
	killed := 0
	apply := f.apply
	f.apply = func() error { killed = 0; return apply() }
	abort := func() {
		killed += n.abortSockets(n.ini, nsTgtAddr) + n.abortSockets(n.tgt, nsIniAddr)
	}
	reached := func(uint64) error {
		if killed == 0 {
			return errSkip("no TCP connection between %s and %s was open to abort during the write", nsIniAddr, nsTgtAddr)
		}
		return nil
	}
	f.reached, f.carried = reached, func(uint64) error { return reached(0) }
	return f, abort
}

// abortSockets aborts the established TCP sockets of ns to peer and says
// how many there were.
func (n *netnsPair) abortSockets(ns, peer string) int {
	out, _ := nsCmd(ns, "ss", "-tnH", "state", "established", "dst", peer)
	count := len(strings.Fields(strings.TrimSpace(out))) / 4
	if count > 0 {
		_, _ = nsCmd(ns, "ss", "-K", "-tn", "state", "established", "dst", peer)
	}
	return count
}

// rejectFault has nftables answer what the initiator sends to the target's
// data address with a TCP reset. It needs nft (package nftables).
func (n *netnsPair) rejectFault() (fault, error) {
	if _, err := exec.LookPath("nft"); err != nil {
		return fault{}, errSkip("reject needs nftables (nft), which is not installed: apt-get install nftables")
	}
	const table = "kvfc_reject"
	matched := false
	return fault{name: "nftables reject with tcp reset",
		apply: func() error {
			for _, args := range [][]string{
				{"nft", "add", "table", "ip", table},
				{"nft", "add chain ip " + table + " out { type filter hook output priority 0 ; }"},
				{"nft", "add", "rule", "ip", table, "out", "ip", "daddr", nsTgtAddr, "meta", "l4proto", "tcp", "counter", "reject", "with", "tcp", "reset"},
			} {
				if _, err := nsCmd(n.ini, args...); err != nil {
					return err
				}
			}
			return nil
		},
		release: func() {
			out, _ := nsCmd(n.ini, "nft", "list", "table", "ip", table)
			m := regexp.MustCompile(`packets (\d+)`).FindStringSubmatch(out)
			matched = m != nil && m[1] != "0"
			_, _ = nsCmd(n.ini, "nft", "delete", "table", "ip", table)
		},
		reached: func(uint64) error {
			if !matched {
				return errSkip("the reject rule matched no packet of the write")
			}
			return nil
		},
		// No TCP segment reaches the target while the rule holds (its
		// handshake answers are rejected too): a write that completed
		// Succeeded with its bytes in place went around the rule. Without
		// this guard such a write passed link-lossy under a fault it never
		// met, and so did any write if the rule itself matched nothing.
		carried: func(sz uint64) error {
			return errSkip("a %d-byte write completed Succeeded with its bytes in place while nftables reset every TCP packet to %s: its data did not take the faulted path", sz, nsTgtAddr)
		},
	}, nil
}
