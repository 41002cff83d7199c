package abimodel

import (
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core"
	"github.com/kvcm/kvcm/core/blockhash"
	"github.com/kvcm/kvcm/core/layout"
)

// A cache is closed once whoever closes it (its Close, its manager's Close,
// or both at once): OnClose runs once and a tracked cache releases its index
// once.
func TestCacheIsClosedOnceUnderRacingCloses(t *testing.T) {
	for round := range 20 {
		m := newManager(t, Options{})
		ext := newExternal()
		x := ext.index()
		require.NoError(t, m.AttachCP(x))
		var mu sync.Mutex
		onClose := map[int]int{}
		var cs []*Cache
		for i := range 16 {
			c, err := m.CreateCache(CacheOptions{RequestID: "r", OnClose: func() {
				mu.Lock()
				onClose[i]++
				mu.Unlock()
			}})
			require.NoError(t, err)
			cs = append(cs, c)
		}
		var wg sync.WaitGroup
		start := make(chan struct{})
		wg.Add(1)
		go func() { defer wg.Done(); <-start; m.Close() }()
		for _, c := range cs {
			wg.Add(1)
			go func() { defer wg.Done(); <-start; c.Close() }()
		}
		close(start)
		wg.Wait()
		for i := range cs {
			assert.Equal(t, 1, onClose[i], "round %d cache %d", round, i)
		}
		assert.Zero(t, ext.destroyCount(), "round %d: the creator still holds the index", round)
		require.NoError(t, x.Destroy())
		assert.Equal(t, 1, ext.destroyCount(), "round %d", round)
	}
}

// A cache's OnOpen runs before CreateCache returns, and its OnClose after
// its OnOpen even when the manager closes the cache at once.
func TestCacheOnOpenRunsBeforeAnyClose(t *testing.T) {
	for round := range 20 {
		m := newManager(t, Options{})
		var mu sync.Mutex
		var log []string
		note := func(s string) { mu.Lock(); log = append(log, s); mu.Unlock() }
		closed := make(chan struct{})
		go func() { defer close(closed); m.Close() }()
		var opened *Cache
		c, err := m.CreateCache(CacheOptions{
			OnOpen:  func(c *Cache) { opened = c; note("open") },
			OnClose: func() { note("close") },
		})
		<-closed
		if err != nil { // the manager was gone first: neither runs
			assert.Empty(t, log, "round %d", round)
			continue
		}
		assert.Same(t, c, opened, "round %d", round)
		require.NoError(t, c.Close())
		assert.Equal(t, []string{"open", "close"}, log, "round %d", round)
	}
}

// Resize bounds capacity and history by MaxElems before the core sees them;
// a negative history keeps the current one.
func TestCacheResizeBounds(t *testing.T) {
	m := newManager(t, Options{})
	s, err := m.CreateStream()
	require.NoError(t, err)
	c := active(t, m, s, CacheOptions{}, seq(0, 8))
	assert.ErrorIs(t, c.Resize(-1, 0), core.ErrInvalidArgument)
	assert.ErrorIs(t, c.Resize(MaxElems+1, 0), core.ErrInvalidArgument)
	assert.ErrorIs(t, c.Resize(16, MaxElems+1), core.ErrInvalidArgument)
	require.NoError(t, c.Resize(12, -1))
	assert.Equal(t, 8, c.Core().HistoryLength())
	assert.Equal(t, 12, c.Core().Capacity())
	c.StopCommitting()
	require.NoError(t, c.Suspend())
	require.NoError(t, c.Prefetch(layout.GPULevel))
	require.NoError(t, c.Close())
}

// Resume needs a stream.
func TestCacheResumeNeedsAStream(t *testing.T) {
	m := newManager(t, Options{})
	c, err := m.CreateCache(CacheOptions{})
	require.NoError(t, err)
	assert.ErrorIs(t, c.Resume(nil), core.ErrInvalidArgument)
	assert.Same(t, m, c.Manager())
}

