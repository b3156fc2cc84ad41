package unsafecore

import (
	"os/exec"
	"strings"
	"testing"

	ku "github.com/kvfence/kvfence/core/knownunsafe"
)

const self = "github.com/kvfence/kvfence/internal/unsafecore"

// runtimeBuild is what an engine loads or runs: the shared library, the
// runtime, the core and every plugin binary.
var runtimeBuild = []string{"./cmd/libkvfence", "./agent", "./core", "./plugins/..."}

// deps lists the packages a build of pkgs links (tests excluded), with
// extra go list flags.
func deps(t *testing.T, flags []string, pkgs ...string) map[string]bool {
	t.Helper()
	args := append(append([]string{"list", "-deps", "-f", "{{.ImportPath}}"}, flags...), pkgs...)
	cmd := exec.Command("go", args...)
	cmd.Dir = "../.." // the module root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go %s: %v", strings.Join(args, " "), err)
	}
	set := map[string]bool{}
	for _, p := range strings.Fields(string(out)) {
		set[p] = true
	}
	return set
}

// A default build of the runtime holds no unsafe policy: no package of it
// links this one. The control arms show the check can fail: the
// simulation and a -tags kvfenceunsafe agent do link it.
func TestDefaultBuildHoldsNoUnsafePolicy(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go command on PATH")
	}
	if deps(t, nil, runtimeBuild...)[self] {
		t.Errorf("a default build of %v links %s", runtimeBuild, self)
	}
	if !deps(t, nil, "./core/sim")[self] {
		t.Errorf("control arm: core/sim does not link %s", self)
	}
	if !deps(t, []string{"-tags", "kvfenceunsafe"}, "./agent", "./cmd/libkvfence")[self] {
		t.Errorf("control arm: a -tags kvfenceunsafe agent does not link %s", self)
	}
}

// Every known-unsafe variant has its policy here, and the self-renewed
// lease travels from the variant into its policy.
func TestEveryVariantRegistered(t *testing.T) {
	if !Linked() {
		t.Fatal("a known-unsafe variant has no policy")
	}
	if d := ku.SelfRenewedLease.WithSelfLease(7).Policy().SelfLease(); d != 7 {
		t.Fatalf("self-renewed lease: policy gives %v, want 7ns", d)
	}
	if ku.Safe.Policy() != nil {
		t.Fatal("Safe has a registered policy; the core uses its own")
	}
}
