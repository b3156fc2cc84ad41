package nocancel

import (
	"net"
	"strings"
)

// EnvListen is the data-path address a host gives a plugin process
// ("host:port"): the conformance suite sets it per network namespace under
// --netns, where 127.0.0.1 of one namespace cannot reach the other. The
// vendor plugins take its host as the default address of their key
// directory (and Mooncake's engine), so a namespaced run reaches them.
const EnvListen = "KVFENCE_TCP_LISTEN"

// ListenHost is the host part of KVFENCE_TCP_LISTEN, or "" when it is unset
// or unusable.
func ListenHost(getenv func(string) string) string {
	v := strings.TrimSpace(getenv(EnvListen))
	if v == "" {
		return ""
	}
	host, _, err := net.SplitHostPort(v)
	if err != nil {
		return ""
	}
	return host
}

// DirListenDefault is the key directory's default listen address: port 0
// on the host of KVFENCE_TCP_LISTEN, else "" (Config's own default,
// 127.0.0.1:0).
func DirListenDefault(getenv func(string) string) string {
	if h := ListenHost(getenv); h != "" {
		return net.JoinHostPort(h, "0")
	}
	return ""
}
