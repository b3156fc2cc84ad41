package conformance

import (
	"bufio"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"

	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/sdk"
)

// The two-host control channel: the certifying side asks the target host
// (`kvfence conformance target`) to grant, fill, compare and watch its
// memory, and the target reports what it observes. Both ends hold the same
// secret (a file, copied to the target host out of band). The handshake
// proves each end knows it (HMAC over both ends' fresh nonces), and every
// message afterwards carries an HMAC-SHA256 over its direction, sequence
// number and body under a key derived from the secret and both nonces, so a
// message cannot be forged, altered, replayed or reflected. The channel is
// authenticated, not encrypted: it carries test patterns, never secrets.

// ctlRequest is one question to the target host.
type ctlRequest struct {
	Op       string `json:"op"`
	Off      uint64 `json:"off,omitempty"`
	N        uint64 `json:"n,omitempty"`
	Src      uint64 `json:"src,omitempty"`
	Byte     byte   `json:"byte,omitempty"`
	Key      uint64 `json:"key,omitempty"`
	WaitMs   int64  `json:"wait_ms,omitempty"`
	Snapshot int    `json:"snapshot,omitempty"`
	// The full suite's ops (twohost_hostops.go): a request names one of
	// the target host's plugin processes by H (0: the one it started with).
	ID     uint64          `json:"id,omitempty"`
	H      int             `json:"h,omitempty"`
	Env    []string        `json:"env,omitempty"`
	Desc   *sdk.MemoryDesc `json:"desc,omitempty"`
	Region uint64          `json:"region,omitempty"`
	Window *sdk.Window     `json:"window,omitempty"`
	Sig    int             `json:"sig,omitempty"`
}

// ctlReply is the target host's answer; Err set means the op failed there.
type ctlReply struct {
	Err      string            `json:"err,omitempty"`
	Key      uint64            `json:"key,omitempty"`
	Endpoint sdk.Endpoint      `json:"endpoint"`
	Host     *HostInfo         `json:"host,omitempty"`
	Info     *sdk.Info         `json:"info,omitempty"`
	Snapshot int               `json:"snapshot,omitempty"`
	SHA256   string            `json:"sha256,omitempty"`
	Change   string            `json:"change,omitempty"` // first change seen, "" for none
	ID       uint64            `json:"id,omitempty"`
	Class    string            `json:"class,omitempty"` // the errdefs class of Err, when the plugin classed it
	H        int               `json:"h,omitempty"`
	Granter  bool              `json:"granter,omitempty"`
	Neg      int               `json:"negotiated,omitempty"`
	Desc     *sdk.MemoryDesc   `json:"desc,omitempty"`
	Region   uint64            `json:"region,omitempty"`
	Revoked  *sdk.RevokeResult `json:"revoked,omitempty"`
	Data     []byte            `json:"data,omitempty"`
	Changed  *change           `json:"changed,omitempty"`
	Count    int               `json:"count,omitempty"`
}

// HostInfo names a host of a two-host run and its network interfaces.
type HostInfo struct {
	Hostname string   `json:"hostname"`
	Netns    string   `json:"netns,omitempty"`
	NICs     []NICRef `json:"nics"`
}

// NICRef is one interface with its driver (the kernel driver of a
// device, or the link kind of a virtual one: veth) and its addresses.
type NICRef struct {
	Name   string   `json:"name"`
	Driver string   `json:"driver,omitempty"`
	Addrs  []string `json:"addrs"`
}

// nicDriver names ifname's driver, running commands with run (on this
// host, or in a namespace): the driver a device is bound to, else the
// link kind ip reports (veth, bridge ...), else "".
func nicDriver(run func(args ...string) (string, error), ifname string) string {
	if out, err := run("readlink", "/sys/class/net/"+ifname+"/device/driver"); err == nil && strings.TrimSpace(out) != "" {
		return filepath.Base(strings.TrimSpace(out))
	}
	out, err := run("ip", "-d", "-j", "link", "show", "dev", ifname)
	if err != nil {
		return ""
	}
	var links []struct {
		LinkInfo struct {
			Kind string `json:"info_kind"`
		} `json:"linkinfo"`
	}
	if json.Unmarshal([]byte(out), &links) != nil || len(links) == 0 {
		return ""
	}
	return links[0].LinkInfo.Kind
}

// runHere runs a command on this host.
func runHere(args ...string) (string, error) {
	out, err := exec.Command(args[0], args[1:]...).Output()
	return string(out), err
}

