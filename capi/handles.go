package capi

/*
#include "kvcm/kvcm.h"
#include "shim_generated.h"
*/
import "C"

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/kvcm/kvcm/core"
	"github.com/kvcm/kvcm/core/abimodel"
)

// Handles are opaque nonzero values of the handle table: the low slotBits
// bits name a slot, the bits above are the handle's sequence number, which
// newHandle counts up from 1 and never reuses within a process. So a freed
// handle stays invalid forever (its slot, when reused, holds an entry with
// another sequence number), 0 is never issued, and every lookup checks the
// whole value against the slot's entry and then the value's type: a stale,
// consumed or forged handle is reported, never dereferenced.
//
// Every C call looks its handle up, so a lookup takes no lock: a slot holds
// an atomic pointer to an immutable entry. Issuing and freeing are serialized
// by the table's mutex.
const (
	slotBits  = 24 // at most 2^24 live handles
	chunkBits = 12 // slots per chunk of the table
	slotMask  = 1<<slotBits - 1
	chunkMask = 1<<chunkBits - 1
	maxSeq    = 1<<(64-slotBits) - 1
)

type handleEntry struct {
	h uint64
	v any
}

var handles struct {
	chunks [1 << (slotBits - chunkBits)]atomic.Pointer[[1 << chunkBits]atomic.Pointer[handleEntry]]

	mu    sync.Mutex // guards what follows and the writes to the slots
	seq   uint64     // the last sequence number issued
	next  uint64     // slots below next have been used
	free  []uint64   // freed slots, reused before new ones
	count uint64     // live handles
}

func handleSlot(slot uint64) *atomic.Pointer[handleEntry] {
	chunk := handles.chunks[slot>>chunkBits].Load()
	if chunk == nil {
		return nil
	}
	return &chunk[slot&chunkMask]
}

// newHandle registers v and returns its handle. It panics (which poisons
// the library) when 2^24 handles are live or 2^40 have been issued.
func newHandle(v any) uint64 {
	handles.mu.Lock()
	defer handles.mu.Unlock()
	if handles.seq == maxSeq {
		panic("kvcm: handle sequence numbers exhausted")
	}
	var slot uint64
	if n := len(handles.free); n > 0 {
		slot = handles.free[n-1]
		handles.free = handles.free[:n-1]
	} else {
		if handles.next > slotMask {
			panic(fmt.Sprintf("kvcm: more than %d live handles", slotMask+1))
		}
		slot = handles.next
		handles.next++
		if slot&chunkMask == 0 {
			handles.chunks[slot>>chunkBits].Store(new([1 << chunkBits]atomic.Pointer[handleEntry]))
		}
	}
	handles.seq++
	h := handles.seq<<slotBits | slot
	handleSlot(slot).Store(&handleEntry{h: h, v: v})
	handles.count++
	return h
}

// handleValue returns the value of a live handle.
func handleValue(h uint64) (any, bool) {
	s := handleSlot(h & slotMask)
	if s == nil {
		return nil, false
	}
	e := s.Load()
	if e == nil || e.h != h {
		return nil, false
	}
	return e.v, true
}

// deleteHandle frees a handle; it reports false when it was not live (so
// exactly one of concurrent deleters wins).
func deleteHandle(h uint64) bool {
	handles.mu.Lock()
	defer handles.mu.Unlock()
	slot := h & slotMask
	s := handleSlot(slot)
	if s == nil {
		return false
	}
	if e := s.Load(); e == nil || e.h != h {
		return false
	}
	s.Store(nil)
	handles.free = append(handles.free, slot)
	handles.count--
	return true
}

func liveHandles() uint64 {
	handles.mu.Lock()
	defer handles.mu.Unlock()
	return handles.count
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
	if o, ok := v.(*abimodel.DefaultCodec); ok {
		if o.Builtin() != nil {
			return "built-in codec"
		}
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
	// kvCacheObj's handle is issued when the cache is created
	// (abimodel's OnOpen) and freed when it is closed, by kvcm_kv_cache_close
	// or by its manager's destroy (abimodel's OnClose).
	kvCacheObj struct {
		*abimodel.Cache
		handle uint64
	}
)
