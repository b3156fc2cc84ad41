package sdk

import (
	"context"
	"net/rpc"

	"github.com/hashicorp/go-plugin"
	"github.com/kvfence/kvfence/errdefs"
	pb "github.com/kvfence/kvfence/sdk/proto/kvfence/transport/v1"
	"google.golang.org/grpc"
)

// ProtocolVersion is the kvfence.transport.v1 protocol version this SDK
// speaks. Hosts and plugins negotiate it through go-plugin's
// VersionedPlugins; a new incompatible protocol gets a new number and both
// are offered side by side while they coexist.
const ProtocolVersion = 1

// pluginName is the one plugin a kvfence binary serves.
const pluginName = "transport"

// Handshake is not a security measure (AutoMTLS and sha256 pinning are): it
// only stops a user from running a plugin binary by hand, and a host from
// starting something that is not a kvfence plugin.
var Handshake = plugin.HandshakeConfig{
	MagicCookieKey:   "KVFENCE_PLUGIN",
	MagicCookieValue: "kvfence-transport-9d1f6c2e",
}

// grpcPlugin adapts the contract to go-plugin: the server side wraps a
// Transport, the client side builds the host's remote.
type grpcPlugin struct {
	impl Transport // server side only
}

// Server and Client are go-plugin's net/rpc side, which kvfence never
// allows (AllowedProtocols is gRPC only).
func (p *grpcPlugin) Server(*plugin.MuxBroker) (interface{}, error) {
	return nil, errdefs.Errorf(errdefs.Unimplemented, "kvfence plugins speak gRPC only")
}

func (p *grpcPlugin) Client(*plugin.MuxBroker, *rpc.Client) (interface{}, error) {
	return nil, errdefs.Errorf(errdefs.Unimplemented, "kvfence plugins speak gRPC only")
}

var _ plugin.GRPCPlugin = (*grpcPlugin)(nil)

func (p *grpcPlugin) GRPCServer(_ *plugin.GRPCBroker, s *grpc.Server) error {
	srv := newGRPCServer(p.impl)
	pb.RegisterTransportServer(s, srv)
	s.RegisterService(&ringsServiceDesc, srv)
	return nil
}

// GRPCClient returns the raw connection; the host builds its remote from it
// (it needs the process hooks that only Open knows).
func (p *grpcPlugin) GRPCClient(_ context.Context, _ *plugin.GRPCBroker, c *grpc.ClientConn) (interface{}, error) {
	return c, nil
}

func versionedPlugins(impl Transport) map[int]plugin.PluginSet {
	return map[int]plugin.PluginSet{
		ProtocolVersion: {pluginName: &grpcPlugin{impl: impl}},
	}
}
