package abimodel

import (
	"slices"
	"sync"

	"github.com/kvcm/kvcm/core"
)

// DefaultEventQueueCapacity is the capacity of a manager's event queue when
// Options.EventQueueCapacity is 0 (KVCM_DEFAULT_EVENT_QUEUE_CAPACITY).
const DefaultEventQueueCapacity = 4096

// EventQueue is a bounded FIFO of cache events: the manager's listener
// pushes (with the manager's lock held), Drain removes. Events beyond the
// capacity are dropped and counted until the next Drain reports the count.
// It is safe for concurrent use.
type EventQueue struct {
	mu      sync.Mutex
	cap     int
	q       []core.CacheEvent
	head    int
	dropped uint64
}

// NewEventQueue returns an empty queue holding at most capacity events.
func NewEventQueue(capacity int) *EventQueue { return &EventQueue{cap: capacity} }

// Push appends a copy of ev (its tokens are copied: the tree's slice must
// not escape), or counts it as dropped when the queue is full.
func (e *EventQueue) Push(ev core.CacheEvent) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.q)-e.head >= e.cap {
		e.dropped++
		return
	}
	ev.Tokens = slices.Clone(ev.Tokens)
	e.q = append(e.q, ev)
}

// Len returns the number of queued events.
func (e *EventQueue) Len() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.q) - e.head
}

// Drain removes and returns the oldest events, at most maxEvents of them
// holding at most maxTokens tokens in all, and the number of events dropped
// since the last Drain (which it resets). When there is room for an event
// but the oldest one has more than maxTokens tokens, it removes nothing,
// keeps the dropped count and returns in need the tokens that event needs.
// This is the rule of the ABI's drains: the export writes the events into
// the caller's buffers (each event's tokens one run after another) or,
// for need, reports KVCM_ERR_BUFFER_TOO_SMALL with need.
func (e *EventQueue) Drain(maxEvents, maxTokens int) (events []core.CacheEvent, need int, dropped uint64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.drain(maxEvents, maxTokens)
}

// DrainCacheEvents is Drain for kvcm_manager_drain_events, whose
// kvcm_cache_event has no form for a priority update: it removes
// BlockPriorityUpdated events without returning or counting them, and
// drains on while a drain brought only those, so that no events means an
// empty queue or no room. When the oldest event left needs more than
// maxTokens, the dropped count stays queued for the next drain.
func (e *EventQueue) DrainCacheEvents(maxEvents, maxTokens int) (events []core.CacheEvent, need int, dropped uint64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for {
		all, need, d := e.drain(maxEvents, maxTokens)
		dropped += d
		if need > 0 {
			e.dropped += dropped
			return nil, need, 0
		}
		events = slices.DeleteFunc(all, func(ev core.CacheEvent) bool { return ev.Kind == core.BlockPriorityUpdated })
		if len(events) > 0 || len(all) == 0 {
			return events, 0, dropped
		}
	}
}

func (e *EventQueue) drain(maxEvents, maxTokens int) (events []core.CacheEvent, need int, dropped uint64) {
	if maxEvents > 0 && e.head < len(e.q) && len(e.q[e.head].Tokens) > maxTokens {
		return nil, len(e.q[e.head].Tokens), 0
	}
	ntok := 0
	for e.head < len(e.q) && len(events) < maxEvents {
		ev := e.q[e.head]
		if len(ev.Tokens) > maxTokens-ntok {
			break
		}
		ntok += len(ev.Tokens)
		events = append(events, ev)
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
	return events, 0, dropped
}
