package agent

import (
	"crypto/tls"
	"fmt"
	"sync/atomic"

	"github.com/kvfence/kvfence/errdefs"
)

// ServerName is the name every agent's certificate carries (as a DNS SAN),
// so that a client verifies the chain against the deployment's CA without
// per-host names. Which role and rank a peer is comes from its
// certificate's common name (IdentityName), and is checked both ways: the
// acceptor checks the client's against its Hello, and the dialler checks
// the server's against the peer it meant to reach.
const ServerName = "kvfence-agent"

// identity is a role and rank: whom a link's far end must be.
type identity struct {
	Role Role
	Rank uint32
}

func (id identity) String() string { return IdentityName(id.Role, id.Rank) }

// IdentityName is the certificate common name of a role and rank.
func IdentityName(role Role, rank uint32) string {
	if role == RoleRouter {
		return "router"
	}
	return fmt.Sprintf("%s-%d", role, rank)
}

// clientTLS is c for dialling want at addr: the chain must verify for
// ServerName, and the certificate must name want; a certificate naming
// anyone else fails the handshake (nothing of ours is sent), and the
// classified reason is left in wrongPeer.
func clientTLS(c *tls.Config, want identity, addr string, wrongPeer *atomic.Pointer[errdefs.Error]) *tls.Config {
	c = c.Clone()
	c.ServerName = ServerName
	c.VerifyConnection = func(cs tls.ConnectionState) error {
		got := "no certificate"
		if len(cs.PeerCertificates) > 0 {
			got = cs.PeerCertificates[0].Subject.CommonName
			if got == want.String() {
				return nil
			}
		}
		e := errdefs.Errorf(errdefs.FailedPrecondition, "link to %s: meant %s, but its certificate names %q", addr, want, got)
		wrongPeer.Store(e)
		return e
	}
	return c
}
