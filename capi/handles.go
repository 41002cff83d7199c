package capi

/*
#include "kvcm/kvcm.h"
#include "shim_generated.h"
*/
import "C"

import (
	"fmt"
	"runtime/cgo"
	"sync"

	"github.com/kvcm/kvcm/core"
	"github.com/kvcm/kvcm/core/abimodel"
)

// Handles are cgo.Handle values. cgo.Handle.Value panics on a freed handle
// (and a forged value could alias a live one of another type), so every
// lookup first checks a registry of live handles and then the value's type:
// a stale, consumed or forged handle is reported, never dereferenced.
// cgo.Handle values are never reused within a process, so a freed handle
// stays invalid forever.
var handles struct {
	mu   sync.Mutex
	live map[cgo.Handle]struct{}
}

// newHandle registers v and returns its handle.
func newHandle(v any) uint64 {
	h := cgo.NewHandle(v)
	handles.mu.Lock()
	defer handles.mu.Unlock()
	if handles.live == nil {
		handles.live = map[cgo.Handle]struct{}{}
	}
	handles.live[h] = struct{}{}
	return uint64(h)
}

// handleValue returns the value of a live handle.
func handleValue(h uint64) (any, bool) {
	handles.mu.Lock()
	defer handles.mu.Unlock()
	if _, ok := handles.live[cgo.Handle(h)]; !ok {
		return nil, false
	}
	return cgo.Handle(h).Value(), true
}

// deleteHandle frees a handle; it reports false when it was not live (so
// exactly one of concurrent deleters wins).
func deleteHandle(h uint64) bool {
	handles.mu.Lock()
	defer handles.mu.Unlock()
	if _, ok := handles.live[cgo.Handle(h)]; !ok {
		return false
	}
	delete(handles.live, cgo.Handle(h))
	cgo.Handle(h).Delete()
	return true
}

func liveHandles() uint64 {
	handles.mu.Lock()
	defer handles.mu.Unlock()
	return uint64(len(handles.live))
}

// lookup resolves a handle argument to a value of type T, or reports
// INVALID_HANDLE naming the argument.
func lookup[T any](fn, arg string, h uint64, what string) (T, *C.kvcm_status) {
	var zero T
	if h == 0 {
		return zero, newStatus(codeInvalidHandle, fmt.Sprintf("%s: %s: handle 0 is never valid", fn, arg))
	}
	v, ok := handleValue(h)
	if !ok {
		return zero, newStatus(codeInvalidHandle, fmt.Sprintf("%s: %s: %#x is not a live handle (freed, consumed or never issued)", fn, arg, h))
	}
	t, ok := v.(T)
	if !ok {
		return zero, newStatus(codeInvalidHandle, fmt.Sprintf("%s: %s: handle %#x is a %s, not a %s", fn, arg, h, kindOf(v), what))
	}
	return t, nil
}

func kindOf(v any) string {
	if k, ok := handleKind(v); ok {
		return k
	}
	if _, ok := v.(*defaultCodecObj); ok {
		return "default codec"
	}
	return fmt.Sprintf("%T", v)
}

// The values handles refer to: an object of the ABI's object model with its
// handle, which the handle's owner frees.
type (
	managerObj struct {
		handle uint64
		*abimodel.Manager
	}
	cpObj struct {
		handle uint64
		*abimodel.CPIndex
	}
	plannedDropObj struct {
		handle uint64
		*core.PlannedDrop
	}
	// kvCacheObj's handle is freed when the cache is closed, by
	// kvcm_kv_cache_close or by its manager's destroy (abimodel's OnClose).
	kvCacheObj struct {
		*abimodel.Cache
		mu     sync.Mutex // guards handle and closed
		handle uint64
		closed bool
	}
)

// newKVCacheObj returns an object for a cache about to be created and the
// OnClose that frees its handle.
func newKVCacheObj() (*kvCacheObj, func()) {
	o := &kvCacheObj{}
	return o, func() {
		o.mu.Lock()
		defer o.mu.Unlock()
		o.closed = true
		if o.handle != 0 {
			deleteHandle(o.handle)
		}
	}
}

// publish issues the cache's handle, unless its manager closed it already.
func (o *kvCacheObj) publish(c *abimodel.Cache) (uint64, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.Cache = c
	if o.closed {
		return 0, false
	}
	o.handle = newHandle(o)
	return o.handle, true
}
