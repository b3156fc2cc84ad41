package nocanceltest

import (
	"errors"
	"fmt"
	"os"
	"testing"

	"github.com/kvfence/kvfence/plugins/kit/dl/dltest"
	"github.com/kvfence/kvfence/sdk/sdktest"
)

// Main is a vendor plugin package's TestMain: build (into a temporary
// directory) the plugin binaries and fake libraries, run the tests, clean
// up, exit. Without a C compiler the tests still run and *noCompiler says
// so (NeedFakes skips those that need a fake).
func Main(m *testing.M, name string, build func(dir string) error, noCompiler *bool) {
	dir, err := os.MkdirTemp("", "kvfence-"+name+"-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := 1
	if err = build(dir); errors.Is(err, dltest.ErrNoCompiler) {
		*noCompiler, err = true, nil
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
	} else {
		code = m.Run()
	}
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// BuildPlugins builds the plugin at pkg and its deliberately broken
// variant (-tags kvfenceunsafe) into dir.
func BuildPlugins(dir, pkg string) (plugin, unsafe string, err error) {
	if plugin, err = sdktest.BuildPlugin(dir, pkg); err != nil {
		return "", "", err
	}
	unsafe, err = sdktest.BuildPlugin(dir, pkg, "kvfenceunsafe")
	return plugin, unsafe, err
}
