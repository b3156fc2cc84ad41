package agent

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/kvfence/kvfence/core"
	"github.com/kvfence/kvfence/core/knownunsafe"
	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/internal/routerlink"
	"github.com/kvfence/kvfence/sdk"
)

// DecodeConfig configures a decode-rank agent.
type DecodeConfig struct {
	Rank     core.RankID
	Instance uint64 // this incarnation; zero picks one from the clock
	Slots    int    // KV slots in the shared-memory pool
	// ShardBytes is what one prefill rank writes per page; a slot holds one
	// shard per tensor-parallel rank (Shards of them).
	ShardBytes int64
	Shards     int

	Lease, MaxHold, ClockMargin time.Duration
	MaxDeclaredTail             time.Duration // longest tail a prefill rank may declare; zero: core.DefaultMaxDeclaredTail
	Tick                        time.Duration // core timer resolution; default 10ms
	PeerDeadAfter               time.Duration // a rank whose link stays down this long is dead; default 1s

	// Fence: grant one key per page per exposure and let the core revoke
	// them (a receiver-side fence). Without it the whole pool is exposed
	// under one key and only drained and timeout release memory.
	Fence bool
	// Revoke: when an aborted exposure's keys are revoked (RevokeOrder;
	// the zero value is RevokeAuto).
	Revoke RevokeOrder
	// UnboundKeys: with a fence, grant keys any holder may use even where
	// the transport could bind each rank's keys to its data identity
	// (Capabilities.WriterBound; writer_keys.go). For measuring the cost
	// of binding and for tests; off by default.
	UnboundKeys bool
	// RequireShardKeys: refuse to start (FailedPrecondition) where keys
	// cannot be bound to shard positions (shard_keys.go): no fence, a
	// restart fence, or a transport declaring bounds none.
	RequireShardKeys bool
	// keyBounds, when set, caps how decode binds keys to shard positions
	// below what the transport declares (tests and benchmarks: the window
	// arm on a pieces transport, the whole-slot control arm).
	keyBounds *sdk.Bounds
	// Check, when set, checks page contents before exposure, at handoff,
	// at finish and after release (the demo's content oracle; a real
	// engine's bytes are its own: nil).
	Check ContentCheck
	// Checksums: require a checksum in every Commit and check it against
	// the slots before the core sees the Commit (checksum.go). Off by default.
	Checksums bool

	ControlAddr string      // where prefill ranks and the router connect
	TLS         *tls.Config // mutual TLS for the control plane; nil = plaintext
	// commands, when set, serves each router link until it ends: the
	// demo's simulated engine takes its orders this way. Nil: routers are
	// refused. Unexported because the router protocol is the demo's, not
	// an engine's API: only this module sets it, through
	// routerlink.ServeCommands (commandlink.go).
	commands func(routerlink.Link)
	// AdvertiseData rewrites the data endpoint prefill ranks are told into
	// one or more addresses, so proxies can sit on the data path (the
	// demo's delaying proxy, one per lane).
	AdvertiseData func(sdk.Endpoint) []sdk.Endpoint
	// unsafeGrantRace is a known-unsafe variant for tests
	// (async_grant.go): a revocation does not wait for the exposure's
	// grant in flight, and keys go out to a released exposure.
	unsafeGrantRace bool
	// unsafeQuiesceEarly is a known-unsafe variant for tests
	// (link_quiesce.go): decode answers a close handshake while an
	// exposure's Assign to that rank still waits for its keys.
	unsafeQuiesceEarly bool
	// syncGrants grants in Init, on the loop, as before issue 21: the
	// baseline arm of BenchmarkGrantPath.
	syncGrants bool
	// syncUnboundGrants grants again for writers not connected yet in the
	// loop, one call per exposure, as before (the known-slow variant of
	// TestUnboundRetryLeavesTheLoopFree).
	syncUnboundGrants bool
	// Restart, when set, turns on the restart fence (restart.go): decode
	// opens its own target instances with Restart.Open, and NewDecode's
	// transport argument must be nil. Per-exposure keys (Fence) are not
	// used then: the instance's process is the fence.
	Restart *RestartConfig
	// Engine, when set, is direct mode (direct.go): the engine's own KV
	// memory is registered instead of a pool, and requests name their
	// pages (KVReceiver.InitAt). Slots is then how many of its pages may
	// be lent at once.
	Engine *EngineMemory
	// Limits bound what one peer can cost this rank (limits.go).
	Limits Limits
	Logger hclog.Logger
}

