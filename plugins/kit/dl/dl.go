package dl

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdlib.h>

static void *kvf_dlopen(const char *path) { return dlopen(path, RTLD_NOW | RTLD_LOCAL); }
static const char *kvf_dlerror(void) { return dlerror(); }
static void *kvf_dlsym(void *h, const char *name) {
	dlerror();
	return dlsym(h, name);
}
*/
import "C"

import (
	"fmt"
	"strings"
	"unsafe"

	"github.com/kvfence/kvfence/errdefs"
)

// Spec says which library to load and what it must export.
type Spec struct {
	// What names the backend in messages ("mooncake").
	What string
	// EnvVar names the variable holding the library's path.
	EnvVar string
	// Names are tried on the dynamic linker's search path when EnvVar is
	// unset, in order (sonames such as "libtransfer_engine.so").
	Names []string
	// Required symbols: without any of them the library is refused.
	Required []string
	// Optional symbols: newer functions the caller can do without.
	Optional []string
}

// Library is a loaded library and its resolved symbols.
type Library struct {
	Path   string
	handle unsafe.Pointer
	syms   map[string]unsafe.Pointer
}

// Load finds, opens and binds the library described by spec. getenv reads
// the environment (os.Getenv in plugins; a map in tests).
func Load(spec Spec, getenv func(string) string) (*Library, error) {
	candidates := spec.Names
	fromEnv := getenv(spec.EnvVar)
	if fromEnv != "" {
		candidates = []string{fromEnv}
	}
	var lib *Library
	var reasons []string
	for _, path := range candidates {
		h, err := open(path)
		if err != nil {
			reasons = append(reasons, err.Error())
			continue
		}
		lib = &Library{Path: path, handle: h, syms: map[string]unsafe.Pointer{}}
		break
	}
	if lib == nil {
		where := fmt.Sprintf("%s is not set and %s is not on the library path", spec.EnvVar, strings.Join(spec.Names, ", "))
		if fromEnv != "" {
			where = fmt.Sprintf("%s=%s cannot be loaded", spec.EnvVar, fromEnv)
		}
		return nil, fail("%s: %s (%s); set %s to the library's path", spec.What, where, strings.Join(reasons, "; "), spec.EnvVar)
	}
	for _, name := range spec.Required {
		p := lib.lookup(name)
		if p == nil {
			return nil, fail("%s: %s lacks the required symbol %s: not a library this plugin can drive; set %s to a supported build", spec.What, lib.Path, name, spec.EnvVar)
		}
		lib.syms[name] = p
	}
	for _, name := range spec.Optional {
		if p := lib.lookup(name); p != nil {
			lib.syms[name] = p
		}
	}
	return lib, nil
}

// Sym returns a resolved symbol, or nil for an optional one the library
// lacks (and for a name that was never asked for).
func (l *Library) Sym(name string) unsafe.Pointer { return l.syms[name] }

// Has reports whether an optional symbol is present.
func (l *Library) Has(name string) bool { return l.syms[name] != nil }

// Refuse builds the one-line error for a library whose version the caller
// cannot drive.
func (l *Library) Refuse(spec Spec, format string, args ...any) error {
	return fail("%s: %s: unsupported version: %s; set %s to a supported build", spec.What, l.Path, fmt.Sprintf(format, args...), spec.EnvVar)
}

// Close unloads the library. Only for a library none of whose functions
// started threads or kept pointers (tests, a refused version).
func (l *Library) Close() {
	if l.handle != nil {
		C.dlclose(l.handle)
		l.handle = nil
	}
}

func (l *Library) lookup(name string) unsafe.Pointer {
	cs := C.CString(name)
	defer C.free(unsafe.Pointer(cs))
	return C.kvf_dlsym(l.handle, cs)
}

func open(path string) (unsafe.Pointer, error) {
	cs := C.CString(path)
	defer C.free(unsafe.Pointer(cs))
	h := C.kvf_dlopen(cs)
	if h == nil {
		msg := "dlopen " + path + " failed"
		if e := C.kvf_dlerror(); e != nil {
			msg = C.GoString(e)
		}
		return nil, fmt.Errorf("%s", oneLine(msg))
	}
	return h, nil
}

func fail(format string, args ...any) error {
	return errdefs.Errorf(errdefs.FailedPrecondition, "%s", oneLine(fmt.Sprintf(format, args...)))
}

// oneLine folds a message onto one line: the host logs the plugin's stderr
// line by line, and an operator reads the first.
func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}
