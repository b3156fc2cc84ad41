package sdk

// This file: how a dma-buf file descriptor reaches the plugin process.
//
// Host memory reaches a plugin by path (/proc/<host pid>/fd/<fd>, shm.go):
// reopening that magic link works for a memfd because a memfd is a file on
// a filesystem that can be opened. A dma-buf cannot: it lives on a pseudo
// filesystem whose inodes refuse open(2) (the kernel answers ENXIO, as it
// does for every anonymous inode: eventfd, pidfd, ...), so the path scheme
// can never carry a real GPU buffer. The fake CUDA driver hides that (its
// "dma-buf" is a memfd); the tests show it with an eventfd.
//
// So a dma-buf travels as a descriptor, with SCM_RIGHTS. go-plugin owns the
// host↔plugin gRPC socket and gives no way to attach ancillary data to it,
// so the host opens a side socket per shared buffer: an abstract unix socket
// (no file to clean up; the plugin, a child process, shares the host's
// network namespace). Its name is visible to every process of the namespace
// (/proc/net/unix), so the descriptor is handed only to a peer that (1) runs
// as the host's user (SO_PEERCRED: the same rule the kernel applies to the
// /proc path) and (2) sends the share's token, which travels only inside the
// MemoryDesc over the private gRPC connection. The path is
// "scm:@<socket name>#<token>"; ImportDMABuf understands both schemes.
//
// The plugin receives its own reference to the buffer (SCM_RIGHTS installs
// a new descriptor of the same open file): the buffer stays alive in the
// plugin for as long as it keeps that file, i.e. for as long as it has the
// region registered, whatever the host does with its own descriptor.

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvfence/kvfence/errdefs"
)

const (
	scmScheme = "scm:@"
	tokenLen  = 16
	// fdPassTimeout bounds one hand-over on either side: a peer that
	// connects and says nothing must not hold the host's accept loop, and a
	// host that never answers must not hang a plugin's RegisterMemory.
	fdPassTimeout = 10 * time.Second
)

// FDShare is a dma-buf descriptor the host offers to plugin processes over
// SCM_RIGHTS. It holds its own duplicate of the descriptor until Close.
type FDShare struct {
	fd     int
	ln     *net.UnixListener
	name   string
	token  []byte
	desc   MemoryDesc
	wg     sync.WaitGroup
	mu     sync.Mutex
	closed bool
	served int
	denied int
}

// ShareDMABuf offers the dma-buf fd (offset, size: the region within it;
// device: e.g. the GPU's PCI bus id) to plugins. The caller may close fd
// afterwards: the share holds a duplicate. Desc is what RegisterMemory
// takes; Close stops offering it (plugins that imported it keep their
// reference).
func ShareDMABuf(fd int, offset, size uint64, device string) (*FDShare, error) {
	if size == 0 || offset+size < offset {
		return nil, errdefs.Errorf(errdefs.InvalidArgument, "ShareDMABuf: region [%d,+%d)", offset, size)
	}
	dup, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, errdefs.Errorf(errdefs.InvalidArgument, "ShareDMABuf: fd %d: %v", fd, err)
	}
	rnd := make([]byte, 2*tokenLen)
	if _, err := rand.Read(rnd); err != nil {
		unix.Close(dup)
		return nil, errdefs.Errorf(errdefs.Internal, "ShareDMABuf: random: %v", err)
	}
	name := fmt.Sprintf("kvfence-fd-%d-%s", os.Getpid(), hex.EncodeToString(rnd[:tokenLen]))
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: "@" + name, Net: "unix"})
	if err != nil {
		unix.Close(dup)
		return nil, errdefs.Errorf(errdefs.Unavailable, "ShareDMABuf: listen: %v", err)
	}
	s := &FDShare{fd: dup, ln: ln, name: name, token: rnd[tokenLen:]}
	s.desc = MemoryDesc{Kind: MemoryDMABuf, Path: scmScheme + name + "#" + hex.EncodeToString(s.token),
		Offset: offset, Size: size, Device: device}
	s.wg.Add(1)
	go s.serve()
	return s, nil
}

// Desc describes the shared buffer for RegisterMemory.
func (s *FDShare) Desc() MemoryDesc { return s.desc }

// Served is how many times the descriptor was handed over; Denied how many
// peers were refused (another user, a wrong token, or silence).
func (s *FDShare) Served() (served, denied int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.served, s.denied
}