// Decode is one decode rank's agent.
type Decode struct {
	cfg     DecodeConfig
	log     hclog.Logger
	tr      sdk.Transport
	granter sdk.Granter
	info    sdk.Info
	mem     *sdk.SharedMemory
	region  sdk.RegionID
	poolKey sdk.Key
	data    sdk.Endpoint
	slotB   int64
	hello   peerHello
	helloMu sync.Mutex // hello changes when a target instance restarts (restart.go)
	fence   bool
	// bindWriters: grant each rank keys bound to its data identity
	bindWriters bool
	// shardKeys: how each rank's keys are bound to its shard positions
	// (shard_keys.go); none: not at all.
	shardKeys sdk.Bounds
	// layers: direct mode's engine buffers, one region each
	// (direct_layers.go); nil with one region.
	layers []engineLayer
	// landing: direct mode's host landing pages (direct_host.go); nil
	// without EngineMemory.HostPages.
	landing *landing

	core    *core.Receiver
	lp      *loop
	srv     *server
	Metrics *Metrics
	snap    atomic.Pointer[core.ReceiverMetrics]
	revokes sync.WaitGroup // key calls off the loop; Close waits for them
	// grantQ and hygieneQ coalesce key calls (coalesce.go): exposures'
	// grants (async_grant.go) and revocations of keys nothing should
	// still write under.
	grantQ   *coalescer[*grantJob]
	hygieneQ *coalescer[[]sdk.Key]
	// keyCalls counts the per-exposure key calls made to the plugin
	// (a batched grant or revocation counts once): DecodeStats.KeyCalls.
	keyCalls atomic.Int64
	// fenceTags and fenceKeys are the exposures the core asked fenced in
	// this loop turn and their keys (loop-owned): flushRevokes revokes
	// them in one call at the turn's end.
	fenceTags []core.Tag
	fenceKeys [][]sdk.Key
	targets   []*target // with a restart fence (restart.go); loop-owned after NewDecode

	linkedPub atomic.Pointer[map[core.RankID]bool] // the linked ranks as Linked reads them (linked.go)

	// loop-owned
	links       map[core.RankID]*link
	routers     map[*link]bool
	tags        map[core.RequestKey]*decTag
	deadline    map[core.RankID]time.Time // link lost at; PeerDead once PeerDeadAfter passed
	quiesced    map[core.RankID]bool      // ranks whose link closed after the close handshake (link_quiesce.go)
	quiesceOwed int                       // links owed the close handshake's answer (link_quiesce.go)
	stats       DecodeStats
	started     time.Time
	lastSamp    time.Time
}

// decTag is the agent's side of one exposure.
type decTag struct {
	tag      core.Tag
	ranks    []core.RankID
	slots    []uint32
	keys     []keyRef                 // shared (bounds none): every rank without its own, at its shard's offset
	rankKeys map[core.RankID][]keyRef // one rank's own, over its shards (nil entry: refused keys)
	granted  []sdk.Key                // per-exposure keys still to revoke
	// granting: its keys are being made off the loop (async_grant.go);
	// held are its messages until then, revokeAsked a revocation the core
	// asked meanwhile.
	granting    bool
	held        []heldFrame
	revokeAsked bool
	state       PollState
	reason      string
	corrupt     map[int]bool
	recv        *KVReceiver
	hold        holdTrack // the hold log (holdlog.go)
}

// NewDecode starts a decode agent on an opened transport: it maps the KV
// pool into shared memory, registers it, and listens for links.
func NewDecode(ctx context.Context, cfg DecodeConfig, tr sdk.Transport) (*Decode, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = hclog.NewNullLogger()
	}
	d := &Decode{cfg: cfg, log: log, tr: tr, links: map[core.RankID]*link{}, routers: map[*link]bool{},
		tags: map[core.RequestKey]*decTag{}, deadline: map[core.RankID]time.Time{}, quiesced: map[core.RankID]bool{}, lp: newLoop(), started: time.Now()}
	d.slotB = cfg.ShardBytes * int64(cfg.Shards)
	d.grantQ = &coalescer[*grantJob]{run: d.grantBatch, wg: &d.revokes}
	d.hygieneQ = &coalescer[[]sdk.Key]{run: func(g [][]sdk.Key) { _ = d.revokeKeys(g) }, wg: &d.revokes}
	if cfg.Restart != nil {
		if err := d.startRestart(ctx); err != nil {
			return nil, err
		}
		return d.listen(log)
	}
	if err := d.startOnTransport(ctx); err != nil {
		return nil, err
	}
	return d.listen(log)
}

