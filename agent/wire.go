package agent

import (
	"encoding/json"

	"github.com/kvfence/kvfence/core"
	"github.com/kvfence/kvfence/errdefs"
)

// ControlVersion is the version of the control-plane protocol (Hello,
// frames, the core messages inside them) this agent speaks. A peer with
// another version is refused at connect (no silent downgrade). It is not
// core.MessageVersion (the encoding of one core message) nor
// sdk.ProtocolVersion (the plugin transport protocol).
//
// v2: keyRef.Base is where the rank's own shard of the page is under the
// key (decode grants each rank keys over its shards only); in v1 it was
// the slot's start and prefill added its shard offset itself.
const ControlVersion = 2

// frameType is what a control-plane frame carries.
type frameType uint8

const (
	frameHello   frameType = 1 // first frame of every link: who, which version, what the transport can prove
	frameWelcome frameType = 2 // the answer to Hello: accepted, with what the acceptor offers
	frameRefuse  frameType = 3 // the answer to Hello: refused, and why (then the link closes)
	frameCore    frameType = 4 // one core-encoded message (core.AppendMessage)
	frameCommand frameType = 5 // router → agent (commandLink)
	frameEvent   frameType = 6 // agent → router (commandLink)
	frameTargets frameType = 7 // decode → prefill: its target instances' data endpoints changed (restart.go)
	// Closing an idle link is a handshake (link_quiesce.go); a peer that
	// does not know these frames ignores them, and the link stays open.
	frameQuiesce   frameType = 8  // prefill → decode: may this link close? (idle here)
	frameQuiesceOK frameType = 9  // decode → prefill: no Assign after this one until frameResume or a new link
	frameResume    frameType = 10 // prefill → decode: not closing after all
)

// frame is one control-plane frame. Seq grows by one per frame on a link in
// each direction: a replayed or reordered frame is refused and counted.
type frame struct {
	Type    frameType  `json:"t"`
	Seq     uint64     `json:"s"`
	Core    []byte     `json:"c,omitempty"`
	Keys    []keyRef   `json:"k,omitempty"` // with an Assign: where each page may be written
	Hello   *peerHello `json:"h,omitempty"`
	Refusal string     `json:"r,omitempty"`
	// Class classifies a Refusal (errdefs; failed-precondition when absent).
	Class errdefs.Class `json:"rc,omitempty"`
	// Payload is a command (frameCommand) or an event (frameEvent) of the
	// router protocol, which the runtime carries without reading.
	Payload json.RawMessage `json:"p,omitempty"`
}

// keyRef is where one page of an exposure may be written: the key decode's
// transport granted for it and, under that key, the offset of the
// receiving rank's own shard of the page (ControlVersion 2).
type keyRef struct {
	Key  uint64 `json:"k"`
	Base uint64 `json:"b"`
	// Target is the decode target instance (restart.go) the key belongs
	// to: lanes to DataTargets[Target] carry the page. Zero without one.
	Target int `json:"t,omitempty"`
	// Parts, when set (direct mode over several engine buffers, one per
	// layer: direct_layers.go), split the rank's shard of the page: part
	// j is the next Len bytes of it, written at Base under Key. Key and
	// Base above are then Parts[0]'s. Only a prefill rank that declared
	// KeyParts is sent them (compatible).
	Parts []keyPart `json:"p,omitempty"`
}

// keyPart is one piece of a page's shard in one engine buffer.
type keyPart struct {
	Key  uint64 `json:"k"`
	Base uint64 `json:"b"`
	Len  uint64 `json:"n"`
}

// Role is what the far end of a link is.
type Role string

const (
	RolePrefill Role = "prefill"
	RoleDecode  Role = "decode"
	RoleRouter  Role = "router"
)

// peerCaps is what a side's transport can prove (docs/design.md §5): quiescence evidence
// on the sending side, revocation on the receiving side.
type peerCaps struct {
	Quiesce bool  `json:"quiesce"`
	Revoke  bool  `json:"revoke"`
	MaxTail int64 `json:"max_tail_ns"`
	// RefusalsIsolated (a prefill rank): its transport fails only the
	// write refused under a revoked key, not the writes beside it
	// (sdk.Capabilities.RefusalsIsolated). Absent from older ranks: decode
	// then revokes their requests' keys after the drain, not at the abort.
	RefusalsIsolated bool `json:"refusals_isolated,omitempty"`
}

