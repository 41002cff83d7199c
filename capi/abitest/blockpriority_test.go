package abitest

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core/blockhash"
	"github.com/kvcm/kvcm/core/config"
)

// priorityFixture is a manager of 4 GPU pages holding two served prompts
// of 2 blocks each, a (released first, so LRU's victim) and b.
type priorityFixture struct {
	m, s uint64
	a, b []int32
}

func newPriorityFixture(t *testing.T) priorityFixture {
	t.Helper()
	cfg := smallConfig(4, 0)
	cfg.EventQueueCapacity = 64
	m, err := CreateManager(cfg, nil)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, DestroyManager(m)) })
	s, err := CreateStream(m)
	require.NoError(t, err)
	f := priorityFixture{m: m, s: s, a: seq(0, 8), b: seq(100, 8)}
	serveV2(t, m, s, Scope{}, f.a)
	serveV2(t, m, s, Scope{}, f.b)
	_, err = DrainBlockEvents(m)
	require.NoError(t, err)
	return f
}

// evictTwo makes a new request take 2 of the 4 pages, which evicts 2 blocks,
// and returns how many tokens of a and b are still reusable.
func (f priorityFixture) evictTwo(t *testing.T) (a, b int64) {
	t.Helper()
	c, err := CreateCacheV2(f.m, Scope{}, seq(500, 8), false, 0)
	require.NoError(t, err)
	require.NoError(t, Resume(c, f.s))
	require.NoError(t, Resize(c, 8, -1))
	a, err = ProbeReuseV2(f.m, Scope{}, append(append([]int32{}, f.a...), 1))
	require.NoError(t, err)
	b, err = ProbeReuseV2(f.m, Scope{}, append(append([]int32{}, f.b...), 1))
	require.NoError(t, err)
	require.NoError(t, CloseCache(c))
	return a, b
}

// Blocks given a higher priority through the C ABI are evicted last,
// although they were released first; each block whose priority changes is
// reported as a priority update.
func TestSetBlockPrioritiesEvictsRaisedBlocksLast(t *testing.T) {
	noLeaks(t)
	f := newPriorityFixture(t)
	n, err := SetBlockPriorities(f.m, Scope{}, chainKeys(f.a), []int32{80, 80})
	require.NoError(t, err)
	assert.Equal(t, 2, n, "both blocks of a are cached")
	evs, err := DrainBlockEvents(f.m)
	require.NoError(t, err)
	require.Len(t, evs, 2)
	for _, e := range evs {
		assert.Equal(t, [3]int32{EventPriorityUpdated, 80, DefaultPriority}, [3]int32{e.Kind, e.Priority, e.OldPriority})
	}

	a, b := f.evictTwo(t)
	assert.Equal(t, int64(8), a, "the raised blocks stay")
	assert.Zero(t, b, "the default ones went first")
}

// KVCM_DEFAULT_PRIORITY returns raised blocks to the common order, so LRU
// evicts them first again; priorities are clamped to KVCM_MAX_PRIORITY.
func TestSetBlockPrioritiesDefaultRestoresLRU(t *testing.T) {
	noLeaks(t)
	f := newPriorityFixture(t)
	_, err := SetBlockPriorities(f.m, Scope{}, chainKeys(f.a), []int32{1000, 1000})
	require.NoError(t, err)
	evs, err := DrainBlockEvents(f.m)
	require.NoError(t, err)
	require.NotEmpty(t, evs)
	assert.Equal(t, MaxPriority, evs[0].Priority, "clamped")
	n, err := SetBlockPriorities(f.m, Scope{}, chainKeys(f.a), []int32{DefaultPriority, DefaultPriority})
	require.NoError(t, err)
	assert.Equal(t, 2, n)

	a, b := f.evictTwo(t)
	assert.Zero(t, a, "back at the default: released first, evicted first")
	assert.Equal(t, int64(8), b)
}

// Keys are looked up in the given scope (has_lora_id included), and only as
// far as the manager holds the chain: the count says how many were set.
func TestSetBlockPrioritiesCountsCachedBlocksOfTheScope(t *testing.T) {
	noLeaks(t)
	f := newPriorityFixture(t)
	n, err := SetBlockPriorities(f.m, Scope{}, append(chainKeys(f.a), chainKeys(seq(900, 4))...), []int32{80, 80, 80})
	require.NoError(t, err)
	assert.Equal(t, 2, n, "an uncached block ends the chain")
	n, err = SetBlockPriorities(f.m, Scope{}, nil, nil)
	require.NoError(t, err)
	assert.Zero(t, n, "an empty chain sets nothing")

	lora := Scope{LoRA: 0, HasLoRA: true}
	serveV2(t, f.m, f.s, lora, seq(0, 4))
	ts := make([]config.Token, 8)
	for i := range ts {
		ts[i] = config.Token(i)
	}
	var loraKeys []uint64
	for _, k := range blockhash.Chain(blockhash.Scope{HasLoRA: true}, tpb, ts) {
		loraKeys = append(loraKeys, uint64(k))
	}

	n, err = SetBlockPriorities(f.m, lora, loraKeys, []int32{80, 80})
	require.NoError(t, err)
	assert.Equal(t, 1, n, "only the first block is cached in the LoRA scope")
	n, err = SetBlockPriorities(f.m, Scope{}, loraKeys, []int32{80, 80})
	require.NoError(t, err)
	assert.Zero(t, n, "the LoRA scope's keys are not the plain scope's")
}

// Bad arguments fail with KVCM_ERR_INVALID_ARGUMENT (or INVALID_HANDLE)
// naming the argument, and change nothing: no event, and LRU still evicts
// a first.
func TestSetBlockPrioritiesBadArgumentsChangeNothing(t *testing.T) {
	noLeaks(t)
	f := newPriorityFixture(t)
	keys := chainKeys(f.a)
	_, err := SetBlockPriorities(f.m, Scope{}, keys, []int32{80})
	requireCode(t, err, InvalidArgument, "priorities", "has 1 entries for a chain of 2 blocks")
	_, err = SetBlockPriorities(f.m, Scope{}, keys[:1], []int32{80, 80})
	requireCode(t, err, InvalidArgument, "priorities")
	requireCode(t, SetBlockPrioritiesNull(f.m, keys[0], 80, NullKeys), InvalidArgument, "keys", "is NULL but num_keys is 1")
	requireCode(t, SetBlockPrioritiesNull(f.m, keys[0], 80, NullPriorities), InvalidArgument, "priorities", "is NULL but num_priorities is 1")
	requireCode(t, SetBlockPrioritiesNull(f.m, keys[0], 80, NullScope), InvalidArgument, "scope")
	requireCode(t, SetBlockPrioritiesNull(f.m, keys[0], 80, NullOut), InvalidArgument, "out")
	requireCode(t, SetBlockPrioritiesNull(f.m+1<<40, keys[0], 80, NullArg(-1)), InvalidHandle, "manager")

	evs, err := DrainBlockEvents(f.m)
	require.NoError(t, err)
	assert.Empty(t, evs, "no priority changed")
	a, b := f.evictTwo(t)
	assert.Zero(t, a, "a is still LRU's victim")
	assert.Equal(t, int64(8), b)
}
