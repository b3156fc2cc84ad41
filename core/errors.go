package core

import (
	"fmt"

	"github.com/kvfence/kvfence/errdefs"
)

// errorf wraps exactly one class with a message: every error the core
// returns does, so a caller can map it (errors.Is, errdefs.ClassOf) to a gRPC
// code or an engine status without reading strings. The classes are the
// project's one vocabulary, package errdefs; the core names no class of its
// own.
func errorf(class errdefs.Class, format string, args ...any) error {
	return fmt.Errorf("%w: %s", class, fmt.Sprintf(format, args...))
}