// localHost describes this process's host: its name and every interface
// that is up and not loopback.
func localHost(netns string) HostInfo {
	h := HostInfo{Netns: netns}
	h.Hostname, _ = os.Hostname()
	ifs, _ := net.Interfaces()
	for _, ifc := range ifs {
		if ifc.Flags&net.FlagLoopback != 0 || ifc.Flags&net.FlagUp == 0 {
			continue
		}
		n := NICRef{Name: ifc.Name, Driver: nicDriver(runHere, ifc.Name)}
		addrs, _ := ifc.Addrs()
		for _, a := range addrs {
			n.Addrs = append(n.Addrs, a.String())
		}
		h.NICs = append(h.NICs, n)
	}
	return h
}

func (h HostInfo) String() string {
	var nics []string
	for _, n := range h.NICs {
		name := n.Name
		if n.Driver != "" {
			name += " (" + n.Driver + ")"
		}
		nics = append(nics, name+" "+strings.Join(n.Addrs, ","))
	}
	s := h.Hostname
	if h.Netns != "" {
		s += " (netns " + h.Netns + ")"
	}
	return s + ": " + strings.Join(nics, "; ")
}

type ctlConn struct {
	c       net.Conn
	r       *bufio.Reader
	key     []byte
	out, in byte // direction tags: what we send, what we accept
	sendSeq uint64
	recvSeq uint64

	mu      sync.Mutex // sends, and the client's pending calls
	pending map[uint64]chan ctlReply
	nextID  uint64
	broken  error
}

const ctlMaxLine = 64 << 20

func newNonce() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func mac(key []byte, parts ...string) string {
	m := hmac.New(sha256.New, key)
	for _, p := range parts {
		var l [8]byte
		binary.BigEndian.PutUint64(l[:], uint64(len(p)))
		m.Write(l[:])
		m.Write([]byte(p))
	}
	return hex.EncodeToString(m.Sum(nil))
}

func (cc *ctlConn) line() (string, error) {
	s, err := cc.r.ReadString('\n')
	if err != nil {
		return "", err
	}
	if len(s) > ctlMaxLine {
		return "", fmt.Errorf("control line over %d bytes", ctlMaxLine)
	}
	return strings.TrimSuffix(s, "\n"), nil
}

// ctlServer authenticates a client that dialled the target host.
func ctlServer(c net.Conn, secret []byte) (*ctlConn, error) {
	cc := &ctlConn{c: c, r: bufio.NewReaderSize(c, 64<<10), out: 'T', in: 'C'}
	ns := newNonce()
	if _, err := fmt.Fprintf(c, "kvfc1 %s\n", ns); err != nil {
		return nil, err
	}
	l, err := cc.line()
	if err != nil {
		return nil, err
	}
	var nc, proof string
	if _, err := fmt.Sscanf(l, "kvfc1 %s %s", &nc, &proof); err != nil || !hmac.Equal([]byte(proof), []byte(mac(secret, "client", ns, nc))) {
		return nil, fmt.Errorf("control client failed authentication")
	}
	if _, err := fmt.Fprintf(c, "%s\n", mac(secret, "server", nc, ns)); err != nil {
		return nil, err
	}
	cc.key = []byte(mac(secret, "session", ns, nc))
	return cc, nil
}

// ctlClient dials the target host's control address and authenticates.
func ctlClient(c net.Conn, secret []byte) (*ctlConn, error) {
	cc := &ctlConn{c: c, r: bufio.NewReaderSize(c, 64<<10), out: 'C', in: 'T'}
	l, err := cc.line()
	if err != nil {
		return nil, err
	}
	var ns string
	if _, err := fmt.Sscanf(l, "kvfc1 %s", &ns); err != nil || len(ns) != 64 {
		return nil, fmt.Errorf("not a kvfence conformance target: %q", l)
	}
	nc := newNonce()
	if _, err := fmt.Fprintf(c, "kvfc1 %s %s\n", nc, mac(secret, "client", ns, nc)); err != nil {
		return nil, err
	}
	if l, err = cc.line(); err != nil {
		return nil, fmt.Errorf("target refused authentication: %w", err)
	}
	if !hmac.Equal([]byte(l), []byte(mac(secret, "server", nc, ns))) {
		return nil, fmt.Errorf("target failed authentication (does it hold the same secret?)")
	}
	cc.key = []byte(mac(secret, "session", ns, nc))
	return cc, nil
}

type ctlFrame struct {
	Body json.RawMessage `json:"body"`
	MAC  string          `json:"mac"`
}

