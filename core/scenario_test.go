package core_test

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"

	"github.com/kvfence/kvfence/core"
)

// TestScenarios runs the protocol scripts under testdata/scenarios. Each
// command is one input to a node (or to the scripted network); the expected
// output is every value the core produced. Regenerate with -rewrite.
func TestScenarios(t *testing.T) {
	datadriven.Walk(t, "testdata/scenarios", func(t *testing.T, path string) {
		h := newHarness()
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			return h.run(t, d)
		})
	})
}

type envelope struct {
	from string
	to   string
	msg  core.Message
}

type harness struct {
	now      core.Time
	decodes  map[string]*core.Receiver
	dcfg     map[string]core.ReceiverConfig
	prefills map[string]*core.Sender
	net      []envelope
	b        strings.Builder
}

func newHarness() *harness {
	return &harness{decodes: map[string]*core.Receiver{}, dcfg: map[string]core.ReceiverConfig{}, prefills: map[string]*core.Sender{}}
}

func rankOf(name string) core.RankID {
	n, err := strconv.Atoi(strings.TrimLeft(name, "rd"))
	if err != nil {
		panic("bad node name " + name)
	}
	return core.RankID(n)
}

func nameOf(id core.RankID, decode bool) string {
	if decode {
		return fmt.Sprintf("d%d", id)
	}
	return fmt.Sprintf("r%d", id)
}

func arg(d *datadriven.TestData, key, def string) string {
	for _, a := range d.CmdArgs {
		if a.Key == key {
			if len(a.Vals) == 0 {
				return "true"
			}
			return strings.Join(a.Vals, ",")
		}
	}
	return def
}

func argInt(d *datadriven.TestData, key string, def int) int {
	v, err := strconv.Atoi(arg(d, key, strconv.Itoa(def)))
	if err != nil {
		d.Fatalf(nil, "%s: %v", key, err)
	}
	return v
}

func argDur(d *datadriven.TestData, key, def string) time.Duration {
	v, err := time.ParseDuration(arg(d, key, def))
	if err != nil {
		d.Fatalf(nil, "%s: %v", key, err)
	}
	return v
}

func (h *harness) key(d *datadriven.TestData) core.RequestKey {
	return core.RequestKey{Room: uint64(argInt(d, "room", 1)), Gen: uint64(argInt(d, "gen", 1))}
}

func (h *harness) tag(d *datadriven.TestData, dec string) core.Tag {
	k := h.key(d)
	inst := uint64(argInt(d, "inst", int(h.dcfg[dec].Instance)))
	return core.Tag{Instance: inst, Room: k.Room, Gen: k.Gen}
}

func (h *harness) at(t core.Time) string { return time.Duration(t).String() }

func (h *harness) fmtMsg(m core.Message) string {
	s := fmt.Sprintf("%s %s", m.Kind, m.Tag)
	switch m.Kind {
	case core.KindAssign:
		s += fmt.Sprintf(" ranks=%v slots=%v lease=%s", m.Ranks, m.Slots, h.at(m.LeaseUntil))
	case core.KindGrant:
		s += " lease=" + h.at(m.LeaseUntil)
	case core.KindAbort:
		s += fmt.Sprintf(" lease=%s %s", h.at(m.LeaseUntil), m.Reason)
	case core.KindCommit:
		s += fmt.Sprintf(" coverage=%d", m.Coverage)
	case core.KindFail, core.KindReject:
		s += " " + m.Reason.String()
	case core.KindDrainAck:
		s += " " + m.Evidence.String()
	case core.KindHeartbeat:
		s += fmt.Sprintf(" s%d #%d", m.Session, m.Seq)
		if m.Full {
			s += " full"
		}
		s += fmt.Sprintf(" started=%v ended=%v count=%d outstanding=%d", m.Tags, m.Ended, m.Count, m.Outstanding)
	case core.KindLease:
		s += fmt.Sprintf(" s%d #%d", m.Session, m.Seq)
		switch {
		case m.Full:
			s += " resync"
		case m.LeaseUntil != 0:
			s += " lease=" + h.at(m.LeaseUntil)
		default:
			s += " no-lease"
		}
		s += fmt.Sprintf(" excluded=%v", m.Tags)
	}
	return s
}

