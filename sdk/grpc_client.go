package sdk

import (
	"context"
	"errors"
	"io"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvfence/kvfence/errdefs"
	pb "github.com/kvfence/kvfence/sdk/proto/kvfence/transport/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// remote is the host's view of a plugin: a Transport over gRPC that also
// enforces, on the host's side, what a plugin may get wrong or be unable to
// say because it died: exactly one completion per batch, and InDoubt for
// every batch a lost plugin still owed.
type remote struct {
	rpc  pb.TransportClient
	info Info

	cancelStream context.CancelFunc
	streamDone   chan struct{}

	mu          sync.Mutex
	outstanding map[BatchID]struct{} // accepted (or maybe accepted), no completion yet
	inDoubt     map[BatchID]struct{} // completed InDoubt and not since quiesced
	lost        error                // set once the completion stream ended
	processGone chan struct{}        // closed when the plugin process is reaped; nil in-process

	sendMu sync.Mutex // serialises sends on out with its close
	closed bool
	out    chan Completion

	events     chan Event
	violations atomic.Uint64
	rings      *hostRings // nil: Post and completions over gRPC
	onLost     func()     // Open's hook: make sure the process dies and is reaped
}

const (
	completionBuffer = 4096
	eventBuffer      = 256
	closeGrace       = 5 * time.Second
)

// newRemote asks the plugin for its Info and opens the completion stream.
func newRemote(ctx context.Context, conn grpc.ClientConnInterface, processGone chan struct{}) (*remote, error) {
	rpc := pb.NewTransportClient(conn)
	ir, err := rpc.Info(ctx, &pb.InfoRequest{})
	if err != nil {
		return nil, fromStatusError(err)
	}
	sctx, cancel := context.WithCancel(context.Background())
	r := &remote{
		rpc:          rpc,
		info:         infoFromPB(ir),
		cancelStream: cancel,
		streamDone:   make(chan struct{}),
		outstanding:  map[BatchID]struct{}{},
		inDoubt:      map[BatchID]struct{}{},
		processGone:  processGone,
		out:          make(chan Completion, completionBuffer),
		events:       make(chan Event, eventBuffer),
	}
	// The rings are attached before the stream opens: the plugin's stream
	// then forwards completions into them (ring_host.go).
	if r.rings, err = attachRings(ctx, conn, r, r.ringViolation); err != nil {
		cancel()
		return nil, err
	}
	stream, err := rpc.Completions(sctx, &pb.CompletionsRequest{})
	if err != nil {
		cancel()
		if r.rings != nil {
			r.rings.shutdown()
			r.rings.release()
		}
		return nil, fromStatusError(err)
	}
	go r.receive(stream)
	return r, nil
}

// asTransport exposes Granter to the host. A plugin over a backend that
// cannot revoke (Mooncake, NIXL, MORI) still grants keys, so that a peer can
// address its memory, and answers Revoke with Unimplemented; whether Revoke
// works is Capabilities.Revoke, never the type assertion. A plugin that
// implements no Granter at all answers Grant with Unimplemented. A plugin
// whose Info declares BatchKeys is a KeyBatcher too (grpc_batch_keys.go).
func (r *remote) asTransport() Transport {
	if r.info.Capabilities.BatchKeys {
		return &remoteBatchGranter{&remoteGranter{r}}
	}
	return &remoteGranter{r}
}

func (r *remote) receive(stream pb.Transport_CompletionsClient) {
	defer close(r.streamDone)
	for {
		c, err := stream.Recv()
		if err != nil {
			if r.rings != nil {
				// What the plugin put in the rings before its stream
				// ended is delivered before lose declares the rest InDoubt.
				r.rings.shutdown()
			}
			r.lose(err)
			if r.rings != nil {
				r.rings.release()
			}
			return
		}
		r.deliver(completionFromPB(c))
	}
}

// deliver passes on a plugin's completion if it is the first for its batch.
func (r *remote) deliver(c Completion) {
	if r.admit(c) {
		r.emit(c)
	}
}

// admit does deliver's bookkeeping: false when c must be dropped.
func (r *remote) admit(c Completion) bool {
	r.mu.Lock()
	if _, ok := r.outstanding[c.Batch]; !ok {
		r.mu.Unlock()
		r.violations.Add(1)
		r.event(Event{Kind: EventProtocolViolation, Batches: []BatchID{c.Batch},
			Detail: "completion for a batch that is not outstanding (duplicate or unknown): dropped"})
		return false
	}
	delete(r.outstanding, c.Batch)
	if c.Status == InDoubt {
		r.inDoubt[c.Batch] = struct{}{}
	}
	r.mu.Unlock()
	return true
}

// lose runs once when the stream ends: a clean end after Close or a dead
// plugin look the same to us, and either way every batch still owed a
// completion is now InDoubt — nothing proves it stopped.
func (r *remote) lose(err error) {
	if err == nil || errors.Is(err, io.EOF) {
		err = errdefs.Errorf(errdefs.Unavailable, "completion stream closed")
	}
	r.mu.Lock()
	r.lost = err
	ids := make([]BatchID, 0, len(r.outstanding))
	for id := range r.outstanding {
		ids = append(ids, id)
		r.inDoubt[id] = struct{}{}
	}
	r.outstanding = map[BatchID]struct{}{}
	r.mu.Unlock()
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	for _, id := range ids {
		r.emit(Completion{Batch: id, Status: InDoubt, Class: errdefs.Unavailable, Detail: "plugin lost: " + err.Error()})
	}
	r.sendMu.Lock()
	r.closed = true
	close(r.out)
	r.sendMu.Unlock()
	r.event(Event{Kind: EventPluginLost, Batches: ids, Detail: err.Error()})
	if r.onLost != nil {
		r.onLost()
	}
}

// processExited is called by Open's watcher once the process is reaped.
func (r *remote) processExited() {
	r.mu.Lock()
	ids := make([]BatchID, 0, len(r.inDoubt))
	for id := range r.inDoubt {
		ids = append(ids, id)
	}
	r.inDoubt = map[BatchID]struct{}{}
	r.mu.Unlock()
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	r.event(Event{Kind: EventPluginExited, Batches: ids, Evidence: EvidenceProcessExited,
		Detail: "plugin process reaped: its sockets and queue pairs are gone"})
}

// tryEmit is emit when it would not block; false: out is full.
func (r *remote) tryEmit(c Completion) bool {
	r.sendMu.Lock()
	defer r.sendMu.Unlock()
	if r.closed {
		return true
	}
	select {
	case r.out <- c:
		return true
	default:
		return false
	}
}

func (r *remote) emit(c Completion) {
	r.sendMu.Lock()
	defer r.sendMu.Unlock()
	if !r.closed {
		r.out <- c
	}
}

// event never blocks the host: a caller that does not read events loses
// them (they are also visible through the completions and Quiesce).
func (r *remote) event(e Event) {
	select {
	case r.events <- e:
	default:
	}
}

func (r *remote) gone() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.lost != nil {
		return errdefs.Errorf(errdefs.Unavailable, "plugin lost: %v", r.lost)
	}
	return nil
}

