//go:build cgo

package cuda

/*
#include "shim.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/kvcm/kvcm/core/device"
)

var _ device.HostWaiter = (*Stream)(nil)

// hostWords is host memory for WaitHost's flags: pages mapped and
// registered (PORTABLE|DEVICEMAP) once, the first time a stream waits for
// the host, and released only at Device.Close. So waiting never registers or
// unregisters host memory on the hot path: cuMemHostUnregister synchronizes
// every stream of the device. Each stream that waits owns one 32-bit word,
// returned when the stream is destroyed.
type hostWords struct {
	pages [][]byte // each registered whole
	free  []*uint32
	// ok: the driver runs cuStreamWaitValue32 on these words (probed once).
	ok bool
}

const wordsPerPage = 1024

// waitWord hands out a zeroed word for a stream, or nil where the driver has
// no stream memory operations on registered host memory. d.privMu is held
// (the probe uses the private stream).
func (d *Device) waitWord() (*uint32, error) {
	w := &d.words
	if len(w.free) == 0 {
		page := int64(os.Getpagesize())
		buf, err := syscall.Mmap(-1, 0, int(page), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
		if err != nil {
			return nil, fmt.Errorf("cuda: host wait words: mmap: %w", err)
		}
		p := unsafe.Pointer(&buf[0])
		var dev C.kv_CUdeviceptr
		if err := checkf(C.kv_host_register(d.ctx, p, C.size_t(page), &dev), "cuMemHostRegister(host wait words)"); err != nil {
			syscall.Munmap(buf)
			return nil, err
		}
		if uintptr(dev) != uintptr(p) {
			C.kv_host_unregister(d.ctx, p)
			syscall.Munmap(buf)
			return nil, fmt.Errorf("cuda: host wait words at %#x map to device address %#x: kvcm needs them equal", uintptr(p), uintptr(dev))
		}
		w.pages = append(w.pages, buf)
		for i := range min(wordsPerPage, int(page)/4) {
			w.free = append(w.free, (*uint32)(unsafe.Add(p, 4*i)))
		}
		if len(w.pages) == 1 {
			ok, err := d.probeWaitValue(w.free[0])
			if err != nil {
				return nil, err
			}
			w.ok = ok
		}
	}
	if !w.ok {
		return nil, nil
	}
	word := w.free[len(w.free)-1]
	w.free = w.free[:len(w.free)-1]
	atomic.StoreUint32(word, 0)
	return word, nil
}

// probeWaitValue reports whether cuStreamWaitValue32 on a registered host
// word works here: a wait for a value already there must be accepted and
// pass. d.privMu is held.
func (d *Device) probeWaitValue(word *uint32) (bool, error) {
	if d.priv == nil {
		var s C.kv_CUstream
		if err := check("cuStreamCreate (private)", C.kv_stream_create(d.ctx, &s)); err != nil {
			return false, err
		}
		d.priv = s
	}
	atomic.StoreUint32(word, 1)
	if C.kv_stream_wait_value32(d.ctx, d.priv, C.kv_CUdeviceptr(uintptr(unsafe.Pointer(word))), 1) != C.KV_CUDA_SUCCESS {
		return false, nil // not supported here (or refused): the host-function fallback
	}
	return true, check("cuStreamSynchronize (private)", C.kv_stream_sync(d.ctx, d.priv))
}

// releaseWords unregisters and unmaps the wait words (Close, after the
// context has synchronized: no stream still waits on one).
func (d *Device) releaseWords() error {
	var errs []error
	for _, buf := range d.words.pages {
		p := unsafe.Pointer(&buf[0])
		errs = append(errs, checkf(C.kv_host_unregister(d.ctx, p), "cuMemHostUnregister(host wait words)"))
		if err := syscall.Munmap(buf); err != nil {
			errs = append(errs, fmt.Errorf("cuda: munmap host wait words: %w", err))
		}
	}
	d.words = hostWords{}
	return errors.Join(errs...)
}

// maxWaitCount is the most waits one host word counts before its stream
// takes another, so a GEQ comparison never sees the count wrap.
const maxWaitCount = 1 << 31

// WaitHost makes work enqueued later on this stream wait until done is
// closed (device.HostWaiter), without a host function: the stream waits
// (cuStreamWaitValue32, GEQ) on its host word for the next value of its
// count, and a goroutine stores that value once done is closed and every
// earlier WaitHost of the stream has been released, so releases stay in
// order. Where the driver cannot wait on host memory it falls back to a host
// function that blocks until done is closed.
func (s *Stream) WaitHost(done <-chan struct{}) error {
	if done == nil {
		return fmt.Errorf("cuda: stream %#x: wait host: nil channel", s.handle)
	}
	if err := s.lock("wait host"); err != nil {
		return err
	}
	defer s.mu.Unlock()
	if s.waitCount >= maxWaitCount {
		// A word's count would wrap: the next waits use a fresh word. The
		// old one returns to the device when the stream is destroyed.
		s.retired, s.word, s.waitCount = append(s.retired, s.word), nil, 0
	}
	if s.word == nil && !s.noWord {
		s.dev.privMu.Lock()
		word, err := s.dev.waitWord()
		s.dev.privMu.Unlock()
		if err != nil {
			return fmt.Errorf("cuda: stream %#x: wait host: %w", s.handle, err)
		}
		s.word, s.noWord = word, word == nil
	}
	if s.word == nil {
		return s.enqueueJob(&hostJob{fn: func() error { <-done; return nil }})
	}
	if err := s.flushChecks(); err != nil {
		return err
	}
	target := s.waitCount + 1
	if err := checkf(C.kv_stream_wait_value32(s.dev.ctx, s.h, C.kv_CUdeviceptr(uintptr(unsafe.Pointer(s.word))), C.uint32_t(target)),
		"stream %#x: cuStreamWaitValue32", s.handle); err != nil {
		return err
	}
	s.waitCount = target
	prev, released := s.lastRelease, make(chan struct{})
	s.lastRelease = released
	word := s.word
	go func() {
		if prev != nil {
			<-prev
		}
		<-done
		atomic.StoreUint32(word, target)
		close(released)
	}()
	return nil
}
