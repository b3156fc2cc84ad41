package conformance

// The promises a plugin makes (sdk/contract.go, docs/design.md §5). Every check
// names the one it tests, so a failed report says which promise was broken.
const (
	PromiseHandshake     = "the plugin handshakes and negotiates the protocol version"
	PromiseCapabilities  = "declared capabilities are true"
	PromiseRegistration  = "memory registration enforces bounds and is repeatable"
	PromiseDeregister    = "deregistering memory revokes every key on it first"
	PromiseSucceeded     = "Succeeded means every byte landed and nothing more moves"
	PromiseOneCompletion = "exactly one terminal completion per accepted batch"
	PromiseFailed        = "FailedDefinite means nothing more of the batch moves"
	PromiseQuiesce       = "Quiesce returns only when none of the batches can move a byte"
	PromiseRevoke        = "after Revoke returns, no byte lands under the key"
	PromiseWriterBound   = "a key granted to one writer is refused to every other writer"
	PromiseCrash         = "after a dead initiator is reaped, target memory is stable"
	PromiseErrorClass    = "refusals carry their exact error class and the plugin survives them"
	PromiseCleanup       = "every resource the suite created is released"
	PromiseContract      = "the sdk contract checks hold"
	PromiseInfoOnly      = "information only (not pass/fail)"
)

// PromiseMaxTail is the promise the tail checks test: the core's timeout
// release is lease + MaxTail, so a later byte lands in reused memory.
const PromiseMaxTail = "MaxTail bounds late bytes"
