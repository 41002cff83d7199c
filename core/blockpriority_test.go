package core

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core/blockhash"
	"github.com/kvcm/kvcm/core/config"
	"github.com/kvcm/kvcm/core/layout"
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

// The PriorityFunc is asked as Resize allocates a page (KVCacheManagerV2 asks
// its custom_priority_callback per page it allocates), once per block and
// layer group: the private page ranks by it, and the committed block keeps it
// without asking again.
func TestPriorityIsAskedAsPagesAreAllocated(t *testing.T) {
	cfg := smallConfig(16)
	cfg.Layers[1].SlidingWindowSize = 8 // two layer groups
	f := newFixture(t, cfg)
	type call struct {
		block int
		lc    layout.LayerGroupID
	}
	var calls []call
	c, err := f.m.CreateKVCache(CacheOptions{Priority: func(b int, lc layout.LayerGroupID) int {
		calls = append(calls, call{b, lc})
		return 60 + int(lc)
	}})
	require.NoError(t, err)
	require.NoError(t, c.Resume(f.stream))
	require.NoError(t, c.Resize(8, -1))
	assert.Equal(t, []call{{0, 0}, {0, 1}, {1, 0}, {1, 1}}, calls, "asked at allocation")
	assert.Equal(t, 61, c.blocks[1].pages[1].priority(), "the private page ranks by it")
	require.NoError(t, c.Commit(seq(0, 8), false))
	assert.Len(t, calls, 4, "the commit asks nothing more")
	n := c.blocks[0].node
	require.NotNil(t, n)
	assert.Equal(t, []int{60, 61}, f.m.prioOf(n), "the committed block keeps its pages' priority")
	require.NoError(t, c.Close())
}

// A PriorityFunc that panics while Resize allocates fails the Resize, which
// changes nothing; the retry allocates.
func TestPanickingPriorityFailsResizeChangingNothing(t *testing.T) {
	f := newFixture(t, smallConfig(16))
	fail := true
	c, err := f.m.CreateKVCache(CacheOptions{Priority: func(int, layout.LayerGroupID) int {
		if fail {
			panic("priority callback bug")
		}
		return 50
	}})
	require.NoError(t, err)
	require.NoError(t, c.Resume(f.stream))
	free := f.m.levels[0].groups[0].free.len()
	err = c.Resize(8, 8)
	require.ErrorIs(t, err, ErrInvalidArgument)
	assert.Contains(t, err.Error(), "priority callback failed for block 0")
	assert.Equal(t, []int{0, 0, 0}, []int{c.Capacity(), c.HistoryLength(), len(c.blocks)}, "nothing changed")
	assert.Equal(t, free, f.m.levels[0].groups[0].free.len(), "no slot was taken")
	fail = false
	require.NoError(t, c.Resize(8, 8))
	require.NoError(t, c.Commit(seq(0, 8), false))
	assert.Equal(t, 8, f.m.ProbeReuse(blockhash.Scope{}, seq(0, 9)))
	require.NoError(t, c.Close())
}

// A commit with isEnd that publishes the trailing partial block at once asks
// that block's priority before it changes anything: a PriorityFunc that
// panics there (for a page a partial-reuse copy gave, asked at commit) fails
// the commit, which changes nothing; the retry publishes the block with the
// priority asked.
func TestPanickingPriorityFailsTheStoppingCommitChangingNothing(t *testing.T) {
	cfg := smallConfig(32)
	cfg.EnablePartialReuse = true
	f := newFixture(t, cfg)
	f.serve(blockhash.Scope{}, seq(0, 6))
	fail := true
	c, err := f.m.CreateKVCache(CacheOptions{InputTokens: append(seq(0, 7), 100), Priority: func(int, layout.LayerGroupID) int {
		if fail {
			panic("priority callback bug")
		}
		return 60
	}})
	require.NoError(t, err)
	require.Equal(t, 6, c.NumCommittedTokens())
	require.NoError(t, c.Resume(f.stream))
	require.NoError(t, c.Resize(8, 6))
	err = c.Commit(seq(6, 1), true)
	require.ErrorIs(t, err, ErrInvalidArgument)
	assert.Contains(t, err.Error(), "priority callback failed for block 1")
	assert.Equal(t, 6, c.NumCommittedTokens(), "nothing changed")
	assert.Equal(t, 6, f.m.ProbeReuse(blockhash.Scope{}, append(seq(0, 7), 100)), "nothing published")
	fail = false
	require.NoError(t, c.Commit(seq(6, 1), true))
	assert.Equal(t, 7, f.m.ProbeReuse(blockhash.Scope{}, append(seq(0, 7), 100)), "published at the stop, the cache open")
	require.NoError(t, c.Close())
}
