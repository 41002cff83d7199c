package emu

import (
	"fmt"
	"sync"

	"github.com/kvcm/kvcm/core/device"
)

// capture is what one Record captured: it completes when the stream reaches
// the Record, carrying the failure of the interval that Record closes.
type capture struct {
	done chan struct{}
	err  error // written once, before done is closed
}

func newCapture() *capture { return &capture{done: make(chan struct{})} }

// closedDone is the done channel of every capture completed when recorded.
var closedDone = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

// cleanCapture is the capture of a clean interval completed when recorded,
// shared so that such a Record allocates nothing.
var cleanCapture = &capture{done: closedDone}

// completedCapture returns a capture already complete with err.
func completedCapture(err error) *capture {
	if err == nil {
		return cleanCapture
	}
	return &capture{done: closedDone, err: err}
}

// completed reports whether the capture has completed.
func (c *capture) completed() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

func (c *capture) complete(err error) {
	c.err = err
	close(c.done)
}

// event is a device.Event: a reference to its latest capture.
type event struct {
	dev *Device

	mu     sync.Mutex
	cur    *capture // nil until first recorded
	closed bool
}

var _ device.Event = (*event)(nil)

// ownEvent checks that ev was made by d.
func (d *Device) ownEvent(ev device.Event) (*event, error) {
	e, ok := ev.(*event)
	if !ok || e == nil || e.dev != d {
		return nil, fmt.Errorf("event %T was not created by this emu device", ev)
	}
	return e, nil
}

// latest returns the current capture, or an error once the event or its
// device is closed.
func (e *event) latest(what string) (*capture, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed || e.dev.isClosed() {
		return nil, fmt.Errorf("emu: event: %s: %w", what, device.ErrClosed)
	}
	return e.cur, nil
}

// Query reports whether the latest recorded work has run and, if so, its
// failure. An event never recorded is (true, nil). After Close of the event or
// its device it returns (true, error wrapping device.ErrClosed).
func (e *event) Query() (bool, error) {
	c, err := e.latest("query")
	if err != nil {
		return true, err
	}
	if c == nil {
		return true, nil
	}
	select {
	case <-c.done:
		return true, c.err
	default:
		return false, nil
	}
}

// Synchronize blocks until the latest recorded work has run and returns its
// failure (nil for an event never recorded). If the device closes meanwhile
// the recorded work is cancelled and the error wraps device.ErrClosed.
func (e *event) Synchronize() error {
	c, err := e.latest("synchronize")
	if err != nil {
		return err
	}
	if c == nil {
		return nil
	}
	// Device.Close completes every pending capture, so this cannot hang on a
	// closed device.
	<-c.done
	return c.err
}

// Close releases the event; later operations on it fail with
// device.ErrClosed. Work already recorded into it, and Waits already made on
// it, are unaffected. Closing twice fails with device.ErrClosed.
func (e *event) Close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return fmt.Errorf("emu: event: close: %w", device.ErrClosed)
	}
	e.closed = true
	return nil
}