// withDefaults fills in the optional fields and refuses a pool that
// cannot exist or a certificate already expired.
func (cfg DecodeConfig) withDefaults() (DecodeConfig, error) {
	if cfg.Tick <= 0 {
		cfg.Tick = 10 * time.Millisecond
	}
	if cfg.PeerDeadAfter <= 0 {
		cfg.PeerDeadAfter = time.Second
	}
	if cfg.Shards <= 0 {
		cfg.Shards = 1
	}
	if cfg.Instance == 0 {
		cfg.Instance = uint64(time.Now().UnixNano())
	}
	if cfg.Slots <= 0 || cfg.ShardBytes <= 0 {
		return cfg, errdefs.Errorf(errdefs.InvalidArgument, "decode: slots (%d) and shard bytes (%d) must be positive", cfg.Slots, cfg.ShardBytes)
	}
	if cfg.MaxDeclaredTail < 0 {
		return cfg, errdefs.Errorf(errdefs.InvalidArgument, "decode: MaxDeclaredTail %v is negative (zero: core.DefaultMaxDeclaredTail)", cfg.MaxDeclaredTail)
	}
	if int(cfg.Revoke) >= len(revokeOrderNames) {
		return cfg, errdefs.Errorf(errdefs.InvalidArgument, "decode: %v is no revoke order", cfg.Revoke)
	}
	if err := checkOwnCertificate(cfg.TLS, time.Now()); err != nil {
		return cfg, err
	}
	cfg.Limits = cfg.Limits.withDefaults(cfg.Slots)
	return cfg, nil
}

// startRestart starts decode under the restart fence: its own target
// instances, no transport of the caller's (restart.go).
func (d *Decode) startRestart(ctx context.Context) error {
	r := d.cfg.Restart
	if d.tr != nil || r.Targets <= 0 || r.Targets > MaxTargets || r.Open == nil || d.cfg.AdvertiseData != nil {
		return errdefs.Errorf(errdefs.InvalidArgument, "decode: a restart fence needs 1..%d Targets (got %d) and an Open function, opens its own transports (so takes none) and takes no AdvertiseData", MaxTargets, r.Targets)
	}
	if _, err := d.chooseShardKeys(); err != nil {
		return err // before any instance starts
	}
	return d.startRestartFenced(ctx)
}

// startOnTransport starts decode on the caller's transport: its
// capabilities decide the fence, the pool is mapped, registered and (with
// no fence) granted under one key, and the data endpoint is advertised.
func (d *Decode) startOnTransport(ctx context.Context) error {
	info, err := d.tr.Info(ctx)
	if err != nil {
		return fmt.Errorf("decode: transport info: %w", err)
	}
	d.info = info
	if err := checkOwnTail(d.cfg.MaxDeclaredTail, info.Capabilities.MaxTail); err != nil {
		return err // before the pool is mapped or registered
	}
	g, ok := d.tr.(sdk.Granter)
	if !ok {
		return errdefs.Errorf(errdefs.FailedPrecondition, "decode: the transport cannot grant keys, so it cannot expose memory to writers")
	}
	d.granter = g
	d.fence = d.cfg.Fence && info.Capabilities.Revoke
	d.bindWriters = d.fence && info.Capabilities.WriterBound && !d.cfg.UnboundKeys
	d.log.Info("fence", "on", d.fence, "revoke", d.cfg.Revoke.String(), "revoke_at_abort", d.revokesAtAbort(),
		"refusals_isolated", info.Capabilities.RefusalsIsolated)
	if d.shardKeys, err = d.chooseShardKeys(); err != nil {
		return err // before the pool is mapped or registered
	}
	if d.cfg.Engine != nil {
		err = d.registerEngine(ctx)
	} else {
		err = d.mapPool(ctx)
	}
	if err != nil {
		return err
	}
	if d.data, err = d.tr.LocalEndpoint(ctx); err != nil {
		return err
	}
	lanes := d.advertise()
	if err := d.newCore(core.RestartFenceConfig{}); err != nil {
		return err
	}
	d.hello.DataAddresses = lanes
	return nil
}

// checkOwnTail refuses a transport whose own declared tail is longer than
// an explicit MaxDeclaredTail. Every timeout hold waits out the larger of
// decode's own tail and the writer's (core: Receiver.Tail), so a configured
// maximum that the own transport exceeds would not bound the holds; the
// caller set it to fit something (SGLang direct mode: SGLang's
// deferred-release timeout), so it is an error, never silently raised.
// Zero: the core's default, which grows to the own tail.
func checkOwnTail(maxDeclared, own time.Duration) error {
	if maxDeclared > 0 && own > maxDeclared {
		return errdefs.Errorf(errdefs.InvalidArgument, "decode: this rank's own transport declares a tail of %v, above the configured MaxDeclaredTail %v (max_declared_tail_ms %d): "+
			"every timeout hold would last that long; raise MaxDeclaredTail or shorten the transport's tail (e.g. KVFENCE_TCP_WRITE_TTL)",
			own, maxDeclared, maxDeclared.Milliseconds())
	}
	return nil
}

