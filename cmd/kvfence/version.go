package main

import (
	"fmt"
	"runtime/debug"

	"github.com/kvfence/kvfence/agent"
	"github.com/kvfence/kvfence/core"
	"github.com/kvfence/kvfence/core/knownunsafe"
	"github.com/kvfence/kvfence/sdk"
)

// version is set at link time (-ldflags "-X main.version=v1.2.3"); without
// it the module version and VCS revision recorded by the Go toolchain are
// used.
var version = ""

// versionString is what `kvfence --version` prints after "kvfence version ":
// the build, the three protocol versions, and whether this binary can run
// known-unsafe cores.
func versionString() string {
	v, rev, dirty := version, "", false
	if bi, ok := debug.ReadBuildInfo(); ok {
		if v == "" {
			v = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
	}
	if v == "" {
		v = "(devel)"
	}
	if rev != "" {
		if len(rev) > 12 {
			rev = rev[:12]
		}
		if dirty {
			rev += "-dirty"
		}
		v += " " + rev
	}
	s := fmt.Sprintf("%s (control protocol v%d, core messages v%d, plugin protocol v%d)",
		v, agent.ControlVersion, core.MessageVersion, sdk.ProtocolVersion)
	if knownunsafe.Compiled {
		s += " [kvfenceunsafe: known-unsafe cores selectable; not for production]"
	}
	return s
}
