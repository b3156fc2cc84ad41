package agent

import (
	"context"
	"crypto/tls"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/kvfence/kvfence/core"
	"github.com/kvfence/kvfence/core/knownunsafe"
	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/internal/routerlink"
	"github.com/kvfence/kvfence/sdk"
)

// PrefillConfig configures a prefill-rank agent.
type PrefillConfig struct {
	Rank       core.RankID
	DecodeAddr string // control address of the decode rank
	// DecodeRank is the decode rank at DecodeAddr: a peer there that is
	// anyone else (by its certificate, or its Welcome) is not linked, so
	// no page is ever written to it.
	DecodeRank  core.RankID
	SourcePages int // source pages (one shard each) in shared memory
	ShardBytes  int64
	// Lanes is how many transport connections to open per decode rank (as
	// an RDMA engine spreads a request's writes over several QPs or NICs);
	// a request's batches all use one lane, picked by its room.
	Lanes int

	// QuiesceGrace: before asking the transport to quiesce (the TCP plugin
	// cuts the connection, and with it every other request's writes in
	// flight on that lane), wait up to this long for the batches to
	// complete on their own. A definite completion (Succeeded or
	// FailedDefinite: every op acknowledged or refused) is itself proof
	// that the batch moves no more. Zero: quiesce at once.
	QuiesceGrace time.Duration

	MaxInflight, MaxBatchPages               int
	Heartbeat, SkewMargin                    time.Duration
	RequestTombstone, BootstrapTimeout, Tick time.Duration
	// Checksums: put a checksum of the written shards in every Commit
	// (checksum.go). Off by default.
	Checksums bool

	ControlAddr string      // where the router connects ("": no listener)
	TLS         *tls.Config // mutual TLS (server and client side); nil = plaintext
	// commands: as DecodeConfig's (set only through
	// routerlink.ServeCommands).
	commands func(routerlink.Link)
	// Limits bound what one peer can cost this rank (limits.go).
	Limits Limits
	Logger hclog.Logger
	// Events, when set, is the plugin's event stream (sdk.Plugin.Events):
	// a reaped plugin is quiescence evidence for its batches.
	Events <-chan sdk.Event
}

// Prefill is one prefill rank's agent.
type Prefill struct {
	cfg     PrefillConfig
	log     hclog.Logger
	tr      sdk.Transport
	info    sdk.Info
	src     *sdk.SharedMemory
	region  sdk.RegionID
	core    *core.Sender
	lp      *loop
	srv     *server
	Metrics *Metrics
	snap    atomic.Pointer[core.SenderMetrics]
	hello   peerHello
	quit    chan struct{}

	// loop-owned
	link   *link
	decode peerHello
	lanes  []sdk.PeerID
	// with decode target instances (restart.go): lanes per instance
	targetLanes [][]sdk.PeerID
	targetAddrs []string
	batchPeer   map[core.BatchID]sdk.PeerID
	lanesBook   // lanes.go: batches per lane, lanes retired until settled
	keys        map[core.Tag]tagKeys
	reqs        map[core.RequestKey]*preReq
	free        []int
	swept       time.Time // last expireKeys
	// the close handshake (link_quiesce.go): an answer awaited, or agreed
	// (then no new link is installed until ResumeLink)
	quiesceWait chan bool
	closeAgreed bool
	dialing     bool // connectLoop has a dial in flight
}

type tagKeys struct {
	at   time.Time // when the Assign came (unopened requests' keys expire)
	keys []keyRef
	pos  int // this rank's shard in each slot
}

type preReq struct {
	key    core.RequestKey
	src    []int
	state  PollState
	closed bool // the engine called Close or Abort
	snd    *KVSender
	// fills and writes copying into src outside the loop (sender_fill.go):
	// their count and pinReleased; pages released while one runs wait in
	// unfreed for the last to end
	pins    atomic.Int64
	unfreed []int
}