func (h *harness) printf(format string, args ...any) { fmt.Fprintf(&h.b, format+"\n", args...) }

// collect prints a node's output and queues its messages on the network.
func (h *harness) collect(node string, out *core.Output, decode bool) {
	for _, e := range out.Messages {
		m := e.Msg
		m.Ranks = append([]core.RankID(nil), m.Ranks...)
		m.Slots = append([]uint32(nil), m.Slots...)
		m.Tags = append([]core.Tag(nil), m.Tags...)
		m.Ended = append([]core.Tag(nil), m.Ended...)
		to := nameOf(e.To, !decode)
		h.net = append(h.net, envelope{from: node, to: to, msg: m})
		h.printf("%s -> %s: %s", node, to, h.fmtMsg(m))
	}
	for _, p := range out.Posts {
		h.printf("%s post batch=%d %s -> d%d pages=[%d,%d) slots=%v", node, p.Batch, p.Tag, p.Decode, p.FirstPage, p.FirstPage+uint32(len(p.Slots)), p.Slots)
	}
	for _, q := range out.Quiesces {
		h.printf("%s quiesce d%d batches=%v", node, q.Decode, q.Batches)
	}
	for _, r := range out.Revokes {
		if r.All {
			h.printf("%s revoke all keys of earlier instances", node)
		} else {
			h.printf("%s revoke %s", node, r.Tag)
		}
	}
	for _, x := range out.Failures {
		h.printf("%s failed %s (%s)", node, x.Tag, x.Reason)
	}
	for _, x := range out.Handoffs {
		h.printf("%s HANDOFF %s slots=%v", node, x.Tag, x.Slots)
	}
	for _, x := range out.Releases {
		h.printf("%s RELEASE %s slots=%v path=%s held=%s", node, x.Tag, x.Slots, x.Path, x.Held)
	}
	for _, x := range out.Sent {
		h.printf("%s sent %s to d%d", node, x.Key, x.Decode)
	}
	for _, x := range out.SourceReleases {
		h.printf("%s source pages of %s released", node, x.Key)
	}
}

func (h *harness) errorf(err error) {
	if err != nil {
		h.printf("error: %v", err)
	}
}

func (h *harness) dec(d *datadriven.TestData) (string, *core.Receiver) {
	n := arg(d, "d", "d100")
	r := h.decodes[n]
	if r == nil {
		d.Fatalf(nil, "no decode %s", n)
	}
	return n, r
}

func (h *harness) pre(d *datadriven.TestData) (string, *core.Sender) {
	n := arg(d, "p", "r0")
	s := h.prefills[n]
	if s == nil {
		d.Fatalf(nil, "no prefill %s", n)
	}
	return n, s
}

func (h *harness) decodeConfig(d *datadriven.TestData, name string, inst uint64, restarted bool) core.ReceiverConfig {
	return core.ReceiverConfig{
		Instance: inst, Self: rankOf(name), Slots: argInt(d, "slots", 4), SlotBytes: 4096,
		Lease: argDur(d, "lease", "1ms"), MaxHold: argDur(d, "maxhold", "4ms"),
		MaxTail: argDur(d, "tail", "300us"), ClockMargin: argDur(d, "margin", "50us"),
		CanRevoke: arg(d, "revoke", "false") == "true", EagerRevoke: arg(d, "eager", "false") == "true",
		Restarted: restarted,
	}
}

