//go:build cgo

package cuda

/*
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"runtime/cgo"
	"slices"
	"sync"
	"unsafe"

	"github.com/kvcm/kvcm/core/device"
)

// Stream is a device.Stream over a CUstream: a non-blocking one the device
// created, or an engine's one it adopted (AdoptStream).
type Stream struct {
	dev    *Device
	h      C.kv_CUstream
	handle uintptr
	// borrowed: the engine's stream (AdoptStream), never destroyed here.
	borrowed bool

	// mu orders this stream's submissions with their host bookkeeping.
	mu     sync.Mutex
	closed bool
	ev     *interval // current event interval
	sync   *interval // current synchronize interval

	// struct-of-arrays scratch for BatchCopy, reused under mu.
	dsts, srcs, sizes []uint64

	// checks are HostCheck functions not yet enqueued (see flushChecks).
	checks []func() error

	// WaitHost's state, under mu: the stream's host word (nil until the
	// first WaitHost; noWord: the driver cannot wait on one), the value the
	// last wait is for, and the release of the last wait.
	word        *uint32
	retired     []*uint32 // earlier words whose count was used up
	noWord      bool
	waitCount   uint32
	lastRelease chan struct{}
}

// maxPendingChecks bounds the checks one host function runs.
const maxPendingChecks = 64

var _ device.Stream = (*Stream)(nil)

func handleOf(h C.kv_CUstream) uintptr { return uintptr(unsafe.Pointer(h)) }

// AsStream returns the *Stream behind s, if s is a stream of this backend.
func AsStream(s device.Stream) (*Stream, bool) {
	cs, ok := s.(*Stream)
	return cs, ok && cs != nil
}

// Device is the device that created the stream.
func (s *Stream) Device() *Device { return s.dev }

// Handle is the CUstream.
func (s *Stream) Handle() uintptr { return s.handle }

// lock takes mu and fails with device.ErrClosed once the stream or its device
// is closed; on success the caller unlocks.
func (s *Stream) lock(what string) error {
	s.mu.Lock()
	if s.closed || s.dev.closed.Load() {
		s.mu.Unlock()
		return fmt.Errorf("cuda: stream %#x: %s: %w", s.handle, what, device.ErrClosed)
	}
	return nil
}

// BatchCopy validates every descriptor (positive size; source and destination
// each inside one live allocation of this device) and enqueues them as one
// submission: one cuMemcpyBatchAsync with stream-ordered source access and
// CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE, a descriptor split only where a
// host-mapped side crosses a registration-region boundary. A bad descriptor
// fails the call with an error wrapping device.ErrInvalidCopy that names its
// index, and nothing is enqueued. In BatchLegacy mode each piece is one
// cuMemcpyAsync; a driver error there may leave the pieces before it
// enqueued. An empty batch is a no-op.
func (s *Stream) BatchCopy(descs []device.CopyDesc) error {
	if err := s.lock("batch copy"); err != nil {
		return err
	}
	defer s.mu.Unlock()
	if len(descs) == 0 {
		return nil
	}
	d := s.dev
	d.memMu.RLock()
	defer d.memMu.RUnlock()
	dsts, srcs, sizes, err := d.plan(descs, s.dsts[:0], s.srcs[:0], s.sizes[:0])
	s.dsts, s.srcs, s.sizes = dsts[:0], srcs[:0], sizes[:0] // keep the grown buffers
	if err != nil {
		return fmt.Errorf("cuda: stream %#x: batch copy: %w", s.handle, err)
	}
	return s.submit(dsts, srcs, sizes)
}

// plan validates descs against the live allocations (memMu held for
// reading) and appends them to the struct-of-arrays batch, split where a
// host-mapped side crosses a registration-region boundary.
func (d *Device) plan(descs []device.CopyDesc, dsts, srcs, sizes []uint64) ([]uint64, []uint64, []uint64, error) {
	var sm, dm memo
	n0 := len(dsts)
	dsts, srcs, sizes = slices.Grow(dsts, len(descs)), slices.Grow(srcs, len(descs)), slices.Grow(sizes, len(descs))
	dsts, srcs, sizes = dsts[:n0+len(descs)], srcs[:n0+len(descs)], sizes[:n0+len(descs)]
	j := n0
	for i, c := range descs {
		if c.Size <= 0 {
			return dsts[:n0], srcs[:n0], sizes[:n0], invalidCopy(i, c, "size", fmt.Errorf("size must be positive"))
		}
		sa, err := d.resolveLocked(c.Src, c.Size, &sm)
		if err != nil {
			return dsts[:n0], srcs[:n0], sizes[:n0], invalidCopy(i, c, "source", err)
		}
		da, err := d.resolveLocked(c.Dst, c.Size, &dm)
		if err != nil {
			return dsts[:n0], srcs[:n0], sizes[:n0], invalidCopy(i, c, "destination", err)
		}
		if !sa.split && !da.split {
			dsts[j], srcs[j], sizes[j] = uint64(c.Dst), uint64(c.Src), uint64(c.Size)
			j++
			continue
		}
		// Split where a host-mapped side crosses a region boundary.
		dsts, srcs, sizes = dsts[:j], srcs[:j], sizes[:j]
		so, do := int64(c.Src-sa.base), int64(c.Dst-da.base)
		for done := int64(0); done < c.Size; {
			n := min(c.Size-done, d.toRegionEnd(sa, so+done), d.toRegionEnd(da, do+done))
			dsts = append(dsts, uint64(c.Dst)+uint64(done))
			srcs = append(srcs, uint64(c.Src)+uint64(done))
			sizes = append(sizes, uint64(n))
			done += n
		}
		j = len(dsts)
		rest := len(descs) - i - 1
		dsts, srcs, sizes = slices.Grow(dsts, rest), slices.Grow(srcs, rest), slices.Grow(sizes, rest)
		dsts, srcs, sizes = dsts[:j+rest], srcs[:j+rest], sizes[:j+rest]
	}
	return dsts[:j], srcs[:j], sizes[:j], nil
}

func invalidCopy(i int, c device.CopyDesc, side string, why error) error {
	return fmt.Errorf("descriptor %d (dst %#x, src %#x, size %d): %s: %w: %v",
		i, c.Dst, c.Src, c.Size, side, device.ErrInvalidCopy, why)
}

// submit hands a struct-of-arrays batch to the driver; mu is held.
func (s *Stream) submit(dsts, srcs, sizes []uint64) error {
	var fail C.size_t
	r := C.kv_batch_copy(s.dev.ctx, s.h, s.dev.mode,
		(*C.uint64_t)(unsafe.Pointer(unsafe.SliceData(dsts))),
		(*C.uint64_t)(unsafe.Pointer(unsafe.SliceData(srcs))),
		(*C.uint64_t)(unsafe.Pointer(unsafe.SliceData(sizes))),
		C.size_t(len(dsts)), C.KV_CU_MEMCPY_SRC_ACCESS_ORDER_STREAM, &fail)
	if r == C.KV_CUDA_SUCCESS {
		return nil
	}
	op := fmt.Sprintf("stream %#x: %v of %d copies", s.handle, BatchMode(s.dev.mode), len(dsts))
	if int(fail) < len(dsts) {
		op += fmt.Sprintf(" (copy %d: dst %#x, src %#x, size %d)", int(fail), dsts[fail], srcs[fail], sizes[fail])
	}
	return newError(op, r)
}

// RawBatch is a batch of copies already laid out as the driver wants them,
// for measuring the driver alone: Stream.SubmitRaw performs no validation,
// no region splitting and no bookkeeping.
type RawBatch struct {
	dsts, srcs, sizes []uint64
}

// NewRawBatch lays out descs for SubmitRaw.
func NewRawBatch(descs []device.CopyDesc) *RawBatch {
	b := &RawBatch{
		dsts:  make([]uint64, len(descs)),
		srcs:  make([]uint64, len(descs)),
		sizes: make([]uint64, len(descs)),
	}
	for i, c := range descs {
		b.dsts[i], b.srcs[i], b.sizes[i] = uint64(c.Dst), uint64(c.Src), uint64(c.Size)
	}
	return b
}

// Len is the number of copies.
func (b *RawBatch) Len() int { return len(b.dsts) }

// Reset empties the batch, keeping its arrays for reuse.
func (b *RawBatch) Reset() { b.dsts, b.srcs, b.sizes = b.dsts[:0], b.srcs[:0], b.sizes[:0] }

// Add appends one copy.
func (b *RawBatch) Add(dst, src device.Ptr, size int64) {
	b.dsts = append(b.dsts, uint64(dst))
	b.srcs = append(b.srcs, uint64(src))
	b.sizes = append(b.sizes, uint64(size))
}

// SubmitRaw submits b exactly as BatchCopy submits a validated batch (one
// cuMemcpyBatchAsync, or cuMemcpyAsync per copy in BatchLegacy mode), with no
// validation: the caller guarantees every copy is valid and crosses no
// registration region boundary. It is the reference BatchCopy is measured
// against.
func (s *Stream) SubmitRaw(b *RawBatch) error {
	if err := s.lock("raw batch"); err != nil {
		return err
	}
	defer s.mu.Unlock()
	if b.Len() == 0 {
		return nil
	}
	return s.submit(b.dsts, b.srcs, b.sizes)
}

// CopyFromHost validates that [dst, dst+len(src)) lies in one live allocation
// and enqueues the copy of src there; src (ordinary host memory) is consumed
// before the call returns. With cuMemcpyBatchAsync it is one batch entry with
// CU_MEMCPY_SRC_ACCESS_ORDER_DURING_API_CALL and PREFER_OVERLAP_WITH_COMPUTE
// (split only at host registration regions when dst is host-mapped); before
// CUDA 12.8 it launches kvcm_upload_segment once per 4064 bytes, the bytes
// travelling in the kernel parameters.
func (s *Stream) CopyFromHost(dst device.Ptr, src []byte) error {
	if err := s.lock("copy from host"); err != nil {
		return err
	}
	defer s.mu.Unlock()
	if len(src) == 0 {
		return nil
	}
	d := s.dev
	var fn C.kv_CUfunction
	if d.mode == C.KV_BATCH_LEGACY {
		f, err := d.uploadFunction()
		if err != nil {
			return err
		}
		fn = f.h
	}
	d.memMu.RLock()
	defer d.memMu.RUnlock()
	var m memo
	a, err := d.resolveLocked(dst, int64(len(src)), &m)
	if err != nil {
		return fmt.Errorf("cuda: stream %#x: copy from host to %#x (%d bytes): %w: %v",
			s.handle, dst, len(src), device.ErrInvalidCopy, err)
	}
	off := int64(dst - a.base)
	if a.kind == device.HostMapped {
		// The host writes mapped memory itself, in stream order, from a
		// private copy: the source is consumed before returning, as for a
		// device destination. (A batch entry of pageable source into pinned
		// host memory was seen not to land on the H200's driver.)
		data := slices.Clone(src)
		return s.enqueueJob(&hostJob{fn: func() error {
			d.memMu.RLock()
			defer d.memMu.RUnlock()
			if a.freed.Load() {
				return fmt.Errorf("cuda: copy from host to %#x: destination freed before the copy ran: %w", dst, device.ErrInvalidCopy)
			}
			copy(a.mapping[off:off+int64(len(data))], data)
			return nil
		}})
	}
	for done := int64(0); done < int64(len(src)); {
		n := min(int64(len(src))-done, d.toRegionEnd(a, off+done))
		r := C.kv_copy_from_host(d.ctx, s.h, d.mode, fn, C.kv_CUdeviceptr(dst.Add(done)),
			unsafe.Pointer(&src[done]), C.size_t(n))
		if err := checkf(r, "stream %#x: copy from host (%d bytes to %#x, %v)", s.handle, n, dst.Add(done), BatchMode(d.mode)); err != nil {
			return err
		}
		done += n
	}
	return nil
}

// Memset enqueues setting n bytes at p (inside one live allocation) to v.
func (s *Stream) Memset(p device.Ptr, v byte, n int64) error {
	if err := s.lock("memset"); err != nil {
		return err
	}
	defer s.mu.Unlock()
	if n <= 0 {
		return nil
	}
	d := s.dev
	d.memMu.RLock()
	defer d.memMu.RUnlock()
	var m memo
	if _, err := d.resolveLocked(p, n, &m); err != nil {
		return fmt.Errorf("cuda: stream %#x: memset %#x (%d bytes): %w: %v", s.handle, p, n, device.ErrInvalidCopy, err)
	}
	return checkf(C.kv_memset8(d.ctx, s.h, C.kv_CUdeviceptr(p), C.uchar(v), C.size_t(n)), "stream %#x: cuMemsetD8Async", s.handle)
}

// HostCheck is a cheaper HostFunc for checks: fn runs on a host thread after
// all work enqueued before it, and its failure is a failure of the interval
// it was enqueued in, exactly as with HostFunc, but consecutive checks are
// batched into one host function, enqueued no later than the next HostFunc,
// Wait, Record, Synchronize or Close of the stream (or once 64 are pending).
// So a migration of several codec calls costs one host round trip, not one
// per call. fn must be short, must not block and, like any host function,
// must not call the device or CUDA.
func (s *Stream) HostCheck(fn func() error) error {
	if fn == nil {
		return fmt.Errorf("cuda: stream %#x: host check: nil function", s.handle)
	}
	if err := s.lock("host check"); err != nil {
		return err
	}
	defer s.mu.Unlock()
	s.checks = append(s.checks, fn)
	if len(s.checks) >= maxPendingChecks {
		return s.flushChecks()
	}
	return nil
}

// flushChecks enqueues the pending checks as one host function; mu is held.
func (s *Stream) flushChecks() error {
	if len(s.checks) == 0 {
		return nil
	}
	checks := s.checks
	err := s.enqueueHost(&hostJob{fn: func() error {
		var first error
		for _, c := range checks {
			if err := c(); err != nil && first == nil {
				first = err
			}
		}
		return first
	}})
	if err == nil {
		s.checks = nil
	}
	return err
}

// enqueueJob enqueues j after the pending checks; mu is held.
func (s *Stream) enqueueJob(j *hostJob) error {
	if err := s.flushChecks(); err != nil {
		return err
	}
	return s.enqueueHost(j)
}

// enqueueHost launches j as a host function; mu is held. It marks the
// current intervals as able to fail.
func (s *Stream) enqueueHost(j *hostJob) error {
	j.ev, j.sync, j.stream = s.ev, s.sync, s.handle
	h := cgo.NewHandle(j)
	if err := checkf(C.kv_host_func(s.dev.ctx, s.h, C.uintptr_t(h)), "stream %#x: cuLaunchHostFunc", s.handle); err != nil {
		h.Delete()
		return err
	}
	s.ev.mayFail, s.sync.mayFail = true, true
	return nil
}

// HostFunc enqueues fn to run on a driver thread in stream order. A non-nil
// return, or a panic (recovered and converted), is an asynchronous failure
// of the stream. fn must not call the device or CUDA (the driver forbids it)
// and must not wait for work queued after it.
func (s *Stream) HostFunc(fn func() error) error {
	if fn == nil {
		return fmt.Errorf("cuda: stream %#x: host func: nil function", s.handle)
	}
	if err := s.lock("host func"); err != nil {
		return err
	}
	defer s.mu.Unlock()
	return s.enqueueJob(&hostJob{fn: fn})
}

// Record makes ev capture the work enqueued so far on this stream, replacing
// its earlier capture (a Wait made before keeps the capture it saw). When
// that work has run, ev reports its first failure since the previous Record
// on this stream, including failures inherited through Wait; a new interval
// starts, and Synchronize's interval restarts too.
func (s *Stream) Record(ev device.Event) error {
	e, err := s.dev.ownEvent(ev)
	if err != nil {
		return fmt.Errorf("cuda: stream %#x: record: %w", s.handle, err)
	}
	if err := s.lock("record"); err != nil {
		return err
	}
	defer s.mu.Unlock()
	if err := s.flushChecks(); err != nil {
		return err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return fmt.Errorf("cuda: stream %#x: record: event: %w", s.handle, device.ErrClosed)
	}
	if err := checkf(C.kv_event_record(s.dev.ctx, e.h, s.h), "stream %#x: cuEventRecord", s.handle); err != nil {
		return err
	}
	var cap *interval
	if s.ev.mayFail {
		cap, s.ev = s.ev, &interval{}
	}
	if s.sync.mayFail {
		s.sync = &interval{}
	}
	e.cap, e.recorded = cap, true
	return nil
}

// Wait makes work enqueued later on this stream wait until ev's latest
// recorded work has completed (cuStreamWaitEvent). If that work could carry a
// failure, a host function enqueued after the wait copies it into this
// stream's current interval. Waiting on a never-recorded event does nothing.
func (s *Stream) Wait(ev device.Event) error {
	e, err := s.dev.ownEvent(ev)
	if err != nil {
		return fmt.Errorf("cuda: stream %#x: wait: %w", s.handle, err)
	}
	if err := s.lock("wait"); err != nil {
		return err
	}
	defer s.mu.Unlock()
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return fmt.Errorf("cuda: stream %#x: wait: event: %w", s.handle, device.ErrClosed)
	}
	if err := s.flushChecks(); err != nil {
		return err
	}
	if !e.recorded {
		return nil
	}
	if err := checkf(C.kv_stream_wait_event(s.dev.ctx, s.h, e.h), "stream %#x: cuStreamWaitEvent", s.handle); err != nil {
		return err
	}
	if e.cap == nil {
		return nil
	}
	return s.enqueueJob(&hostJob{inherit: e.cap})
}

// Synchronize blocks until all work enqueued so far has completed and returns
// its first failure since the previous Record or Synchronize on this stream
// (or the driver's error). It does not start a new event interval.
func (s *Stream) Synchronize() error {
	if err := s.lock("synchronize"); err != nil {
		return err
	}
	if err := s.flushChecks(); err != nil {
		s.mu.Unlock()
		return err
	}
	si := s.sync
	if si.mayFail {
		s.sync = &interval{}
	} else {
		si = nil
	}
	s.mu.Unlock()
	if err := checkf(C.kv_stream_sync(s.dev.ctx, s.h), "stream %#x: cuStreamSynchronize", s.handle); err != nil {
		return err
	}
	return si.result()
}

// Close drains the stream (everything enqueued runs), destroys it and forgets
// its handle; later operations fail with device.ErrClosed. Failures of the
// drained work are reported only by events recorded before Close. Closing
// twice fails with device.ErrClosed.
func (s *Stream) Close() error {
	if s.dev.closed.Load() {
		return fmt.Errorf("cuda: stream %#x: close: %w", s.handle, device.ErrClosed)
	}
	s.dev.mu.Lock()
	delete(s.dev.streams, s.handle)
	s.dev.mu.Unlock()
	return s.destroy()
}

func (s *Stream) destroy() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fmt.Errorf("cuda: stream %#x: close: %w", s.handle, device.ErrClosed)
	}
	ferr := s.flushChecks()
	s.closed = true
	err := checkf(C.kv_stream_sync(s.dev.ctx, s.h), "stream %#x: cuStreamSynchronize (close)", s.handle)
	if ferr != nil {
		// The checks could not be enqueued: run them now that the work is done.
		for _, c := range s.checks {
			_ = c()
		}
		s.checks = nil
	}
	if s.word != nil || len(s.retired) > 0 {
		// The stream has passed its last wait, so its words are written for
		// good; the next stream's WaitHost resets one it takes.
		s.dev.privMu.Lock()
		for _, w := range append(s.retired, s.word) {
			if w != nil {
				s.dev.words.free = append(s.dev.words.free, w)
			}
		}
		s.dev.privMu.Unlock()
		s.word, s.retired = nil, nil
	}
	if s.borrowed {
		return err
	}
	if e2 := checkf(C.kv_stream_destroy(s.dev.ctx, s.h), "stream %#x: cuStreamDestroy", s.handle); err == nil {
		err = e2
	}
	return err
}