func (cc *ctlConn) send(v any) error {
	body, err := json.Marshal(v)
	if err != nil {
		return err
	}
	cc.sendSeq++
	f := ctlFrame{Body: body, MAC: mac(cc.key, string(cc.out), fmt.Sprint(cc.sendSeq), string(body))}
	b, _ := json.Marshal(f)
	_, err = cc.c.Write(append(b, '\n'))
	return err
}

func (cc *ctlConn) recv(v any) error {
	l, err := cc.line()
	if err != nil {
		return err
	}
	var f ctlFrame
	if err := json.Unmarshal([]byte(l), &f); err != nil {
		return fmt.Errorf("control frame: %w", err)
	}
	cc.recvSeq++
	if !hmac.Equal([]byte(f.MAC), []byte(mac(cc.key, string(cc.in), fmt.Sprint(cc.recvSeq), string(f.Body)))) {
		return fmt.Errorf("control frame %d failed authentication", cc.recvSeq)
	}
	return json.Unmarshal(f.Body, v)
}

// call sends q and waits for the answer. Calls may come from several
// goroutines at once (the suite's completion collector reads target memory
// while a check waits on a watch): each request carries an id, the target
// answers each as it finishes, and one reader hands the answers out.
func (cc *ctlConn) call(q ctlRequest) (ctlReply, error) {
	r, err := cc.roundTrip(q)
	if err != nil {
		return r, fmt.Errorf("target host %s: %w", q.Op, err)
	}
	if r.Err != "" {
		return r, replyError(q.Op, r)
	}
	return r, nil
}

func (cc *ctlConn) roundTrip(q ctlRequest) (ctlReply, error) {
	ch := make(chan ctlReply, 1)
	cc.mu.Lock()
	if cc.broken != nil {
		cc.mu.Unlock()
		return ctlReply{}, cc.broken
	}
	if cc.pending == nil {
		cc.pending = map[uint64]chan ctlReply{}
		go cc.readReplies()
	}
	cc.nextID++
	q.ID = cc.nextID
	cc.pending[q.ID] = ch
	err := cc.send(q)
	cc.mu.Unlock()
	if err != nil {
		return ctlReply{}, err
	}
	r, ok := <-ch
	if !ok {
		cc.mu.Lock()
		defer cc.mu.Unlock()
		return r, cc.broken
	}
	return r, nil
}

// readReplies hands each answer to its caller; a broken channel fails
// every call still waiting and every later one.
func (cc *ctlConn) readReplies() {
	for {
		var r ctlReply
		err := cc.recv(&r)
		cc.mu.Lock()
		if err != nil {
			cc.broken = fmt.Errorf("control channel: %w", err)
			for id, ch := range cc.pending {
				close(ch)
				delete(cc.pending, id)
			}
			cc.mu.Unlock()
			return
		}
		if ch, ok := cc.pending[r.ID]; ok {
			ch <- r
			delete(cc.pending, r.ID)
		}
		cc.mu.Unlock()
	}
}

// replyError is the target host's error, with the class the plugin gave it
// (a check judges the class of a refusal on the other host as on this one).
func replyError(op string, r ctlReply) error {
	if c, ok := errdefs.Parse(r.Class); ok && r.Class != "" {
		return errdefs.Errorf(c, "%s", strings.TrimPrefix(r.Err, r.Class+": "))
	}
	return fmt.Errorf("target host %s: %s", op, r.Err)
}

// TwoHostMarkdown is the human summary of a two-host run.
func TwoHostMarkdown(r *TwoHostReport) string {
	var b strings.Builder
	verdict := "NOT certified"
	if r.Certified {
		verdict = "certified"
	} else if r.Passed && r.Error == "" {
		verdict = "partial (every check that ran passed; a check NOT RUN is never a pass): no certificate"
	}
	fmt.Fprintf(&b, "# Two-host conformance: %s\n\n- plugin: %s (sha256 %s)\n- initiator host: %s\n- target host: %s\n- data link: %s\n- control: %s\n- guard window: %s\n",
		verdict, r.Plugin, r.SHA256, r.Initiator, r.Target, r.Link, r.Control, r.GuardWindow)
	if r.Error != "" {
		fmt.Fprintf(&b, "- error: %s\n", r.Error)
	}
	b.WriteString("\n| check | promise | status | reason / notes |\n|---|---|---|---|\n")
	for _, c := range r.Checks {
		fmt.Fprintf(&b, "| %s | %s | %s | %s %s |\n", c.Name, c.Promise, c.Status, c.Reason, strings.Join(c.Notes, "; "))
	}
	return b.String()
}
