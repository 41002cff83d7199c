package emu

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/kvcm/kvcm/core/device"
)

type opKind int

const (
	opCopy opKind = iota
	opHostFunc
	opRecord
	opWait
	opSync
	opUpload
	opWaitHost
)

// piece is one copy as executed: a caller's descriptor, or part of one after
// region splitting. index is the caller's descriptor index, for errors;
// inject marks a failure requested by FailNext.
type piece struct {
	dst, src device.Ptr
	size     int64
	index    int
	inject   bool
}

// op is one queued unit of stream work.
type op struct {
	kind   opKind
	pieces []piece         // opCopy
	fn     func() error    // opHostFunc
	cap    *capture        // opRecord: completed by it; opWait: waited for
	reply  chan<- error    // opSync: buffered, receives the interval's failure
	dst    device.Ptr      // opUpload
	data   []byte          // opUpload: private copy of the caller's bytes
	host   <-chan struct{} // opWaitHost: closed when the stream may go on
}

// stream is a device.Stream: an unbounded FIFO of ops served by one worker
// goroutine.
//
// A Record, Wait or Synchronize that finds the stream idle (nothing queued,
// the worker not running a batch) and needs no waiting is executed by the
// calling goroutine instead (see runsInline): it completes exactly as the
// worker would have run it next, without waking the worker.
type stream struct {
	dev    *Device
	handle uintptr

	mu     sync.Mutex
	queue  []op
	closed bool          // nothing more is accepted; the worker exits once the queue is empty
	busy   bool          // the worker has taken a batch and not finished it
	wake   chan struct{} // buffered(1): the queue grew or closed was set
	exited chan struct{} // closed when the worker returns

	// Execution state: the worker's while busy, else an inline caller's
	// under mu.
	rng *rand.Rand
	// evErr is the first failure since the last executed Record; syncErr
	// the first since the last executed Record or Synchronize.
	evErr, syncErr error
}

var (
	_ device.Stream     = (*stream)(nil)
	_ device.HostWaiter = (*stream)(nil)
)

func newStream(d *Device, handle uintptr, ordinal uint64) *stream {
	return &stream{
		dev:    d,
		handle: handle,
		wake:   make(chan struct{}, 1),
		exited: make(chan struct{}),
		rng:    rand.New(rand.NewPCG(uint64(d.opts.Seed), ordinal)),
	}
}

// Handle is this stream's opaque nonzero token, unique in the process.
func (s *stream) Handle() uintptr { return s.handle }

// enqueue appends o, or fails with device.ErrClosed once the stream or its
// device is closed. what names the operation for the error.
func (s *stream) enqueue(what string, o op) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || s.dev.isClosed() {
		return fmt.Errorf("emu: stream %#x: %s: %w", s.handle, what, device.ErrClosed)
	}
	s.queue = append(s.queue, o)
	s.signal()
	return nil
}

// idleLocked reports whether an op may run inline now: nothing is queued or
// running, so it is next in stream order, and operations carry no random
// delay (Options.MaxDelay), which only the worker sleeps. s.mu is held.
func (s *stream) idleLocked() bool {
	return !s.busy && len(s.queue) == 0 && s.dev.opts.MaxDelay <= 0
}

// checkOpen fails with device.ErrClosed once the stream or its device is
// closed, for operations that enqueue nothing.
func (s *stream) checkOpen(what string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || s.dev.isClosed() {
		return fmt.Errorf("emu: stream %#x: %s: %w", s.handle, what, device.ErrClosed)
	}
	return nil
}

// signal wakes the worker; s.mu is held.
func (s *stream) signal() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// BatchCopy validates every descriptor now (positive size; source and
// destination ranges each inside one live allocation) and enqueues them as one
// submission, split at host region boundaries when Options.HostRegionBytes is
// set. A bad descriptor fails the call with an error wrapping
// device.ErrInvalidCopy that names its index, and nothing is enqueued. An empty
// batch is a no-op and is not counted. At execution each piece is copied with
// memmove semantics; a piece chosen to fail (by FailNext or Options.FailRate),
// or whose memory was freed meanwhile, copies nothing and is an asynchronous
// failure, and the other pieces of the batch still run.
func (s *stream) BatchCopy(descs []device.CopyDesc) error {
	// Checked first so that a closed device, whose registry is empty, reports
	// ErrClosed rather than invalid descriptors.
	if err := s.checkOpen("batch copy"); err != nil || len(descs) == 0 {
		return err
	}
	pieces, splits, err := s.dev.plan(descs)
	if err != nil {
		return fmt.Errorf("emu: stream %#x: batch copy: %w", s.handle, err)
	}
	injected := 0
	for i := range pieces {
		if !s.dev.takeInjected() {
			break
		}
		pieces[i].inject = true
		injected++
	}
	if err := s.enqueue("batch copy", op{kind: opCopy, pieces: pieces}); err != nil {
		s.dev.failNext.Add(int64(injected)) // not submitted: give the failures back
		return err
	}
	s.dev.batchCalls.Add(1)
	s.dev.descriptors.Add(int64(len(pieces)))
	s.dev.regionSplits.Add(int64(splits))
	return nil
}

