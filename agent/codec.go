package agent

import (
	"encoding/json"

	"github.com/kvfence/kvfence/errdefs"
)

// frameCodec is the gRPC codec of the control plane: frames as JSON. Only
// core messages matter for speed, and they travel inside as the core's own
// compact binary encoding.
type frameCodec struct{}

func (frameCodec) Name() string { return "kvfence-frame" }

func (frameCodec) Marshal(v any) ([]byte, error) {
	f, ok := v.(*frame)
	if !ok {
		return nil, errdefs.Errorf(errdefs.Internal, "agent: codec cannot marshal %T", v)
	}
	return json.Marshal(f)
}

func (frameCodec) Unmarshal(data []byte, v any) error {
	f, ok := v.(*frame)
	if !ok {
		return errdefs.Errorf(errdefs.Internal, "agent: codec cannot unmarshal into %T", v)
	}
	return json.Unmarshal(data, f)
}
