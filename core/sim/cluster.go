package sim

import (
	"fmt"
	"math/rand/v2"

	"github.com/kvfence/kvfence/core"
)

type slotState uint8

const (
	slotFree slotState = iota
	slotExposed
	slotHanded
	slotQuarantine
)

// slotShadow is the checker's own record of one decode slot: who owns it
// and whose bytes it holds.
type slotShadow struct {
	state   slotState
	tag     core.Tag
	content uint64 // uid of the request whose bytes are there (0: never written)
}

type decodeNode struct {
	id       core.RankID
	idx      int
	off      int64
	inst     uint64
	r        *core.Receiver
	slots    []slotShadow
	revoked  map[core.Tag]bool
	revBelow uint64 // every tag of an instance below this is revoked
	stopped  map[core.Tag]bool
	exposed  map[core.Tag][]uint32 // each tag's slots, as its Assign named them
	tagReq   map[core.Tag]*simReq
	admitted map[core.Tag]int64
	// restart fence: the process epoch of each target instance, and the
	// instance (and epoch) each tag was bound to at Assign
	epochs    []uint64
	tagTarget map[core.Tag]targetRef
}

type prefillNode struct {
	id          core.RankID
	idx         int
	off         int64
	alive       bool
	s           *core.Sender
	srcReleased map[core.RequestKey]bool
	sent        map[core.RequestKey]int
	cancelled   map[core.RequestKey]bool // the router's cancel reached this rank's engine
}

type simReq struct {
	uid      uint64
	key      core.RequestKey
	pages    int
	total    int
	reject   bool
	slow     bool
	decodes  []*decodeNode
	tags     []core.Tag
	released int
	aborted  bool
	done     bool
	attempts int
}

type flightKey struct {
	rank  int
	batch core.BatchID
}

type flight struct {
	rank    *prefillNode
	batch   core.BatchID
	tag     core.Tag
	dec     *decodeNode
	key     core.RequestKey
	uid     uint64
	pending int   // landings still scheduled
	lastAt  int64 // last scheduled landing
	done    bool  // completion delivered
	rogue   bool  // a lying rank's write after its DrainAck
}

type streamRef struct {
	rank int
	tag  core.Tag
	dec  core.RankID
}

type cluster struct {
	cfg      Config
	p        Profile
	rng      *rand.Rand
	sch      scheduler
	decodes  []*decodeNode
	prefills []*prefillNode
	reqs     map[core.RequestKey]*simReq
	order    []*simReq
	roomGen  []uint64
	nextUID  uint64
	arrivals int
	noMore   bool
	flights  map[flightKey]*flight
	pending  map[streamRef]int
	rogue    int // a lying rank's writes still to land
	res      Result
	trace    []string
	stopped  bool
	partA    int // partitioned decode, prefill
	partB    int
	partFrom int64
	partTo   int64
}

// Run simulates one seed and checks every invariant on every step.
func Run(cfg Config) Result {
	c := newCluster(cfg)
	c.run()
	if c.res.Violation != nil && !cfg.Trace {
		// Replay the same seed with tracing on: determinism gives the
		// same violation, now with its trace.
		cfg.Trace = true
		r := Run(cfg)
		if r.Violation != nil {
			return r
		}
		c.res.Violation.What += " (replay did not reproduce: nondeterminism!)"
	}
	return c.res
}