// mapPool maps the KV pool into shared memory and registers it; without
// the fence, one key covers the whole pool.
func (d *Decode) mapPool(ctx context.Context) error {
	size := int64(d.cfg.Slots) * d.slotB
	var err error
	if d.mem, err = sdk.NewSharedMemory(fmt.Sprintf("decode-%d-pool", d.cfg.Rank), uint64(size)); err != nil {
		return err
	}
	if d.region, err = d.tr.RegisterMemory(ctx, d.mem.Desc()); err != nil {
		d.mem.Close()
		return fmt.Errorf("decode: register pool: %w", err)
	}
	if !d.fence {
		if d.poolKey, err = d.granter.Grant(ctx, sdk.Window{Region: d.region, Length: uint64(size)}); err != nil {
			return fmt.Errorf("decode: grant pool key: %w", err)
		}
	}
	return nil
}

// advertise applies AdvertiseData: prefill ranks are told the first
// rewritten endpoint, and every rewritten address as a lane.
func (d *Decode) advertise() []string {
	if d.cfg.AdvertiseData == nil {
		return nil
	}
	eps := d.cfg.AdvertiseData(d.data)
	var lanes []string
	for _, ep := range eps {
		lanes = append(lanes, ep.Address)
	}
	if len(eps) > 0 {
		d.data = eps[0]
	}
	return lanes
}

// rankRefusals tells the core what a linking prefill rank's transport
// declares of refused writes (loop only). Revocation at the abort waits
// for the drain on a rank whose refused write may fail its neighbours:
// other requests' batches queued on the same connection (an older plugin).
func (d *Decode) rankRefusals(rank core.RankID, isolated bool) {
	if d.cfg.Revoke == RevokeAtAbort {
		isolated = true // the operator's order, whatever the rank declares
	}
	d.core.RankRefusals(rank, isolated)
	if d.revokesAtAbort() && !isolated {
		d.log.Warn("prefill rank's transport does not isolate refused writes: its requests' keys are revoked after their drain, not at the abort (upgrade its plugin for short holds)",
			"rank", rank)
	}
}

// revokesAtAbort: the fence revokes an aborted exposure's keys at the
// abort (cfg.Revoke, resolved against the transport's declaration).
func (d *Decode) revokesAtAbort() bool {
	return d.fence && d.cfg.Revoke.revokesAtAbort(d.info.Capabilities.RefusalsIsolated)
}

// newCore starts the receiver and the Hello it answers with, once d.info
// and d.data are known.
func (d *Decode) newCore(rf core.RestartFenceConfig) error {
	cfg, info := d.cfg, d.info
	var err error
	d.core, err = core.NewReceiver(core.ReceiverConfig{
		Instance: cfg.Instance, Self: cfg.Rank, Slots: cfg.Slots, SlotBytes: d.slotB, EnginePages: cfg.enginePages(),
		Lease: cfg.Lease, MaxHold: cfg.MaxHold, MaxTail: info.Capabilities.MaxTail, ClockMargin: cfg.ClockMargin,
		MaxDeclaredTail: cfg.MaxDeclaredTail, CanRevoke: d.fence, EagerRevoke: d.revokesAtAbort(), RestartFence: rf, Unsafe: knownunsafe.AgentVariant(),
	}, now())
	if err != nil {
		return err
	}
	d.hello = peerHello{Role: RoleDecode, Rank: uint32(cfg.Rank), Version: ControlVersion, Instance: cfg.Instance,
		Caps:          peerCaps{Revoke: info.Capabilities.Revoke, MaxTail: int64(info.Capabilities.MaxTail)},
		DataTransport: d.data.Transport, DataAddress: d.data.Address, DataOpaque: d.data.Opaque, SlotBytes: d.slotB, ShardBytes: cfg.ShardBytes,
		Checksums: cfg.Checksums, Buffers: len(d.layers)}
	return nil
}

// listen serves the control plane and starts the loop.
func (d *Decode) listen(log hclog.Logger) (*Decode, error) {
	cfg := d.cfg
	var err error
	d.Metrics = newMetrics("decode", uint32(cfg.Rank), d.snapshot)
	d.publish()
	d.srv, err = newServer(cfg.ControlAddr, cfg.TLS, cfg.Limits, d.accept, d.serveLink)
	if err != nil {
		d.closeTargets()
		return nil, err
	}
	d.lp.turnEnd = d.flushRevokes
	go d.lp.run(cfg.Tick, d.tick)
	log.Info("decode agent up", "rank", cfg.Rank, "instance", cfg.Instance, "control", d.srv.Addr(),
		"data", d.data.Address, "slots", cfg.Slots, "slot_bytes", d.slotB, "fence", d.fence, "writer_bound", d.bindWriters, "shard_keys", d.shardKeys.String(), "max_tail", d.info.Capabilities.MaxTail, "targets", len(d.targets),
		"variant", knownunsafe.AgentVariant().Name())
	return d, nil
}

