package sdk

import (
	"context"

	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"
)

// PluginSet is the go-plugin plugin set that serves impl. Hosts never need
// it; sdktest uses it to run a plugin over a real gRPC connection inside the
// test process (go-plugin's TestPluginGRPCConn).
func PluginSet(impl Transport) plugin.PluginSet {
	return plugin.PluginSet{pluginName: &grpcPlugin{impl: impl}}
}

// PluginName is the name under which a kvfence binary serves its transport.
const PluginName = pluginName

// NewRemote builds the host's view of a plugin on an established gRPC
// connection (what Open does after starting the process). Without a process
// there is no process-exited evidence: after losing the plugin, Quiesce
// answers Unavailable.
func NewRemote(ctx context.Context, conn grpc.ClientConnInterface) (Transport, <-chan Event, error) {
	r, err := newRemote(ctx, conn, nil)
	if err != nil {
		return nil, nil, err
	}
	return r.asTransport(), r.events, nil
}
