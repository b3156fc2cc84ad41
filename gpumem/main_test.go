package gpumem

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// fakeLib is the fake driver built by TestMain (testdata/fakecuda.c), or ""
// when gcc is missing (the fake-driver tests then fail, not skip: CI has gcc).
var fakeLib, testDir, pluginBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "kvfence-gpumem-test-")
	if err != nil {
		panic(err)
	}
	testDir = dir
	fakeLib = filepath.Join(dir, "libfakecuda.so")
	if out, err := exec.Command("gcc", "-Wall", "-shared", "-fPIC", "-O1", "-pthread", "-o", fakeLib, "testdata/fakecuda.c").CombinedOutput(); err != nil {
		os.Stderr.Write(out)
		panic("building the fake CUDA driver: " + err.Error())
	}
	pluginBin = filepath.Join(dir, "kvfence-plugin-tcp")
	if out, err := exec.Command("go", "build", "-o", pluginBin, "../plugins/tcp/cmd/kvfence-plugin-tcp").CombinedOutput(); err != nil {
		os.Stderr.Write(out)
		panic(err)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// openFake opens a Device on the fake driver with small chunks.
func openFake(t testing.TB, o Options) *Device {
	t.Helper()
	o.Library = fakeLib
	d, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	return d
}
