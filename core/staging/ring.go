package staging

import (
	"errors"
	"fmt"
	"slices"

	"github.com/kvcm/kvcm/core/device"
)

// Errors reported by this package. Returned errors wrap one of them (test with
// errors.Is) and add detail.
var (
	// ErrRingFull: no run of retired bytes from the cursor, nor in the one
	// extra pass from the beginning, fits the minimum request. The caller
	// must release leases (or use a smaller minimum) and retry; the ring
	// never waits.
	ErrRingFull = errors.New("staging: ring full")
	// ErrRequestTooLarge: the rounded minimum request exceeds the ring's
	// capacity, so it can never succeed.
	ErrRequestTooLarge = errors.New("staging: request larger than ring")
	// ErrInvalidRequest: a Request field is out of range.
	ErrInvalidRequest = errors.New("staging: invalid request")
	// ErrSourceFailed: a synchronous acquisition synchronized a source event
	// that carried an asynchronous failure of the previous owner's work.
	ErrSourceFailed = errors.New("staging: previous owner's asynchronous work failed")
	// ErrLiveLeases: Close was called while leases are live.
	ErrLiveLeases = errors.New("staging: ring has live leases")
	// ErrClosed: the ring was closed.
	ErrClosed = errors.New("staging: ring closed")
	// ErrReleased: the StagingBuffer was already released.
	ErrReleased = errors.New("staging: buffer already released")
)

// Request describes one allocation.
//
// The returned size is a multiple of Granularity: Min is rounded up to one,
// and the largest available size not above Max is rounded down to one. The
// returned pointer is aligned to Alignment (as an absolute address), and
// because Granularity is a multiple of Alignment every granularity-sized
// slice inside the lease is aligned too.
type Request struct {
	// Min is the smallest acceptable size in bytes; 0 < Min <= Max.
	Min int64
	// Max is the largest useful size in bytes.
	Max int64
	// Granularity is the positive size granularity in bytes (need not be a
	// power of two); it must be a multiple of Alignment.
	Granularity int64
	// Alignment is the power-of-two address alignment in bytes.
	Alignment int64
}

// normalized is a validated request: min and max are multiples of gran.
type normalized struct {
	min, max, gran, align int64
}

func (q Request) normalize() (normalized, error) {
	switch {
	case q.Granularity <= 0:
		return normalized{}, fmt.Errorf("%w: Granularity %d must be positive", ErrInvalidRequest, q.Granularity)
	case q.Alignment <= 0 || q.Alignment&(q.Alignment-1) != 0:
		return normalized{}, fmt.Errorf("%w: Alignment %d must be a positive power of two", ErrInvalidRequest, q.Alignment)
	case q.Granularity%q.Alignment != 0:
		return normalized{}, fmt.Errorf("%w: Granularity %d must be a multiple of Alignment %d", ErrInvalidRequest, q.Granularity, q.Alignment)
	case q.Min <= 0:
		return normalized{}, fmt.Errorf("%w: Min %d must be positive", ErrInvalidRequest, q.Min)
	case q.Max < q.Min:
		return normalized{}, fmt.Errorf("%w: Max %d is below Min %d", ErrInvalidRequest, q.Max, q.Min)
	}
	// Round without overflow: units of Granularity.
	lo := (q.Min-1)/q.Granularity + 1
	hi := q.Max / q.Granularity
	if lo > hi {
		return normalized{}, fmt.Errorf("%w: no multiple of Granularity %d lies in [Min %d, Max %d]",
			ErrInvalidRequest, q.Granularity, q.Min, q.Max)
	}
	return normalized{min: lo * q.Granularity, max: hi * q.Granularity, gran: q.Granularity, align: q.Alignment}, nil
}

// span is one range of the spatial partition: [off, end) in ring offsets.
type span struct {
	off, end   int64
	lease      *StagingBuffer // non-nil iff the range is live
	ev         *sharedEvent   // retired only: event of the previous owner, nil if none
	prev, next *span
}

func (s *span) live() bool { return s.lease != nil }

