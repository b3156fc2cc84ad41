package demo

import (
	"fmt"
	"io"
	"strings"
	"time"
)

// progress redraws a one-line progress bar on w every 200 ms until stop.
type progress struct {
	stopc chan struct{}
	done  chan struct{}
}

// startProgress draws c's counts against total on w (nil: no bar).
func startProgress(w io.Writer, c *counts, total int, start time.Time) *progress {
	p := &progress{stopc: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		if w == nil {
			<-p.stopc
			return
		}
		draw := func() {
			progressBar(w, int(c.done.Load()), total, int(c.handed.Load()), int(c.cancels.Load()), time.Since(start))
		}
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				draw()
			case <-p.stopc:
				draw()
				fmt.Fprintln(w)
				return
			}
		}
	}()
	return p
}

// stop draws the bar a last time and ends its line.
func (p *progress) stop() {
	close(p.stopc)
	<-p.done
}

func progressBar(w io.Writer, done, total, handed, cancels int, el time.Duration) {
	const width = 40
	n := done * width / max(total, 1)
	fmt.Fprintf(w, "\r[%s%s] %4d/%d requests  handoffs %4d  cancels %4d  %5.1fs",
		strings.Repeat("=", n), strings.Repeat(" ", width-n), done, total, handed, cancels, el.Seconds())
}
