package conformance

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/kvfence/kvfence/sdk"
)

// TwoHostConfig is a two-host certification (`kvfence conformance
// --two-host`): the initiator plugin runs on the certifying host, the
// target plugin on a second host under `kvfence conformance target`, which
// owns the destination memory and reports what it observes over the
// authenticated control channel; the certifying host drives kernel faults
// on the data link between them. Here the hosts are two network namespaces
// joined by a veth pair (the data link) and the control channel runs on a
// second veth pair from the certifying process's namespace to the target's
// (a management network, as two real hosts would have).
type TwoHostConfig struct {
	Plugin string
	Env    []string
	// TargetCommand runs `kvfence conformance target` (the kvfence binary
	// and "conformance", "target"); the run appends its flags.
	TargetCommand     []string
	GuardFloor        time.Duration
	CompletionTimeout time.Duration
	Log               io.Writer
}

// TwoHostReport is what a two-host run found. Certified only when every
// check ran and passed: a skipped check is never a pass.
type TwoHostReport struct {
	Plugin      string         `json:"plugin"`
	SHA256      string         `json:"sha256"`
	Initiator   HostInfo       `json:"initiator_host"`
	Target      HostInfo       `json:"target_host"`
	Link        string         `json:"data_link"`
	Control     string         `json:"control_channel"`
	GuardWindow string         `json:"guard_window"`
	Checks      []TwoHostCheck `json:"checks"`
	Passed      bool           `json:"passed"`    // no check failed
	Certified   bool           `json:"certified"` // passed and no check skipped
	Error       string         `json:"error,omitempty"`
}

// TwoHostCheck is one check's outcome: pass, fail or skip (NOT RUN).
type TwoHostCheck struct {
	Name    string   `json:"name"`
	Promise string   `json:"promise"`
	Status  string   `json:"status"`
	Reason  string   `json:"reason,omitempty"`
	Notes   []string `json:"notes,omitempty"`
}

// twoHost is one run's state.
type twoHost struct {
	*hostPair
	cfg   TwoHostConfig
	se    *iniSide
	key   sdk.Key
	guard time.Duration
	rep   *TwoHostReport
}

// hostPair is the two hosts of a run: the namespaces and their data link,
// the management link, the target host's process and the authenticated
// control channel to it. The link-fault checks (CertifyTwoHost) and the
// full suite on two hosts (Config.TwoHost) both stand on it.
type hostPair struct {
	net     *netnsPair
	mgmt    string // the management veth's host end (deleted at the end)
	cc      *ctlConn
	target  *exec.Cmd
	control string // how the report names the control channel
	hello   ctlReply
}

// hostsConfig is what starting the target host needs.
type hostsConfig struct {
	plugin        string
	sha256        string
	env           []string
	targetCommand []string
	log           io.Writer
}

const (
	twoHostWin = 1 << 20
	twoHostOff = 64 << 10
)

// mgmtAddrs is the management link's /30 for this run, inside 10.214.0.0/16
// and picked by pid: its host end lives in the certifying process's own
// namespace, so two runs (or one a killed run left behind) must not share it.
func mgmtAddrs() (host, tgt string) {
	base := uint32(os.Getpid()%16384) * 4
	a := func(i uint32) string { return fmt.Sprintf("10.214.%d.%d", (base+i)>>8, (base+i)&0xff) }
	return a(1), a(2)
}

// CertifyTwoHost runs the two-host checks. It needs root (namespaces).
func CertifyTwoHost(ctx context.Context, cfg TwoHostConfig) *TwoHostReport {
	if cfg.CompletionTimeout <= 0 {
		cfg.CompletionTimeout = 30 * time.Second
	}
	if cfg.GuardFloor <= 0 {
		cfg.GuardFloor = DefaultGuardFloor
	}
	if cfg.Log == nil {
		cfg.Log = io.Discard
	}
	th := &twoHost{cfg: cfg, rep: &TwoHostReport{Plugin: cfg.Plugin}}
	defer th.close()
	if err := th.setup(ctx); err != nil {
		th.rep.Error = err.Error()
		return th.rep
	}
	th.run(ctx)
	return th.rep
}

func (th *twoHost) setup(ctx context.Context) error {
	sum, err := sdk.FileSHA256(th.cfg.Plugin)
	if err != nil {
		return err
	}
	th.rep.SHA256 = hex.EncodeToString(sum)
	th.hostPair, err = startHosts(hostsConfig{plugin: th.cfg.Plugin, sha256: th.rep.SHA256, env: th.cfg.Env,
		targetCommand: th.cfg.TargetCommand, log: th.cfg.Log})
	if th.hostPair != nil {
		th.rep.Link, th.rep.Control, th.rep.Target = th.net.describe(), th.control, th.targetHost()
	}
	if err != nil {
		return err
	}
	return th.openInitiator(ctx, sum, th.hello)
}

