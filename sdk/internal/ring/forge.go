package ring

import "time"

// Forge lets a test play a hostile producer on this view: it continues
// where the real producer is (the published tail), f writes what it likes
// into the data area at pos and returns the tail to publish. Never called
// outside tests: a producer that forges is what Next must survive.
func (r *Ring) Forge(f func(data []byte, pos, capacity uint64) (tail uint64)) {
	r.pos = r.tail.Load()
	r.tail.Store(f(r.data, r.pos, r.capacity))
}

// Capacity is the ring's data area size.
func (r *Ring) Capacity() uint64 { return r.capacity }

// AnnounceSleep marks this view's consumer as asleep, as Wait does before
// its futex wait, so a test can see who rings for it.
func (r *Ring) AnnounceSleep() { r.sleeping.Store(1) }

// SleepFor bounds this view's sleeps by d instead of the default, so a
// test can tell a wake-up from a sleep that merely timed out.
func (r *Ring) SleepFor(d time.Duration) { r.sleepFor = d }