func (h *harness) run(t *testing.T, d *datadriven.TestData) string {
	h.b.Reset()
	if v := arg(d, "at", ""); v != "" {
		dur, err := time.ParseDuration(v)
		if err != nil {
			d.Fatalf(t, "at: %v", err)
		}
		h.now = core.Time(dur)
	}
	switch d.Cmd {
	case "decode":
		name := arg(d, "name", "d100")
		cfg := h.decodeConfig(d, name, uint64(argInt(d, "instance", 1)), false)
		r, err := core.NewReceiver(cfg, h.now)
		if err != nil {
			return "error: " + err.Error()
		}
		h.decodes[name], h.dcfg[name] = r, cfg
		h.collect(name, r.Ready(), true)
	case "restart":
		name, _ := h.dec(d)
		cfg := h.dcfg[name]
		cfg.Instance++
		cfg.Restarted = true
		r, err := core.NewReceiver(cfg, h.now)
		if err != nil {
			return "error: " + err.Error()
		}
		h.decodes[name], h.dcfg[name] = r, cfg
		h.printf("%s restarted as instance %d", name, cfg.Instance)
		h.collect(name, r.Ready(), true)
	case "prefill":
		name := arg(d, "name", "r0")
		s, err := core.NewSender(core.SenderConfig{
			Rank: rankOf(name), Session: uint64(argInt(d, "session", 1)), SkewMargin: argDur(d, "margin", "50us"), MaxInflight: argInt(d, "inflight", 4),
			MaxBatchPages: argInt(d, "batch", 1), Heartbeat: argDur(d, "heartbeat", "250us"),
			RequestTombstone: argDur(d, "tombstone", "5ms"), BootstrapTimeout: argDur(d, "bootstrap", "3ms"),
		})
		if err != nil {
			return "error: " + err.Error()
		}
		h.prefills[name] = s
	case "admit":
		name, r := h.dec(d)
		var ranks []core.RankID
		for _, x := range strings.Split(arg(d, "ranks", "r0"), ",") {
			ranks = append(ranks, rankOf(x))
		}
		tag, err := r.Admit(h.key(d), ranks, argInt(d, "pages", 1), h.now)
		if err != nil {
			h.errorf(err)
			break
		}
		h.printf("%s admitted %s", name, tag)
		h.collect(name, r.Ready(), true)
	case "abort", "reject", "dfinish", "revoked":
		name, r := h.dec(d)
		tag := h.tag(d, name)
		var err error
		switch d.Cmd {
		case "abort":
			err = r.Abort(tag, core.ReasonClientAbort, h.now)
		case "reject":
			err = r.Reject(tag, h.now)
		case "dfinish":
			err = r.Finish(tag, h.now)
		case "revoked":
			r.Revoked(tag, h.now)
		}
		h.errorf(err)
		h.collect(name, r.Ready(), true)
	case "revokedall":
		name, r := h.dec(d)
		r.RevokedAll(h.now)
		h.collect(name, r.Ready(), true)
	case "ranktail":
		name, r := h.dec(d)
		h.errorf(r.RankTail(rankOf(arg(d, "rank", "r0")), argDur(d, "tail", "0s")))
		h.collect(name, r.Ready(), true)
	case "rankrefusals":
		name, r := h.dec(d)
		r.RankRefusals(rankOf(arg(d, "rank", "r0")), arg(d, "isolated", "true") == "true")
		_ = name // no output: Ready stays the last input's
	case "peerdead":
		name, r := h.dec(d)
		r.PeerDead(rankOf(arg(d, "rank", "r0")), h.now)
		h.collect(name, r.Ready(), true)
	case "open", "produce", "finish", "pabort", "preject", "pclose":
		name, s := h.pre(d)
		k := h.key(d)
		var err error
		switch d.Cmd {
		case "open":
			err = s.Open(k, argInt(d, "pages", 1), h.now)
		case "produce":
			err = s.Produce(k, argInt(d, "upto", 1), h.now)
		case "finish":
			err = s.Finish(k, argInt(d, "total", 1), h.now)
		case "pabort":
			err = s.Abort(k, h.now)
		case "preject":
			err = s.Reject(k, h.now)
		case "pclose":
			err = s.Close(k, h.now)
		}
		h.errorf(err)
		h.collect(name, s.Ready(), false)
	case "complete":
		name, s := h.pre(d)
		st := map[string]core.BatchStatus{"succeeded": core.Succeeded, "failed-definite": core.FailedDefinite, "in-doubt": core.InDoubt}[arg(d, "status", "succeeded")]
		h.errorf(s.Completed(core.BatchID(argInt(d, "batch", 1)), st, h.now))
		h.collect(name, s.Ready(), false)
	case "quiesced":
		name, s := h.pre(d)
		var ids []core.BatchID
		for _, x := range strings.Split(arg(d, "batches", "1"), ",") {
			n, _ := strconv.Atoi(x)
			ids = append(ids, core.BatchID(n))
		}
		s.Quiesced(ids, core.EvidenceQuiesced, h.now)
		h.collect(name, s.Ready(), false)
	case "tick":
		node := arg(d, "node", "all")
		names := h.nodes()
		for _, n := range names {
			if node != "all" && node != n {
				continue
			}
			if r := h.decodes[n]; r != nil {
				r.Tick(h.now)
				h.collect(n, r.Ready(), true)
			} else {
				h.prefills[n].Tick(h.now)
				h.collect(n, h.prefills[n].Ready(), false)
			}
		}
	case "deliver", "drop", "dup":
		h.network(d)
	case "net":
		for i, e := range h.net {
			h.printf("%d: %s -> %s: %s", i, e.from, e.to, h.fmtMsg(e.msg))
		}
	case "metrics":
		n := arg(d, "node", "d100")
		if r := h.decodes[n]; r != nil {
			m := r.Metrics()
			h.printf("admitted=%d handoffs=%d aborts=%d rejects=%d drained=%d fenced=%d timeout=%d completed=%d",
				m.Admitted, m.Handoffs, m.Aborts, m.Rejects, m.Released[core.PathDrained], m.Released[core.PathFenced],
				m.Released[core.PathTimeout], m.Released[core.PathCompleted])
			h.printf("stale=%d foreign=%d short=%d grants=%d assigned=%d held=%d handed=%d quarantined=%d held-bytes=%d free=%d",
				m.StaleMessages, m.ForeignMessages, m.ShortCoverage, m.Grants, m.AssignedSlots, m.HeldSlots, m.HandedSlots,
				m.QuarantinedSlots, m.HeldBytes, r.FreeSlots())
			if m.RevokesAfterDrain > 0 {
				h.printf("revokes-after-drain=%d", m.RevokesAfterDrain)
			}
		} else {
			m := h.prefills[n].Metrics()
			h.printf("posted=%d succeeded=%d failed-definite=%d in-doubt=%d quiesced=%d commits=%d fails=%d drain-acks=%d",
				m.Posted, m.Succeeded, m.FailedDefinite, m.InDoubt, m.Quiesced, m.Commits, m.Fails, m.DrainAcks)
			h.printf("duplicate-assigns=%d refused-assigns=%d lease-lapses=%d dropped-pages=%d unsettled=%d streams=%d tombstones=%d requests=%d",
				m.DuplicateAssigns, m.RefusedAssigns, m.LeaseLapses, m.DroppedPages, m.Unsettled, m.Streams, m.Tombstones, m.Requests)
		}
	default:
		d.Fatalf(t, "unknown command %s", d.Cmd)
	}
	return h.b.String()
}

