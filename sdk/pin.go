package sdk

import (
	"crypto/sha256"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvfence/kvfence/errdefs"
)

// sealedBinary is a private, immutable copy of a plugin binary: a memfd
// filled from the file while hashing it, then sealed against every change.
// The host checks the hash of this copy and executes this copy (through
// /proc/self/fd), so no one can swap or rewrite the file between the check
// and the exec — hashing a path and then exec'ing the path leaves exactly
// that window.
type sealedBinary struct {
	f   *os.File
	sum []byte
}

func sealBinary(path string) (*sealedBinary, error) {
	src, err := os.Open(path)
	if err != nil {
		return nil, errdefs.Errorf(errdefs.NotFound, "plugin binary: %v", err)
	}
	defer src.Close()
	fd, err := unix.MemfdCreate("kvfence-plugin:"+filepath.Base(path), unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, errdefs.Errorf(errdefs.Unavailable, "plugin binary: memfd_create: %v", err)
	}
	f := os.NewFile(uintptr(fd), "memfd:"+filepath.Base(path))
	h := sha256.New()
	if _, err := io.Copy(io.MultiWriter(f, h), src); err != nil {
		f.Close()
		return nil, errdefs.Errorf(errdefs.Unavailable, "plugin binary: copying %s: %v", path, err)
	}
	if err := addSeals(f); err != nil {
		f.Close()
		return nil, errdefs.Errorf(errdefs.Unavailable, "plugin binary: sealing the copy: %v", err)
	}
	return &sealedBinary{f: f, sum: h.Sum(nil)}, nil
}

// addSeals seals f against every change. The kernel refuses F_SEAL_WRITE
// with EBUSY while any page of the file still holds a transient extra
// reference (seen on a loaded machine right after the copy's writes, with
// no mapping of ours), after waiting only ~70 ms itself; so EBUSY is
// retried for a bounded while before it counts as a failure.
func addSeals(f *os.File) error {
	seals := unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_WRITE | unix.F_SEAL_SEAL
	var err error
	for try := 0; try < sealTries; try++ {
		if _, err = unix.FcntlInt(f.Fd(), unix.F_ADD_SEALS, seals); err != unix.EBUSY {
			return err
		}
		time.Sleep(sealRetryPause)
	}
	return err
}

const (
	sealTries      = 40
	sealRetryPause = 50 * time.Millisecond
)

// execPath is the path the child execs: its fd 3 (the first ExtraFiles
// entry) is the sealed copy.
const sealedExecPath = "/proc/self/fd/3"

// verifyPins checks the sealed copy against the pinned sha256 and the
// certificate policy, if any.
func (b *sealedBinary) verifyPins(path string, opts OpenOptions) error {
	if len(opts.SHA256) > 0 && string(opts.SHA256) != string(b.sum) {
		return errdefs.Errorf(errdefs.FailedPrecondition, "Open %s: checksum mismatch: sha256 %x, pinned %x", path, b.sum, opts.SHA256)
	}
	if opts.CertificatePolicy != nil {
		if len(opts.Certificate) == 0 {
			return errdefs.Errorf(errdefs.FailedPrecondition, "Open %s: a certificate is required and none was given", path)
		}
		if _, err := opts.CertificatePolicy.Verify(opts.Certificate, b.sum); err != nil {
			return errdefs.Errorf(errdefs.ClassOf(err), "Open %s (sha256 %x): %v", path, b.sum, err)
		}
	}
	return nil
}

func (b *sealedBinary) String() string { return fmt.Sprintf("%s (sha256 %x)", b.f.Name(), b.sum) }
