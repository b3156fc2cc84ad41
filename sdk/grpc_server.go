package sdk

import (
	"context"
	"sync"

	"github.com/kvfence/kvfence/errdefs"
	pb "github.com/kvfence/kvfence/sdk/proto/kvfence/transport/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// trailerClassified marks an error the transport itself returned (as opposed
// to one the gRPC machinery produced). The host needs the difference for
// Post: a transport error means "not accepted", a machinery error means "we
// do not know whether the plugin accepted it".
const trailerClassified = "kvfence-classified"

// grpcServer serves one Transport as kvfence.transport.v1.
type grpcServer struct {
	pb.UnimplementedTransportServer
	impl Transport

	streamMu sync.Mutex
	streamOn bool         // one completion stream at a time: two would split completions
	rings    *pluginRings // attached and not yet taken by the stream (ring_plugin.go)
}

func newGRPCServer(impl Transport) *grpcServer { return &grpcServer{impl: impl} }

// fail returns err as a status error and marks it as the transport's own.
func fail(ctx context.Context, err error) error {
	_ = grpc.SetTrailer(ctx, metadata.Pairs(trailerClassified, "1"))
	return toStatusError(err)
}

func (s *grpcServer) Info(ctx context.Context, _ *pb.InfoRequest) (*pb.InfoResponse, error) {
	i, err := s.impl.Info(ctx)
	if err != nil {
		return nil, fail(ctx, err)
	}
	r := infoToPB(i)
	if _, ok := s.impl.(Granter); ok {
		// This server answers the batch RPCs for every Granter
		// (grpc_batch_keys.go), with the plugin's KeyBatcher or item by item.
		r.BatchKeys = true
	}
	return r, nil
}

func (s *grpcServer) RegisterMemory(ctx context.Context, r *pb.RegisterMemoryRequest) (*pb.RegisterMemoryResponse, error) {
	if r.GetMemory() == nil {
		return nil, fail(ctx, errdefs.Errorf(errdefs.InvalidArgument, "RegisterMemory: no memory described"))
	}
	id, err := s.impl.RegisterMemory(ctx, memoryDescFromPB(r.GetMemory()))
	if err != nil {
		return nil, fail(ctx, err)
	}
	return &pb.RegisterMemoryResponse{Region: uint64(id)}, nil
}

func (s *grpcServer) DeregisterMemory(ctx context.Context, r *pb.DeregisterMemoryRequest) (*pb.DeregisterMemoryResponse, error) {
	if err := s.impl.DeregisterMemory(ctx, RegionID(r.GetRegion())); err != nil {
		return nil, fail(ctx, err)
	}
	return &pb.DeregisterMemoryResponse{}, nil
}

func (s *grpcServer) LocalEndpoint(ctx context.Context, _ *pb.LocalEndpointRequest) (*pb.Endpoint, error) {
	ep, err := s.impl.LocalEndpoint(ctx)
	if err != nil {
		return nil, fail(ctx, err)
	}
	return endpointToPB(ep), nil
}

func (s *grpcServer) Connect(ctx context.Context, r *pb.ConnectRequest) (*pb.ConnectResponse, error) {
	if r.GetEndpoint() == nil {
		return nil, fail(ctx, errdefs.Errorf(errdefs.InvalidArgument, "Connect: no endpoint"))
	}
	peer, err := s.impl.Connect(ctx, endpointFromPB(r.GetEndpoint()))
	if err != nil {
		return nil, fail(ctx, err)
	}
	return &pb.ConnectResponse{Peer: string(peer)}, nil
}

func (s *grpcServer) Disconnect(ctx context.Context, r *pb.DisconnectRequest) (*pb.DisconnectResponse, error) {
	if err := s.impl.Disconnect(ctx, PeerID(r.GetPeer())); err != nil {
		return nil, fail(ctx, err)
	}
	return &pb.DisconnectResponse{}, nil
}

func (s *grpcServer) Post(ctx context.Context, r *pb.PostRequest) (*pb.PostResponse, error) {
	if err := s.impl.Post(ctx, batchFromPB(r)); err != nil {
		return nil, fail(ctx, err)
	}
	return &pb.PostResponse{}, nil
}

// Completions forwards the transport's completion channel until it closes
// (Close) or the host goes away.
func (s *grpcServer) Completions(_ *pb.CompletionsRequest, stream pb.Transport_CompletionsServer) error {
	s.streamMu.Lock()
	if s.streamOn {
		s.streamMu.Unlock()
		return fail(stream.Context(), errdefs.Errorf(errdefs.FailedPrecondition, "Completions: a stream is already open"))
	}
	s.streamOn = true
	s.streamMu.Unlock()
	defer func() {
		s.streamMu.Lock()
		s.streamOn = false
		s.streamMu.Unlock()
	}()
	ch := s.impl.Completions()
	if rings := s.takeRings(); rings != nil {
		return rings.forward(stream.Context(), ch)
	}
	for {
		select {
		case <-stream.Context().Done():
			return nil
		case c, ok := <-ch:
			if !ok {
				return nil
			}
			if err := stream.Send(completionToPB(c)); err != nil {
				// The host is gone; a completion lost here is recovered by
				// the host's crash semantics (its batches become InDoubt).
				return err
			}
		}
	}
}

func (s *grpcServer) Quiesce(ctx context.Context, r *pb.QuiesceRequest) (*pb.QuiesceResponse, error) {
	res, err := s.impl.Quiesce(ctx, PeerID(r.GetPeer()), batchIDsFromPB(r.GetBatches()))
	if err != nil {
		return nil, fail(ctx, err)
	}
	return &pb.QuiesceResponse{Evidence: string(res.Evidence), Batches: batchIDsToPB(res.Batches), Detail: res.Detail}, nil
}

func (s *grpcServer) Grant(ctx context.Context, r *pb.GrantRequest) (*pb.GrantResponse, error) {
	g, ok := s.impl.(Granter)
	if !ok {
		return nil, fail(ctx, errdefs.Errorf(errdefs.Unimplemented, "Grant: transport cannot revoke"))
	}
	w := windowFromPB(r)
	if w.Pieced() {
		// The plugin's own side of the guard: a host that did not check
		// (or lies) still cannot get a pieced key from a transport that
		// does not enforce pieces.
		info, err := s.impl.Info(ctx)
		if err != nil {
			return nil, fail(ctx, err)
		}
		if err := refusePieced(w, info.Capabilities.Bounds); err != nil {
			return nil, fail(ctx, err)
		}
	}
	k, err := g.Grant(ctx, w)
	if err != nil {
		return nil, fail(ctx, err)
	}
	return &pb.GrantResponse{Key: uint64(k)}, nil
}

func (s *grpcServer) Revoke(ctx context.Context, r *pb.RevokeRequest) (*pb.RevokeResponse, error) {
	g, ok := s.impl.(Granter)
	if !ok {
		return nil, fail(ctx, errdefs.Errorf(errdefs.Unimplemented, "Revoke: transport cannot revoke"))
	}
	res, err := g.Revoke(ctx, Key(r.GetKey()))
	if err != nil {
		return nil, fail(ctx, err)
	}
	return &pb.RevokeResponse{WritesApplied: res.WritesApplied, WritesDropped: res.WritesDropped}, nil
}

func (s *grpcServer) Stats(ctx context.Context, _ *pb.StatsRequest) (*pb.StatsResponse, error) {
	sr, ok := s.impl.(StatsReporter)
	if !ok {
		return nil, fail(ctx, errdefs.Errorf(errdefs.Unimplemented, "Stats: not reported"))
	}
	m, err := sr.Stats(ctx)
	if err != nil {
		return nil, fail(ctx, err)
	}
	return &pb.StatsResponse{Counters: m}, nil
}

func (s *grpcServer) Close(ctx context.Context, _ *pb.CloseRequest) (*pb.CloseResponse, error) {
	if err := s.impl.Close(); err != nil {
		return nil, fail(ctx, err)
	}
	return &pb.CloseResponse{}, nil
}