// Digests pairs each position with its 32 bytes, in order; a byte string
// that is not 32 bytes per position is an invalid argument naming the
// argument, and no positions are no digests.
func TestDigestsPairPositionsWithTheirBytes(t *testing.T) {
	bytes := strings.Repeat("a", blockhash.DigestSize) + strings.Repeat("b", blockhash.DigestSize)
	ds, err := Digests([]uint64{3, 7}, bytes, "digest_positions")
	require.NoError(t, err)
	require.Len(t, ds, 2)
	assert.Equal(t, []int{3, 7}, []int{ds[0].Pos, ds[1].Pos})
	assert.Equal(t, byte('a'), ds[0].Digest[blockhash.DigestSize-1])
	assert.Equal(t, byte('b'), ds[1].Digest[0])

	_, err = Digests([]uint64{3}, bytes, "digest_positions")
	assert.ErrorIs(t, err, core.ErrInvalidArgument)
	assert.ErrorContains(t, err, "digest_positions: 1 digests need 32 digest bytes, got 64")
	ds, err = Digests(nil, "", "digest_positions")
	assert.NoError(t, err)
	assert.Nil(t, ds)
}

// KVCacheOptions.Resolve turns the ABI's flags and arrays into the cache
// options: the LoRA flag into the scope, the expected prompt length into a
// value only when its flag is set, the digest arrays into digests (a bad
// pairing is an invalid argument naming options.input_digest_positions).
func TestKVCacheOptionsResolve(t *testing.T) {
	o, err := KVCacheOptions{ScopeHasLoraID: true, HasExpectedPromptLength: true, ExpectedPromptLength: 12,
		InputDigestPositions: []uint64{2}, InputDigestBytes: strings.Repeat("x", blockhash.DigestSize)}.Resolve()
	require.NoError(t, err)
	assert.True(t, o.Scope.HasLoRA)
	require.NotNil(t, o.CacheOptions.ExpectedPromptLength)
	assert.Equal(t, 12, *o.CacheOptions.ExpectedPromptLength)
	require.Len(t, o.InputDigests, 1)
	assert.Equal(t, 2, o.InputDigests[0].Pos)

	o, err = KVCacheOptions{ExpectedPromptLength: 12}.Resolve()
	require.NoError(t, err)
	assert.Nil(t, o.CacheOptions.ExpectedPromptLength, "a length without its flag is unset")
	assert.False(t, o.Scope.HasLoRA)
	assert.Nil(t, o.InputDigests)

	_, err = KVCacheOptions{InputDigestPositions: []uint64{2}}.Resolve()
	assert.ErrorIs(t, err, core.ErrInvalidArgument)
	assert.ErrorContains(t, err, "options.input_digest_positions")
}

// A cache takes one priority callback: the block one (asked with the block
// only) or the layer group one, not both (an invalid argument naming
// options.layer_group_priority); a callback's failure panics, which the
// core turns into the failure of the resize or commit that asked.
func TestKVCacheOptionsPriorityCallbacks(t *testing.T) {
	block := func(b int64) (int32, error) { return int32(b * 10), nil }
	perLG := func(b int64, lg layout.LayerGroupID) (int32, error) { return int32(b*10) + int32(lg), nil }

	o, err := KVCacheOptions{BlockPriority: block}.Resolve()
	require.NoError(t, err)
	assert.Equal(t, 30, o.Priority(3, 1))

	o, err = KVCacheOptions{LayerGroupPriority: perLG}.Resolve()
	require.NoError(t, err)
	assert.Equal(t, 31, o.Priority(3, 1))

	o, err = KVCacheOptions{}.Resolve()
	require.NoError(t, err)
	assert.Nil(t, o.Priority)

	_, err = KVCacheOptions{BlockPriority: block, LayerGroupPriority: perLG}.Resolve()
	assert.ErrorIs(t, err, core.ErrInvalidArgument)
	assert.ErrorContains(t, err, "options.layer_group_priority: is set together with options.priority")

	failed := errors.New("kvcm_priority_func returned 7")
	o, err = KVCacheOptions{BlockPriority: func(int64) (int32, error) { return 0, failed }}.Resolve()
	require.NoError(t, err)
	assert.PanicsWithError(t, failed.Error(), func() { o.Priority(0, 0) })
}