func newCluster(cfg Config) *cluster {
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x6b7666656e6365))
	c := &cluster{cfg: cfg, rng: rng, reqs: map[core.RequestKey]*simReq{},
		flights: map[flightKey]*flight{}, pending: map[streamRef]int{}}
	c.p = drawProfile(rng)
	c.p.drawRestart(cfg.Seed)
	c.p.drawRefusals(cfg.Seed)
	if cfg.Tweak != nil {
		cfg.Tweak(&c.p)
	}
	c.res.Seed = cfg.Seed
	c.res.Profile = c.p
	c.roomGen = make([]uint64, c.p.Rooms)
	for i := 0; i < c.p.Decode; i++ {
		d := &decodeNode{id: core.RankID(100 + i), idx: i, off: rng.Int64N(maxSkew+1) - maxSkew/2}
		d.slots = make([]slotShadow, c.p.Slots)
		d.revoked = map[core.Tag]bool{}
		c.decodes = append(c.decodes, d)
		c.startDecode(d, false)
	}
	for i := 0; i < c.p.Prefill; i++ {
		p := &prefillNode{id: core.RankID(i), idx: i, off: rng.Int64N(maxSkew+1) - maxSkew/2, alive: true,
			srcReleased: map[core.RequestKey]bool{}, sent: map[core.RequestKey]int{}, cancelled: map[core.RequestKey]bool{}}
		s, err := core.NewSender(core.SenderConfig{
			Rank: p.id, Session: uint64(i) + 1, SkewMargin: tdur(maxSkew), MaxInflight: c.p.MaxInflight, MaxBatchPages: c.p.MaxBatch,
			Heartbeat: tdur(heartbeat), RequestTombstone: tdur(maxHold + 2*maxSkew), BootstrapTimeout: tdur(3 * lease),
			Unsafe: cfg.Variant.WithSelfLease(tdur(lease)),
		})
		if err != nil {
			panic(err)
		}
		p.s = s
		c.prefills = append(c.prefills, p)
	}
	if c.p.Partition {
		c.partA = rng.IntN(c.p.Decode)
		c.partB = rng.IntN(c.p.Prefill)
		c.partFrom = rng.Int64N(int64(c.p.Requests) * 300_000)
		c.partTo = c.partFrom + 2*lease + rng.Int64N(6*lease)
	}
	return c
}

func (c *cluster) startDecode(d *decodeNode, restarted bool) {
	d.inst++
	d.stopped = map[core.Tag]bool{}
	d.exposed = map[core.Tag][]uint32{}
	d.tagReq = map[core.Tag]*simReq{}
	d.admitted = map[core.Tag]int64{}
	d.tagTarget = map[core.Tag]targetRef{}
	d.epochs = make([]uint64, c.p.Targets)
	r, err := core.NewReceiver(core.ReceiverConfig{
		Instance: d.inst, Self: d.id, Slots: c.p.Slots, SlotBytes: 4096,
		Lease: tdur(lease), MaxHold: tdur(maxHold), MaxTail: tdur(maxTail), ClockMargin: tdur(maxSkew),
		CanRevoke: c.p.CanRevoke, EagerRevoke: c.p.EagerRevoke, Restarted: restarted, Unsafe: c.cfg.Variant,
		RestartFence: c.p.restartFence(),
	}, c.dnow(d))
	if err != nil {
		panic(err)
	}
	// Every prefill rank declares its transport's tail when it links (its
	// Hello comes before any Assign can reach it), a restart included.
	for i := range c.p.Tails {
		if err := r.RankTail(core.RankID(i), tdur(c.p.declaredTail(i))); err != nil {
			panic(err)
		}
		r.RankRefusals(core.RankID(i), c.p.isolated(i))
	}
	d.r = r
	c.decodeOut(d)
}

func (c *cluster) dnow(d *decodeNode) core.Time  { return core.Time(c.sch.now + d.off) }
func (c *cluster) pnow(p *prefillNode) core.Time { return core.Time(c.sch.now + p.off) }

func (c *cluster) tracef(format string, args ...any) {
	if !c.cfg.Trace {
		return
	}
	n := c.cfg.TraceLen
	if n == 0 {
		n = 60
	}
	c.trace = append(c.trace, fmt.Sprintf("%7dus ", c.sch.now/1000)+fmt.Sprintf(format, args...))
	if len(c.trace) > n {
		c.trace = c.trace[len(c.trace)-n:]
	}
}

