package main

// #include "abi.h"
import "C"

import (
	"fmt"
	"runtime/debug"

	"github.com/kvfence/kvfence/agent"
	"github.com/kvfence/kvfence/core"
	"github.com/kvfence/kvfence/sdk"
)

func main() {}

// versionC is built once and never freed: kvfence_version returns it.
var versionC = C.CString(versionString())

// versionString names the build and the protocol versions it speaks, so two
// processes can tell whether they can talk before they try.
func versionString() string {
	rev := "devel"
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 {
				rev = s.Value[:12]
			}
		}
	}
	return fmt.Sprintf("kvfence %s (control v%d, message v%d, transport v%d)", rev, agent.ControlVersion, core.MessageVersion, sdk.ProtocolVersion)
}

// kvfence_version is the library's version string (static; do not free).
//
//export kvfence_version
func kvfence_version() *C.char { return versionC }
