package sdk

import (
	"bytes"
	"crypto/ed25519"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/kvfence/kvfence/errdefs"
)

// CertificateFile is the certificate a conformance run writes: the
// certificate's JSON exactly as signed, and an ed25519 signature over those
// bytes. Only the fields in CertificateClaims are enforced by hosts; the
// rest (link, kernel, checks) is for people.
type CertificateFile struct {
	Certificate json.RawMessage       `json:"certificate"`
	Signature   *CertificateSignature `json:"signature,omitempty"`
}

// CertificateSignature is an ed25519 signature and the public key that
// made it (base64, standard encoding). The key must also be trusted by
// whoever verifies: carrying it only says which one to look for.
type CertificateSignature struct {
	Algorithm string `json:"algorithm"`
	PublicKey string `json:"public_key"`
	Value     string `json:"value"`
}

// CertificateClaims are the fields a host enforces before loading a plugin.
type CertificateClaims struct {
	Certified bool `json:"certified"`
	Plugin    struct {
		Name   string `json:"name"`
		SHA256 string `json:"sha256"`
	} `json:"plugin"`
	SuiteVersion string `json:"suite_version"`
	Profile      string `json:"profile"`
	// ValidFrom and ValidUntil bound when the certificate may be used: a
	// host refuses one outside them, or without them (a certificate of
	// an older suite, which never expired).
	ValidFrom  time.Time `json:"valid_from"`
	ValidUntil time.Time `json:"valid_until"`
}

// CertifiableProfiles are the conformance profiles a certificate can be
// issued for (conformance.ProfileFull, ProfileGrantOnly). A host refuses
// any other, whatever its policy lists: a signed certificate for a
// profile the suite never certifies (initiator-only) was not made by a
// complete run.
var CertifiableProfiles = []string{"full", "grant-only"}

// CertificateValidity is how long a certificate the suite writes is valid
// from its run: a plugin is certified again against a newer suite and
// kernel at least this often.
const CertificateValidity = 180 * 24 * time.Hour

const sigAlgorithm = "ed25519"

// SignCertificate signs the certificate JSON cert with key. The signature
// covers the compact form of cert, so re-indenting the file (as writing it
// with json.MarshalIndent does) does not break it, and changing any value
// does.
func SignCertificate(cert []byte, key ed25519.PrivateKey) CertificateFile {
	pub := key.Public().(ed25519.PublicKey)
	cert = compact(cert)
	return CertificateFile{Certificate: cert, Signature: &CertificateSignature{Algorithm: sigAlgorithm,
		PublicKey: base64.StdEncoding.EncodeToString(pub), Value: base64.StdEncoding.EncodeToString(ed25519.Sign(key, cert))}}
}

// CertificatePolicy is what a certificate must satisfy for a host to load
// the plugin it names.
type CertificatePolicy struct {
	// TrustedKeys: the certificate must be signed by one of these.
	TrustedKeys []ed25519.PublicKey
	// SuiteVersions accepted (empty: any).
	SuiteVersions []string
	// Profiles accepted (empty: any certifiable profile). Only
	// CertifiableProfiles are ever accepted.
	Profiles []string
	// Now is the clock validity is checked against (nil: time.Now).
	Now func() time.Time
}

// Verify checks a certificate file against the policy and the sha256 of the
// exact binary about to run: a valid signature by a trusted key, certified,
// for this sha256, within its validity period, an accepted suite version
// and a certifiable, accepted profile. Every refusal is
// FailedPrecondition (InvalidArgument for a malformed file) and says why.
func (p CertificatePolicy) Verify(file []byte, binarySHA256 []byte) (CertificateClaims, error) {
	var cl CertificateClaims
	var f CertificateFile
	if err := json.Unmarshal(file, &f); err != nil || len(f.Certificate) == 0 {
		return cl, errdefs.Errorf(errdefs.InvalidArgument, "certificate: not a kvfence certificate file: %v", err)
	}
	if f.Signature == nil {
		return cl, errdefs.Errorf(errdefs.FailedPrecondition, "certificate: not signed")
	}
	if f.Signature.Algorithm != sigAlgorithm {
		return cl, errdefs.Errorf(errdefs.FailedPrecondition, "certificate: signature algorithm %q, want %s", f.Signature.Algorithm, sigAlgorithm)
	}
	pub, err1 := base64.StdEncoding.DecodeString(f.Signature.PublicKey)
	sig, err2 := base64.StdEncoding.DecodeString(f.Signature.Value)
	if err1 != nil || err2 != nil || len(pub) != ed25519.PublicKeySize {
		return cl, errdefs.Errorf(errdefs.InvalidArgument, "certificate: malformed signature")
	}
	if !slices.ContainsFunc(p.TrustedKeys, func(k ed25519.PublicKey) bool { return bytes.Equal(k, pub) }) {
		return cl, errdefs.Errorf(errdefs.FailedPrecondition, "certificate: signed by key %s, which is not trusted", f.Signature.PublicKey)
	}
	if !ed25519.Verify(pub, compact(f.Certificate), sig) {
		return cl, errdefs.Errorf(errdefs.FailedPrecondition, "certificate: signature does not verify (the certificate was altered)")
	}
	if err := json.Unmarshal(f.Certificate, &cl); err != nil {
		return cl, errdefs.Errorf(errdefs.InvalidArgument, "certificate: %v", err)
	}
	switch {
	case !cl.Certified:
		return cl, errdefs.Errorf(errdefs.FailedPrecondition, "certificate: the plugin was not certified")
	case cl.Plugin.SHA256 != hex.EncodeToString(binarySHA256):
		return cl, errdefs.Errorf(errdefs.FailedPrecondition, "certificate: it is for sha256 %s, the binary's is %x", cl.Plugin.SHA256, binarySHA256)
	case len(p.SuiteVersions) > 0 && !slices.Contains(p.SuiteVersions, cl.SuiteVersion):
		return cl, errdefs.Errorf(errdefs.FailedPrecondition, "certificate: suite version %q is not accepted (want one of %v)", cl.SuiteVersion, p.SuiteVersions)
	case !slices.Contains(CertifiableProfiles, cl.Profile):
		return cl, errdefs.Errorf(errdefs.FailedPrecondition, "certificate: profile %q is never certifiable (want one of %v)", cl.Profile, CertifiableProfiles)
	case len(p.Profiles) > 0 && !slices.Contains(p.Profiles, cl.Profile):
		return cl, errdefs.Errorf(errdefs.FailedPrecondition, "certificate: profile %q is not accepted (want one of %v)", cl.Profile, p.Profiles)
	}
	return cl, p.checkValidity(cl)
}