// Addr is the control-plane address.
func (d *Decode) Addr() string { return d.srv.Addr() }

// Instance is this decode incarnation.
func (d *Decode) Instance() uint64 { return d.cfg.Instance }

func (d *Decode) snapshot() metricsSnapshot { return metricsSnapshot{Receiver: d.snap.Load()} }

func (d *Decode) publish() {
	m := d.core.Metrics()
	d.snap.Store(&m)
}

// Close stops the agent. Exposed memory is not released by it: the process
// is going away, and a restarted instance quarantines what this one exposed.
// The host landing pages of direct mode (EngineMemory.HostPages), which
// the agent itself mapped, are deregistered and unmapped here when no
// exposure can still write them (none lent for writing); else they stay
// mapped until ReleaseHostPages, called once the transport is closed.
func (d *Decode) Close() {
	d.srv.Stop()
	d.lp.shutdown()
	for l := range d.routers {
		l.close()
	}
	for _, l := range d.links {
		l.close()
	}
	d.revokes.Wait()
	d.closeTargets()
	d.releaseLanding(false) // after the loop and every key call off it stopped
}

// accept decides about a Hello on the control port.
func (d *Decode) accept(h peerHello) (peerHello, error) {
	self := d.currentHello()
	switch h.Role {
	case RoleRouter:
		if d.cfg.commands == nil {
			return peerHello{}, errdefs.Errorf(errdefs.FailedPrecondition, "decode rank %d takes no router commands", d.cfg.Rank)
		}
		if h.Version != ControlVersion {
			return peerHello{}, errdefs.Errorf(errdefs.FailedPrecondition, "incompatible router: speaks control protocol v%d, decode speaks v%d", h.Version, ControlVersion)
		}
		return self, nil
	case RolePrefill:
		err := compatible(h, self)
		if err == nil {
			err = d.core.CheckTail(core.RankID(h.Rank), time.Duration(h.Caps.MaxTail)) // reads only configuration
		}
		if err != nil {
			d.log.Error("refusing prefill rank", "rank", h.Rank, "error", err)
			return peerHello{}, err
		}
		return self, nil
	}
	return peerHello{}, errdefs.Errorf(errdefs.FailedPrecondition, "decode accepts prefill ranks and routers, not %q", h.Role)
}

func (d *Decode) serveLink(l *link) {
	if l.peer.Role == RoleRouter {
		d.lp.post(func() { d.routers[l] = true })
		defer d.lp.post(func() { delete(d.routers, l) })
		d.cfg.commands(agentLink(l))
		return
	}
	rank := core.RankID(l.peer.Rank)
	declared := time.Duration(l.peer.Caps.MaxTail)
	d.lp.post(func() {
		// The rank's writes can land as late as its own transport allows
		// (accept refused a tail the core would refuse).
		if err := d.core.RankTail(rank, declared); err != nil {
			d.log.Error("refusing prefill rank", "rank", rank, "error", err)
			l.close()
			return
		}
		d.rankRefusals(rank, l.peer.Caps.RefusalsIsolated)
		if old := d.links[rank]; old != nil && old != l {
			old.close()
		}
		d.links[rank] = l
		delete(d.deadline, rank)
		delete(d.quiesced, rank)
		d.publishLinked()
		d.Metrics.tail(rank, d.core.Tail(rank))
		d.log.Info("prefill rank linked", "rank", rank, "declared_tail", declared, "tail", d.core.Tail(rank))
	})
	defer d.lp.post(func() {
		d.settleQuiesce(l)
		if d.links[rank] == l {
			delete(d.links, rank)
			d.publishLinked()
			d.deadline[rank] = time.Now()
			if l.quiescing { // closed after the handshake: no request until it links again
				d.quiesced[rank] = true
			}
			d.log.Warn("prefill rank link lost", "rank", rank)
		}
	})
	for {
		f, err := l.recv(func() { d.Metrics.reject("replayed") })
		if err != nil || !d.onFrame(l, f) {
			return
		}
	}
}

