package mooncake_test

import (
	"errors"
	"fmt"
	"os"
	"testing"

	"github.com/kvfence/kvfence/plugins/internal/dl/dltest"
	"github.com/kvfence/kvfence/sdk/sdktest"
)

// Built once per test run from the current source: the plugin, its
// deliberately broken variant, and the fake libraries (see testdata).
var (
	pluginBin, unsafeBin      string
	fakeLib, oldLib, brokeLib string
	noCompiler                bool
)

const (
	pluginPkg = "github.com/kvfence/kvfence/plugins/mooncake/cmd/kvfence-plugin-mooncake"
	fakeSrc   = "testdata/fake_transfer_engine.c"
	wireDir   = "../internal/nocancel/testdata"
)

// fakeArgs are gcc's inputs for the fake library plus extra flags.
func fakeArgs(extra ...string) []string {
	return append([]string{"-I" + wireDir, fakeSrc, wireDir + "/fakewire.c"}, extra...)
}

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "kvfence-mooncake-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := 1
	if err = build(dir); errors.Is(err, dltest.ErrNoCompiler) {
		noCompiler = true
		err = nil
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
	} else {
		code = m.Run()
	}
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

func build(dir string) (err error) {
	if pluginBin, err = sdktest.BuildPlugin(dir, pluginPkg); err != nil {
		return err
	}
	if unsafeBin, err = sdktest.BuildPlugin(dir, pluginPkg, "kvfenceunsafe"); err != nil {
		return err
	}
	if fakeLib, err = dltest.Build(dir, "libfake_transfer_engine.so", fakeArgs()...); err != nil {
		return err
	}
	if oldLib, err = dltest.Build(dir, "libfake_old.so", fakeArgs("-DFAKE_OLD_API")...); err != nil {
		return err
	}
	brokeLib, err = dltest.Build(dir, "libfake_nosubmit.so", fakeArgs("-DFAKE_NO_SUBMIT")...)
	return err
}

func needFakes(t *testing.T) {
	if noCompiler {
		t.Skip(dltest.ErrNoCompiler)
	}
}
