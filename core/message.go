package core

import "fmt"

// Kind is the type of a control message (docs/design.md §3).
type Kind uint8

const (
	KindAssign    Kind = 1 // decode → rank: where to write, and until when
	KindGrant     Kind = 2 // decode → rank: the only way a lease grows
	KindHeartbeat Kind = 3 // rank → decode: life and progress; never a lease
	KindCommit    Kind = 4 // rank → decode: every write succeeded
	KindFail      Kind = 5 // rank → decode: a send failed; NOT completion
	KindAbort     Kind = 6 // decode/router → rank: stop, drop unsent chunks
	KindDrainAck  Kind = 7 // rank → decode: nothing of mine can still move
	KindReject    Kind = 8 // decode → rank: admission refused; never hand off
	KindLease     Kind = 9 // decode → rank: the rank lease, answering one heartbeat
	kindMax       Kind = KindLease
)

var kindNames = [...]string{"?", "Assign", "Grant", "Heartbeat", "Commit", "Fail", "Abort", "DrainAck", "Reject", "Lease"}

func (k Kind) String() string {
	if k == 0 || k > kindMax {
		return fmt.Sprintf("Kind(%d)", uint8(k))
	}
	return kindNames[k]
}

// Reason says why a request ended badly.
type Reason uint8

const (
	ReasonNone             Reason = iota
	ReasonClientAbort             // the client or router cancelled the request
	ReasonDecodeAbort             // decode gave up (its own timeout, capacity)
	ReasonRejected                // admission refused (by prefill or decode)
	ReasonSendFailed              // a transport batch did not succeed
	ReasonLeaseLapsed             // the posting lease ran out before the writes did
	ReasonShortCoverage           // a rank committed fewer pages than assigned
	ReasonPeerDead                // a rank was declared dead
	ReasonDecodeRestart           // the decode instance that assigned is gone
	ReasonBootstrapTimeout        // prefill never heard from decode for this request
	ReasonChecksumMismatch        // a rank's committed checksum did not match the pages decode holds
	reasonMax              = ReasonChecksumMismatch
)

var reasonNames = [...]string{"none", "client-abort", "decode-abort", "rejected", "send-failed", "lease-lapsed", "short-coverage", "peer-dead", "decode-restart", "bootstrap-timeout", "checksum-mismatch"}

func (r Reason) String() string {
	if r > reasonMax {
		return fmt.Sprintf("Reason(%d)", uint8(r))
	}
	return reasonNames[r]
}

// DrainEvidence says how a rank knows that its writes for a tag stopped.
type DrainEvidence uint8

const (
	EvidenceNone          DrainEvidence = iota
	EvidenceCompleted                   // every batch had a definite completion
	EvidenceNothingPosted               // the rank never posted for this tag
	EvidenceQuiesced                    // the transport quiesced the in-doubt batches
	EvidenceProcessExited               // the plugin process that owned them was reaped
	evidenceMax           = EvidenceProcessExited
)

var evidenceNames = [...]string{"none", "completed", "nothing-posted", "quiesced", "process-exited"}

func (e DrainEvidence) String() string {
	if e > evidenceMax {
		return fmt.Sprintf("DrainEvidence(%d)", uint8(e))
	}
	return evidenceNames[e]
}

// Message is one control message. Which fields matter depends on Kind; the
// codec writes only those.
type Message struct {
	Kind Kind
	Tag  Tag
	// Rank is the prefill rank the message is from (rank → decode) or for
	// (decode → rank). Decode is the decode rank on the other end.
	Rank   RankID
	Decode RankID
	// LeaseUntil is an absolute time on decode's clock (Assign, Grant,
	// Abort, Lease; zero in a Lease that grants nothing).
	LeaseUntil Time
	// HoldUntil is admission + MaxHold on decode's clock (Assign): no lease
	// of the tag, per tag or per rank, ever reaches past it.
	HoldUntil Time
	// Ranks are the prefill ranks that must all commit (Assign).
	Ranks []RankID
	// Slots are the decode slots to write, one per page, in page order (Assign).
	Slots []uint32
	// Coverage is the number of pages written with Succeeded (Commit).
	Coverage uint32
	// Checksum is an optional checksum of the written pages (Commit).
	Checksum uint64
	Reason   Reason
	Evidence DrainEvidence
	// A Heartbeat carries what changed since the last heartbeat decode
	// acknowledged (docs/design.md §3, Heartbeats and the rank lease):
	// Tags started and Ended, plus the Count and Digest (sum of TagHash) of
	// every tag the rank lists, so decode detects divergence. With Full,
	// Tags is the whole list instead. A Lease answers the heartbeat Seq of
	// Session: LeaseUntil is the rank lease (zero: none), Tag.Instance the
	// decode instance that grants it, Tags the listed tags it does not
	// cover, and Full asks for a full heartbeat (resync).
	Session     uint64
	Seq         uint64
	Full        bool
	Tags        []Tag
	Ended       []Tag
	Count       uint32
	Digest      uint64
	Outstanding uint32 // Heartbeat: the rank's unsettled batches for this decode rank
}

func (m Message) String() string {
	s := fmt.Sprintf("%s{%s r%d d%d", m.Kind, m.Tag, m.Rank, m.Decode)
	switch m.Kind {
	case KindAssign:
		s += fmt.Sprintf(" ranks=%v pages=%d lease=%d", m.Ranks, len(m.Slots), m.LeaseUntil)
	case KindGrant:
		s += fmt.Sprintf(" lease=%d", m.LeaseUntil)
	case KindCommit:
		s += fmt.Sprintf(" coverage=%d", m.Coverage)
	case KindFail, KindAbort, KindReject:
		s += " " + m.Reason.String()
	case KindDrainAck:
		s += " " + m.Evidence.String()
	case KindHeartbeat:
		s += fmt.Sprintf(" s%d #%d", m.Session, m.Seq)
		if m.Full {
			s += " full"
		}
		s += fmt.Sprintf(" started=%d ended=%d count=%d outstanding=%d", len(m.Tags), len(m.Ended), m.Count, m.Outstanding)
	case KindLease:
		s += fmt.Sprintf(" s%d #%d lease=%d excluded=%d", m.Session, m.Seq, m.LeaseUntil, len(m.Tags))
		if m.Full {
			s += " resync"
		}
	}
	return s + "}"
}
