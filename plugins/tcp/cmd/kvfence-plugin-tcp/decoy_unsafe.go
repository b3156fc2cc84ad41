//go:build kvfenceunsafe

package main

import (
	"context"
	"net"
	"os"
	"strings"
	"sync"

	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/plugins/tcp"
	"github.com/kvfence/kvfence/sdk"
)

// decoyWrites is the source offset of the conformance suite's fault writes
// (honest() in conformance/group_honesty.go): the variant answers exactly
// those with InDoubt. decoyRefused is that of the write Quiesce is asked
// about at once under a stall (checkStallQuiesceNow): the variant refuses
// that Quiesce, as an honest plugin that has no evidence does.
const (
	decoyWrites  = 999
	decoyRefused = 1234
)

// wrapVariant: KVFENCE_TCP_UNSAFE=decoy-indoubt (issue 23 item 2) sends
// its data straight to KVFENCE_TCP_UNSAFE_DIRECT (the target's real data
// address), around whatever sits on the endpoint address it is given, and
// keeps only an idle decoy connection there. Writes it recognises as a
// fault check's it reports InDoubt once they completed, and Quiesce covers
// them with evidence: true of bytes that did land, but an answer to a fault
// its data never met. A suite that credits it with the link-fault checks
// has been fooled; the reached guard must report them NOT RUN.
func wrapVariant(t *tcp.Transport) sdk.Transport {
	direct := os.Getenv("KVFENCE_TCP_UNSAFE_DIRECT")
	if os.Getenv("KVFENCE_TCP_UNSAFE") != "decoy-indoubt" || direct == "" {
		return t
	}
	d := &decoyTransport{Transport: t, direct: direct, marked: map[sdk.BatchID]bool{}, refuse: map[sdk.BatchID]bool{}, out: make(chan sdk.Completion, 64)}
	go d.relay()
	return d
}

type decoyTransport struct {
	*tcp.Transport
	direct string
	mu     sync.Mutex
	marked map[sdk.BatchID]bool
	refuse map[sdk.BatchID]bool
	decoys []net.Conn
	out    chan sdk.Completion
}

// Connect dials the given address once and leaves that connection idle
// (the decoy); the peer it returns writes to the direct address.
func (d *decoyTransport) Connect(ctx context.Context, ep sdk.Endpoint) (sdk.PeerID, error) {
	addr, pin, pinned := strings.Cut(ep.Address, "#")
	if c, err := net.Dial("tcp", addr); err == nil {
		d.mu.Lock()
		d.decoys = append(d.decoys, c)
		d.mu.Unlock()
	}
	ep.Address = d.direct
	if pinned {
		ep.Address += "#" + pin
	}
	return d.Transport.Connect(ctx, ep)
}

func (d *decoyTransport) Post(ctx context.Context, b sdk.Batch) error {
	if len(b.Ops) > 0 {
		d.mu.Lock()
		d.marked[b.ID] = b.Ops[0].LocalOffset == decoyWrites
		d.refuse[b.ID] = b.Ops[0].LocalOffset == decoyRefused
		d.mu.Unlock()
	}
	return d.Transport.Post(ctx, b)
}

func (d *decoyTransport) Completions() <-chan sdk.Completion { return d.out }

func (d *decoyTransport) relay() {
	defer close(d.out)
	for c := range d.Transport.Completions() {
		d.mu.Lock()
		if d.marked[c.Batch] && c.Status == sdk.Succeeded {
			c.Status, c.Class, c.Detail = sdk.InDoubt, errdefs.Unavailable, "decoy-indoubt: reported in doubt"
		}
		d.mu.Unlock()
		d.out <- c
	}
}

// Quiesce covers the marked batches at once: they completed, so nothing of
// them moves, whatever the link it claims to have waited out. It refuses
// for the batches of decoyRefused.
func (d *decoyTransport) Quiesce(ctx context.Context, peer sdk.PeerID, batches []sdk.BatchID) (sdk.QuiesceResult, error) {
	d.mu.Lock()
	all, refuse := len(batches) > 0, false
	for _, id := range batches {
		all, refuse = all && d.marked[id], refuse || d.refuse[id]
	}
	d.mu.Unlock()
	if refuse {
		return sdk.QuiesceResult{}, errdefs.Errorf(errdefs.Unavailable, "decoy-indoubt: no evidence")
	}
	if all {
		return sdk.QuiesceResult{Evidence: sdk.EvidenceReceiverConfirmed, Batches: batches, Detail: "decoy-indoubt"}, nil
	}
	return d.Transport.Quiesce(ctx, peer, batches)
}
