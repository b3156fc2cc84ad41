package core

import "slices"

// This file: the rank's per-key records. Everything the rank keeps under
// one request key (its open request, the request's tombstone, the streams
// waiting for it to open, its live streams and their tombstones) sits in one
// record reached by one probe of a keyIndex (keyindex.go). With 100,000 live requests the first
// probe of a new key misses the cache; one record costs that miss once per
// input where a map per kind cost it once per map (docs/fence-cost.md).

// tagRec is one request key's record. It goes back to the free list as soon
// as nothing is left in it, so the map holds only keys with state.
type tagRec struct {
	req      *request // open on this rank; nil before Open and after it settled
	ended    bool     // a request tombstone: the key ended here ...
	endUntil Time     // ... and is remembered until then
	waiting  []*stream
	streams  []*stream // live streams of any decode rank or instance
	tombs    []tagTomb // stream tombstones
}

// tagTomb is a stream tombstone and the stream it stands for.
type tagTomb struct {
	key streamKey
	tombstone
}

func (r *tagRec) empty() bool {
	return r.req == nil && !r.ended && len(r.waiting) == 0 && len(r.streams) == 0 && len(r.tombs) == 0
}

// recFor returns key's record, making it if there is none.
func (s *Sender) recFor(key RequestKey) *tagRec {
	if r := s.recs.get(key); r != nil {
		return r
	}
	var r *tagRec
	if n := len(s.freeRecs); n > 0 {
		r = s.freeRecs[n-1]
		s.freeRecs = s.freeRecs[:n-1]
	} else {
		r = &tagRec{}
	}
	s.recs.put(key, r)
	return r
}

// tidy forgets key's record once it holds nothing, and reuses it.
func (s *Sender) tidy(key RequestKey, r *tagRec) {
	if r == nil || !r.empty() {
		return
	}
	s.recs.del(key)
	*r = tagRec{waiting: r.waiting[:0], streams: r.streams[:0], tombs: r.tombs[:0]}
	s.freeRecs = append(s.freeRecs, r)
}

// request returns the open request of key, or nil.
func (s *Sender) request(key RequestKey) *request {
	if r := s.recs.get(key); r != nil {
		return r.req
	}
	return nil
}

// requestEnded reports whether key has a request tombstone.
func (s *Sender) requestEnded(key RequestKey) bool {
	r := s.recs.get(key)
	return r != nil && r.ended
}

// stream returns the live stream of k, or nil.
func (s *Sender) stream(k streamKey) *stream {
	if r := s.recs.get(k.tag.Key()); r != nil {
		for _, st := range r.streams {
			if st.key == k {
				return st
			}
		}
	}
	return nil
}

// tomb returns the tombstone of k, if there is one.
func (s *Sender) tomb(k streamKey) (tombstone, bool) {
	if r := s.recs.get(k.tag.Key()); r != nil {
		for i := range r.tombs {
			if r.tombs[i].key == k {
				return r.tombs[i].tombstone, true
			}
		}
	}
	return tombstone{}, false
}

// setTomb records (or replaces) the tombstone of k.
func (s *Sender) setTomb(k streamKey, tb tombstone) {
	r := s.recFor(k.tag.Key())
	for i := range r.tombs {
		if r.tombs[i].key == k {
			r.tombs[i].tombstone = tb
			return
		}
	}
	r.tombs = append(r.tombs, tagTomb{key: k, tombstone: tb})
	s.nTombs++
}

// expireTomb forgets k's tombstone if it ended by now.
func (s *Sender) expireTomb(k streamKey, now Time) {
	r := s.recs.get(k.tag.Key())
	if r == nil {
		return
	}
	for i := range r.tombs {
		if r.tombs[i].key == k && now >= r.tombs[i].until {
			r.tombs = slices.Delete(r.tombs, i, i+1)
			s.nTombs--
			s.tidy(k.tag.Key(), r)
			return
		}
	}
}

// expireRequestTomb forgets key's request tombstone if it ended by now.
func (s *Sender) expireRequestTomb(key RequestKey, now Time) {
	if r := s.recs.get(key); r != nil && r.ended && now >= r.endUntil {
		r.ended, r.endUntil = false, 0
		s.tidy(key, r)
	}
}

// addStream files a new live stream under its key.
func (s *Sender) addStream(st *stream) {
	r := s.recFor(st.key.tag.Key())
	r.streams = append(r.streams, st)
}

// removeStream takes a live stream out of its key's record.
func (s *Sender) removeStream(st *stream) {
	k := st.key.tag.Key()
	if r := s.recs.get(k); r != nil {
		r.streams = without(r.streams, st)
		s.tidy(k, r)
	}
}

// without removes st from sts, keeping the order of the rest.
func without(sts []*stream, st *stream) []*stream {
	if i := slices.Index(sts, st); i >= 0 {
		return slices.Delete(sts, i, i+1)
	}
	return sts
}
