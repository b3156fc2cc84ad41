package nixl_test

import (
	"testing"

	"github.com/kvfence/kvfence/plugins/kit/dl/dltest"
	"github.com/kvfence/kvfence/plugins/kit/nocancel/nocanceltest"
)

// Built once per run from the current source: the plugin, its broken
// variant, and the fake libnixl_capi.so (see testdata).
var (
	pluginBin, unsafeBin string
	fakeLib, brokeLib    string
	v01Lib, v02Lib       string
	noCompiler           bool
)

const (
	pluginPkg = "github.com/kvfence/kvfence/plugins/nixl/cmd/kvfence-plugin-nixl"
	fakeSrc   = "testdata/fake_nixl_capi.c"
	wireDir   = "../kit/nocancel/testdata"
)

func fakeArgs(extra ...string) []string {
	return append([]string{"-I" + wireDir, fakeSrc, wireDir + "/fakewire.c"}, extra...)
}

func TestMain(m *testing.M) { nocanceltest.Main(m, "nixl", build, &noCompiler) }

func build(dir string) (err error) {
	if pluginBin, unsafeBin, err = nocanceltest.BuildPlugins(dir, pluginPkg); err != nil {
		return err
	}
	if fakeLib, err = dltest.Build(dir, "libfake_nixl_capi.so", fakeArgs()...); err != nil {
		return err
	}
	if v01Lib, err = dltest.Build(dir, "libfake_nixl_v01.so", fakeArgs("-DFAKE_CAPI_V01")...); err != nil {
		return err
	}
	if v02Lib, err = dltest.Build(dir, "libfake_nixl_v02.so", fakeArgs("-DFAKE_CAPI_V01", "-DFAKE_CAPI_MINOR=2")...); err != nil {
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
