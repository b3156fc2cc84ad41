package knownunsafe

// Variant selects one known-unsafe behaviour of the core. The zero value is
// the real, safe core.
type Variant struct{ name string }

var (
	Safe                   = Variant{}
	ReleaseOnAbort         = Variant{"release-on-abort"}
	AckAfterFailedSend     = Variant{"ack-after-failed-send"}
	IgnoreGenerations      = Variant{"ignore-generations"}
	UnboundedTimeout       = Variant{"unbounded-timeout"}
	SingleAckTarget        = Variant{"single-ack-target"}
	ReleaseOnRemoteFailure = Variant{"release-on-remote-failure"}
	NoCoverageCheck        = Variant{"no-coverage-check"}
	SelfRenewedLease       = Variant{"self-renewed-lease"}
	NoTombstones           = Variant{"no-tombstones"}
	RestartReuse           = Variant{"restart-reuse"}
	OwnTailOnly            = Variant{"own-tail-only"}
	// ReleaseOnDrainAck trusts the ranks' acks with a fence at hand: slots
	// go back on every rank's DrainAck (or the decode loop's finish) before
	// their keys are revoked, so a rank that acks and keeps writing writes
	// into reused memory.
	ReleaseOnDrainAck = Variant{"release-on-drain-ack"}
)

// All lists every unsafe variant, in a stable order.
var All = []Variant{
	ReleaseOnAbort, AckAfterFailedSend, IgnoreGenerations, UnboundedTimeout,
	SingleAckTarget, ReleaseOnRemoteFailure, NoCoverageCheck, SelfRenewedLease,
	NoTombstones, RestartReuse, OwnTailOnly, ReleaseOnDrainAck,
}

// Name is the variant's stable name ("safe" for the real core).
func (v Variant) Name() string {
	if v.name == "" {
		return "safe"
	}
	return v.name
}

// IsSafe reports whether v is the real core.
func (v Variant) IsSafe() bool { return v.name == "" }

// Parse maps a name back to its variant.
func Parse(name string) (Variant, bool) {
	if name == "safe" || name == "" {
		return Safe, true
	}
	for _, v := range All {
		if v.name == name {
			return v, true
		}
	}
	return Safe, false
}