// onFrame checks one frame from a prefill rank's link and queues it for the
// loop; false when the link ended while it waited for its turn.
func (d *Decode) onFrame(l *link, f *frame) bool {
	if handled, up := quiesceFrame(f, l, d.lp, func(t frameType) {
		if t == frameQuiesce {
			d.onQuiesce(l)
		} else if t == frameResume {
			d.onResume(l)
		}
	}); handled {
		return up
	}
	m, ok := coreMessage(f, d.Metrics)
	if !ok {
		return true
	}
	if len(m.Tags)+len(m.Ended) > maxHeartbeatTags(d.cfg.Slots) {
		d.Metrics.reject("oversized") // more tags than an honest rank can hold here
		return true
	}
	return l.toLoop(d.lp, func() { d.step(l, m) })
}

// step checks a control message at the agent before the core sees it: it
// must come from the rank it names, be addressed to us, be of a kind a rank
// sends, and — for a tag we hold — come from a rank the assignment names.
func (d *Decode) step(l *link, m core.Message) {
	switch {
	case m.Decode != d.cfg.Rank:
		d.Metrics.reject("misaddressed")
		return
	case m.Rank != core.RankID(l.peer.Rank):
		d.Metrics.reject("forged")
		d.log.Warn("forged message refused", "link_rank", l.peer.Rank, "claims", m.Rank, "msg", m.String())
		return
	}
	switch m.Kind {
	case core.KindHeartbeat:
		d.noteStarted(m.Tags)
	case core.KindCommit, core.KindFail, core.KindDrainAck:
		if dt := d.tags[m.Tag.Key()]; dt != nil && dt.tag == m.Tag && !hasRank(dt.ranks, m.Rank) {
			d.Metrics.reject("foreign")
			return
		}
		if m.Kind == core.KindCommit && d.cfg.Checksums && !d.checkCommit(m) {
			return
		}
		if dt := d.tags[m.Tag.Key()]; dt != nil && dt.tag == m.Tag && m.Kind != core.KindFail {
			d.noteEvidence(dt, m)
		}
	default:
		d.Metrics.reject("wrong-kind")
		return
	}
	d.core.Step(m, now())
	d.act()
}

// noteStarted notes the transfers that started: a heartbeat lists a tag
// once the rank works on it (loop only). Tags this instance does not hold
// go to the core whole: dropping some would make the rank's list and
// decode's copy differ, and the core bounds the Aborts it answers them
// with (core.MaxStaleAborts).
func (d *Decode) noteStarted(tags []core.Tag) {
	for _, t := range tags {
		if dt := d.tags[t.Key()]; dt != nil && dt.tag == t && dt.state == PollWaitingForInput {
			dt.state = PollTransferring
			dt.recv.publish(PollTransferring)
		}
	}
}

func hasRank(rs []core.RankID, r core.RankID) bool {
	for _, x := range rs {
		if x == r {
			return true
		}
	}
	return false
}

func (d *Decode) tick() {
	t := now()
	for rank, since := range d.deadline {
		if time.Since(since) >= d.cfg.PeerDeadAfter {
			delete(d.deadline, rank)
			d.log.Warn("prefill rank declared dead", "rank", rank)
			d.core.PeerDead(rank, t)
			d.act()
		}
	}
	d.core.Tick(t)
	d.act()
	if time.Since(d.lastSamp) >= 100*time.Millisecond {
		d.lastSamp = time.Now()
		m := d.core.Metrics()
		d.stats.Series = append(d.stats.Series, HeldSample{
			T: time.Since(d.started).Seconds(), Held: m.HeldSlots, Assigned: m.AssignedSlots, Handed: m.HandedSlots,
		})
	}
}

// admit exposes slots for a request (loop only): pages the pool picks,
// or in direct mode the engine's pages idx.
func (d *Decode) admit(key core.RequestKey, pages int, idx []uint32, ranks []core.RankID, rv *KVReceiver) (core.Tag, error) {
	if err := d.checkAdmission(key, pages, ranks); err != nil {
		return core.Tag{}, err
	}
	if err := d.checkQuiesced(key, ranks); err != nil {
		return core.Tag{}, err
	}
	var tag core.Tag
	var err error
	if idx != nil {
		tag, err = d.core.AdmitAt(key, ranks, idx, now())
	} else {
		tag, err = d.core.Admit(key, ranks, pages, now())
	}
	if err != nil {
		return core.Tag{}, err
	}
	out := d.core.Ready()
	dt := &decTag{tag: tag, ranks: append([]core.RankID(nil), ranks...), state: PollWaitingForInput, recv: rv}
	for _, env := range out.Messages {
		if env.Msg.Kind == core.KindAssign {
			dt.slots = append(dt.slots[:0], env.Msg.Slots...)
			break
		}
	}
	d.checkFree(dt)
	d.tags[key] = dt
	rv.publish(PollWaitingForInput)
	if d.fence && !d.restartFenced() && !d.cfg.syncGrants {
		d.grantAsync(dt) // the Assigns wait for the keys, not Init
		d.act()
		return tag, nil
	}
	if err := d.grant(dt); err != nil {
		d.log.Error("grant failed: aborting the exposure", "tag", tag, "error", err)
		d.act() // the Assigns go out without keys: nothing can be written
		_ = d.core.Abort(tag, core.ReasonDecodeAbort, now())
	}
	d.act()
	return tag, nil
}

