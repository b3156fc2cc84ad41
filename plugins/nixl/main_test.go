package nixl_test

import (
	"errors"
	"fmt"
	"os"
	"testing"

	"github.com/kvfence/kvfence/plugins/internal/dl/dltest"
	"github.com/kvfence/kvfence/sdk/sdktest"
)

// Built once per run from the current source: the plugin, its broken
// variant, and the fake libnixl_capi.so (see testdata).
var (
	pluginBin, unsafeBin string
	fakeLib, brokeLib    string
	noCompiler           bool
)

const (
	pluginPkg = "github.com/kvfence/kvfence/plugins/nixl/cmd/kvfence-plugin-nixl"
	fakeSrc   = "testdata/fake_nixl_capi.c"
	wireDir   = "../internal/nocancel/testdata"
)

func fakeArgs(extra ...string) []string {
	return append([]string{"-I" + wireDir, fakeSrc, wireDir + "/fakewire.c"}, extra...)
}

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "kvfence-nixl-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := 1
	if err = build(dir); errors.Is(err, dltest.ErrNoCompiler) {
		noCompiler, err = true, nil
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
	if fakeLib, err = dltest.Build(dir, "libfake_nixl_capi.so", fakeArgs()...); err != nil {
		return err
	}
	brokeLib, err = dltest.Build(dir, "libfake_nixl_nostatus.so", fakeArgs("-DFAKE_NO_STATUS")...)
	return err
}

func needFakes(t *testing.T) {
	if noCompiler {
		t.Skip(dltest.ErrNoCompiler)
	}
}
