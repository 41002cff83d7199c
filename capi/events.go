package capi

/*
#include "kvcm/kvcm.h"
#include "shim_generated.h"
*/
import "C"

import (
	"slices"
	"sync"
	"unsafe"

	"github.com/kvcm/kvcm/core"
)

// eventQueue is a manager's bounded queue of cache events: the listener
// (called with the manager's lock held) appends, kvcm_manager_drain_events
// removes; events beyond the capacity are dropped and counted.
type eventQueue struct {
	mu      sync.Mutex
	cap     int
	q       []core.CacheEvent
	head    int
	dropped uint64
}

func newEventQueue(capacity int) *eventQueue { return &eventQueue{cap: capacity} }

func (e *eventQueue) push(ev core.CacheEvent) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.q)-e.head >= e.cap {
		e.dropped++
		return
	}
	ev.Tokens = slices.Clone(ev.Tokens) // the tree's slice must not escape
	e.q = append(e.q, ev)
}

// drain moves the oldest events that fit into the caller's buffers. When
// there is room for an event but the oldest one's tokens do not fit in the
// whole tokens buffer, it moves nothing and reports the tokens that event
// needs (tooSmall > 0); the dropped count is then kept for the next drain.
func (e *eventQueue) drain(events []C.kvcm_cache_event, tokens []C.kvcm_token) (nev, ntok int, dropped uint64, tooSmall int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(events) > 0 && e.head < len(e.q) && len(e.q[e.head].Tokens) > len(tokens) {
		return 0, 0, 0, len(e.q[e.head].Tokens)
	}
	for e.head < len(e.q) && nev < len(events) {
		ev := e.q[e.head]
		if len(ev.Tokens) > len(tokens)-ntok {
			break
		}
		ce := C.kvcm_cache_event{
			seq: C.uint64_t(ev.Seq), key: C.uint64_t(ev.Key), parent: C.uint64_t(ev.Parent),
			kind: C.kvcm_event_kind(ev.Kind), layer_group: C.kvcm_layer_group_id(ev.LayerGroup),
			level: C.kvcm_cache_level(ev.Level), num_tokens: C.size_t(len(ev.Tokens)),
			cache_id: C.uint64_t(ev.CacheID),
		}
		if len(ev.Tokens) > 0 {
			ce.tokens = &tokens[ntok]
			for _, t := range ev.Tokens {
				tokens[ntok] = C.kvcm_token(t)
				ntok++
			}
		}
		events[nev] = ce
		nev++
		e.q[e.head] = core.CacheEvent{}
		e.head++
	}
	if e.head == len(e.q) {
		e.q, e.head = e.q[:0], 0
	} else if e.head > len(e.q)/2 {
		e.q = append(e.q[:0], e.q[e.head:]...)
		e.head = 0
	}
	dropped, e.dropped = e.dropped, 0
	return nev, ntok, dropped, 0
}

func glueManagerDrainEvents(mgr *managerObj, events *C.kvcm_cache_event, eventsCap C.size_t, tokens *C.kvcm_token, tokensCap C.size_t,
	numEvents *C.size_t, numTokens *C.size_t, dropped *C.uint64_t) error {
	ev, err := cSlice(events, eventsCap, "events_cap")
	if err != nil {
		return err
	}
	tok, err := cSlice(tokens, tokensCap, "tokens_cap")
	if err != nil {
		return err
	}
	ne, nt, d, need := mgr.events.drain(ev, tok)
	if need > 0 {
		*numTokens = C.size_t(need)
		return errorf(codeBufferTooSmall, "the oldest event has %d tokens; tokens_cap is %d", need, uint64(tokensCap))
	}
	*numEvents, *numTokens = C.size_t(ne), C.size_t(nt)
	if dropped != nil {
		*dropped = C.uint64_t(d)
	}
	return nil
}

// maxElems bounds caller-provided counts, so that a garbage count is an
// argument error rather than a huge slice.
const maxElems = 1 << 40

// cSlice views a caller's buffer of n elements.
func cSlice[T any](p *T, n C.size_t, name string) ([]T, error) {
	if n > maxElems/C.size_t(max(unsafe.Sizeof(*p), 1)) {
		return nil, argError(name, "%d is too large", uint64(n))
	}
	if p == nil || n == 0 {
		return nil, nil
	}
	return unsafe.Slice(p, int(n)), nil
}
