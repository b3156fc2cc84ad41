package mooncake_test

import (
	"testing"

	"github.com/kvfence/kvfence/plugins/kit/dl/dltest"
	"github.com/kvfence/kvfence/plugins/kit/nocancel/nocanceltest"
)

// Built once per test run from the current source: the plugin, its
// deliberately broken variant, and the fake libraries (see testdata).
var (
	pluginBin, unsafeBin      string
	fakeLib, oldLib, brokeLib string
	legacyLib                 string
	noCompiler                bool
)

const (
	pluginPkg = "github.com/kvfence/kvfence/plugins/mooncake/cmd/kvfence-plugin-mooncake"
	fakeSrc   = "testdata/fake_transfer_engine.c"
	wireDir   = "../kit/nocancel/testdata"
)

// fakeArgs are gcc's inputs for the fake library plus extra flags.
func fakeArgs(extra ...string) []string {
	return append([]string{"-I" + wireDir, fakeSrc, wireDir + "/fakewire.c"}, extra...)
}

func TestMain(m *testing.M) { nocanceltest.Main(m, "mooncake", build, &noCompiler) }

func build(dir string) (err error) {
	if pluginBin, unsafeBin, err = nocanceltest.BuildPlugins(dir, pluginPkg); err != nil {
		return err
	}
	if fakeLib, err = dltest.Build(dir, "libfake_transfer_engine.so", fakeArgs()...); err != nil {
		return err
	}
	if oldLib, err = dltest.Build(dir, "libfake_old.so", fakeArgs("-DFAKE_OLD_API")...); err != nil {
		return err
	}
	if legacyLib, err = dltest.Build(dir, "libfake_legacy.so", fakeArgs("-DFAKE_LEGACY")...); err != nil {
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