func (r *remote) Info(ctx context.Context) (Info, error) {
	if err := r.gone(); err != nil {
		return Info{}, err
	}
	return r.info, nil
}

func (r *remote) RegisterMemory(ctx context.Context, desc MemoryDesc) (RegionID, error) {
	res, err := r.rpc.RegisterMemory(ctx, &pb.RegisterMemoryRequest{Memory: memoryDescToPB(desc)})
	if err != nil {
		return 0, fromStatusError(err)
	}
	return RegionID(res.GetRegion()), nil
}

func (r *remote) DeregisterMemory(ctx context.Context, region RegionID) error {
	_, err := r.rpc.DeregisterMemory(ctx, &pb.DeregisterMemoryRequest{Region: uint64(region)})
	return fromStatusError(err)
}

func (r *remote) LocalEndpoint(ctx context.Context) (Endpoint, error) {
	ep, err := r.rpc.LocalEndpoint(ctx, &pb.LocalEndpointRequest{})
	if err != nil {
		return Endpoint{}, fromStatusError(err)
	}
	return endpointFromPB(ep), nil
}

func (r *remote) Connect(ctx context.Context, ep Endpoint) (PeerID, error) {
	res, err := r.rpc.Connect(ctx, &pb.ConnectRequest{Endpoint: endpointToPB(ep)})
	if err != nil {
		return "", fromStatusError(err)
	}
	return PeerID(res.GetPeer()), nil
}

