package tcp

import (
	"fmt"
	"os"
	"testing"

	"github.com/kvfence/kvfence/sdk/sdktest"
)

// Plugin binaries built from the current source by TestMain: the normal one
// and the kvfenceunsafe build that can select a known-unsafe variant.
var pluginBin, unsafePluginBin string

const pluginPkg = "github.com/kvfence/kvfence/plugins/tcp/cmd/kvfence-plugin-tcp"

func TestMain(m *testing.M) {
	if os.Getenv(roleEnv) == roleHost {
		runAsHost() // helper process for TestPluginExitsWhenHostDies
		return
	}
	dir, err := os.MkdirTemp("", "kvfence-tcp-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := 1
	if pluginBin, err = sdktest.BuildPlugin(dir, pluginPkg); err != nil {
		fmt.Fprintln(os.Stderr, "build plugin:", err)
	} else if unsafePluginBin, err = sdktest.BuildPlugin(dir, pluginPkg, "kvfenceunsafe"); err != nil {
		fmt.Fprintln(os.Stderr, "build unsafe plugin:", err)
	} else {
		code = m.Run()
	}
	_ = os.RemoveAll(dir)
	os.Exit(code)
}
