package core

import (
	"fmt"

	"github.com/kvcm/kvcm/core/device"
)

// sharedEvent is one recorded device event referenced by every slot it
// protects; it goes back to the pool when the last reference is dropped.
type sharedEvent struct {
	ev   device.Event
	refs int
	// on is the stream the event was recorded on.
	on device.Stream
	// done: a query saw the event complete (or fail); it stays so until the
	// event goes back to the pool.
	done bool
}

// completed reports whether the event has completed or failed, querying the
// device only until it has.
func (e *sharedEvent) completed() bool {
	if !e.done {
		e.done, _ = e.ev.Query()
	}
	return e.done
}

// eventPool recycles device events. Not safe for concurrent use: the manager
// lock covers it.
type eventPool struct {
	dev  device.Device
	free []device.Event
	// spare holds shared events nobody references, for record to reuse.
	spare []*sharedEvent
}

// record captures the work enqueued on s so far into a new shared event with
// one reference.
func (p *eventPool) record(s device.Stream) (*sharedEvent, error) {
	var ev device.Event
	if n := len(p.free); n > 0 {
		ev, p.free = p.free[n-1], p.free[:n-1]
	} else {
		var err error
		if ev, err = p.dev.NewEvent(); err != nil {
			return nil, err
		}
	}
	if err := s.Record(ev); err != nil {
		p.free = append(p.free, ev)
		return nil, err
	}
	if n := len(p.spare); n > 0 {
		e := p.spare[n-1]
		p.spare = p.spare[:n-1]
		*e = sharedEvent{ev: ev, refs: 1, on: s}
		return e, nil
	}
	return &sharedEvent{ev: ev, refs: 1, on: s}, nil
}

func (p *eventPool) release(e *sharedEvent) {
	e.refs--
	if e.refs == 0 {
		p.free = append(p.free, e.ev)
		e.ev, e.on = nil, nil
		p.spare = append(p.spare, e)
	}
}

func (p *eventPool) close() {
	for _, ev := range p.free {
		ev.Close()
	}
	p.free = nil
}

// fence is the set of events that must complete before a slot's bytes are
// stable and before the slot may be written again: the last write into it and
// every read of it since.
type fence []*sharedEvent

// fenceQueryMin is how many pages a cache event must fence before it is
// queried first: an event already complete (the stream had caught up when it
// was recorded) orders nothing, so no fence needs it, and one query costs
// less than that many fence entries.
const fenceQueryMin = 16

// fencePruneAt is the fence size from which add drops completed events:
// querying on every add would cost more than the waits saved.
const fencePruneAt = 4

// add attaches e, first dropping completed events once the set has grown, so
// it stays small. It queries from the oldest event until one has not
// completed (events mostly complete in the order they were added, and a
// completed one is never queried again), then drops every event known to
// have completed. A failed event is dropped too: settle has accounted its
// failure to the pages it moved, and nothing orders after completed work.
func (f *fence) add(p *eventPool, e *sharedEvent) {
	e.refs++
	if len(*f) >= fencePruneAt {
		for _, x := range *f {
			if !x.completed() {
				break
			}
		}
		kept := (*f)[:0]
		for _, x := range *f {
			if x.done {
				p.release(x)
				continue
			}
			kept = append(kept, x)
		}
		clear((*f)[len(kept):])
		*f = kept
	}
	*f = append(*f, e)
}

// waitSet makes a stream wait on each distinct event once. The fences of the
// pages one call touches mostly hold the same few events, so those are kept
// in a small array and only more of them in a map.
type waitSet struct {
	// skip, if set, is the stream that will wait: events recorded on it are
	// ordered by the stream itself and left out. Only cache streams set it;
	// a migration waits on every event, so a failure of earlier migration
	// work reaches the transaction that depends on it. Streams are compared
	// by identity (every device.Stream implementation is a pointer).
	skip device.Stream
	few  [8]*sharedEvent
	n    int
	more map[*sharedEvent]struct{}
}

func (w *waitSet) add(x *sharedEvent) {
	if x.done || (w.skip != nil && x.on == w.skip) {
		return // orders nothing
	}
	for _, y := range w.few[:w.n] {
		if y == x {
			return
		}
	}
	if w.n < len(w.few) {
		w.few[w.n] = x
		w.n++
		return
	}
	if x.completed() {
		return // worth a query before growing the map
	}
	if w.more == nil {
		w.more = map[*sharedEvent]struct{}{}
	}
	w.more[x] = struct{}{}
}

func (w *waitSet) addFence(f fence) {
	for _, x := range f {
		w.add(x)
	}
}

func (w *waitSet) empty() bool { return w.n == 0 }

// each calls fn for every event until it returns an error.
func (w *waitSet) each(fn func(x *sharedEvent) error) error {
	for _, x := range w.few[:w.n] {
		if err := fn(x); err != nil {
			return err
		}
	}
	for x := range w.more {
		if err := fn(x); err != nil {
			return err
		}
	}
	return nil
}

// apply makes s wait on the events that have not completed. A completed one
// orders nothing, and waiting on a failed one would pass its failure (already
// accounted to the pages it moved) to unrelated work.
func (w *waitSet) apply(s device.Stream) error {
	return w.each(func(x *sharedEvent) error {
		if x.completed() {
			return nil
		}
		if err := s.Wait(x.ev); err != nil {
			return fmt.Errorf("wait on page fence: %w", err)
		}
		return nil
	})
}

// synchronize blocks until every event has completed.
func (w *waitSet) synchronize() error {
	return w.each(func(x *sharedEvent) error { return x.ev.Synchronize() })
}