func (r *remote) Disconnect(ctx context.Context, peer PeerID) error {
	_, err := r.rpc.Disconnect(ctx, &pb.DisconnectRequest{Peer: string(peer)})
	return fromStatusError(err)
}

// Post registers the batch as outstanding before the call, so a completion
// racing the reply is never mistaken for an unknown batch. If the call fails
// in the gRPC machinery (no classified trailer), we cannot know whether the
// plugin accepted it; we then accept it ourselves and complete it InDoubt.
func (r *remote) Post(ctx context.Context, b Batch) error {
	r.mu.Lock()
	if r.lost != nil {
		r.mu.Unlock()
		return errdefs.Errorf(errdefs.Unavailable, "Post: plugin lost: %v", r.lost)
	}
	if _, dup := r.outstanding[b.ID]; dup {
		r.mu.Unlock()
		return errdefs.Errorf(errdefs.AlreadyExists, "Post: batch %d is outstanding", b.ID)
	}
	r.outstanding[b.ID] = struct{}{}
	r.mu.Unlock()

	classified, err := r.submit(ctx, b)
	if err == nil {
		return nil
	}
	if classified {
		r.mu.Lock()
		_, still := r.outstanding[b.ID]
		delete(r.outstanding, b.ID)
		r.mu.Unlock()
		if !still {
			// lose (the plugin died after refusing) already completed it
			// InDoubt: report it accepted, so it has exactly one outcome.
			return nil
		}
		return fromStatusError(err)
	}
	c := Completion{Batch: b.ID, Status: InDoubt, Class: errdefs.Unavailable,
		Detail: "Post outcome unknown: " + err.Error()}
	// Claim and send under sendMu: a lose (the plugin died, which is what
	// broke this call) that closes out between them would drop the only
	// completion of a batch we report accepted. Lock order: sendMu, then mu.
	r.sendMu.Lock()
	defer r.sendMu.Unlock()
	r.mu.Lock()
	_, still := r.outstanding[b.ID]
	delete(r.outstanding, b.ID)
	if still {
		r.inDoubt[b.ID] = struct{}{}
	}
	r.mu.Unlock()
	if still && !r.closed { // closed implies lose took (and completed) it
		if postUnknownHook != nil {
			postUnknownHook(r)
		}
		r.out <- c
	}
	return nil
}

// submit hands b to the plugin, on the rings when attached (and the batch
// fits), else over gRPC. classified: err is the plugin's own refusal.
func (r *remote) submit(ctx context.Context, b Batch) (classified bool, err error) {
	if r.rings != nil {
		switch err := r.rings.post(ctx, b); {
		case err == nil:
			return false, nil
		case errors.Is(err, errRingNoVerdict):
			return false, err
		case !errors.Is(err, errRingUnsent):
			return true, err
		}
	}
	var trailer metadata.MD
	_, err = r.rpc.Post(ctx, batchToPB(b), grpc.Trailer(&trailer))
	return len(trailer.Get(trailerClassified)) > 0, err
}

// ringViolation: the plugin broke the ring format. Its records are no
// longer read; ending the stream makes receive treat it as lost (every
// batch it owes becomes InDoubt) and Open's hook kill it.
func (r *remote) ringViolation(detail string) {
	r.violations.Add(1)
	r.event(Event{Kind: EventProtocolViolation, Detail: "rings: " + detail + ": plugin dropped"})
	r.cancelStream()
}

// postUnknownHook, set by tests only, runs between Post's claim of a batch
// whose outcome is unknown and the send of its InDoubt completion.
var postUnknownHook func(*remote)

