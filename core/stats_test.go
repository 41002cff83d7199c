package core

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core/blockhash"
	"github.com/kvcm/kvcm/core/layout"
)

// The contract of the per-layer-group iteration statistics
// (KVCacheManagerV2's KVCacheIterationStatsDelta): reused pages, full input
// blocks not reused, fresh pages, generation-phase growth and page moves are
// counted per layer group, and each getter restarts only its own counts.

// TestLayerGroupStatsCountReuseAllocationAndGeneration: a cache reusing 2 of
// its prompt's 3 full blocks counts 2 reused and 1 missed; growth while the
// history is short of the prompt is prefill, growth after it generation.
func TestLayerGroupStatsCountReuseAllocationAndGeneration(t *testing.T) {
	f := newFixture(t, smallConfig(8))
	f.serve(blockhash.Scope{}, seq(0, 8)) // publishes 2 blocks
	first := f.m.GetAndResetLayerGroupIterationStats()
	require.Len(t, first, 1)
	assert.Equal(t, LayerGroupStats{AllocTotalBlocks: 2, AllocNewBlocks: 2, MissedBlocks: 2}, first[0])

	c, err := f.m.CreateKVCache(CacheOptions{InputTokens: seq(0, 13)})
	require.NoError(t, err)
	require.NoError(t, c.Resume(f.stream))
	require.NoError(t, c.Resize(16, 13)) // 2 new blocks, history 8 < 13 before
	require.NoError(t, c.Resize(20, 16)) // 1 new block after the prompt
	require.NoError(t, c.Close())
	got := f.m.GetAndResetLayerGroupIterationStats()[0]
	assert.Equal(t, LayerGroupStats{
		AllocTotalBlocks: 5, AllocNewBlocks: 3, ReusedBlocks: 2, FullReusedBlocks: 2, MissedBlocks: 1,
		GenAllocBlocks: 1,
	}, got)
	assert.InDelta(t, 2.0/3, got.HitRate(), 1e-9)
	assert.Equal(t, LayerGroupStats{}, f.m.GetAndResetLayerGroupIterationStats()[0], "reset")
}

// TestReuseIsCountedByTheLevelItCameFrom: blocks offloaded to the host and
// reused from there count at level 1, as reused pages and as cached tokens,
// and their return to the GPU counts as onboarding.
func TestReuseIsCountedByTheLevelItCameFrom(t *testing.T) {
	f := newTieredFixture(t, tieredConfig(t, 4, 8, 0))
	f.serve(blockhash.Scope{}, seq(0, 8))
	f.serve(blockhash.Scope{}, seq(100, 16)) // needs the whole GPU: the first 2 blocks go to the host
	moved := f.m.GetAndResetLayerGroupIterationStats()[0]
	assert.Equal(t, int64(2), moved.OffloadBlocks)
	assert.Positive(t, moved.OffloadBytes)
	f.m.GetAndResetIterationReusedBlocksByLevel()
	f.m.GetAndResetIterationCachedTokensByLevel()

	c, err := f.m.CreateKVCache(CacheOptions{InputTokens: seq(0, 9)})
	require.NoError(t, err)
	assert.Equal(t, []ReusedBlocksByLevel{{Full: []int64{0, 2}, Partial: []int64{0, 0}}},
		f.m.GetAndResetIterationReusedBlocksByLevel())
	assert.Equal(t, []int64{0, 8}, f.m.GetAndResetIterationCachedTokensByLevel())
	assert.Equal(t, []int64{0, 0}, f.m.GetAndResetIterationCachedTokensByLevel(), "reset")
	require.NoError(t, c.Resume(f.stream))
	got := f.m.GetAndResetLayerGroupIterationStats()[0]
	assert.Equal(t, int64(2), got.OnboardBlocks)
	assert.Equal(t, moved.OffloadBytes, got.OnboardBytes, "the same cold pages travel back")
	assert.Equal(t, int64(2), got.FullReusedBlocks)
	require.NoError(t, c.Close())
}

