package dl

import (
	"fmt"
	"os"
	"sync"
	"syscall"
)

var protectOnce struct {
	sync.Once
	err error
}

// ProtectStdout keeps a vendor library's writes to standard output off the
// plugin protocol. go-plugin speaks its handshake on stdout, and C libraries
// print there: UCX writes its log (warnings included) to stdout by default
// and its protocol table with UCX_PROTO_INFO=y, which broke the NIXL
// plugin's handshake against the real library ("Unrecognized remote plugin
// message"). Afterwards os.Stdout is a duplicate of the original standard
// output and descriptor 1 is a duplicate of standard error: Go's writes
// reach the host as before, the library's go to stderr (which the host
// logs). Call it before loading the library; later calls do nothing.
func ProtectStdout() error {
	protectOnce.Do(func() {
		fd, err := syscall.Dup(1)
		if err != nil {
			protectOnce.err = fmt.Errorf("dl: keep stdout: dup: %w", err)
			return
		}
		syscall.CloseOnExec(fd)
		if err := syscall.Dup3(2, 1, 0); err != nil {
			_ = syscall.Close(fd)
			protectOnce.err = fmt.Errorf("dl: point descriptor 1 at stderr: %w", err)
			return
		}
		os.Stdout = os.NewFile(uintptr(fd), "/dev/stdout")
	})
	return protectOnce.err
}