func (r *remote) Completions() <-chan Completion { return r.out }

// Quiesce asks the plugin, unless the plugin process is already reaped:
// then process exit is the evidence for every batch it ever had.
func (r *remote) Quiesce(ctx context.Context, peer PeerID, batches []BatchID) (QuiesceResult, error) {
	if r.processGone != nil {
		select {
		case <-r.processGone:
			return r.quiesced(QuiesceResult{Evidence: EvidenceProcessExited, Batches: batches,
				Detail: "plugin process exited"}), nil
		default:
		}
		if r.gone() != nil {
			// Lost but not yet reaped: Open's watcher kills and reaps it.
			select {
			case <-r.processGone:
				return r.quiesced(QuiesceResult{Evidence: EvidenceProcessExited, Batches: batches,
					Detail: "plugin process exited"}), nil
			case <-ctx.Done():
				return QuiesceResult{}, errdefs.Errorf(errdefs.Unavailable, "Quiesce: plugin lost and not yet reaped: %v", ctx.Err())
			}
		}
	} else if err := r.gone(); err != nil {
		return QuiesceResult{}, err
	}
	res, err := r.rpc.Quiesce(ctx, &pb.QuiesceRequest{Peer: string(peer), Batches: batchIDsToPB(batches)})
	if err != nil {
		return QuiesceResult{}, fromStatusError(err)
	}
	return r.quiesced(QuiesceResult{Evidence: Evidence(res.GetEvidence()), Batches: batchIDsFromPB(res.GetBatches()),
		Detail: res.GetDetail()}), nil
}

func (r *remote) quiesced(res QuiesceResult) QuiesceResult {
	r.mu.Lock()
	for _, id := range res.Batches {
		delete(r.inDoubt, id)
	}
	r.mu.Unlock()
	return res
}

func (r *remote) Stats(ctx context.Context) (map[string]uint64, error) {
	res, err := r.rpc.Stats(ctx, &pb.StatsRequest{})
	if err != nil {
		return nil, fromStatusError(err)
	}
	m := res.GetCounters()
	if m == nil {
		m = map[string]uint64{}
	}
	m["host.protocol_violations"] = r.violations.Load()
	m["host.data_path_rings"] = 0
	if r.rings != nil {
		m["host.data_path_rings"] = 1
	}
	return m, nil
}

// Close asks the plugin to stop (it completes pending batches InDoubt and
// ends the stream), then waits for the stream to end.
func (r *remote) Close() error {
	var err error
	if r.gone() == nil {
		_, err = r.rpc.Close(context.Background(), &pb.CloseRequest{})
		err = fromStatusError(err)
	}
	if err != nil {
		r.cancelStream()
	}
	select {
	case <-r.streamDone:
	case <-time.After(closeGrace):
		// A plugin that does not end its stream on Close is not waited for.
		r.cancelStream()
		<-r.streamDone
	}
	r.cancelStream()
	return err
}

// remoteGranter is a remote with Grant and Revoke forwarded to the plugin.
type remoteGranter struct{ *remote }

// Grant refuses a pieced window to a plugin that did not declare pieces
// before it leaves the host: an older plugin would drop the fields it does
// not know and expose the whole span.
func (r *remoteGranter) Grant(ctx context.Context, w Window) (Key, error) {
	if err := refusePieced(w, r.info.Capabilities.Bounds); err != nil {
		return 0, err
	}
	res, err := r.rpc.Grant(ctx, windowToPB(w))
	if err != nil {
		return 0, fromStatusError(err)
	}
	return Key(res.GetKey()), nil
}

func (r *remoteGranter) Revoke(ctx context.Context, key Key) (RevokeResult, error) {
	res, err := r.rpc.Revoke(ctx, &pb.RevokeRequest{Key: uint64(key)})
	if err != nil {
		return RevokeResult{}, fromStatusError(err)
	}
	return RevokeResult{WritesApplied: res.GetWritesApplied(), WritesDropped: res.GetWritesDropped()}, nil
}