func (h *harness) nodes() []string {
	var names []string
	for n := range h.decodes {
		names = append(names, n)
	}
	for n := range h.prefills {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// network delivers, drops or duplicates queued messages that match the
// filters (to=, from=, kind=, n= for at most n of them), oldest first.
func (h *harness) network(d *datadriven.TestData) {
	to, from, kind := arg(d, "to", ""), arg(d, "from", ""), arg(d, "kind", "")
	n := argInt(d, "n", 1<<30)
	var keep, picked []envelope
	for _, e := range h.net {
		if len(picked) < n && (to == "" || e.to == to) && (from == "" || e.from == from) && (kind == "" || e.msg.Kind.String() == kind) {
			picked = append(picked, e)
			if d.Cmd == "dup" {
				keep = append(keep, e)
			}
			continue
		}
		keep = append(keep, e)
	}
	h.net = keep
	for _, e := range picked {
		switch d.Cmd {
		case "drop":
			h.printf("dropped %s -> %s: %s", e.from, e.to, h.fmtMsg(e.msg))
		case "dup":
			h.net = append(h.net, e)
			h.printf("duplicated %s -> %s: %s", e.from, e.to, h.fmtMsg(e.msg))
		case "deliver":
			if r := h.decodes[e.to]; r != nil {
				r.Step(e.msg, h.now)
				h.collect(e.to, r.Ready(), true)
			} else if s := h.prefills[e.to]; s != nil {
				s.Step(e.msg, h.now)
				h.collect(e.to, s.Ready(), false)
			}
		}
	}
}