// grant makes the keys an Assign carries: with a fence, each rank's own
// keys over its shards of this exposure only (shard_keys.go; bound to its
// data identity where the transport can: writer_keys.go), else the pool
// key at the slot's offset (keysFor adds the rank's shard).
func (d *Decode) grant(dt *decTag) error {
	if d.restartFenced() {
		d.grantTarget(dt)
		return nil
	}
	if !d.fence {
		dt.keys = make([]keyRef, len(dt.slots))
		for i, s := range dt.slots {
			dt.keys[i] = d.poolRef(s)
		}
		return nil
	}
	return d.grantFenced(dt)
}

// act carries out what the core's last input asked for (loop only).
func (d *Decode) act() {
	out := d.core.Ready()
	t := now()
	for _, env := range out.Messages {
		f := &frame{Type: frameCore, Core: core.AppendMessage(nil, &env.Msg)}
		if d.holdFrame(env.To, &env.Msg, f) {
			continue
		}
		if env.Msg.Kind == core.KindAssign {
			if dt := d.tags[env.Msg.Tag.Key()]; dt != nil && dt.tag == env.Msg.Tag {
				f.Keys = dt.keysFor(d, env.To)
			}
		}
		d.sendFrame(env.To, f)
	}
	// Copy what later inputs need: Output slices die with the next input.
	revokes := append([]core.Revoke(nil), out.Revokes...)
	handoffs := make([]core.Handoff, len(out.Handoffs))
	copy(handoffs, out.Handoffs)
	failures := append([]core.Failure(nil), out.Failures...)
	releases := make([]core.Release, len(out.Releases))
	copy(releases, out.Releases)
	restarts := append([]core.RestartTarget(nil), out.Restarts...)
	d.revokeAll(revokes)
	for _, h := range handoffs {
		d.handoff(h)
	}
	for _, f := range failures {
		if dt := d.tags[f.Tag.Key()]; dt != nil && dt.tag == f.Tag && dt.state != PollFailed {
			d.logHoldStart(dt, f.Reason)
			dt.state, dt.reason = PollFailed, f.Reason.String()
			d.log.Debug("request failed", "tag", f.Tag, "reason", f.Reason)
			if dt.recv != nil {
				dt.recv.reason = dt.reason
				dt.recv.publish(PollFailed) // before Done closes: a waiter on Done then polls
				dt.recv.settle()
			}
		}
	}
	var hygiene []sdk.Key
	for _, rel := range releases {
		hygiene = append(hygiene, d.release(rel, t)...)
	}
	d.hygieneRevoke(hygiene)
	for _, r := range restarts {
		d.restartTarget(r)
	}
	d.publish()
}

// sendFrame sends a control frame to a rank (loop only).
func (d *Decode) sendFrame(to core.RankID, f *frame) {
	l := d.links[to]
	if l == nil || !l.send(f) {
		d.Metrics.failedSend("control")
	}
}

// hygieneRevoke revokes keys nothing should still write under (drained,
// handed off, or never sent), off the loop: it only frees the plugin's
// state, and is a second line of defence. The hygiene queue revokes all
// those queued while its last call ran in one call.
func (d *Decode) hygieneRevoke(keys []sdk.Key) {
	if len(keys) > 0 {
		d.hygieneQ.add(keys)
	}
}

// revokeAll queues the keys of every exposure the core asked to fence in
// one input; flushRevokes revokes the whole loop turn's in one call off
// the loop (sdk.RevokeKeys: one RPC where the plugin takes batches), and
// each exposure whose keys all went is Revoked.
func (d *Decode) revokeAll(rvs []core.Revoke) {
	for _, rv := range rvs {
		if rv.All {
			// Our pool is fresh memory of this process, registered under
			// new keys: nothing an earlier instance granted can reach it.
			d.core.RevokedAll(now())
			d.act()
			continue
		}
		dt := d.tags[rv.Tag.Key()]
		if dt == nil || dt.tag != rv.Tag || d.awaitGrant(dt) {
			continue
		}
		d.fenceTags, d.fenceKeys = append(d.fenceTags, rv.Tag), append(d.fenceKeys, dt.granted)
		dt.granted = nil
	}
}

