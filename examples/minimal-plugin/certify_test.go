package main

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/kvfence/kvfence/conformance"
	"github.com/kvfence/kvfence/sdk/sdktest"
)

// The example must pass the conformance suite: the guide's promise that it
// is a certified plugin is checked on every test run.
func TestExampleIsCertified(t *testing.T) {
	// A full certification (about a minute under -race).
	if os.Getenv("KVFENCE_TEST_QUICK") != "" {
		t.Skip("long test: make test-long runs it")
	}
	dir := t.TempDir()
	bin, err := sdktest.BuildPlugin(dir, "github.com/kvfence/kvfence/examples/minimal-plugin")
	if err != nil {
		t.Fatal(err)
	}
	r := conformance.Run(t, conformance.Config{
		Plugin:            bin,
		Env:               []string{"KVFENCE_EXAMPLE_TTL=1s"},
		MaxWriteSize:      1 << 20,
		GuardWindow:       500 * time.Millisecond,
		CompletionTimeout: 10 * time.Second,
		Repeat:            5,
		PerfBytes:         8 << 20,
	})
	if !r.Passed {
		t.Fatalf("the example failed certification:\n%s", strings.Join(r.Failures(), "\n"))
	}
	if c := r.Certificate(); !c.Certified {
		t.Fatalf("no certificate: %+v", c)
	}
	out := t.TempDir()
	if err := conformance.Write(out, r); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(out + "/" + conformance.FileCertificate); err != nil {
		t.Fatal(err)
	}
}