// NewPrefill starts a prefill agent on an opened transport.
func NewPrefill(ctx context.Context, cfg PrefillConfig, tr sdk.Transport) (*Prefill, error) {
	if cfg.Tick <= 0 {
		cfg.Tick = 10 * time.Millisecond
	}
	if cfg.Lanes <= 0 {
		cfg.Lanes = 1
	}
	if cfg.SourcePages <= 0 || cfg.ShardBytes <= 0 {
		return nil, errdefs.Errorf(errdefs.InvalidArgument, "prefill: source pages (%d) and shard bytes (%d) must be positive", cfg.SourcePages, cfg.ShardBytes)
	}
	if err := checkOwnCertificate(cfg.TLS, time.Now()); err != nil {
		return nil, err
	}
	cfg.Limits = cfg.Limits.withDefaults(cfg.SourcePages)
	log := cfg.Logger
	if log == nil {
		log = hclog.NewNullLogger()
	}
	p := &Prefill{cfg: cfg, log: log, tr: tr, lp: newLoop(), quit: make(chan struct{}),
		batchPeer: map[core.BatchID]sdk.PeerID{}, keys: map[core.Tag]tagKeys{}, reqs: map[core.RequestKey]*preReq{}}
	var err error
	if p.info, err = tr.Info(ctx); err != nil {
		return nil, err
	}
	if p.src, err = sdk.NewSharedMemory(fmt.Sprintf("prefill-%d-src", cfg.Rank), uint64(int64(cfg.SourcePages)*cfg.ShardBytes)); err != nil {
		return nil, err
	}
	if p.region, err = tr.RegisterMemory(ctx, p.src.Desc()); err != nil {
		return nil, err
	}
	for i := cfg.SourcePages - 1; i >= 0; i-- {
		p.free = append(p.free, i)
	}
	// A new heartbeat session on every start: decode then never applies
	// an earlier incarnation's list to this one (docs/design.md §3).
	p.core, err = core.NewSender(core.SenderConfig{Rank: cfg.Rank, Session: rand.Uint64() | 1, SkewMargin: cfg.SkewMargin, MaxInflight: cfg.MaxInflight,
		MaxBatchPages: cfg.MaxBatchPages, Heartbeat: cfg.Heartbeat, RequestTombstone: cfg.RequestTombstone,
		BootstrapTimeout: cfg.BootstrapTimeout, Unsafe: knownunsafe.AgentVariant()})
	if err != nil {
		return nil, err
	}
	// Every sdk transport can quiesce: Quiesce is part of the required
	// contract, and the plugin host turns a reaped process into evidence.
	p.hello = peerHello{Role: RolePrefill, Rank: uint32(cfg.Rank), Version: ControlVersion,
		Caps: peerCaps{Quiesce: true, Revoke: p.info.Capabilities.Revoke, MaxTail: int64(p.info.Capabilities.MaxTail),
			RefusalsIsolated: p.info.Capabilities.RefusalsIsolated},
		ShardBytes: cfg.ShardBytes, Checksums: cfg.Checksums, KeyParts: true}
	// Decode binds this rank's keys to its data identity where it can; a
	// transport with no endpoint of its own gets unbound keys.
	if ep, err := tr.LocalEndpoint(ctx); err == nil {
		p.hello.Writer = ep.Address
	} else {
		log.Debug("no local data endpoint to announce; decode will grant unbound keys", "error", err)
	}
	p.Metrics = newMetrics("prefill", uint32(cfg.Rank), func() metricsSnapshot { return metricsSnapshot{Sender: p.snap.Load()} })
	p.publish()
	if cfg.ControlAddr != "" {
		p.srv, err = newServer(cfg.ControlAddr, cfg.TLS, cfg.Limits, p.accept, func(l *link) {
			cfg.commands(agentLink(l))
		})
		if err != nil {
			return nil, err
		}
	}
	go p.lp.run(cfg.Tick, p.tick)
	go p.completions()
	if cfg.Events != nil {
		go p.events()
	}
	go p.connectLoop()
	log.Info("prefill agent up", "rank", cfg.Rank, "decode", cfg.DecodeAddr, "lanes", cfg.Lanes, "variant", knownunsafe.AgentVariant().Name())
	return p, nil
}

// Addr is the router-facing control address ("" if none).
func (p *Prefill) Addr() string {
	if p.srv == nil {
		return ""
	}
	return p.srv.Addr()
}

