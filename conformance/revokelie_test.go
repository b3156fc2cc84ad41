package conformance_test

import (
	"context"
	"strings"
	"testing"

	"github.com/kvfence/kvfence/conformance"
)

// Issue 23 item 4: a plugin whose Revoke lies (it returns, and writes under
// the key still apply) breaks the revocation promise, and the report must
// say so — not that it broke Succeeded, whose bytes were there. Before,
// remote-refusals/revoked-key reported this variant as breaking "Succeeded
// means every byte landed". Run on the groups that write under a revoked
// key (without the handshake's claim check, which catches the same variant
// first in a full run).
func TestLyingRevokeBreaksRevokePromise(t *testing.T) {
	cfg := testConfig(unsafeBin, "KVFENCE_TCP_UNSAFE=apply-after-revoke")
	cfg.Groups = []string{"revocation", "remote-refusals"}
	r := conformance.Certify(context.Background(), cfg)
	for _, f := range r.Failures() {
		t.Log(f)
	}
	if r.Passed {
		t.Fatalf("a Revoke that revokes nothing passed the revocation group:\n%s", r.Markdown())
	}
	broken := r.BrokenPromises()
	if !broken[conformance.PromiseRevoke] {
		t.Fatalf("the lying Revoke is not reported as breaking %q (broken: %v):\n%s", conformance.PromiseRevoke, broken, strings.Join(r.Failures(), "\n"))
	}
	if broken[conformance.PromiseSucceeded] {
		t.Errorf("the lying Revoke is reported as breaking %q too: its Succeeded writes did land", conformance.PromiseSucceeded)
	}
	if got := failed(r, "remote-refusals/revoked-key"); !strings.Contains(got, conformance.PromiseRevoke) {
		t.Errorf("remote-refusals/revoked-key: %q, want it to name %q", got, conformance.PromiseRevoke)
	}
}

// failed is check's failure line ("" if it did not fail).
func failed(r *conformance.Report, check string) string {
	for _, f := range r.Failures() {
		if strings.HasPrefix(f, check+":") {
			return f
		}
	}
	return ""
}