// TestPeakBlockStatsTrackAvailableUnavailableEvictable: KVCacheManagerV2's
// peaks are the largest available, unavailable and evictable slot counts
// seen at the end of an operation; a reset restarts them from the current
// counts.
func TestPeakBlockStatsTrackAvailableUnavailableEvictable(t *testing.T) {
	f := newFixture(t, smallConfig(8))
	a := f.open(blockhash.Scope{}, seq(0, 12)) // 3 pages in use
	require.NoError(t, a.Close())              // now evictable
	peaks, err := f.m.GetAndResetIterationPeakBlockStats(layout.GPULevel)
	require.NoError(t, err)
	require.Len(t, peaks, 1)
	assert.Equal(t, PeakBlockStats{Index: 0, PeakUsed: 3, Total: 8, Available: 8, Unavailable: 3, Evictable: 3}, peaks[0])
	peaks, err = f.m.GetAndResetIterationPeakBlockStats(layout.GPULevel)
	require.NoError(t, err)
	assert.Equal(t, PeakBlockStats{Index: 0, PeakUsed: 3, Total: 8, Available: 8, Unavailable: 0, Evictable: 3}, peaks[0],
		"restarted from the current counts: 3 used, all available, 3 evictable")
}

// TestCacheStatsCountOnlyItsOwnBlocks: a cache's counters are its share of
// the manager's (reuse and misses at creation, Resize's allocations), and
// another cache's work does not reach them.
func TestCacheStatsCountOnlyItsOwnBlocks(t *testing.T) {
	f := newFixture(t, smallConfig(8))
	f.serve(blockhash.Scope{}, seq(0, 8)) // publishes 2 blocks
	before := f.m.Stats()

	c, err := f.m.CreateKVCache(CacheOptions{InputTokens: seq(0, 13)})
	require.NoError(t, err)
	assert.Equal(t, BlockStats{AllocTotalBlocks: 2, ReusedBlocks: 2, MissedBlocks: 1}, c.Stats())
	other := f.open(blockhash.Scope{}, seq(200, 8))
	require.NoError(t, c.Resume(f.stream))
	require.NoError(t, c.Resize(16, 13))
	require.NoError(t, c.Resize(20, 16))
	want := BlockStats{AllocTotalBlocks: 5, AllocNewBlocks: 3, ReusedBlocks: 2, MissedBlocks: 1}
	assert.Equal(t, want, c.Stats())
	require.NoError(t, other.Close())
	require.NoError(t, c.Close())
	assert.Equal(t, want, c.Stats(), "a closed cache keeps its counters")
	after := f.m.Stats()
	assert.Equal(t, before.AllocNewBlocks+want.AllocNewBlocks+2, after.AllocNewBlocks,
		"the manager counts the cache's blocks and the other cache's 2")
}

// TestCachedTokensByLevelFollowTheCachesPages: a cache's tokens with
// computed KV count on the level their block's coldest page is on: reused
// host blocks at level 1 until Resume brings them to the GPU, new tokens at
// the GPU.
func TestCachedTokensByLevelFollowTheCachesPages(t *testing.T) {
	f := newTieredFixture(t, tieredConfig(t, 4, 8, 0))
	f.serve(blockhash.Scope{}, seq(0, 8))
	f.serve(blockhash.Scope{}, seq(100, 16)) // the first 2 blocks go to the host

	c, err := f.m.CreateKVCache(CacheOptions{InputTokens: seq(0, 9)})
	require.NoError(t, err)
	assert.Equal(t, []int{0, 8}, c.CachedTokensByLevel())
	require.NoError(t, c.Resume(f.stream))
	assert.Equal(t, []int{8, 0}, c.CachedTokensByLevel())
	require.NoError(t, c.Resize(12, 10))
	assert.Equal(t, []int{10, 0}, c.CachedTokensByLevel(), "capacity beyond the history holds no tokens")
	require.NoError(t, c.Close())
}
