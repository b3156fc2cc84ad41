package tcp

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"errors"
	"fmt"
	"math/big"
	"strings"
	"time"
)

// This file: who is at the other end of a data connection. Every transport
// instance makes one ephemeral key pair and self-signed certificate when it
// starts (the private key never leaves the process) and is known to its
// peers by the SHA-256 of that certificate, its fingerprint. The fingerprint
// travels inside the endpoint address ("127.0.0.1:40123#sha256=<hex>"),
// which hosts exchange over their own authenticated control plane (the
// kvfence agents' is mutual TLS): so an initiator that Connects to an
// address knows whom it must reach, and a target told Window.Writer knows
// which writer a key is for. Connections are TLS 1.3 both ways with those
// certificates: the initiator refuses a receiver whose certificate is not
// the pinned one; the receiver accepts any client certificate (it cannot
// know its writers in advance) but records the client's fingerprint, proven
// by the handshake, and binds the session, its Quiesce and writer-bound keys
// to it.

// pinPrefix separates host:port from the fingerprint in an endpoint
// address. It contains no ':' so net.SplitHostPort still splits the address
// (the fingerprint stays with the port).
const pinPrefix = "#sha256="

// fingerprint is the SHA-256 of a DER certificate. The zero value is "no
// identity" (the known-unsafe cleartext variant).
type fingerprint [sha256.Size]byte

func fingerprintOf(der []byte) fingerprint { return sha256.Sum256(der) }

func (f fingerprint) String() string { return hex.EncodeToString(f[:]) }

func (f fingerprint) equal(g fingerprint) bool { return subtle.ConstantTimeCompare(f[:], g[:]) == 1 }

// pinnedAddress is addr with fp appended.
func pinnedAddress(addr string, fp fingerprint) string { return addr + pinPrefix + fp.String() }

// splitPin splits an endpoint address into the host:port to dial and its
// fingerprint. ok is false when the address names none.
func splitPin(addr string) (hostPort string, fp fingerprint, ok bool, err error) {
	hostPort, pin, found := strings.Cut(addr, pinPrefix)
	if !found {
		if strings.Contains(addr, "#") {
			return "", fp, false, fmt.Errorf("address %q: unknown suffix (want %s<64 hex digits>)", addr, pinPrefix)
		}
		return addr, fp, false, nil
	}
	b, err := hex.DecodeString(pin)
	if err != nil || len(b) != len(fp) {
		return "", fp, false, fmt.Errorf("address %q: fingerprint is not %d hex digits", addr, 2*len(fp))
	}
	copy(fp[:], b)
	return hostPort, fp, true, nil
}

// identity is this process's certificate.
type identity struct {
	cert tls.Certificate
	fp   fingerprint
}

// newIdentity makes a fresh P-256 key and a self-signed certificate for it.
// Its validity window is wide on purpose: peers pin the fingerprint, not a
// chain or a clock, and the key dies with the process.
func newIdentity() (*identity, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: "kvfence-tcp ephemeral"},
		NotBefore:    now.Add(-24 * time.Hour),
		NotAfter:     now.Add(100 * 365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	return &identity{cert: tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, fp: fingerprintOf(der)}, nil
}

var errNoPeerCert = errors.New("peer presented no certificate")

// peerFingerprint is the fingerprint of the certificate the handshake
// proved the peer holds the key of.
func peerFingerprint(cs tls.ConnectionState) (fingerprint, error) {
	if len(cs.PeerCertificates) == 0 {
		return fingerprint{}, errNoPeerCert
	}
	return fingerprintOf(cs.PeerCertificates[0].Raw), nil
}

// serverTLS: TLS 1.3 only, a client certificate required (any: the
// receiver binds what it proves, see above), no session tickets (every
// connection proves its key afresh).
func (id *identity) serverTLS() *tls.Config {
	return &tls.Config{
		MinVersion:             tls.VersionTLS13,
		Certificates:           []tls.Certificate{id.cert},
		ClientAuth:             tls.RequireAnyClientCert,
		SessionTicketsDisabled: true,
		// Bulk transfer: full 16 KiB records from the first byte.
		DynamicRecordSizingDisabled: true,
	}
}

// clientTLS: TLS 1.3 only, our certificate as the client's, and the
// receiver's certificate must be exactly the pinned one. Chain and name
// checks are replaced by the pin (InsecureSkipVerify turns off only those;
// the handshake still proves the receiver holds the pinned key).
func (id *identity) clientTLS(want fingerprint) *tls.Config {
	return &tls.Config{
		MinVersion:         tls.VersionTLS13,
		Certificates:       []tls.Certificate{id.cert},
		InsecureSkipVerify: true, //nolint:gosec // replaced by the fingerprint pin below
		ServerName:         "kvfence-tcp",
		// Bulk transfer: full 16 KiB records from the first byte.
		DynamicRecordSizingDisabled: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			got, err := peerFingerprint(cs)
			if err != nil {
				return err
			}
			if !got.equal(want) {
				return fmt.Errorf("receiver certificate %s is not the pinned %s", got, want)
			}
			return nil
		},
	}
}