// checkValidity refuses a certificate without a validity period, not yet
// valid, or expired.
func (p CertificatePolicy) checkValidity(cl CertificateClaims) error {
	now := time.Now()
	if p.Now != nil {
		now = p.Now()
	}
	switch {
	case cl.ValidFrom.IsZero() || cl.ValidUntil.IsZero():
		return errdefs.Errorf(errdefs.FailedPrecondition, "certificate: no validity period (valid_from, valid_until): certify the plugin again")
	case !cl.ValidUntil.After(cl.ValidFrom):
		return errdefs.Errorf(errdefs.FailedPrecondition, "certificate: validity period ends (%s) before it starts (%s)", cl.ValidUntil.Format(time.RFC3339), cl.ValidFrom.Format(time.RFC3339))
	case now.Before(cl.ValidFrom):
		return errdefs.Errorf(errdefs.FailedPrecondition, "certificate: not valid before %s (now %s)", cl.ValidFrom.Format(time.RFC3339), now.Format(time.RFC3339))
	case now.After(cl.ValidUntil):
		return errdefs.Errorf(errdefs.FailedPrecondition, "certificate: expired at %s (now %s): certify the plugin again", cl.ValidUntil.Format(time.RFC3339), now.Format(time.RFC3339))
	}
	return nil
}

// GenerateSigningKey makes an ed25519 key pair as PEM (PKCS#8 private key,
// PKIX public key), the formats LoadPrivateKey and LoadPublicKey read and
// `openssl genpkey -algorithm ed25519` writes.
func GenerateSigningKey() (private, public []byte, err error) {
	pub, priv, err := ed25519.GenerateKey(nil)
	if err != nil {
		return nil, nil, err
	}
	p8, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return nil, nil, err
	}
	px, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: p8}), pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: px}), nil
}

// LoadPrivateKey reads an ed25519 private key (PEM, PKCS#8).
func LoadPrivateKey(path string) (ed25519.PrivateKey, error) {
	der, err := readPEM(path, "PRIVATE KEY")
	if err != nil {
		return nil, err
	}
	k, err := x509.ParsePKCS8PrivateKey(der)
	if err != nil {
		return nil, errdefs.Errorf(errdefs.InvalidArgument, "%s: %v", path, err)
	}
	ek, ok := k.(ed25519.PrivateKey)
	if !ok {
		return nil, errdefs.Errorf(errdefs.InvalidArgument, "%s: a %T, want an ed25519 key", path, k)
	}
	return ek, nil
}

// LoadPublicKey reads an ed25519 public key (PEM, PKIX).
func LoadPublicKey(path string) (ed25519.PublicKey, error) {
	der, err := readPEM(path, "PUBLIC KEY")
	if err != nil {
		return nil, err
	}
	k, err := x509.ParsePKIXPublicKey(der)
	if err != nil {
		return nil, errdefs.Errorf(errdefs.InvalidArgument, "%s: %v", path, err)
	}
	ek, ok := k.(ed25519.PublicKey)
	if !ok {
		return nil, errdefs.Errorf(errdefs.InvalidArgument, "%s: a %T, want an ed25519 key", path, k)
	}
	return ek, nil
}

func readPEM(path, typ string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, errdefs.Errorf(errdefs.NotFound, "%v", err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil || blk.Type != typ {
		return nil, errdefs.Errorf(errdefs.InvalidArgument, "%s: want a PEM %q block", path, typ)
	}
	return blk.Bytes, nil
}

// compact is JSON without insignificant whitespace (invalid JSON is
// returned unchanged, and then fails to verify or to parse).
func compact(b []byte) []byte {
	var buf bytes.Buffer
	if err := json.Compact(&buf, b); err != nil {
		return b
	}
	return buf.Bytes()
}

// String is a one-line summary for logs.
func (c CertificateClaims) String() string {
	return fmt.Sprintf("%s sha256 %s, profile %s, suite %s", c.Plugin.Name, c.Plugin.SHA256, c.Profile, c.SuiteVersion)
}
