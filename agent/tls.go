package agent

import "crypto/tls"

// ServerName is the name every agent's certificate carries (as a DNS SAN),
// so that a client verifies the agent it reached against the deployment's
// CA without per-host names; which role and rank the peer is comes from its
// certificate's common name (IdentityName), checked at Hello.
const ServerName = "kvfence-agent"

// clientTLS is c for the dialling side: the server must present ServerName.
func clientTLS(c *tls.Config) *tls.Config {
	if c == nil {
		return nil
	}
	c = c.Clone()
	c.ServerName = ServerName
	return c
}
