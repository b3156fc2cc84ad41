//go:build kvfenceunsafe

package agent

// UnsafeSlots is the slot memory of a receiver's exposure before handoff:
// only the known-unsafe control arm of gpumem's staged-mode test uses it
// (to copy pages into GPU memory before success). A default build has no
// such function.
func UnsafeSlots(r *KVReceiver) [][]byte {
	var pages [][]byte
	r.d.lp.call(func() {
		dt := r.d.tags[r.key]
		if dt == nil || dt.tag != r.tag {
			return
		}
		for _, s := range dt.slots {
			pages = append(pages, r.d.slotMem(s))
		}
	})
	return pages
}
