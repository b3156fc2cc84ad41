package main

import (
	"unsafe"

	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/gpumem"
	"github.com/kvfence/kvfence/internal/stage"
)

// GPU KV buffers (the staged mode of issue 24). A layout buffer is device
// memory when the CUDA driver says so (gpumem.DeviceOf, at layout_new);
// its runs go to gpumem instead of memmove, and no host code ever touches
// it. Prefill copies device → a Go-owned bounce buffer (off the rank's
// loop, waited on the job's goroutine), then fills the source pages from it
// under KVSender.Fill's ownership check, so a late device copy can only
// land in memory this library holds. Decode copies a handed-off request's
// slots (host memory kvfence holds, handed off only after the request
// succeeded) into the device pages; the job, and so scatter_done, ends only
// when the device copies did.

// deviceCopier performs runs whose engine side lies in a device buffer of
// its layout through mv, and any other run with memmove.
type deviceCopier struct {
	mv       gpumem.Mover
	dev      []stage.Buffer // the layout's device buffers
	toDevice bool           // scatter (host → device), else gather
}

// onDevice reports whether the n bytes at p lie in one device buffer.
func (c deviceCopier) onDevice(p unsafe.Pointer, n int) bool {
	a := uintptr(p)
	for _, b := range c.dev {
		lo := uintptr(b.Addr)
		if a >= lo && a+uintptr(n) <= lo+uintptr(b.Len) {
			return true
		}
	}
	return false
}

// Copy implements stage.Copier: one gpumem operation for the device runs,
// waited for before it returns (runs on a staging job's goroutine).
func (c deviceCopier) Copy(runs []stage.Run) error {
	var pieces []gpumem.Piece
	var host []stage.Run
	for _, r := range runs {
		if r.N <= 0 {
			continue
		}
		eng, other := r.Src, r.Dst
		if c.toDevice {
			eng, other = r.Dst, r.Src
		}
		if !c.onDevice(eng, r.N) {
			host = append(host, r)
			continue
		}
		pieces = append(pieces, gpumem.Piece{Device: uintptr(eng), Host: unsafe.Slice((*byte)(other), r.N)})
	}
	if err := safeCopy(stage.Host{}, host); err != nil {
		return err
	}
	if len(pieces) == 0 {
		return nil
	}
	start := c.mv.Gather
	if c.toDevice {
		start = c.mv.Scatter
	}
	op, err := start(pieces)
	if err != nil {
		return err
	}
	return op.Wait()
}

// markDevice asks the driver which buffers are device memory (a buffer is
// device memory when its first and last byte are) and returns the Mover
// for them, nil when none is. A buffer half on the device is refused.
func markDevice(bufs []stage.Buffer) (gpumem.Mover, error) {
	var mv gpumem.Mover
	for i := range bufs {
		b := &bufs[i]
		if b.Addr == nil || b.Len <= 0 {
			continue // NewLayout refuses it
		}
		first, ok1 := gpumem.DeviceOf(uintptr(b.Addr))
		_, ok2 := gpumem.DeviceOf(uintptr(b.Addr) + uintptr(b.Len) - 1)
		if ok1 != ok2 {
			return nil, errdefs.Errorf(errdefs.InvalidArgument, "buffer %d (%d bytes at %#x) is partly device memory", i, b.Len, b.Addr)
		}
		if ok1 {
			b.Device, mv = true, first
		}
	}
	return mv, nil
}

// gpuCopier is the copier of a layout with device buffers, nil without.
func gpuCopier(lo *layoutObj, toDevice bool) stage.Copier {
	if lo.mv == nil {
		return nil
	}
	var dev []stage.Buffer
	for _, b := range lo.l.Bufs {
		if b.Device {
			dev = append(dev, b)
		}
	}
	return deviceCopier{mv: lo.mv, dev: dev, toDevice: toDevice}
}

// bounceBytes bounds the host buffer of one device gather batch.
const bounceBytes = 16 << 20

// gatherDevice is gather for a layout with device buffers: per batch of
// pages, device → bounce buffer (waited here, not on the rank's loop),
// then bounce → source pages under Fill's check that the request still
// owns them.
func gatherDevice(o *senderObj, l *stage.Layout, sl stage.Slice, cp stage.Copier, pages []int32, first int) error {
	sb := l.ShardBytes(sl)
	per := int(max(1, bounceBytes/sb))
	bounce := make([]byte, int64(min(per, len(pages)))*sb)
	var runs []stage.Run
	for at := 0; at < len(pages); at += per {
		n := min(per, len(pages)-at)
		runs = runs[:0]
		for i := 0; i < n; i++ {
			runs = l.GatherPage(runs, pages[at+i], sl, unsafe.Pointer(&bounce[int64(i)*sb]))
		}
		if err := cp.Copy(runs); err != nil {
			return err
		}
		err := o.s.Fill(first+at, n, func(i int, page []byte) error {
			off := int64(i-first-at) * sb
			copy(page[:sb], bounce[off:off+sb])
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}
