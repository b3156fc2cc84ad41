package demo

import (
	"crypto/tls"

	"github.com/kvfence/kvfence/agent"
	"github.com/kvfence/kvfence/internal/demo/pki"
)

// WriteThrowawayPKI makes a fresh CA and one certificate per identity
// (agent.IdentityName: router, decode-0, prefill-1, ...) in dir, for one
// demo run on loopback (package pki).
func WriteThrowawayPKI(dir string, names []string) error {
	return pki.WriteThrowaway(dir, names, agent.ServerName)
}

// LoadTLS loads identity name from dir (see WriteThrowawayPKI) as a config
// for both sides of mutual TLS.
func LoadTLS(dir, name string) (*tls.Config, error) { return pki.Load(dir, name, agent.ServerName) }