// flushRevokes revokes the keys revokeAll queued this loop turn (loop
// only, at the turn's end).
func (d *Decode) flushRevokes() {
	tags, groups := d.fenceTags, d.fenceKeys
	if len(tags) == 0 {
		return
	}
	d.fenceTags, d.fenceKeys = nil, nil
	d.revokes.Add(1)
	go func() {
		defer d.revokes.Done()
		start := time.Now()
		errs := d.revokeKeys(groups)
		var done []core.Tag
		for i, tag := range tags {
			if errs[i] != nil {
				d.log.Error("revoke failed; the exposure stays held until its timeout bound", "tag", tag, "error", errs[i])
				continue
			}
			d.Metrics.revoked(time.Since(start))
			done = append(done, tag)
		}
		if len(done) == 0 {
			return
		}
		d.lp.post(func() {
			for _, tag := range done {
				if dt := d.tags[tag.Key()]; dt != nil && dt.tag == tag {
					d.logHoldFence(dt)
				}
				// One input, then its output: the core's output holds
				// only the last input's releases.
				d.core.Revoked(tag, now())
				d.act()
			}
		})
	}()
}

// revokeKeys revokes every group's keys in one call and says, per group,
// whether one of its keys was not revoked (an unknown key counts as
// revoked: nothing can write under it).
func (d *Decode) revokeKeys(groups [][]sdk.Key) []error {
	var all []sdk.Key
	for _, g := range groups {
		all = append(all, g...)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	d.keyCalls.Add(1)
	got := sdk.RevokeKeys(ctx, d.granter, all)
	errs := make([]error, len(groups))
	for i, g := range groups {
		var ge []error
		for range g {
			if err := got[0].Err; err != nil && !errdefs.Is(err, errdefs.NotFound) {
				ge = append(ge, err)
			}
			got = got[1:]
		}
		errs[i] = errors.Join(ge...)
	}
	return errs
}

func (d *Decode) handoff(h core.Handoff) {
	dt := d.tags[h.Tag.Key()]
	if dt == nil || dt.tag != h.Tag {
		return
	}
	dt.state = PollSuccess
	d.verify(dt)
	d.stats.Handoffs++
	if dt.recv != nil {
		dt.recv.handed = true
		if pages := dt.recv.pagesInLoop(); pages != nil {
			dt.recv.pages.Store(&pages)
		}
		// Success only once the pages are there: published before them, a
		// poll in between (the loop preempted, or in verify) found Success
		// and no pages, and kvfence_receiver_handoff failed the request
		// FailedPrecondition (bench_sglang_calls with SWA state at load ~7:
		// 1 child in ~6).
		dt.recv.publish(PollSuccess)
		dt.recv.settle()
	}
}

// finish ends a handed-off request: the decode loop read its pages (they
// are verified once more, which catches late writes that landed during
// decoding) and its slots go back.
func (d *Decode) finish(tag core.Tag) {
	dt := d.tags[tag.Key()]
	if dt == nil || dt.tag != tag || dt.state != PollSuccess {
		return
	}
	d.verify(dt)
	if err := d.core.Finish(tag, now()); err != nil {
		d.log.Error("finish refused", "tag", tag, "error", err)
		return
	}
	d.act()
}

// release ends an exposure whose memory the core gave back and returns
// the keys still to revoke (act revokes them, for every release at once).
func (d *Decode) release(rel core.Release, t core.Time) []sdk.Key {
	d.Metrics.observeRelease(rel)
	d.stats.addRelease(rel)
	if rel.Tag == (core.Tag{}) {
		return nil // the restart quarantine
	}
	dt := d.tags[rel.Tag.Key()]
	if dt == nil || dt.tag != rel.Tag {
		return nil
	}
	delete(d.tags, rel.Tag.Key())
	if dt.recv != nil {
		dt.recv.pages.Store(nil) // before the slots are scrubbed and go back
	}
	if dt.recv != nil && !dt.recv.handed {
		dt.recv.publish(PollFailed) // released without handoff: nothing to read
	}
	d.logHoldRelease(dt, rel)
	d.scrub(dt)
	if dt.recv != nil {
		dt.recv.released.Store(true)
	}
	return dt.granted
}

// Stats returns the agent's figures (safe from any goroutine).
func (d *Decode) Stats() DecodeStats {
	var s DecodeStats
	d.lp.call(func() {
		s = d.stats.clone()
		s.Core = d.core.Metrics()
		s.LiveTags = len(d.tags)
		s.RevokeAtAbort = d.revokesAtAbort()
		s.KeyCalls = d.keyCalls.Load()
		for _, l := range d.links {
			s.ReplaysRefused += l.replays.Load()
		}
	})
	return s
}
