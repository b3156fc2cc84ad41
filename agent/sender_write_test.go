package agent

import (
	"testing"

	"github.com/kvfence/kvfence/core"
	"github.com/kvfence/kvfence/errdefs"
)

// TestWriteRefusedOnceSourcePagesReturn: decode aborts a request; once the
// runtime gives the request's source pages back, Write must refuse rather
// than copy into pages that may already be another request's.
func TestWriteRefusedOnceSourcePagesReturn(t *testing.T) {
	d, p := startPair(t, nil, nil, nil)
	key := core.RequestKey{Room: 77, Gen: 1}
	rv := d.NewReceiver(key)
	if _, err := rv.Init(2, []core.RankID{1}); err != nil {
		t.Fatal(err)
	}
	s := p.NewSender(key)
	if err := s.Init(2); err != nil {
		t.Fatal(err)
	}
	page := make([]byte, 4096)
	if err := s.Write(0, page); err != nil {
		t.Fatalf("write to a live request: %v", err)
	}
	if err := s.Write(1, page[:100]); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("a partial page: want InvalidArgument, got %v", err)
	}
	rv.Abort()
	waitFor(t, "Write to refuse the source pages of a request whose pages went back", func() bool {
		err := s.Write(1, page)
		if err != nil && !errdefs.IsFailedPrecondition(err) {
			t.Fatalf("want FailedPrecondition, got %v", err)
		}
		return err != nil
	})
}
