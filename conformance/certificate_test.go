package conformance_test

import (
	"context"
	"crypto/ed25519"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvfence/kvfence/conformance"
	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/sdk"
)

// A configuration the suite cannot honour is refused before any process
// starts: the report has only the reason, and no certificate.
func TestInvalidConfigurationRefusedUpFront(t *testing.T) {
	for name, mut := range map[string]func(*conformance.Config){
		"unknown group":                func(c *conformance.Config) { c.Groups = []string{"nosuch"} },
		"bogus proxy":                  func(c *conformance.Config) { c.Proxy = "bogus" },
		"env without =":                func(c *conformance.Config) { c.Env = []string{"FOO"} },
		"negative guard":               func(c *conformance.Config) { c.GuardWindow = -1 },
		"write size too small":         func(c *conformance.Config) { c.MaxWriteSize = 1 },
		"no such plugin":               func(c *conformance.Config) { c.Plugin = "/nonexistent/plugin" },
		"two hosts, no target command": func(c *conformance.Config) { c.TwoHost = true },
		"two hosts with the proxy": func(c *conformance.Config) {
			c.TwoHost, c.TargetCommand, c.Proxy = true, []string{"/bin/false"}, "on"
		},
		"two hosts with netem devices": func(c *conformance.Config) {
			c.TwoHost, c.TargetCommand, c.NetemDevices = true, []string{"/bin/false"}, []string{"eth0"}
		},
	} {
		t.Run(name, func(t *testing.T) {
			cfg := testConfig(pluginBin)
			mut(&cfg)
			r := conformance.Certify(context.Background(), cfg)
			if r.Passed || r.Certified || !strings.Contains(r.Setup, "invalid configuration") || len(r.Groups) != 0 {
				t.Fatalf("report: passed %v certified %v setup %q groups %d", r.Passed, r.Certified, r.Setup, len(r.Groups))
			}
		})
	}
}

// A run restricted to some groups passes what it ran, is partial, lists
// what it skipped, and writes no certificate (removing a stale one).
func TestRestrictedRunIsPartial(t *testing.T) {
	cfg := testConfig(pluginBin)
	cfg.Groups = []string{"handshake"}
	r := conformance.Certify(context.Background(), cfg)
	if !r.Passed || !r.Partial || r.Certified || len(r.Skipped) == 0 {
		t.Fatalf("passed %v partial %v certified %v skipped %d: %v", r.Passed, r.Partial, r.Certified, len(r.Skipped), r.Failures())
	}
	dir := t.TempDir()
	stale := filepath.Join(dir, conformance.FileCertificate)
	if err := os.WriteFile(stale, []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := conformance.Write(dir, r); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Fatalf("a partial run left a certificate: %v", err)
	}
	if md, _ := os.ReadFile(filepath.Join(dir, conformance.FileMarkdown)); !strings.Contains(string(md), "Partial run") {
		t.Errorf("the summary does not say the run was partial")
	}
}

// A signed certificate, as written, verifies for the binary it names and
// for no other.
func TestSignedCertificateVerifies(t *testing.T) {
	pub, key, _ := ed25519.GenerateKey(nil)
	sum, err := sdk.FileSHA256(pluginBin)
	if err != nil {
		t.Fatal(err)
	}
	r := &conformance.Report{SuiteVersion: conformance.SuiteVersion, Profile: conformance.ProfileFull, Passed: true, Certified: true, Date: time.Now().UTC()}
	r.Plugin.SHA256 = hex.EncodeToString(sum)
	dir := t.TempDir()
	if err := conformance.WriteSigned(dir, r, key); err != nil {
		t.Fatal(err)
	}
	file, err := os.ReadFile(filepath.Join(dir, conformance.FileCertificate))
	if err != nil {
		t.Fatal(err)
	}
	pol := sdk.CertificatePolicy{TrustedKeys: []ed25519.PublicKey{pub}, SuiteVersions: []string{conformance.SuiteVersion}, Profiles: []string{conformance.ProfileFull}}
	if _, err := pol.Verify(file, sum); err != nil {
		t.Fatalf("the certificate as written does not verify: %v", err)
	}
	// Valid for sdk.CertificateValidity from the run, not after.
	later := pol
	later.Now = func() time.Time { return r.Date.Add(sdk.CertificateValidity + time.Hour) }
	if _, err := later.Verify(file, sum); !errdefs.Is(err, errdefs.FailedPrecondition) || !strings.Contains(err.Error(), "expired") {
		t.Fatalf("verified after its validity period: %v", err)
	}
	other := append([]byte(nil), sum...)
	other[0] ^= 1
	if _, err := pol.Verify(file, other); !errdefs.Is(err, errdefs.FailedPrecondition) {
		t.Fatalf("verified for another binary: %v", err)
	}
}
