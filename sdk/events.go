package sdk

// EventKind names what happened to a loaded plugin.
type EventKind uint8

const (
	// EventPluginLost: the host lost the plugin (its completion stream broke).
	// Every batch it still owed a completion was completed InDoubt; Batches
	// lists them. Bytes may still move until EventPluginExited.
	EventPluginLost EventKind = 1
	// EventPluginExited: the plugin process was reaped. The kernel has closed
	// its sockets and destroyed its queue pairs, so nothing of Batches (every
	// batch of this plugin still in doubt) can move any more: this is
	// quiescence evidence EvidenceProcessExited. Restarting is the caller's
	// choice: Open the plugin again.
	EventPluginExited EventKind = 2
	// EventProtocolViolation: the plugin broke the contract (a second
	// completion for a batch, or one for a batch it was never given). The
	// host dropped it; the plugin should not be trusted.
	EventProtocolViolation EventKind = 3
)

func (k EventKind) String() string {
	switch k {
	case EventPluginLost:
		return "plugin-lost"
	case EventPluginExited:
		return "plugin-exited"
	case EventProtocolViolation:
		return "protocol-violation"
	}
	return "event(?)"
}

// Event is something the host observed about a plugin.
type Event struct {
	Kind     EventKind
	Batches  []BatchID
	Evidence Evidence // EvidenceProcessExited for EventPluginExited
	Detail   string
}