// peerHello opens a link; the acceptor answers Welcome with its own peerHello, or
// Refuse.
type peerHello struct {
	Role     Role     `json:"role"`
	Rank     uint32   `json:"rank"`
	Version  int      `json:"version"`
	Caps     peerCaps `json:"caps"`
	Instance uint64   `json:"instance,omitempty"` // decode incarnation
	// Data is the decode data endpoint prefill connects its transport to.
	DataTransport string `json:"data_transport,omitempty"`
	DataAddress   string `json:"data_address,omitempty"`
	// DataOpaque is the endpoint's opaque part (sdk.Endpoint.Opaque: e.g.
	// the directory address of a mooncake or nixl plugin), passed back
	// unchanged to Connect.
	DataOpaque []byte `json:"data_opaque,omitempty"`
	// DataAddresses, when set, are several ways to the same data endpoint
	// (NICs, proxies): lane i of a prefill rank uses DataAddresses[i % n].
	DataAddresses []string `json:"data_addresses,omitempty"`
	SlotBytes     int64    `json:"slot_bytes,omitempty"`
	// DataTargets (a decode rank with a restart fence, restart.go): one
	// data endpoint per target instance; a key names its instance.
	DataTargets []dataTarget `json:"data_targets,omitempty"`
	// ShardBytes is what one prefill rank writes per page: both sides
	// declare it and must agree, or a rank's writes would straddle shards.
	ShardBytes int64 `json:"shard_bytes,omitempty"`
	// Checksums: a prefill rank puts checksums in its Commits; a decode
	// rank requires them (and refuses a prefill rank that sends none).
	Checksums bool `json:"checksums,omitempty"`
	// Writer (a prefill rank): its transport's LocalEndpoint address, the
	// identity its data connections prove. Decode binds the keys it grants
	// this rank to it (sdk.Window.Writer) when its transport can.
	Writer string `json:"writer,omitempty"`
	// Buffers (a decode rank): how many engine buffers each page is split
	// across (direct mode with one buffer per layer); 0 or 1: keys carry
	// no Parts. KeyParts (a prefill rank): it writes a page in the Parts
	// its keys carry. A decode rank with several buffers refuses a prefill
	// rank without KeyParts: it would write the whole shard under the
	// first part's key.
	Buffers  int  `json:"buffers,omitempty"`
	KeyParts bool `json:"key_parts,omitempty"`
}

// compatible says whether a prefill rank (p) and a decode rank (d) may run
// together, and if not, why in words an operator can act on.
func compatible(p, d peerHello) error {
	if p.Version != d.Version {
		return errdefs.Errorf(errdefs.FailedPrecondition, "incompatible peers: %s rank %d speaks control protocol v%d, %s rank %d speaks v%d",
			p.Role, p.Rank, p.Version, d.Role, d.Rank, d.Version)
	}
	if d.Checksums && !p.Checksums {
		return errdefs.Errorf(errdefs.FailedPrecondition, "incompatible peers: decode rank %d requires checksums at commit and prefill rank %d does not compute them (enable checksums on the prefill rank)",
			d.Rank, p.Rank)
	}
	if p.ShardBytes != d.ShardBytes || d.SlotBytes < d.ShardBytes {
		return errdefs.Errorf(errdefs.FailedPrecondition, "incompatible peers: prefill rank %d writes shards of %d bytes, decode rank %d holds shards of %d bytes (slots of %d)",
			p.Rank, p.ShardBytes, d.Rank, d.ShardBytes, d.SlotBytes)
	}
	if d.Buffers > 1 && !p.KeyParts {
		return errdefs.Errorf(errdefs.FailedPrecondition, "incompatible peers: decode rank %d splits each page across %d engine buffers (direct mode, one buffer per layer) and prefill rank %d cannot write split pages (upgrade the prefill rank)",
			d.Rank, d.Buffers, p.Rank)
	}
	if p.Caps.MaxTail < 0 {
		return errdefs.Errorf(errdefs.InvalidArgument, "incompatible peers: prefill rank %d declares a negative transport tail (%dns)", p.Rank, p.Caps.MaxTail)
	}
	if !p.Caps.Quiesce {
		return errdefs.Errorf(errdefs.FailedPrecondition, "incompatible peers: prefill rank %d's transport cannot prove quiescence; decode rank %d would have to release in-doubt writes on timeout only — refusing to run with weaker guarantees",
			p.Rank, d.Rank)
	}
	return nil
}

// coreMessage is the core message a frame carries; a frame of another
// kind, or one that does not decode, is counted and refused.
func coreMessage(f *frame, m *Metrics) (core.Message, bool) {
	if f.Type != frameCore {
		m.reject("wrong-kind")
		return core.Message{}, false
	}
	msg, err := core.DecodeMessage(f.Core)
	if err != nil {
		m.reject("malformed")
		return core.Message{}, false
	}
	return msg, true
}
