// Package catalog maps what an operator types after --plugin to a plugin
// binary: a known name (tcp, verbs, mooncake, nixl, mori) or a path.
//
// It owns the list of this project's plugins, their binary names and the
// variable each vendor plugin reads for its library. It must never start a
// plugin, load a library, or import a plugin package (so a host that only
// resolves names links none of them).
package catalog

import (
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/kvfence/kvfence/errdefs"
)

// Plugin describes one of this project's plugins.
type Plugin struct {
	Name   string // what --plugin accepts
	Binary string // file name under bin/ (make plugins)
	// LibraryEnv is the variable naming the vendor library the plugin loads
	// at run time ("" for plugins without one).
	LibraryEnv string
}

var known = map[string]Plugin{
	"tcp":      {"tcp", "kvfence-plugin-tcp", ""},
	"verbs":    {"verbs", "kvfence-plugin-verbs", ""},
	"mooncake": {"mooncake", "kvfence-plugin-mooncake", "KVFENCE_MOONCAKE_LIB"},
	"nixl":     {"nixl", "kvfence-plugin-nixl", "KVFENCE_NIXL_LIB"},
	"mori":     {"mori", "kvfence-plugin-mori", "KVFENCE_MORI_SHIM"},
}

// Names lists the known plugin names, sorted.
func Names() []string {
	out := make([]string, 0, len(known))
	for n := range known {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Lookup returns a known plugin by name.
func Lookup(name string) (Plugin, bool) {
	p, ok := known[name]
	return p, ok
}

// Resolve turns a --plugin value into the path of an existing binary. A
// value with a slash is a path. A known name is looked up in dirs, in
// order (callers pass the bin/ directory next to their own executable and
// the working directory's bin/). Anything else, or a binary that is not
// there, is a classified error that says what to do.
func Resolve(value string, dirs ...string) (string, error) {
	if value == "" {
		return "", errdefs.Errorf(errdefs.InvalidArgument, "--plugin: empty; want one of %s or a path", strings.Join(Names(), "|"))
	}
	if strings.ContainsRune(value, '/') {
		return existing(value)
	}
	p, ok := known[value]
	if !ok {
		return "", errdefs.Errorf(errdefs.InvalidArgument, "--plugin %q: not one of %s, and not a path (a path contains a slash: ./%s)", value, strings.Join(Names(), "|"), value)
	}
	for _, d := range dirs {
		path := filepath.Join(d, p.Binary)
		if st, err := os.Stat(path); err == nil && st.Mode().IsRegular() {
			return path, nil
		}
	}
	return "", errdefs.Errorf(errdefs.NotFound, "--plugin %s: %s not found in %s; run make plugins", value, p.Binary, strings.Join(dirs, ", "))
}

func existing(path string) (string, error) {
	st, err := os.Stat(path)
	if err != nil {
		return "", errdefs.Errorf(errdefs.NotFound, "--plugin %s: %v", path, err)
	}
	if !st.Mode().IsRegular() || st.Mode().Perm()&0o111 == 0 {
		return "", errdefs.Errorf(errdefs.InvalidArgument, "--plugin %s: not an executable file", path)
	}
	return path, nil
}

// DefaultDirs are where Resolve looks by default: bin/ beside the running
// executable, then ./bin.
func DefaultDirs() []string {
	var dirs []string
	if exe, err := os.Executable(); err == nil {
		dirs = append(dirs, filepath.Dir(exe))
	}
	return append(dirs, "bin")
}