// startHosts builds the namespaces and the management link, starts the
// target host's process and authenticates to it. On error the pair
// returned (possibly partial) still needs close.
func startHosts(cfg hostsConfig) (*hostPair, error) {
	hp := &hostPair{}
	var err error
	if hp.net, err = newNetnsPair(); err != nil {
		return nil, err
	}
	if err := hp.managementLink(); err != nil {
		return hp, err
	}
	secret := make([]byte, 32)
	_, _ = rand.Read(secret)
	if err := hp.startTarget(cfg, secret); err != nil {
		return hp, err
	}
	return hp, hp.greet(cfg.sha256)
}

// greet asks the target host who it is, and refuses one that runs another
// plugin binary than the one certified.
func (hp *hostPair) greet(sha256 string) (err error) {
	if hp.hello, err = hp.cc.call(ctlRequest{Op: "hello"}); err != nil {
		return err
	}
	if hp.hello.SHA256 != sha256 {
		return fmt.Errorf("the target host runs plugin sha256 %s, not %s", hp.hello.SHA256, sha256)
	}
	return nil
}

// targetHost is how the report names the target host.
func (hp *hostPair) targetHost() HostInfo {
	if hp.hello.Host == nil {
		return HostInfo{}
	}
	return *hp.hello.Host
}

// managementLink joins the certifying process's namespace to the target's
// by a second veth pair: the control channel must not share the faulted
// data link.
func (th *hostPair) managementLink() error {
	id := os.Getpid() % 100000
	mgmtHostAddr, mgmtTgtAddr := mgmtAddrs()
	th.mgmt = fmt.Sprintf("kvfm%d", id)
	peer := fmt.Sprintf("kvfn%d", id)
	for _, st := range [][]string{
		{"link", "add", th.mgmt, "type", "veth", "peer", "name", peer, "netns", th.net.tgt},
		{"addr", "add", mgmtHostAddr + "/30", "dev", th.mgmt},
		{"link", "set", th.mgmt, "up"},
		{"-n", th.net.tgt, "addr", "add", mgmtTgtAddr + "/30", "dev", peer},
		{"-n", th.net.tgt, "link", "set", peer, "up"},
	} {
		if out, err := exec.Command("ip", st...).CombinedOutput(); err != nil {
			return fmt.Errorf("ip %s: %v: %s", strings.Join(st, " "), err, out)
		}
	}
	th.control = fmt.Sprintf("HMAC-SHA256-authenticated channel over veth %s (%s) <-> %s (%s, netns %s)", th.mgmt, mgmtHostAddr, peer, mgmtTgtAddr, th.net.tgt)
	return nil
}

// startTarget runs the target host's process in the target namespace and
// dials its control channel.
func (th *hostPair) startTarget(cfg hostsConfig, secret []byte) error {
	dir, err := os.MkdirTemp("", "kvfc-twohost-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir) // the target reads the secret at start
	sf := filepath.Join(dir, "secret")
	if err := os.WriteFile(sf, []byte(hex.EncodeToString(secret)), 0o600); err != nil {
		return err
	}
	args := append([]string{"netns", "exec", th.net.tgt}, cfg.targetCommand...)
	_, mgmtTgtAddr := mgmtAddrs()
	args = append(args, "--plugin", cfg.plugin, "--listen", net.JoinHostPort(mgmtTgtAddr, "0"),
		"--data-addr", nsTgtAddr, "--secret-file", sf, "--netns", th.net.tgt)
	for _, e := range cfg.env {
		args = append(args, "--env", e)
	}
	th.target = exec.Command("ip", args...)
	th.target.Stderr = prefixed(orDiscard(cfg.log), "target-host")
	out, err := th.target.StdoutPipe()
	if err != nil {
		return err
	}
	if err := th.target.Start(); err != nil {
		return err
	}
	addr, err := readListening(out)
	if err != nil {
		return fmt.Errorf("target host: %w", err)
	}
	c, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		return err
	}
	th.cc, err = ctlClient(c, []byte(hex.EncodeToString(secret)))
	return err
}

// readListening reads the target's "listening on ADDR" line.
func readListening(r io.Reader) (string, error) {
	type res struct {
		addr string
		err  error
	}
	ch := make(chan res, 1)
	go func() {
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			if a, ok := strings.CutPrefix(sc.Text(), TargetListeningPrefix); ok {
				ch <- res{addr: strings.TrimSpace(a)}
				go func() { _, _ = io.Copy(io.Discard, r) }()
				return
			}
		}
		ch <- res{err: fmt.Errorf("exited before listening")}
	}()
	select {
	case r := <-ch:
		return r.addr, r.err
	case <-time.After(60 * time.Second):
		return "", fmt.Errorf("not listening after 60 s")
	}
}

// TargetListeningPrefix starts the line `kvfence conformance target`
// prints on stdout once its control channel listens.
const TargetListeningPrefix = "kvfence conformance target listening on "