// Ring is a staging manager over one backing allocation. See the package
// documentation for the allocation and ownership contracts. A Ring is not
// safe for concurrent use.
type Ring struct {
	dev      device.Device
	mem      device.Memory // the one owning allocation; nil after Close
	capacity int64
	head     *span
	cursor   int64 // byte offset where the next-fit scan starts, in [0, capacity]
	live     int
	// draining holds events no retired range references any more but that
	// enqueued stream work may still wait on; they are closed once complete.
	draining []*sharedEvent
	// deferred collects event Close failures seen during normal operation;
	// Close reports them.
	deferred []error
	closed   bool
}

// NewRing allocates a ring of size bytes of the given memory kind from dev.
// The ring owns the allocation and frees it in Close.
func NewRing(dev device.Device, kind device.MemoryKind, size int64) (*Ring, error) {
	if dev == nil {
		return nil, errors.New("staging: nil device")
	}
	if size <= 0 {
		return nil, fmt.Errorf("staging: ring size %d must be positive", size)
	}
	mem, err := dev.Alloc(kind, size)
	if err != nil {
		return nil, fmt.Errorf("staging: allocating %d-byte %v ring: %w", size, kind, err)
	}
	if mem.Size() < size {
		_ = mem.Free()
		return nil, fmt.Errorf("staging: device returned %d bytes for a %d-byte ring", mem.Size(), size)
	}
	r := &Ring{dev: dev, mem: mem, capacity: size}
	r.head = &span{off: 0, end: size}
	return r, nil
}

// Kind is the memory kind of the backing allocation. Valid until Close.
func (r *Ring) Kind() device.MemoryKind { return r.mem.Kind() }

// Base is the base address of the backing allocation (0 after Close).
func (r *Ring) Base() device.Ptr {
	if r.mem == nil {
		return 0
	}
	return r.mem.Ptr()
}

// Capacity is the ring size in bytes.
func (r *Ring) Capacity() int64 { return r.capacity }

// Live is the number of live leases.
func (r *Ring) Live() int { return r.live }

// Acquire leases a slice satisfying req, owned by stream (nil: synchronous
// CPU ownership).
//
// With a nil stream, Acquire host-synchronizes every event protecting the
// slice before returning, so the CPU may overwrite it at once; those events
// are then dropped from every retired range and closed. If one of them
// carries an asynchronous failure, Acquire returns an error wrapping
// ErrSourceFailed and that failure, and no lease (the bytes stay retired,
// now without the events, so a retry succeeds). With a stream, Acquire
// enqueues on it a wait for each of those events; they stay valid for other
// fragments and waiters. Acquire never waits for a live lease: if nothing
// fits it fails with ErrRingFull and leaves the cursor where it was.
func (r *Ring) Acquire(req Request, stream device.Stream) (*StagingBuffer, error) {
	if r.closed {
		return nil, ErrClosed
	}
	q, err := req.normalize()
	if err != nil {
		return nil, err
	}
	if q.min > r.capacity {
		return nil, fmt.Errorf("%w: %d bytes (Min %d rounded to Granularity %d) > capacity %d",
			ErrRequestTooLarge, q.min, req.Min, q.gran, r.capacity)
	}
	r.reap()
	off, size, ok := r.find(q)
	if !ok {
		return nil, fmt.Errorf("%w: no retired run fits %d bytes aligned to %d (capacity %d, %d live leases)",
			ErrRingFull, q.min, q.align, r.capacity, r.live)
	}
	end := off + size
	evs := r.eventsIn(off, end)
	if stream == nil {
		var failure error
		for _, e := range evs {
			if err := e.ev.Synchronize(); err != nil && failure == nil {
				failure = err
			}
		}
		// Complete now: no future consumer needs to wait on them.
		for _, e := range evs {
			r.forget(e)
		}
		r.coalesce()
		if failure != nil {
			return nil, fmt.Errorf("%w: %w", ErrSourceFailed, failure)
		}
	} else {
		for _, e := range evs {
			if err := stream.Wait(e.ev); err != nil {
				// Nothing changed in the partition; extra waits already
				// enqueued only delay the stream.
				return nil, fmt.Errorf("staging: stream wait on previous owner's event: %w", err)
			}
		}
	}
	b := &StagingBuffer{ring: r, owner: stream}
	b.sp = r.carve(off, end, b)
	r.live++
	r.cursor = end
	return b, nil
}

