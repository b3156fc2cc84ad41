package gpumem

import (
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// fakeLib is the fake driver built by TestMain (testdata/fakecuda.c), or ""
// when gcc is missing (the fake-driver tests then fail, not skip: CI has gcc).
var fakeLib, testDir, pluginBin string

// realDriver (make gpu-check) runs the driver-neutral tests against a real
// driver library instead of the fake; fake-only tests skip.
var realDriver = flag.String("gpumem.driver", "", "run the tests against this CUDA driver library instead of the fake (make gpu-check)")

func TestMain(m *testing.M) {
	flag.Parse()
	if os.Getenv(directChildEnv) != "" {
		os.Exit(m.Run()) // a plugin-side child of a direct-mode test: nothing to build
	}
	dir, err := os.MkdirTemp("", "kvfence-gpumem-test-")
	if err != nil {
		panic(err)
	}
	testDir = dir
	fakeLib = filepath.Join(dir, "libfakecuda.so")
	if *realDriver != "" {
		fakeLib = *realDriver
	} else if out, err := exec.Command("gcc", "-Wall", "-shared", "-fPIC", "-O1", "-pthread", "-o", fakeLib, "testdata/fakecuda.c").CombinedOutput(); err != nil {
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

// fakeOnly skips a test that checks the fake driver's own behaviour.
func fakeOnly(t *testing.T) {
	if *realDriver != "" {
		t.Skip("checks the fake driver (running against " + *realDriver + ")")
	}
}
