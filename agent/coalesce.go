package agent

import "sync"

// coalescer runs one call at a time over everything queued meanwhile: the
// decode rank's key calls to its plugin (grants, hygiene revocations) go
// out in as few round trips as the plugin's pace allows — one per item
// when it keeps up, one per burst when it does not — and no goroutine is
// started per item. Items are never dropped or reordered; run gets each
// item exactly once.
type coalescer[T any] struct {
	mu      sync.Mutex
	items   []T
	running bool
	run     func([]T)
	wg      *sync.WaitGroup // Close waits for the worker
}

// add queues an item, starting the worker if none runs.
func (c *coalescer[T]) add(it T) {
	c.mu.Lock()
	c.items = append(c.items, it)
	if c.running {
		c.mu.Unlock()
		return
	}
	c.running = true
	c.wg.Add(1)
	c.mu.Unlock()
	go c.work()
}

// work runs batches until the queue is empty.
func (c *coalescer[T]) work() {
	defer c.wg.Done()
	for {
		c.mu.Lock()
		batch := c.items
		c.items = nil
		if len(batch) == 0 {
			c.running = false
			c.mu.Unlock()
			return
		}
		c.mu.Unlock()
		c.run(batch)
	}
}
