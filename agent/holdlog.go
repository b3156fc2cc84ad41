package agent

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/kvfence/kvfence/core"
)

// The hold log: decode writes one structured line per step of every hold
// (a request that stopped — aborted, rejected or failed — while its memory
// stays exposed), so a log alone shows that each hold ended by evidence:
//
//	"hold start"    tag, reason, ranks, evidence so far (ranks that committed)
//	"hold evidence" tag, rank, kind=drain-ack|commit   (a rank's writes stopped)
//	"hold fence"    tag                                 (its keys are revoked)
//	"hold release"  tag, path=drained|fenced|timeout|unsafe, held_ms, evidence
//
// kvfence __holds-check reads these lines (CheckHolds).
const (
	HoldStartMsg    = "hold start"
	HoldEvidenceMsg = "hold evidence"
	HoldFenceMsg    = "hold fence"
	HoldReleaseMsg  = "hold release"
)

// holdTrack is the hold log's state of one exposure (loop-owned).
type holdTrack struct {
	held     bool
	evidence map[core.RankID]string // rank → "commit" | "drain-ack"
}

// noteEvidence records a Commit or DrainAck of a rank for dt and logs it if
// dt is held.
func (d *Decode) noteEvidence(dt *decTag, m core.Message) {
	kind := "commit"
	if m.Kind == core.KindDrainAck {
		kind = "drain-ack"
	}
	if dt.hold.evidence == nil {
		dt.hold.evidence = map[core.RankID]string{}
	}
	if _, seen := dt.hold.evidence[m.Rank]; seen {
		return
	}
	dt.hold.evidence[m.Rank] = kind
	if dt.hold.held {
		d.log.Info(HoldEvidenceMsg, "tag", dt.tag.String(), "rank", uint32(m.Rank), "kind", kind)
	}
}

func (d *Decode) logHoldStart(dt *decTag, reason core.Reason) {
	if dt.hold.held {
		return
	}
	dt.hold.held = true
	d.log.Info(HoldStartMsg, "tag", dt.tag.String(), "reason", reason.String(), "ranks", rankList(dt.ranks),
		"slots", len(dt.slots), "evidence", dt.hold.evidenceString())
}

func (d *Decode) logHoldFence(dt *decTag) {
	if dt.hold.held {
		d.log.Info(HoldFenceMsg, "tag", dt.tag.String())
	}
}

func (d *Decode) logHoldRelease(dt *decTag, rel core.Release) {
	if !dt.hold.held {
		return
	}
	d.log.Info(HoldReleaseMsg, "tag", dt.tag.String(), "path", rel.Path.String(),
		"held_ms", float64(rel.Held)/float64(time.Millisecond), "evidence", dt.hold.evidenceString())
}

func (h *holdTrack) evidenceString() string {
	ranks := make([]core.RankID, 0, len(h.evidence))
	for r := range h.evidence {
		ranks = append(ranks, r)
	}
	slices.Sort(ranks)
	parts := make([]string, len(ranks))
	for i, r := range ranks {
		parts[i] = fmt.Sprintf("%d:%s", r, h.evidence[r])
	}
	return strings.Join(parts, ",")
}

func rankList(rs []core.RankID) string {
	parts := make([]string, len(rs))
	for i, r := range rs {
		parts[i] = fmt.Sprint(uint32(r))
	}
	return strings.Join(parts, ",")
}