// find runs the next-fit scan and returns the payload placement.
func (r *Ring) find(q normalized) (off, size int64, ok bool) {
	// Pass 1: from the cursor to the physical end.
	for rs, re := range r.runs() {
		if re <= r.cursor {
			continue
		}
		if off, size, ok = r.fit(max(rs, r.cursor), re, q); ok {
			return off, size, true
		}
	}
	// Pass 2, the only extra one: from the beginning, over every run that
	// starts before the cursor, each considered whole.
	for rs, re := range r.runs() {
		if rs >= r.cursor {
			break
		}
		if off, size, ok = r.fit(rs, re, q); ok {
			return off, size, true
		}
	}
	return 0, 0, false
}

// runs yields each maximal run [start, end) of contiguous retired ranges in
// address order.
func (r *Ring) runs() func(yield func(int64, int64) bool) {
	return func(yield func(int64, int64) bool) {
		for s := r.head; s != nil; {
			if s.live() {
				s = s.next
				continue
			}
			e := s
			for e.next != nil && !e.next.live() {
				e = e.next
			}
			if !yield(s.off, e.end) {
				return
			}
			s = e.next
		}
	}
}

// fit places an aligned payload inside the retired bytes [start, end).
func (r *Ring) fit(start, end int64, q normalized) (off, size int64, ok bool) {
	base := uint64(r.mem.Ptr())
	a := uint64(q.align)
	aligned := (base + uint64(start) + a - 1) &^ (a - 1)
	off = int64(aligned - base)
	if off >= end {
		return 0, 0, false
	}
	size = min(end-off, q.max) / q.gran * q.gran
	if size < q.min {
		return 0, 0, false
	}
	return off, size, true
}

// eventsIn returns the distinct events of the retired ranges overlapping
// [off, end), in address order.
func (r *Ring) eventsIn(off, end int64) []*sharedEvent {
	var evs []*sharedEvent
	for s := r.head; s != nil && s.off < end; s = s.next {
		if s.end <= off || s.ev == nil {
			continue
		}
		if !slices.Contains(evs, s.ev) {
			evs = append(evs, s.ev)
		}
	}
	return evs
}

// split makes x a range boundary; both halves keep the range's event.
func (r *Ring) split(x int64) {
	for s := r.head; s != nil; s = s.next {
		if s.off < x && x < s.end {
			n := &span{off: x, end: s.end, ev: s.ev, prev: s, next: s.next}
			if s.next != nil {
				s.next.prev = n
			}
			s.next = n
			s.end = x
			if s.ev != nil {
				s.ev.refs++
			}
			return
		}
		if s.off >= x {
			return
		}
	}
}

// carve turns the retired bytes [off, end) into one live range owned by b.
// The ranges it replaces release their references to their events.
func (r *Ring) carve(off, end int64, b *StagingBuffer) *span {
	r.split(off)
	r.split(end)
	first := r.head
	for first.off != off {
		first = first.next
	}
	last := first
	for {
		if last.ev != nil {
			r.unref(last.ev)
		}
		if last.end == end {
			break
		}
		last = last.next
	}
	sp := &span{off: off, end: end, lease: b, prev: first.prev, next: last.next}
	if sp.prev != nil {
		sp.prev.next = sp
	} else {
		r.head = sp
	}
	if sp.next != nil {
		sp.next.prev = sp
	}
	return sp
}

// retire turns a live range into a retired one protected by ev (nil: none).
func (r *Ring) retire(sp *span, ev *sharedEvent) {
	sp.lease = nil
	sp.ev = ev
	r.live--
	r.coalesce()
}

