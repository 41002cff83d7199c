package core

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core/blockhash"
	"github.com/kvcm/kvcm/core/config"
)

// same is n copies of p.
func same(n, p int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = p
	}
	return out
}

func chainOf(tokens []config.Token) []blockhash.Key {
	return blockhash.Chain(blockhash.Scope{}, tpb, tokens)
}

// A block raised with SetBlockPriorities is evicted after blocks of lower
// priority, although it was released first.
func TestSetBlockPrioritiesKeepsRaisedBlocksLongest(t *testing.T) {
	f := newFixture(t, smallConfig(4))
	f.serve(blockhash.Scope{}, seq(0, 8))   // A: released first, LRU's victim
	f.serve(blockhash.Scope{}, seq(100, 8)) // B
	n, err := f.m.SetBlockPriorities(blockhash.Scope{}, chainOf(seq(0, 8)), same(len(chainOf(seq(0, 8))), 80))
	require.NoError(t, err)
	assert.Equal(t, 2, n)

	d := f.open(blockhash.Scope{}, seq(500, 8))
	assert.Equal(t, 8, f.m.ProbeReuse(blockhash.Scope{}, seq(0, 9)), "the raised blocks stay")
	assert.Zero(t, f.m.ProbeReuse(blockhash.Scope{}, seq(100, 9)), "the default ones went first")
	require.NoError(t, d.Close())
}

// Lowering a block back stops at its children's priority, so an ancestor
// never ranks below a descendant; raising a tail raises its ancestors.
func TestSetBlockPrioritiesKeepsAncestorsAtLeastTheirChildren(t *testing.T) {
	var events []CacheEvent
	f := newFixture(t, smallConfig(8), WithEventListener(func(e CacheEvent) {
		if e.Kind == BlockPriorityUpdated {
			events = append(events, e)
		}
	}))
	f.serve(blockhash.Scope{}, seq(0, 12))
	chain := chainOf(seq(0, 12))

	n, err := f.m.SetBlockPriorities(blockhash.Scope{}, chain, same(len(chain), 70))
	require.NoError(t, err)
	assert.Equal(t, 3, n)
	assert.Len(t, events, 3, "one event a block (one layer group)")

	_, err = f.m.SetBlockPriorities(blockhash.Scope{}, chain[:1], same(len(chain[:1]), DefaultPriority))
	require.NoError(t, err)
	f.m.mu.Lock()
	first := f.m.child(f.m.root(blockhash.Scope{}), chain[0])
	assert.Equal(t, 70, f.m.blockPriority(first), "its child still ranks 70: the first block cannot go below")
	f.m.mu.Unlock()

	_, err = f.m.SetBlockPriorities(blockhash.Scope{}, chain, same(len(chain), DefaultPriority))
	require.NoError(t, err)
	f.m.mu.Lock()
	assert.Equal(t, DefaultPriority, f.m.blockPriority(first), "lowering the whole chain lowers its head too")
	f.m.mu.Unlock()

	n, err = f.m.SetBlockPriorities(blockhash.Scope{}, chainOf(seq(900, 8)), same(len(chainOf(seq(900, 8))), 90))
	require.NoError(t, err)
	assert.Zero(t, n, "uncached blocks are skipped")
	_, err = f.m.SetBlockPriorities(blockhash.Scope{}, chain, []int{70})
	assert.ErrorIs(t, err, ErrInvalidArgument, "one priority a block")
	assert.ErrorContains(t, err, "priorities")
	_, err = f.m.SetBlockPriorities(blockhash.Scope{}, chain, []int{70, 70, 0})
	require.NoError(t, err)
	f.m.mu.Lock()
	assert.Equal(t, []int{70, 70, 0}, []int{f.m.blockPriority(first), f.m.blockPriority(f.m.child(first, chain[1])),
		f.m.blockPriority(f.m.child(f.m.child(first, chain[1]), chain[2]))}, "one priority a block along the chain")
	f.m.mu.Unlock()
	_, err = f.m.SetBlockPriorities(blockhash.Scope{}, chain, same(len(chain), 1000))
	require.NoError(t, err)
	f.m.mu.Lock()
	assert.Equal(t, MaxPriority, f.m.blockPriority(first), "clamped")
	f.m.mu.Unlock()
}