func (p *Prefill) publish() {
	m := p.core.Metrics()
	p.snap.Store(&m)
}

// Close stops the agent. Nothing it holds is released by it: the transport
// is closed by its owner, which completes what is left InDoubt.
func (p *Prefill) Close() {
	close(p.quit)
	if p.srv != nil {
		p.srv.Stop()
	}
	p.lp.shutdown()
	if p.link != nil {
		p.link.close()
	}
}

// Linked reports whether the decode link is up (for tests).
func (p *Prefill) Linked() bool {
	up := false
	p.lp.call(func() { up = p.link != nil })
	return up
}

// connectLoop keeps a link to decode, reconnecting (a restarted decode is a
// new instance; the core sorts out old tags by their instance). It dials
// only while the agent has not agreed to close (link_quiesce.go): decode
// would take a new link as one to assign over.
func (p *Prefill) connectLoop() {
	backoff := 50 * time.Millisecond
	for {
		select {
		case <-p.quit:
			return
		default:
		}
		may := false
		if !p.lp.call(func() { may = p.startDial() }) {
			return
		}
		if !may {
			if !p.pause(backoff) {
				return
			}
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		l, _, err := dial(ctx, p.cfg.DecodeAddr, p.cfg.TLS, identity{RoleDecode, uint32(p.cfg.DecodeRank)}, p.hello)
		cancel()
		if err != nil {
			p.lp.post(p.endDial)
			if !errdefs.IsUnavailable(err) { // refused, not unreachable: say why (a restarted decode may still accept)
				p.log.Error("no link to decode (refused, or not the decode meant)", "error", err)
			}
			if !p.pause(backoff) {
				return
			}
			if backoff < time.Second {
				backoff *= 2
			}
			continue
		}
		if err := compatible(p.hello, l.peer); err != nil {
			// Decode checked us; we check it too: a decode whose slots
			// are laid out otherwise would be written out of place.
			p.log.Error("refusing decode", "rank", l.peer.Rank, "error", err)
			l.close()
			p.lp.post(p.endDial)
			if !p.pause(time.Second) {
				return
			}
			continue
		}
		backoff = 50 * time.Millisecond
		l.gate = p.cfg.Limits.gate()
		if !p.lp.call(func() { p.endDial(); p.linked(l) }) {
			l.close()
			return
		}
		p.readDecode(l)
		p.lp.post(func() {
			if p.link == l {
				p.link = nil
			}
		})
	}
}

// pause waits d; false when the agent stops meanwhile.
func (p *Prefill) pause(d time.Duration) bool {
	select {
	case <-p.quit:
		return false
	case <-time.After(d):
		return true
	}
}

// linked installs a new decode link and, for a new data endpoint, new lanes.
func (p *Prefill) linked(l *link) {
	if p.link != nil {
		p.link.close()
	}
	p.link = l
	old := p.decode
	p.decode = l.peer
	if len(l.peer.DataTargets) > 0 {
		p.dropLanes(p.lanes) // a decode that now runs target instances
		p.lanes = nil
		p.connectTargets(l.peer.DataTargets)
	} else if old.DataAddress != l.peer.DataAddress || len(p.lanes) == 0 {
		addrs := l.peer.DataAddresses
		if len(addrs) == 0 {
			addrs = []string{l.peer.DataAddress}
		}
		p.connectTargets(nil) // drops the lanes to target instances, if any
		p.dropLanes(p.lanes)
		p.lanes = nil
		for i := 0; i < p.cfg.Lanes; i++ {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			id, err := p.tr.Connect(ctx, sdk.Endpoint{Transport: l.peer.DataTransport, Address: addrs[i%len(addrs)], Opaque: l.peer.DataOpaque})
			cancel()
			if err != nil {
				p.log.Error("connect data lane", "error", err)
				continue
			}
			p.adoptLane(id)
			p.lanes = append(p.lanes, id)
		}
	}
	p.log.Info("linked to decode", "decode", l.peer.Rank, "instance", l.peer.Instance, "data", l.peer.DataAddress)
}

func (p *Prefill) readDecode(l *link) {
	for {
		f, err := l.recv(func() { p.Metrics.reject("replayed") })
		if err != nil || !p.onFrame(l, f) {
			return
		}
	}
}

// onFrame checks one frame from decode and queues it for the loop; false
// when the link ended while it waited for its turn.
func (p *Prefill) onFrame(l *link, f *frame) bool {
	if f.Type == frameTargets {
		return p.onTargets(l, f.Hello)
	}
	if handled, up := quiesceFrame(f, l, p.lp, func(t frameType) {
		if t == frameQuiesceOK {
			p.onQuiesceOK(l)
		}
	}); handled {
		return up
	}
	m, ok := coreMessage(f, p.Metrics)
	if !ok {
		return true
	}
	return l.toLoop(p.lp, func() { p.step(l, m, f.Keys) })
}

// step checks a message from decode before the core sees it.
func (p *Prefill) step(l *link, m core.Message, keys []keyRef) {
	switch {
	case m.Rank != p.cfg.Rank:
		p.Metrics.reject("misaddressed")
		return
	case m.Decode != core.RankID(l.peer.Rank):
		p.Metrics.reject("forged")
		return
	}
	switch m.Kind {
	case core.KindAssign:
		pos, why := p.checkAssign(m, keys)
		if why != "" {
			p.Metrics.reject(why)
			p.log.Warn("assign refused", "tag", m.Tag, "why", why, "ranks", len(m.Ranks), "slots", len(m.Slots), "keys", len(keys))
			return
		}
		if len(p.keys) >= maxAssignedTags(p.cfg.SourcePages) {
			p.Metrics.reject("excess-assigns") // neither the keys nor the core keep it
			return
		}
		if _, seen := p.keys[m.Tag]; !seen {
			p.keys[m.Tag] = tagKeys{at: time.Now(), keys: keys, pos: pos}
		}
	case core.KindGrant, core.KindLease, core.KindAbort, core.KindReject:
	default:
		p.Metrics.reject("wrong-kind")
		return
	}
	p.core.Step(m, now())
	p.act()
}

func (p *Prefill) tick() {
	p.core.Tick(now())
	p.act()
	p.expireKeys()
}

// act carries out the core's last output (loop only). Follow-up inputs
// (a refused post) are queued, never fed back while the output is read.
func (p *Prefill) act() {
	out := p.core.Ready()
	p.sendMessages(out.Messages)
	for _, post := range out.Posts {
		p.post(post)
	}
	for _, q := range out.Quiesces {
		p.quiesce(q)
	}
	p.settleRequests(out)
	// Source releases last: a request whose pages come back in the same
	// round as its Sent or Failure must settle first, or its sender never
	// learns how it ended.
	for _, sr := range out.SourceReleases {
		p.releaseSource(sr.Key)
	}
	p.publish()
}

// sendMessages sends the core's messages to decode, each Commit with its
// checksum when Checksums is on; a message that cannot go is counted.
func (p *Prefill) sendMessages(msgs []core.Envelope) {
	for _, env := range msgs {
		if env.Msg.Kind == core.KindCommit && p.cfg.Checksums {
			env.Msg.Checksum = p.commitChecksum(env.Msg.Tag, int(env.Msg.Coverage))
		}
		if p.link == nil || core.RankID(p.decode.Rank) != env.To || !p.link.send(&frame{Type: frameCore, Core: core.AppendMessage(nil, &env.Msg)}) {
			p.Metrics.failedSend("control")
		}
	}
}

// settleRequests ends the senders of the requests the core failed or
// finished sending in this output.
func (p *Prefill) settleRequests(out *core.Output) {
	for _, f := range out.Failures {
		if r := p.reqs[f.Tag.Key()]; r != nil && r.state != PollFailed {
			r.state = PollFailed
			r.snd.publish(PollFailed) // before Done closes: a waiter on Done then polls
			r.snd.settle(PollFailed, f.Reason.String())
		}
	}
	for _, s := range out.Sent {
		if r := p.reqs[s.Key]; r != nil && r.state != PollFailed {
			r.state = PollSuccess
			r.snd.publish(PollSuccess)
			r.snd.settle(PollSuccess, "")
		}
	}
}

// releaseSource takes a request's source pages back into the free list
// and forgets the request and its keys.
func (p *Prefill) releaseSource(key core.RequestKey) {
	r := p.reqs[key]
	if r == nil {
		return
	}
	if r.releasePinned() { // else a fill may still write them: its unpin frees them
		p.free = append(p.free, r.src...)
	}
	r.src = nil
	delete(p.reqs, key)
	if r.snd != nil && !r.snd.settled {
		r.snd.publish(PollFailed) // closed or aborted before it ended
	}
	for tag := range p.keys {
		if tag.Key() == key {
			delete(p.keys, tag)
		}
	}
}

// post maps a core Post to one sdk batch: page i of the request goes from
// its source page to the slot's shard for this rank, under the key decode
// granted for that page.
func (p *Prefill) post(post core.Post) {
	id := post.Batch
	fail := func(why string) {
		p.Metrics.failedSend("post")
		p.log.Warn("batch not posted", "batch", id, "tag", post.Tag, "why", why)
		p.lp.later(func() {
			if p.core.Completed(id, core.FailedDefinite, now()) == nil {
				p.act()
			}
		})
	}
	tk, ok := p.keys[post.Tag]
	r := p.reqs[post.Tag.Key()]
	switch {
	case !ok || int(post.FirstPage)+len(post.Slots) > len(tk.keys):
		fail("no keys for these pages")
		return
	case r == nil || int(post.FirstPage)+len(post.Slots) > len(r.src):
		fail("no source pages")
		return
	}
	lanes := p.lanesFor(tk.keys, int(post.FirstPage))
	if len(lanes) == 0 {
		fail("no data lane to decode")
		return
	}
	shard := uint64(p.cfg.ShardBytes)
	ops := make([]sdk.Op, 0, len(post.Slots))
	for i := range post.Slots {
		page := int(post.FirstPage) + i
		ops = p.pageOps(ops, uint64(r.src[page])*shard, tk.keys[page])
	}
	peer := lanes[lane(post.Tag, len(lanes))]
	p.track(id, peer)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	err := p.tr.Post(ctx, sdk.Batch{ID: sdk.BatchID(id), Peer: peer, Ops: ops})
	cancel()
	if err != nil {
		p.untrack(id)
		fail(err.Error()) // a refused Post was never accepted: nothing moves
	}
}

// pageOps appends the writes of one page: this rank's shard under the
// page's key at Base (v2), or, where decode split the page across engine
// buffers (keyRef.Parts: direct mode, one buffer per layer), each next
// piece of the shard under its part's key.
func (p *Prefill) pageOps(ops []sdk.Op, src uint64, k keyRef) []sdk.Op {
	if len(k.Parts) == 0 {
		return append(ops, sdk.Op{Kind: sdk.OpWrite, LocalRegion: p.region, LocalOffset: src,
			RemoteKey: sdk.Key(k.Key), RemoteOffset: k.Base, Length: uint64(p.cfg.ShardBytes)})
	}
	for _, part := range k.Parts {
		ops = append(ops, sdk.Op{Kind: sdk.OpWrite, LocalRegion: p.region, LocalOffset: src,
			RemoteKey: sdk.Key(part.Key), RemoteOffset: part.Base, Length: part.Len})
		src += part.Len
	}
	return ops
}

func lane(tag core.Tag, n int) int {
	h := fnv.New64a()
	var b [16]byte
	for i := 0; i < 8; i++ {
		b[i] = byte(tag.Room >> (8 * i))
		b[8+i] = byte(tag.Gen >> (8 * i))
	}
	h.Write(b[:])
	return int(h.Sum64() % uint64(n))
}

// quiesce asks the transport for evidence, per lane, retrying until it has
// some: a batch stays in doubt (and its tag un-acked) until then.
func (p *Prefill) quiesce(q core.Quiesce) {
	byPeer := map[sdk.PeerID][]sdk.BatchID{}
	for _, id := range q.Batches {
		peer, ok := p.batchPeer[id]
		if !ok {
			continue // never posted: its refusal is already queued
		}
		byPeer[peer] = append(byPeer[peer], sdk.BatchID(id))
	}
	for peer, ids := range byPeer {
		go func() {
			if p.cfg.QuiesceGrace > 0 {
				if ids = p.awaitSettled(ids, p.cfg.QuiesceGrace); len(ids) == 0 {
					return // all completed definitely: the core has settled them
				}
			}
			for attempt := 0; ; attempt++ {
				start := time.Now()
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				res, err := p.tr.Quiesce(ctx, peer, ids)
				cancel()
				if err == nil {
					p.Metrics.quiesced(time.Since(start))
					p.Metrics.evidence(string(res.Evidence), len(ids))
					// Every transport evidence but a reaped plugin
					// (completions harvested, receiver confirmed,
					// receiver closed, endpoint flushed) is the core's
					// "quiesced"; the kind is kept in the metric and log.
					ev := core.EvidenceQuiesced
					if res.Evidence == sdk.EvidenceProcessExited {
						ev = core.EvidenceProcessExited
					}
					if res.Evidence == sdk.EvidenceReceiverClosed {
						p.log.Info("in-doubt batches quiesced: the receiver closed their connection (it is gone)", "peer", peer, "batches", len(ids), "detail", res.Detail)
					}
					p.lp.post(func() { p.quiesced(ids, ev) })
					return
				}
				if attempt == 0 || attempt%20 == 0 {
					p.log.Warn("quiesce gave no evidence yet; batches stay in doubt", "peer", peer, "batches", len(ids), "error", err)
				}
				select {
				case <-p.quit:
					return
				case <-time.After(250 * time.Millisecond):
				}
			}
		}()
	}
}

// awaitSettled waits up to grace for batches to complete definitely and
// returns those that did not (still pending, or completed InDoubt).
func (p *Prefill) awaitSettled(ids []sdk.BatchID, grace time.Duration) []sdk.BatchID {
	deadline := time.Now().Add(grace)
	for {
		var left []sdk.BatchID
		if !p.lp.call(func() {
			for _, id := range ids {
				// batchPeer keeps a batch until a definite completion.
				if _, ok := p.batchPeer[core.BatchID(id)]; ok {
					left = append(left, id)
				}
			}
		}) {
			return nil // agent closed
		}
		if len(left) == 0 || time.Now().After(deadline) {
			return left
		}
		ids = left
		select {
		case <-p.quit:
			return nil
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (p *Prefill) quiesced(ids []sdk.BatchID, ev core.DrainEvidence) {
	cids := make([]core.BatchID, len(ids))
	for i, id := range ids {
		cids[i] = core.BatchID(id)
		p.untrack(cids[i]) // settled: no lane carries it any more
	}
	p.core.Quiesced(cids, ev, now())
	p.act()
}

func (p *Prefill) completions() {
	for c := range p.tr.Completions() {
		id := core.BatchID(c.Batch)
		var st core.BatchStatus
		switch c.Status {
		case sdk.Succeeded:
			st = core.Succeeded
		case sdk.FailedDefinite:
			st = core.FailedDefinite
		default:
			st = core.InDoubt // anything unknown is in doubt
			p.Metrics.inDoubt.Inc()
		}
		p.lp.post(func() {
			if p.core.Completed(id, st, now()) == nil {
				p.act()
			}
			if st != core.InDoubt {
				p.untrack(id)
			}
		})
	}
}

func (p *Prefill) events() {
	for ev := range p.cfg.Events {
		if ev.Kind == sdk.EventPluginExited && len(ev.Batches) > 0 {
			ids := ev.Batches
			p.log.Warn("transport plugin exited: its batches can no longer move", "batches", len(ids))
			p.Metrics.evidence(string(sdk.EvidenceProcessExited), len(ids))
			p.lp.post(func() { p.quiesced(ids, core.EvidenceProcessExited) })
		}
	}
}

// Stats returns the core's figures.
func (p *Prefill) Stats() core.SenderMetrics {
	var m core.SenderMetrics
	p.lp.call(func() { m = p.core.Metrics() })
	return m
}