// coalesce merges adjacent retired ranges that hold the same event (or both
// none). This neither loses nor adds protection.
func (r *Ring) coalesce() {
	for s := r.head; s != nil && s.next != nil; {
		n := s.next
		if !s.live() && !n.live() && s.ev == n.ev {
			s.end = n.end
			s.next = n.next
			if n.next != nil {
				n.next.prev = s
			}
			if s.ev != nil {
				s.ev.refs--
			}
			continue
		}
		s = n
	}
}

// forget drops a complete event from every retired range and closes it.
func (r *Ring) forget(e *sharedEvent) {
	for s := r.head; s != nil; s = s.next {
		if s.ev == e {
			s.ev = nil
			e.refs--
		}
	}
	r.closeEvent(e)
}

// unref drops one range's reference to e. An unreferenced event that may
// still be waited on by enqueued work goes to the draining list.
func (r *Ring) unref(e *sharedEvent) {
	e.refs--
	if e.refs > 0 {
		return
	}
	r.drain(e)
}

// drain closes e if it is complete, else keeps it until it is.
func (r *Ring) drain(e *sharedEvent) {
	if done, _ := e.ev.Query(); done {
		r.closeEvent(e)
		return
	}
	r.draining = append(r.draining, e)
}

// reap closes draining events that have completed. It runs at Acquire,
// Release and SetStream, so the list stays short.
func (r *Ring) reap() {
	kept := r.draining[:0]
	for _, e := range r.draining {
		if done, _ := e.ev.Query(); done {
			r.closeEvent(e)
		} else {
			kept = append(kept, e)
		}
	}
	clear(r.draining[len(kept):])
	r.draining = kept
}

func (r *Ring) closeEvent(e *sharedEvent) {
	if e.refs != 0 {
		panic(fmt.Sprintf("staging: closing an event still held by %d retired ranges", e.refs))
	}
	if e.closed {
		return
	}
	e.closed = true
	if err := e.ev.Close(); err != nil {
		r.deferred = append(r.deferred, fmt.Errorf("staging: closing event: %w", err))
	}
}

// Close destroys the ring. It refuses (ErrLiveLeases, nothing freed) while
// any lease is live. Otherwise it host-synchronizes every event held by a
// retired range and every draining event, closes them, and only then frees
// the backing allocation; Synchronize returns only once the work is
// complete, so freeing is safe even when an event reports a failure.
//
// A failure carried by an event still held by a retired range is reported
// (wrapping ErrSourceFailed): no later acquisition will report it, and the
// release Record that captured it also closed the owner stream's Synchronize
// interval. It may already have been seen elsewhere (a stream that waited on
// the event for other bytes, or an owner's Stream.Synchronize before the
// release). Failures of draining events are not reported: the streams that
// waited on them inherited them. Close also reports event Close failures seen
// during the ring's life and a Free failure, after freeing. Closing a closed
// ring returns ErrClosed.
func (r *Ring) Close() error {
	if r.closed {
		return ErrClosed
	}
	if r.live > 0 {
		return fmt.Errorf("%w: %d live; release them before closing", ErrLiveLeases, r.live)
	}
	var evs []*sharedEvent // refs > 0: held by retired ranges; 0: draining
	for s := r.head; s != nil; s = s.next {
		if s.ev != nil && !slices.Contains(evs, s.ev) {
			evs = append(evs, s.ev)
		}
		s.ev = nil
	}
	evs = append(evs, r.draining...)
	r.draining = nil
	var errs []error
	for _, e := range evs {
		if err := e.ev.Synchronize(); err != nil && e.refs > 0 {
			errs = append(errs, fmt.Errorf("%w (found at ring close): %w", ErrSourceFailed, err))
		}
	}
	for _, e := range evs {
		e.refs = 0
		r.closeEvent(e)
	}
	errs = append(errs, r.deferred...)
	r.deferred = nil
	r.head = &span{off: 0, end: r.capacity}
	if err := r.mem.Free(); err != nil {
		errs = append(errs, fmt.Errorf("staging: freeing ring memory: %w", err))
	}
	r.mem = nil
	r.closed = true
	return errors.Join(errs...)
}
