package mori_test

import (
	"testing"

	"github.com/kvfence/kvfence/plugins/kit/dl/dltest"
	"github.com/kvfence/kvfence/plugins/kit/nocancel/nocanceltest"
)

// Built once per run: the plugin, its broken variant, and fakes of
// kvfence's MORI shim interface (testdata; no MORI anywhere).
var (
	pluginBin, unsafeBin string
	fakeShim, oldShim    string
	noCompiler           bool
)

const (
	pluginPkg = "github.com/kvfence/kvfence/plugins/mori/cmd/kvfence-plugin-mori"
	fakeSrc   = "testdata/fake_mori_shim.c"
	wireDir   = "../kit/nocancel/testdata"
)

func fakeArgs(extra ...string) []string {
	return append([]string{"-I" + wireDir, "-Ishim", fakeSrc, wireDir + "/fakewire.c"}, extra...)
}

func TestMain(m *testing.M) { nocanceltest.Main(m, "mori", build, &noCompiler) }

func build(dir string) (err error) {
	if pluginBin, unsafeBin, err = nocanceltest.BuildPlugins(dir, pluginPkg); err != nil {
		return err
	}
	if fakeShim, err = dltest.Build(dir, "libfake_mori_shim.so", fakeArgs()...); err != nil {
		return err
	}
	oldShim, err = dltest.Build(dir, "libfake_mori_shim_abi0.so", fakeArgs("-DFAKE_ABI=0")...)
	return err
}

func needFakes(t *testing.T) {
	if noCompiler {
		t.Skip(dltest.ErrNoCompiler)
	}
}
