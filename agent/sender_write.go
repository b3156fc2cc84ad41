package agent

import "github.com/kvfence/kvfence/errdefs"

// Write copies data (whole pages) into the source pages from page first on,
// on the caller's goroutine as FillRange does (one step a page), and refuses
// (FailedPrecondition) once the request ended. Page hands out the memory
// itself and cannot refuse: an engine that fills a page after decode aborted
// the request and the runtime released its pages would write into another
// request's source page. Callers that cannot order their writes before the
// end of a request (the C ABI's) use Write.
func (s *KVSender) Write(first int, data []byte) error {
	shard := int(s.p.cfg.ShardBytes)
	if first < 0 || len(data)%shard != 0 || first+len(data)/shard > s.pages {
		return errdefs.Errorf(errdefs.InvalidArgument, "%d bytes at page %d: not whole pages of %d bytes within the %d reserved", len(data), first, shard, s.pages)
	}
	return s.FillRange(first, len(data)/shard, func(pages [][]byte, step func() error) error {
		for i, page := range pages {
			if err := step(); err != nil {
				return err
			}
			copy(page, data[i*shard:(i+1)*shard])
		}
		return nil
	})
}