// plan validates descs against the live allocations and splits them at host
// region boundaries.
func (d *Device) plan(descs []device.CopyDesc) (pieces []piece, splits int, err error) {
	d.memMu.RLock()
	defer d.memMu.RUnlock()
	pieces = make([]piece, 0, len(descs))
	for i, c := range descs {
		invalid := func(side string, why error) error {
			return fmt.Errorf("descriptor %d (dst %#x, src %#x, size %d): %s: %w: %v",
				i, c.Dst, c.Src, c.Size, side, device.ErrInvalidCopy, why)
		}
		if c.Size <= 0 {
			return nil, 0, invalid("size", fmt.Errorf("size must be positive"))
		}
		src, srcOff, err := d.resolveLocked(c.Src, c.Size)
		if err != nil {
			return nil, 0, invalid("source", err)
		}
		dst, dstOff, err := d.resolveLocked(c.Dst, c.Size)
		if err != nil {
			return nil, 0, invalid("destination", err)
		}
		n := len(pieces)
		for done := int64(0); done < c.Size; {
			size := min(c.Size-done, d.toRegionEnd(src, srcOff+done), d.toRegionEnd(dst, dstOff+done))
			pieces = append(pieces, piece{dst: c.Dst.Add(done), src: c.Src.Add(done), size: size, index: i})
			done += size
		}
		splits += len(pieces) - n - 1
	}
	return pieces, splits, nil
}

// toRegionEnd returns how many bytes from off in a stay in one registered
// region: unbounded for device memory or when regions are off.
func (d *Device) toRegionEnd(a *allocation, off int64) int64 {
	r := d.opts.HostRegionBytes
	if a.kind != device.HostMapped || r <= 0 {
		return a.size() - off
	}
	return r - off%r
}

// CopyFromHost validates that [dst, dst+len(src)) lies in one live
// allocation, copies src before returning, and enqueues the write of those
// bytes to dst. It counts as one batch call of one descriptor.
func (s *stream) CopyFromHost(dst device.Ptr, src []byte) error {
	if err := s.checkOpen("copy from host"); err != nil || len(src) == 0 {
		return err
	}
	s.dev.memMu.RLock()
	_, _, err := s.dev.resolveLocked(dst, int64(len(src)))
	s.dev.memMu.RUnlock()
	if err != nil {
		return fmt.Errorf("emu: stream %#x: copy from host to %#x (%d bytes): %w: %v",
			s.handle, dst, len(src), device.ErrInvalidCopy, err)
	}
	if err := s.enqueue("copy from host", op{kind: opUpload, dst: dst, data: append([]byte(nil), src...)}); err != nil {
		return err
	}
	s.dev.batchCalls.Add(1)
	s.dev.descriptors.Add(1)
	return nil
}

func (s *stream) runUpload(dst device.Ptr, data []byte) {
	d := s.dev
	d.memMu.RLock()
	defer d.memMu.RUnlock()
	a, off, err := d.resolveLocked(dst, int64(len(data)))
	if err != nil {
		s.fail(fmt.Errorf("emu: stream %#x: copy from host: destination freed before the copy ran: %w: %v",
			s.handle, device.ErrInvalidCopy, err))
		return
	}
	copy(a.buf[off:], data)
	d.bytesCopied.Add(int64(len(data)))
}

// HostFunc enqueues fn to run on the stream's goroutine in stream order. A
// non-nil return, or a panic (recovered and converted), is an asynchronous
// failure of the stream. fn must not wait for work queued after it on the same
// stream, nor close the stream or the device.
func (s *stream) HostFunc(fn func() error) error {
	if fn == nil {
		return fmt.Errorf("emu: stream %#x: host func: nil function", s.handle)
	}
	if err := s.enqueue("host func", op{kind: opHostFunc, fn: fn}); err != nil {
		return err
	}
	s.dev.hostFuncs.Add(1)
	return nil
}