func (c *cluster) violate(inv, format string, args ...any) {
	if c.res.Violation != nil {
		return
	}
	what := fmt.Sprintf(format, args...)
	c.tracef("VIOLATION %s: %s", inv, what)
	c.res.Violation = &Violation{Seed: c.cfg.Seed, Invariant: inv, At: c.sch.now, What: what,
		Trace: append([]string(nil), c.trace...)}
	c.stopped = true
}

func (c *cluster) run() {
	gap := int64(0)
	for i := 0; i < c.p.Requests; i++ {
		gap += 30_000 + c.rng.Int64N(300_000)
		c.sch.at(gap, c.arrive)
	}
	for s := 0; s < c.p.Storms; s++ {
		c.sch.at(c.rng.Int64N(gap+1), c.storm)
	}
	if c.p.CrashRank {
		victim := c.prefills[c.rng.IntN(len(c.prefills))]
		c.sch.at(c.rng.Int64N(gap+1), func() { c.crash(victim) })
	}
	if c.p.RestartDecode {
		victim := c.decodes[c.rng.IntN(len(c.decodes))]
		c.sch.at(c.rng.Int64N(gap+1), func() { c.restart(victim) })
	}
	c.sch.at(0, c.tick)
	for !c.stopped {
		fn, ok := c.sch.next()
		if !ok {
			break
		}
		c.res.Steps++
		fn()
		if c.sch.now > runLimit && !c.stopped {
			c.violate("I6", "run did not settle within %dms: %s", runLimit/1e6, c.unsettledReason())
		}
	}
	for _, d := range c.decodes {
		c.countBlastRadius(d)
	}
}

// tick drives every node's timers and ends the run once everything settled.
func (c *cluster) tick() {
	if c.stopped {
		return
	}
	for _, d := range c.decodes {
		d.r.Tick(c.dnow(d))
		c.decodeOut(d)
	}
	for _, p := range c.prefills {
		if p.alive {
			p.s.Tick(c.pnow(p))
			c.prefillOut(p)
		}
	}
	if c.settled() {
		c.finalChecks()
		c.stopped = true
		return
	}
	c.sch.after(tickEvery, c.tick)
}

func (c *cluster) settled() bool { return c.unsettledReason() == "" }

// unsettledReason says what still keeps the run from ending ("" if nothing).
func (c *cluster) unsettledReason() string {
	if c.arrivals < c.p.Requests && !c.noMore {
		return "requests still arriving"
	}
	for _, r := range c.order {
		if !r.done {
			return fmt.Sprintf("request %s (tags %v) not resolved: %d of %d exposures released", r.key, r.tags, r.released, len(r.tags))
		}
	}
	if len(c.flights) > 0 || c.rogue > 0 {
		return "writes in flight"
	}
	for _, d := range c.decodes {
		if d.r.FreeSlots() != c.p.Slots {
			return fmt.Sprintf("decode %d: %d of %d slots free, %+v", d.id, d.r.FreeSlots(), c.p.Slots, d.r.Metrics())
		}
	}
	for _, p := range c.prefills {
		if p.alive {
			m := p.s.Metrics()
			if m.Streams > 0 || m.Unsettled > 0 || m.Requests > 0 {
				return fmt.Sprintf("prefill %d: %d streams, %d unsettled batches, requests still open: %v", p.id, m.Streams, m.Unsettled, p.s.OpenRequests())
			}
		}
	}
	return ""
}

// finalChecks: I6 — nothing leaked, every hold resolved.
func (c *cluster) finalChecks() {
	for _, d := range c.decodes {
		m := d.r.Metrics()
		if m.HeldSlots != 0 || m.AssignedSlots != 0 || m.HandedSlots != 0 || m.QuarantinedSlots != 0 {
			c.violate("I6", "decode %d gauges not zero at the end: %+v", d.id, m)
		}
		for i, s := range d.slots {
			if s.state != slotFree {
				c.violate("I6", "decode %d slot %d still %d in the checker's shadow", d.id, i, s.state)
			}
		}
	}
}
