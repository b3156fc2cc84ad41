package sdk

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kvfence/kvfence/errdefs"
)

// The child side of the out-of-process tests: this test binary, run again
// with KVFENCE_FDPASS_CHILD set, imports the buffer the parent describes
// and writes into it, as a plugin's RegisterMemory would import it.
func TestFDPassChild(t *testing.T) {
	mode := os.Getenv("KVFENCE_FDPASS_CHILD")
	if mode == "" {
		t.Skip("the child side of TestDMABuf*: run by them in another process")
	}
	var desc MemoryDesc
	desc.Kind = MemoryDMABuf
	desc.Path = os.Getenv("KVFENCE_FDPASS_PATH")
	_, _ = fmt.Sscan(os.Getenv("KVFENCE_FDPASS_REGION"), &desc.Offset, &desc.Size)
	f, err := ImportDMABuf(desc)
	if err != nil {
		fmt.Printf("import-error %s: %v\n", errdefs.ClassOf(err).String(), err)
		return
	}
	defer f.Close()
	switch mode {
	case "memfd": // map the region and write the child's mark into it
		m, err := unix.Mmap(int(f.Fd()), int64(desc.Offset), int(desc.Size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		if err != nil {
			t.Fatal(err)
		}
		copy(m, fmt.Sprintf("written by pid %d", os.Getpid()))
		_ = unix.Munmap(m)
	case "eventfd": // add 5 to the parent's counter
		if _, err := f.Write(binary.NativeEndian.AppendUint64(nil, 5)); err != nil {
			t.Fatal(err)
		}
	}
	fmt.Printf("imported pid %d\n", os.Getpid())
}

// inChild runs TestFDPassChild in a new process on desc and returns its
// first line of output.
func inChild(t *testing.T, mode string, desc MemoryDesc) string {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestFDPassChild$", "-test.v")
	cmd.Env = append(os.Environ(), "KVFENCE_FDPASS_CHILD="+mode, "KVFENCE_FDPASS_PATH="+desc.Path,
		fmt.Sprintf("KVFENCE_FDPASS_REGION=%d %d", desc.Offset, desc.Size))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	for _, l := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(l, "import") {
			return l
		}
	}
	t.Fatalf("child said nothing about the import:\n%s", out)
	return ""
}

// TestDMABufReachesPluginProcess: a buffer shared with ShareDMABuf is
// imported by another process, whose writes land in the host's memory at
// the described offset.
func TestDMABufReachesPluginProcess(t *testing.T) {
	mem, err := NewSharedMemory("fdpass", 8192)
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	s, err := ShareDMABuf(mem.fd, 4096, 4096, "test")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	line := inChild(t, "memfd", s.Desc())
	var pid int
	if _, err := fmt.Sscanf(line, "imported pid %d", &pid); err != nil {
		t.Fatalf("child: %s", line)
	}
	want := fmt.Sprintf("written by pid %d", pid)
	if got := string(mem.Bytes()[4096 : 4096+len(want)]); got != want {
		t.Fatalf("host sees %q at the region's offset, want %q", got, want)
	}
	if bytes.ContainsFunc(mem.Bytes()[:4096], func(r rune) bool { return r != 0 }) {
		t.Fatal("the child wrote before the region's offset")
	}
	if served, denied := s.Served(); served != 1 || denied != 0 {
		t.Fatalf("served %d, denied %d", served, denied)
	}
}

// TestDMABufAnonInodeNeedsSCMRights: a dma-buf, like an eventfd, is an
// inode that refuses open(2), so the /proc/<pid>/fd path scheme cannot
// reach it: the known-unsafe variant (DescribeDMABuf + OpenDMABuf, which
// only the fake driver's memfd survives) must fail here, and SCM_RIGHTS
// must carry the same descriptor to the child.
func TestDMABufAnonInodeNeedsSCMRights(t *testing.T) {
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(efd)
	if line := inChild(t, "eventfd", DescribeDMABuf(efd, 0, 8, "test")); !strings.HasPrefix(line, "import-error not-found") ||
		!strings.Contains(line, "no such device or address") {
		t.Fatalf("control arm not caught: the path scheme reached an anonymous inode: %s", line)
	}
	s, err := ShareDMABuf(efd, 0, 8, "test")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if line := inChild(t, "eventfd", s.Desc()); !strings.HasPrefix(line, "imported") {
		t.Fatalf("over SCM_RIGHTS: %s", line)
	}
	b := make([]byte, 8)
	if _, err := unix.Read(efd, b); err != nil || binary.NativeEndian.Uint64(b) != 5 {
		t.Fatalf("the parent's eventfd reads %v (%v), want the child's 5", b, err)
	}
}

// TestImportedDMABufOutlivesHostDescriptor: the importer's file holds the
// buffer after the host closed the share and its own descriptor.
func TestImportedDMABufOutlivesHostDescriptor(t *testing.T) {
	fd, err := unix.MemfdCreate("fdpass-hold", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Ftruncate(fd, 4096); err != nil {
		t.Fatal(err)
	}
	if _, err := unix.Pwrite(fd, []byte("kept"), 0); err != nil {
		t.Fatal(err)
	}
	s, err := ShareDMABuf(fd, 0, 4096, "")
	if err != nil {
		t.Fatal(err)
	}
	f, err := ImportDMABuf(s.Desc())
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	_ = s.Close()
	unix.Close(fd)
	b := make([]byte, 4)
	if _, err := f.ReadAt(b, 0); err != nil || string(b) != "kept" {
		t.Fatalf("after the host let go: %q, %v", b, err)
	}
	if _, err := ImportDMABuf(s.Desc()); !errdefs.IsNotFound(err) {
		t.Fatalf("import after Close: %v, want NotFound", err)
	}
}

// TestImportDMABufRefusals: bad descriptors are refused with their class,
// and a refused peer leaves the share serving.
func TestImportDMABufRefusals(t *testing.T) {
	fd, err := unix.MemfdCreate("fdpass-refuse", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if _, err := ShareDMABuf(fd, 0, 0, ""); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("zero size: %v", err)
	}
	if _, err := ShareDMABuf(-1, 0, 1, ""); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("bad fd: %v", err)
	}
	s, err := ShareDMABuf(fd, 0, 4096, "")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	good := s.Desc()
	bad := good
	bad.Path = good.Path[:len(good.Path)-2] + map[bool]string{true: "00", false: "11"}[strings.HasSuffix(good.Path, "11")]
	cases := []struct {
		name string
		desc MemoryDesc
		want errdefs.Class
	}{
		{"wrong token", bad, errdefs.FailedPrecondition},
		{"host memory", MemoryDesc{Kind: MemoryHostShared, Path: good.Path, Size: 1}, errdefs.InvalidArgument},
		{"no token", MemoryDesc{Kind: MemoryDMABuf, Path: strings.Split(good.Path, "#")[0], Size: 1}, errdefs.InvalidArgument},
		{"short token", MemoryDesc{Kind: MemoryDMABuf, Path: good.Path[:len(good.Path)-2], Size: 1}, errdefs.InvalidArgument},
		{"no such share", MemoryDesc{Kind: MemoryDMABuf, Path: "scm:@kvfence-fd-none#" + strings.Repeat("00", tokenLen), Size: 1}, errdefs.NotFound},
	}
	for _, c := range cases {
		f, err := ImportDMABuf(c.desc)
		if f != nil {
			f.Close()
		}
		if errdefs.ClassOf(err) != c.want {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
	f, err := ImportDMABuf(good)
	if err != nil {
		t.Fatalf("after a refusal: %v", err)
	}
	f.Close()
	if served, denied := s.Served(); served != 1 || denied != 1 {
		t.Fatalf("served %d, denied %d; want 1 and 1", served, denied)
	}
}
