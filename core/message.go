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
	kindMax       Kind = KindReject
)

var kindNames = [...]string{"?", "Assign", "Grant", "Heartbeat", "Commit", "Fail", "Abort", "DrainAck", "Reject"}

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
	// LeaseUntil is an absolute time on decode's clock (Assign, Grant, Abort).
	LeaseUntil Time
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
	// Tags and Outstanding make up a Heartbeat: the rank's live tags with
	// this decode rank and its number of unsettled batches.
	Tags        []Tag
	Outstanding uint32
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
		s += fmt.Sprintf(" tags=%d outstanding=%d", len(m.Tags), m.Outstanding)
	}
	return s + "}"
}
