//go:build cgo

package cuda

/*
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"sync"
	"time"

	"github.com/kvcm/kvcm/core/device"
)

// interval is the failure state of one stretch of a stream's work: between
// two Records (the event interval) or between Records and Synchronizes (the
// synchronize interval). Host functions enqueued while it is current fail it.
type interval struct {
	// mayFail says a host function was enqueued in the interval; it is
	// written and read only under the owning stream's mu, on the enqueue side.
	mayFail bool

	mu  sync.Mutex
	err error
}

func (iv *interval) fail(err error) {
	iv.mu.Lock()
	if iv.err == nil {
		iv.err = err
	}
	iv.mu.Unlock()
}

// result is the interval's first failure; nil for a nil interval (one that
// could not fail). Read it only once the interval's work has completed.
func (iv *interval) result() error {
	if iv == nil {
		return nil
	}
	iv.mu.Lock()
	defer iv.mu.Unlock()
	return iv.err
}

// Event is a device.Event: a CUDA event plus the interval its latest Record
// captured (nil when that interval had no host function and cannot fail but
// through the driver).
type Event struct {
	dev    *Device
	h      C.kv_CUevent
	timing bool

	mu       sync.Mutex
	recorded bool
	cap      *interval
	closed   bool
}

var _ device.Event = (*Event)(nil)

func (d *Device) ownEvent(ev device.Event) (*Event, error) {
	e, ok := ev.(*Event)
	if !ok || e == nil || e.dev != d {
		return nil, fmt.Errorf("event %T was not created by this cuda device", ev)
	}
	return e, nil
}

// latest returns the capture of the latest Record and whether there was one.
func (e *Event) latest(what string) (*interval, bool, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed || e.dev.closed.Load() {
		return nil, false, fmt.Errorf("cuda: event: %s: %w", what, device.ErrClosed)
	}
	return e.cap, e.recorded, nil
}

// Query reports whether the latest recorded work has completed and, if so,
// its first failure (a host function's, one inherited through Wait, or the
// driver's). An event never recorded is (true, nil). After Close of the event
// or its device it returns (true, error wrapping device.ErrClosed).
func (e *Event) Query() (bool, error) {
	cap, recorded, err := e.latest("query")
	if err != nil {
		return true, err
	}
	if !recorded {
		return true, nil
	}
	r := C.kv_event_query(e.dev.ctx, e.h)
	if r == cudaErrorNotReady {
		return false, nil
	}
	if err := check("cuEventQuery", r); err != nil {
		return true, err
	}
	return true, cap.result()
}

// Synchronize blocks until the latest recorded work has completed and
// returns its first failure (nil for an event never recorded).
func (e *Event) Synchronize() error {
	cap, recorded, err := e.latest("synchronize")
	if err != nil || !recorded {
		return err
	}
	if err := check("cuEventSynchronize", C.kv_event_sync(e.dev.ctx, e.h)); err != nil {
		return err
	}
	return cap.result()
}

// Close destroys the event; work already recorded into it and Waits already
// made on it are unaffected. Closing twice fails with device.ErrClosed.
func (e *Event) Close() error {
	e.dev.mu.Lock()
	delete(e.dev.events, e)
	e.dev.mu.Unlock()
	return e.destroy()
}

func (e *Event) destroy() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return fmt.Errorf("cuda: event: close: %w", device.ErrClosed)
	}
	e.closed = true
	return check("cuEventDestroy", C.kv_event_destroy(e.dev.ctx, e.h))
}

// ElapsedTime is the GPU time between two recorded timing events (see
// NewTimingEvent), after both have completed.
func ElapsedTime(start, end *Event) (time.Duration, error) {
	if start == nil || end == nil || start.dev != end.dev {
		return 0, fmt.Errorf("cuda: elapsed time needs two events of one device")
	}
	if !start.timing || !end.timing {
		return 0, fmt.Errorf("cuda: elapsed time needs events from NewTimingEvent")
	}
	if _, _, err := start.latest("elapsed time"); err != nil {
		return 0, err
	}
	if _, _, err := end.latest("elapsed time"); err != nil {
		return 0, err
	}
	var ms C.float
	if err := check("cuEventElapsedTime", C.kv_event_elapsed(start.dev.ctx, &ms, start.h, end.h)); err != nil {
		return 0, err
	}
	return time.Duration(float64(ms) * float64(time.Millisecond)), nil
}
