package abimodel

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core"
	"github.com/kvcm/kvcm/core/config"
)

func stored(seq uint64, tokens ...config.Token) core.CacheEvent {
	return core.CacheEvent{Seq: seq, Kind: core.BlockStored, Tokens: tokens}
}

// The queue holds at most its capacity; events beyond it are dropped and
// counted, and the next Drain reports (and resets) the count.
func TestEventQueueDropsAndCountsBeyondCapacity(t *testing.T) {
	q := NewEventQueue(2)
	for i := range 5 {
		q.Push(stored(uint64(i)))
	}
	assert.Equal(t, 2, q.Len())
	evs, need, dropped := q.Drain(10, 0)
	assert.Zero(t, need)
	assert.Equal(t, uint64(3), dropped)
	require.Len(t, evs, 2)
	assert.Equal(t, []uint64{0, 1}, []uint64{evs[0].Seq, evs[1].Seq}, "oldest first")
	_, _, dropped = q.Drain(10, 0)
	assert.Zero(t, dropped, "the count was reset")
}

// Drain takes the oldest events that fit both the event and the token
// budget, in order, and leaves the rest queued.
func TestEventQueueDrainsWhatFits(t *testing.T) {
	q := NewEventQueue(8)
	q.Push(stored(0, 1, 2))
	q.Push(stored(1, 3, 4, 5))
	q.Push(stored(2, 6))
	evs, need, _ := q.Drain(3, 4)
	assert.Zero(t, need)
	require.Len(t, evs, 1, "the second event's 3 tokens do not fit in the 2 left")
	assert.Equal(t, []config.Token{1, 2}, evs[0].Tokens)
	evs, _, _ = q.Drain(1, 10)
	require.Len(t, evs, 1, "at most maxEvents")
	assert.Equal(t, uint64(1), evs[0].Seq)
	assert.Equal(t, 1, q.Len())
}

// When the oldest event's tokens do not fit in the whole token budget, Drain
// moves nothing, reports the tokens needed and keeps the dropped count.
func TestEventQueueReportsTokensNeeded(t *testing.T) {
	q := NewEventQueue(1)
	q.Push(stored(0, 1, 2, 3))
	q.Push(stored(1)) // dropped
	evs, need, dropped := q.Drain(4, 2)
	assert.Empty(t, evs)
	assert.Zero(t, dropped)
	assert.Equal(t, 3, need)
	evs, need, dropped = q.Drain(4, 3)
	assert.Zero(t, need)
	assert.Len(t, evs, 1)
	assert.Equal(t, uint64(1), dropped, "kept for the drain that succeeds")
}

// Push copies an event's tokens: the tree's slice never escapes.
func TestEventQueueCopiesTokens(t *testing.T) {
	q := NewEventQueue(1)
	toks := []config.Token{7, 8}
	q.Push(stored(0, toks...))
	toks[0] = 99
	evs, _, _ := q.Drain(1, 2)
	assert.Equal(t, []config.Token{7, 8}, evs[0].Tokens)
}

// A manager's committed blocks reach its queue, bounded by
// Options.EventQueueCapacity.
func TestManagerQueuesItsEvents(t *testing.T) {
	m := newManager(t, Options{EventQueueCapacity: 1})
	s, err := m.CreateStream()
	require.NoError(t, err)
	c := active(t, m, s, CacheOptions{}, seq(0, 8))
	require.NoError(t, c.Close())
	evs, _, dropped := m.Events().Drain(10, 100)
	require.Len(t, evs, 1)
	assert.Equal(t, core.BlockStored, evs[0].Kind)
	assert.Equal(t, seq(0, 4), evs[0].Tokens)
	assert.NotZero(t, dropped, "the second block's event was dropped")
}

func priority(seq uint64) core.CacheEvent {
	return core.CacheEvent{Seq: seq, Kind: core.BlockPriorityUpdated}
}

// DrainCacheEvents removes priority updates without returning them and
// drains on past a drain that brought only those; when the oldest event
// needs more tokens than there is room for, nothing it took is lost: the
// dropped count stays for the next drain.
func TestDrainCacheEventsSkipsPriorityUpdates(t *testing.T) {
	q := NewEventQueue(3)
	q.Push(priority(0))
	q.Push(priority(1))
	q.Push(stored(2, 1, 2))
	q.Push(stored(3)) // dropped: the queue holds 3
	evs, need, dropped := q.DrainCacheEvents(2, 1)
	assert.Nil(t, evs)
	assert.Equal(t, 2, need, "the stored event needs 2 tokens")
	assert.Zero(t, dropped)

	evs, need, dropped = q.DrainCacheEvents(2, 8)
	assert.Zero(t, need)
	assert.Equal(t, uint64(1), dropped, "the count survived the failed drain")
	require.Len(t, evs, 1)
	assert.Equal(t, uint64(2), evs[0].Seq)
	assert.Zero(t, q.Len())

	q.Push(priority(4))
	evs, _, _ = q.DrainCacheEvents(1, 0)
	assert.Empty(t, evs, "only a priority update: none, and the queue is empty")
	assert.Zero(t, q.Len())
}