// WaitHost makes work enqueued later wait until done is closed
// (device.HostWaiter). The stream's goroutine waits, outside any host
// function, so with Options.SharedHostThread other streams' host functions
// still run meanwhile.
func (s *stream) WaitHost(done <-chan struct{}) error {
	if done == nil {
		return fmt.Errorf("emu: stream %#x: wait host: nil channel", s.handle)
	}
	return s.enqueue("wait host", op{kind: opWaitHost, host: done})
}

// Record makes ev capture the work enqueued so far on this stream, replacing
// any earlier capture of ev (a Wait made before keeps waiting for the capture
// it saw). When that work has run, ev reports its first failure since the
// previous Record on this stream, including failures inherited through Wait;
// the interval then starts clean.
func (s *stream) Record(ev device.Event) error {
	e, err := s.dev.ownEvent(ev)
	if err != nil {
		return fmt.Errorf("emu: stream %#x: record: %w", s.handle, err)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return fmt.Errorf("emu: stream %#x: record: event: %w", s.handle, device.ErrClosed)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || s.dev.isClosed() {
		return fmt.Errorf("emu: stream %#x: record: %w", s.handle, device.ErrClosed)
	}
	if s.idleLocked() {
		// Everything enqueued before has run: the capture is complete.
		e.cur = completedCapture(s.evErr)
		s.evErr, s.syncErr = nil, nil
		return nil
	}
	c := newCapture()
	s.queue = append(s.queue, op{kind: opRecord, cap: c})
	s.signal()
	e.cur = c
	return nil
}

// Wait makes work enqueued later on this stream wait until the capture ev
// holds now has completed; a failure it carries becomes a failure of this
// stream's current interval. Waiting on a never-recorded event does nothing.
func (s *stream) Wait(ev device.Event) error {
	e, err := s.dev.ownEvent(ev)
	if err != nil {
		return fmt.Errorf("emu: stream %#x: wait: %w", s.handle, err)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return fmt.Errorf("emu: stream %#x: wait: event: %w", s.handle, device.ErrClosed)
	}
	if e.cur == nil {
		return s.checkOpen("wait")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || s.dev.isClosed() {
		return fmt.Errorf("emu: stream %#x: wait: %w", s.handle, device.ErrClosed)
	}
	if s.idleLocked() && e.cur.completed() {
		// Nothing to wait for: only the failure is inherited.
		s.fail(e.cur.err)
		return nil
	}
	s.queue = append(s.queue, op{kind: opWait, cap: e.cur})
	s.signal()
	return nil
}

// Synchronize blocks until all work enqueued so far has run and returns its
// first failure since the previous Record or Synchronize on this stream.
func (s *stream) Synchronize() error {
	s.mu.Lock()
	if s.closed || s.dev.isClosed() {
		s.mu.Unlock()
		return fmt.Errorf("emu: stream %#x: synchronize: %w", s.handle, device.ErrClosed)
	}
	if !s.busy && len(s.queue) == 0 {
		// Nothing enqueued is left to run (a Synchronize is never delayed).
		err := s.syncErr
		s.syncErr = nil
		s.mu.Unlock()
		return err
	}
	reply := make(chan error, 1)
	s.queue = append(s.queue, op{kind: opSync, reply: reply})
	s.signal()
	s.mu.Unlock()
	return <-reply
}

// Close drains the stream (everything enqueued runs), stops its goroutine and
// forgets its handle; later operations fail with device.ErrClosed. Failures of
// the drained work are reported only by events recorded before Close. Closing
// twice fails with device.ErrClosed.
func (s *stream) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return fmt.Errorf("emu: stream %#x: close: %w", s.handle, device.ErrClosed)
	}
	s.closed = true
	s.signal()
	s.mu.Unlock()

	s.dev.mu.Lock()
	delete(s.dev.streams, s.handle)
	s.dev.mu.Unlock()
	<-s.exited
	return nil
}

// shut stops accepting work; Device.Close uses it after closing done, so the
// worker cancels what is queued and exits.
func (s *stream) shut() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	s.signal()
}

