package main

import (
	"sync"

	"github.com/kvfence/kvfence/errdefs"
)

// registry maps the opaque handles C holds to Go objects. Handles count up
// from 1 and are never reused, so a stale handle is NotFound, not another
// object.
var registry = struct {
	sync.RWMutex
	next uint64
	objs map[uint64]any
}{objs: map[uint64]any{}}

func register(v any) uint64 {
	registry.Lock()
	defer registry.Unlock()
	registry.next++
	registry.objs[registry.next] = v
	markOpen(v)
	return registry.next
}

// lookup returns the object of handle h if it is a T.
func lookup[T any](h uint64, what string) (T, error) {
	registry.RLock()
	v, ok := registry.objs[uint64(h)]
	registry.RUnlock()
	t, isT := v.(T)
	if !ok {
		return t, errdefs.Errorf(errdefs.NotFound, "no %s with handle %d (closed or never opened)", what, h)
	}
	if !isT {
		return t, errdefs.Errorf(errdefs.InvalidArgument, "handle %d is not a %s", h, what)
	}
	return t, nil
}

// unregister removes h and returns what it held.
func unregister(h uint64) (any, bool) {
	registry.Lock()
	defer registry.Unlock()
	v, ok := registry.objs[h]
	delete(registry.objs, h)
	if ok {
		markClosed(v) // wakes kvfence_wait on h
	}
	return v, ok
}
