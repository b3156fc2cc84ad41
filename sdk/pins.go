package sdk

import (
	"crypto/ed25519"
	"encoding/hex"
	"os"

	"github.com/kvfence/kvfence/errdefs"
)

// PluginPins is how a host configures trust in a plugin binary from flags
// or a file: a pinned sha256, and/or a conformance certificate that must be
// valid, signed by a trusted key, for the exact binary that runs. Apply
// turns it into OpenOptions; Open then executes a sealed copy of the file
// it hashed.
type PluginPins struct {
	SHA256             string   // hex; empty: not pinned
	Certificate        string   // path of a certificate file
	TrustedKeys        []string // paths of ed25519 public keys (PEM)
	RequireCertificate bool
	SuiteVersions      []string // accepted suite versions (empty: any)
	Profiles           []string // accepted profiles (empty: any)
}

// Apply loads what the pins name into opts. It refuses inconsistent pins
// (a required certificate without trusted keys or a certificate file) with
// InvalidArgument, before any plugin starts.
func (p PluginPins) Apply(opts *OpenOptions) error {
	if p.SHA256 != "" {
		sum, err := hex.DecodeString(p.SHA256)
		if err != nil || len(sum) != 32 {
			return errdefs.Errorf(errdefs.InvalidArgument, "plugin sha256 %q: want 64 hex digits", p.SHA256)
		}
		opts.SHA256 = sum
	}
	if !p.RequireCertificate {
		if p.Certificate != "" || len(p.TrustedKeys) > 0 {
			return errdefs.Errorf(errdefs.InvalidArgument, "a plugin certificate or trusted keys were given without requiring a certificate")
		}
		return nil
	}
	if len(p.TrustedKeys) == 0 || p.Certificate == "" {
		return errdefs.Errorf(errdefs.InvalidArgument, "requiring a plugin certificate needs the certificate file and at least one trusted key")
	}
	pol := &CertificatePolicy{SuiteVersions: p.SuiteVersions, Profiles: p.Profiles}
	for _, path := range p.TrustedKeys {
		k, err := LoadPublicKey(path)
		if err != nil {
			return err
		}
		pol.TrustedKeys = append(pol.TrustedKeys, ed25519.PublicKey(k))
	}
	cert, err := os.ReadFile(p.Certificate)
	if err != nil {
		return errdefs.Errorf(errdefs.NotFound, "plugin certificate: %v", err)
	}
	opts.CertificatePolicy, opts.Certificate = pol, cert
	return nil
}
