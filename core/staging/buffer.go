package staging

import (
	"errors"
	"fmt"

	"github.com/kvcm/kvcm/core/device"
)

// sharedEvent is a device event shared by the retired ranges (fragments)
// that it protects. refs counts those ranges; the event is closed only when
// no range references it and it is known complete.
type sharedEvent struct {
	ev     device.Event
	refs   int
	closed bool
}

// StagingBuffer is a non-owning lease of a slice of a Ring. It has exactly
// one current owner: a stream, or nil for synchronous CPU ownership with no
// outstanding asynchronous access. It must be released (Release) before its
// Ring is closed and must not be used afterwards. Not safe for concurrent
// use.
type StagingBuffer struct {
	ring  *Ring // nil once released
	sp    *span
	owner device.Stream
}

// Ptr is the device address of the slice (also its host address for a
// host-mapped ring). It is aligned to the Request's Alignment.
func (b *StagingBuffer) Ptr() device.Ptr {
	if b.ring == nil {
		return 0
	}
	return b.ring.mem.Ptr().Add(b.sp.off)
}

// Size is the slice length in bytes, a multiple of the Request's
// Granularity (0 once released).
func (b *StagingBuffer) Size() int64 {
	if b.ring == nil {
		return 0
	}
	return b.sp.end - b.sp.off
}

// Host is the host view of the slice for a host-mapped ring, and nil for a
// device ring or a released buffer. Its capacity equals its length.
func (b *StagingBuffer) Host() []byte {
	if b.ring == nil {
		return nil
	}
	h := b.ring.mem.Host()
	if h == nil {
		return nil
	}
	return h[b.sp.off:b.sp.end:b.sp.end]
}

// Kind is the memory kind of the ring the slice lives in.
func (b *StagingBuffer) Kind() device.MemoryKind {
	if b.ring == nil {
		return device.MemoryKind(-1)
	}
	return b.ring.Kind()
}

// Stream returns the current owner: a stream, or nil for synchronous CPU
// ownership with no outstanding asynchronous access.
func (b *StagingBuffer) Stream() device.Stream { return b.owner }

// SetStream transfers ownership to s (nil: synchronous CPU ownership):
//
//	nil      -> nil       no action
//	nil      -> stream    no action; the caller's CPU access must be complete
//	stream A -> stream A  no action (same Handle)
//	stream A -> stream B  record a fresh event on A, make B wait on it
//	stream   -> nil       host-synchronize the old stream
//
// On a synchronous error of A->B (NewEvent, Record or Wait) ownership stays
// with A. Note the device failure model: the A->B Record closes A's failure
// interval, so a failure of A's work so far travels in the transfer event to
// B (which inherits it through Wait), not to A's next Record. For stream->nil, Synchronize returns only once the old stream's
// work is complete, so ownership passes to nil even if Synchronize reports
// an asynchronous failure; that failure is returned.
func (b *StagingBuffer) SetStream(s device.Stream) error {
	if b.ring == nil {
		return ErrReleased
	}
	old := b.owner
	switch {
	case old == nil:
		// nil->nil and nil->stream: no action.
		b.owner = s
		return nil
	case s == nil:
		b.owner = nil
		if err := old.Synchronize(); err != nil {
			return fmt.Errorf("staging: synchronizing the previous owner stream: %w", err)
		}
		return nil
	case old.Handle() == s.Handle():
		return nil
	}
	r := b.ring
	r.reap()
	ev, err := r.dev.NewEvent()
	if err != nil {
		return fmt.Errorf("staging: creating a transfer event: %w", err)
	}
	if err := old.Record(ev); err != nil {
		if cerr := ev.Close(); cerr != nil {
			err = errors.Join(err, cerr)
		}
		return fmt.Errorf("staging: recording a transfer event on the old owner: %w", err)
	}
	werr := s.Wait(ev)
	// The event belongs to no range; close it once s no longer needs it.
	r.drain(&sharedEvent{ev: ev})
	if werr != nil {
		return fmt.Errorf("staging: new owner waiting on the transfer event: %w", werr)
	}
	b.owner = s
	return nil
}

// Release ends the lease (the StagingBuffer's destructor). A stream-owned
// slice records a fresh event on its owner stream and becomes a retired range
// protected by that event; a synchronously owned slice becomes immediately
// reusable (retired, no event). The release Record closes the owner stream's
// failure interval (package device), so a caller that needs the failures of
// its own work records its own event (e.g. the migration finish event) before
// releasing; otherwise the failure travels to the next acquirer of the bytes.
// The lease always ends. If the event cannot be
// created or recorded, Release host-synchronizes the owner stream instead,
// retires the slice without an event, and returns the errors. Releasing twice
// returns ErrReleased.
func (b *StagingBuffer) Release() error {
	r := b.ring
	if r == nil {
		return ErrReleased
	}
	r.reap()
	var ev *sharedEvent
	var err error
	if s := b.owner; s != nil {
		e, nerr := r.dev.NewEvent()
		if nerr == nil {
			if rerr := s.Record(e); rerr != nil {
				nerr = rerr
				if cerr := e.Close(); cerr != nil {
					nerr = errors.Join(nerr, cerr)
				}
			} else {
				ev = &sharedEvent{ev: e, refs: 1}
			}
		}
		if nerr != nil {
			err = fmt.Errorf("staging: release could not record its event; synchronized the owner stream instead: %w", nerr)
			if serr := s.Synchronize(); serr != nil {
				err = errors.Join(err, fmt.Errorf("staging: synchronizing the owner stream: %w", serr))
			}
		}
	}
	r.retire(b.sp, ev)
	b.ring, b.sp, b.owner = nil, nil, nil
	return err
}