// Close stops offering the buffer and closes the share's descriptor.
func (s *FDShare) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	err := s.ln.Close()
	s.wg.Wait() // no hand-over reads s.fd after this
	if cerr := unix.Close(s.fd); err == nil {
		err = cerr
	}
	return err
}

func (s *FDShare) serve() {
	defer s.wg.Done()
	for {
		c, err := s.ln.AcceptUnix()
		if err != nil {
			return // closed
		}
		ok := s.handOver(c) == nil
		s.mu.Lock()
		if ok {
			s.served++
		} else {
			s.denied++
		}
		s.mu.Unlock()
		c.Close() // the importer waits for this: the hand-over is counted
	}
}

// handOver sends the descriptor to c if its peer is this user and sends
// the token; one hand-over at a time (the accept loop runs them in turn).
func (s *FDShare) handOver(c *net.UnixConn) error {
	_ = c.SetDeadline(time.Now().Add(fdPassTimeout))
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil || cerr != nil {
		return errors.Join(err, cerr)
	}
	if cred.Uid != uint32(os.Getuid()) {
		return fmt.Errorf("peer uid %d", cred.Uid)
	}
	got := make([]byte, tokenLen)
	if _, err := readFull(c, got); err != nil {
		return err
	}
	if subtle.ConstantTimeCompare(got, s.token) != 1 {
		return errors.New("wrong token")
	}
	_, _, err = c.WriteMsgUnix([]byte{1}, unix.UnixRights(s.fd), nil)
	return err
}

func readFull(c *net.UnixConn, b []byte) (int, error) {
	n := 0
	for n < len(b) {
		m, err := c.Read(b[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// ImportDMABuf is the plugin's side: it returns its own file of the dma-buf
// desc names, received over SCM_RIGHTS for an "scm:" path (ShareDMABuf), or
// reopened by path otherwise (OpenDMABuf: only a memfd-backed buffer, such
// as the fake driver's, survives that). Keep the file open for as long as
// the region is registered: it is what holds the buffer in this process.
func ImportDMABuf(desc MemoryDesc) (*os.File, error) {
	if desc.Kind != MemoryDMABuf {
		return nil, errdefs.Errorf(errdefs.InvalidArgument, "ImportDMABuf: %v is not a dma-buf", desc.Kind)
	}
	if !strings.HasPrefix(desc.Path, scmScheme) {
		return OpenDMABuf(desc)
	}
	name, tok, ok := strings.Cut(strings.TrimPrefix(desc.Path, scmScheme), "#")
	token, err := hex.DecodeString(tok)
	if !ok || name == "" || err != nil || len(token) != tokenLen {
		return nil, errdefs.Errorf(errdefs.InvalidArgument, "ImportDMABuf: malformed path %q", desc.Path)
	}
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: "@" + name, Net: "unix"})
	if err != nil {
		return nil, errdefs.Errorf(errdefs.NotFound, "ImportDMABuf: %s: %v (the host no longer shares it)", name, err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(fdPassTimeout))
	if _, err := c.Write(token); err != nil {
		return nil, errdefs.Errorf(errdefs.Unavailable, "ImportDMABuf: %s: %v", name, err)
	}
	return receiveFD(c, name)
}

// receiveFD reads the one descriptor the host sends; a host that refused
// closes the connection without one.
func receiveFD(c *net.UnixConn, name string) (*os.File, error) {
	buf := make([]byte, 1)
	oob := make([]byte, unix.CmsgSpace(4*4)) // room for more than one: extras are closed
	n, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
	if err != nil || n == 0 {
		return nil, errdefs.Errorf(errdefs.FailedPrecondition, "ImportDMABuf: %s refused the hand-over (another user, or a wrong token): %v", name, err)
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	var fds []int
	for _, m := range msgs {
		if rights, rerr := unix.ParseUnixRights(&m); rerr == nil {
			fds = append(fds, rights...)
		}
	}
	if err != nil || len(fds) != 1 {
		for _, fd := range fds {
			unix.Close(fd)
		}
		return nil, errdefs.Errorf(errdefs.Internal, "ImportDMABuf: %s sent %d descriptors (%v)", name, len(fds), err)
	}
	unix.CloseOnExec(fds[0])
	_, _ = c.Read(buf) // until the host closed: it has counted the hand-over
	return os.NewFile(uintptr(fds[0]), "dmabuf:"+name), nil
}