// work is the worker loop: it runs queued ops in order until the stream is
// closed and its queue is empty.
func (s *stream) work() {
	defer close(s.exited)
	for {
		s.mu.Lock()
		s.busy = false
		for len(s.queue) == 0 && !s.closed {
			s.mu.Unlock()
			<-s.wake
			s.mu.Lock()
		}
		batch := s.queue
		s.queue = nil
		s.busy = len(batch) > 0
		s.mu.Unlock()
		if len(batch) == 0 {
			return // closed and drained
		}
		last := len(batch) - 1
		for i := range batch[:last] {
			s.run(&batch[i])
		}
		if batch[last].kind != opSync {
			s.run(&batch[last])
			continue
		}
		// A Synchronize that ends the batch hands the stream back before it
		// returns: its caller then finds the stream idle, so a Record made
		// right after it runs inline as documented.
		s.mu.Lock()
		s.busy = len(s.queue) > 0
		s.run(&batch[last])
		s.mu.Unlock()
	}
}

// run executes one op, or cancels it once the device is closing.
func (s *stream) run(o *op) {
	if o.kind != opSync && !s.delay() {
		s.cancel(o)
		return
	}
	if s.dev.isClosed() {
		s.cancel(o)
		return
	}
	switch o.kind {
	case opCopy:
		s.runCopy(o.pieces)
	case opHostFunc:
		s.fail(s.runHostFunc(o.fn))
	case opUpload:
		s.runUpload(o.dst, o.data)
	case opRecord:
		o.cap.complete(s.evErr)
		s.evErr, s.syncErr = nil, nil
	case opWait:
		select {
		case <-o.cap.done:
			// The capture's err is written before done is closed.
			s.fail(o.cap.err)
		case <-s.dev.done:
			s.cancel(o)
		}
	case opSync:
		o.reply <- s.syncErr
		s.syncErr = nil
	case opWaitHost:
		select {
		case <-o.host:
		case <-s.dev.done:
		}
	}
}

// cancel disposes of an op dropped by Device.Close, so nobody blocks on it.
func (s *stream) cancel(o *op) {
	err := fmt.Errorf("emu: stream %#x: work cancelled: %w", s.handle, device.ErrClosed)
	switch o.kind {
	case opRecord:
		o.cap.complete(err)
	case opSync:
		o.reply <- err
	}
}

// delay sleeps the seeded random pre-operation delay. It returns false if the
// device started closing meanwhile.
func (s *stream) delay() bool {
	if s.dev.opts.MaxDelay <= 0 {
		return true
	}
	t := time.NewTimer(time.Duration(s.rng.Int64N(int64(s.dev.opts.MaxDelay))))
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-s.dev.done:
		return false
	}
}

// fail records err (if non-nil) as a failure of the current intervals.
func (s *stream) fail(err error) {
	if err == nil {
		return
	}
	if s.evErr == nil {
		s.evErr = err
	}
	if s.syncErr == nil {
		s.syncErr = err
	}
}

// runCopy executes the pieces of one batch. Holding memMu for reading keeps
// every allocation it resolves mapped until the batch is done.
func (s *stream) runCopy(pieces []piece) {
	d := s.dev
	d.memMu.RLock()
	defer d.memMu.RUnlock()
	for _, p := range pieces {
		if err := s.copyPiece(p); err != nil {
			s.fail(fmt.Errorf("emu: stream %#x: batch copy descriptor %d (dst %#x, src %#x, size %d): %w",
				s.handle, p.index, p.dst, p.src, p.size, err))
		}
	}
}

func (s *stream) copyPiece(p piece) error {
	d := s.dev
	if p.inject || (d.opts.FailRate > 0 && s.rng.Float64() < d.opts.FailRate) {
		return device.ErrInjected
	}
	src, srcOff, err := d.resolveLocked(p.src, p.size)
	if err != nil {
		return fmt.Errorf("source freed before the copy ran: %w: %v", device.ErrInvalidCopy, err)
	}
	dst, dstOff, err := d.resolveLocked(p.dst, p.size)
	if err != nil {
		return fmt.Errorf("destination freed before the copy ran: %w: %v", device.ErrInvalidCopy, err)
	}
	copy(dst.buf[dstOff:dstOff+p.size], src.buf[srcOff:srcOff+p.size])
	d.bytesCopied.Add(p.size)
	return nil
}

// runHostFunc calls fn, converting a panic into an error.
func (s *stream) runHostFunc(fn func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			if e, ok := r.(error); ok {
				err = fmt.Errorf("emu: stream %#x: host function panicked: %w", s.handle, e)
			} else {
				err = fmt.Errorf("emu: stream %#x: host function panicked: %v", s.handle, r)
			}
		}
	}()
	if s.dev.opts.SharedHostThread {
		s.dev.hostThread.Lock()
		defer s.dev.hostThread.Unlock()
	}
	if err := fn(); err != nil {
		return fmt.Errorf("emu: stream %#x: host function: %w", s.handle, err)
	}
	return nil
}
