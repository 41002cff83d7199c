package core

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core/blockhash"
	"github.com/kvcm/kvcm/core/layout"
)

// The contract of the per-layer-group iteration statistics
// (KVCacheManagerV2's KVCacheIterationStatsDelta) and of a cache's request
// statistics (its KVCacheStatsDelta), by KVCacheManagerV2's rules: a reuse
// counts reused blocks only (no allocation, no miss); every page allocated
// for a cache is an allocation, a missed block while the history is short of
// the prompt and generation-phase growth after; a partial block's private
// copy is one allocation and one intra-device copy; page moves count per
// layer group when they happen, and each getter restarts only its own counts.

// TestLayerGroupStatsCountReuseAllocationAndGeneration: tokens_per_block 4,
// 8 tokens cached; a 13-token prompt reuses the 2 full blocks (2 reused, no
// allocation), resize(16) before the history reached the prompt allocates
// blocks 2 and 3 (2 allocations, both missed: the trailing partial block of
// the prompt too), resize(20) after it 1 generation-phase allocation.
func TestLayerGroupStatsCountReuseAllocationAndGeneration(t *testing.T) {
	f := newFixture(t, smallConfig(8))
	first := f.open(blockhash.Scope{}, seq(0, 8)) // publishes 2 blocks
	first.CommitPendingStats()
	require.NoError(t, first.Close())
	firstStats := f.m.GetAndResetLayerGroupIterationStats()
	require.Len(t, firstStats, 1)
	assert.Equal(t, LayerGroupStats{AllocTotalBlocks: 2, AllocNewBlocks: 2, MissedBlocks: 2}, firstStats[0],
		"a fresh prompt's prefill blocks are allocated and missed")

	c, err := f.m.CreateKVCache(CacheOptions{InputTokens: seq(0, 13)})
	require.NoError(t, err)
	assert.Equal(t, RequestStats{ReusedBlocks: 2}, c.PendingRequestStats(), "reuse allocates nothing")
	require.NoError(t, c.Resume(f.stream))
	require.NoError(t, c.Resize(16, 13)) // 2 new blocks, history 8 < 13 before
	require.NoError(t, c.Resize(20, 16)) // 1 new block after the prompt
	assert.Equal(t, RequestStats{AllocTotalBlocks: 3, AllocNewBlocks: 3, ReusedBlocks: 2, MissedBlocks: 2},
		c.PendingRequestStats())
	c.CommitPendingStats()
	require.NoError(t, c.Close())
	got := f.m.GetAndResetLayerGroupIterationStats()[0]
	assert.Equal(t, LayerGroupStats{
		AllocTotalBlocks: 3, AllocNewBlocks: 3, ReusedBlocks: 2, FullReusedBlocks: 2, MissedBlocks: 2,
		GenAllocBlocks: 1,
	}, got)
	assert.InDelta(t, 2.0/4, got.HitRate(), 1e-9)
	assert.Equal(t, LayerGroupStats{}, f.m.GetAndResetLayerGroupIterationStats()[0], "reset")
}

// TestPartialReuseCountsOneAllocationAndOneCopy: tokens_per_block 4, a
// 12-token prompt cached; a new cache reuses 9 tokens (2 full blocks and the
// first token of the third, copied into a private page), then resize(10)
// needs no new block: 3 reused (2 full, 1 partial), 1 allocation (the copy,
// not missed) and 1 intra-device copy of the page's bytes, the copy counted
// at once, the rest pending.
func TestPartialReuseCountsOneAllocationAndOneCopy(t *testing.T) {
	cfg := smallConfig(16)
	cfg.EnablePartialReuse = true
	f := newFixture(t, cfg)
	f.serve(blockhash.Scope{}, seq(0, 12))
	f.m.GetAndResetLayerGroupIterationStats()

	c, err := f.m.CreateKVCache(CacheOptions{InputTokens: seq(0, 9)})
	require.NoError(t, err)
	require.Equal(t, 9, c.ReusedTokens())
	require.NoError(t, c.Resume(f.stream))
	require.NoError(t, c.Resize(10, 9))
	pageBytes := f.hotStats().PageBytes
	assert.Equal(t, LayerGroupStats{IntraDeviceCopyBlocks: 1, IntraDeviceCopyBytes: pageBytes},
		f.m.GetAndResetLayerGroupIterationStats()[0], "the copy is a page movement: counted at once")
	assert.Equal(t, RequestStats{AllocTotalBlocks: 1, AllocNewBlocks: 1, ReusedBlocks: 3}, c.PendingRequestStats())
	c.CommitPendingStats()
	assert.Equal(t, LayerGroupStats{
		AllocTotalBlocks: 1, AllocNewBlocks: 1, ReusedBlocks: 3, FullReusedBlocks: 2, PartialReusedBlocks: 1,
	}, f.m.GetAndResetLayerGroupIterationStats()[0])
	require.NoError(t, c.Close())
}

// TestRequestStatsSumTheAttentionLayerGroups: a cache's request counts are
// the sums over its attention layer groups, each counting the blocks it has
// pages for. tokens_per_block 4, a full-attention and a window-8 layer group,
// 16 tokens cached; a cache reusing 15 tokens (3 full blocks and 3 tokens of
// the fourth) holds in the full-attention group 3 full and 1 partial page, in
// the window (blocks 2 and 3 at history 15) 1 full and 1 partial page: each
// group counts its partial copy as 1 allocation and 1 intra-device copy.
func TestRequestStatsSumTheAttentionLayerGroups(t *testing.T) {
	cfg := smallConfig(64)
	cfg.EnablePartialReuse = true
	cfg.Layers[1].SlidingWindowSize = 8
	f := newFixture(t, cfg)
	f.serve(blockhash.Scope{}, seq(0, 16))
	f.m.GetAndResetLayerGroupIterationStats()

	c, err := f.m.CreateKVCache(CacheOptions{InputTokens: seq(0, 15)})
	require.NoError(t, err)
	require.Equal(t, 15, c.ReusedTokens())
	assert.Equal(t, RequestStats{AllocTotalBlocks: 2, AllocNewBlocks: 2, ReusedBlocks: 4 + 2}, c.PendingRequestStats())
	moved := f.m.GetAndResetLayerGroupIterationStats()
	c.CommitPendingStats()
	got := f.m.GetAndResetLayerGroupIterationStats()
	require.Len(t, got, 2)
	for lc, st := range got {
		full, window := LayerGroupStats{
			AllocTotalBlocks: 1, AllocNewBlocks: 1, ReusedBlocks: 4, FullReusedBlocks: 3, PartialReusedBlocks: 1,
		}, LayerGroupStats{
			AllocTotalBlocks: 1, AllocNewBlocks: 1, ReusedBlocks: 2, FullReusedBlocks: 1, PartialReusedBlocks: 1,
		}
		want := full
		if f.m.lt.LifeCycles[lc].Window.Size > 0 {
			want = window
		}
		assert.Equal(t, want, st, "layer group %d", lc)
		assert.Equal(t, int64(1), moved[lc].IntraDeviceCopyBlocks, "layer group %d", lc)
	}
	require.NoError(t, c.Close())
}

// TestShrinkTakesBackPendingAllocations: a shrinking Resize takes back the
// pending allocations of the blocks it releases, as KVCacheManagerV2 does
// (a step reverted before the commit counts nothing); allocations already
// committed stay counted. tokens_per_block 4, a fresh 8-token prompt.
func TestShrinkTakesBackPendingAllocations(t *testing.T) {
	f := newFixture(t, smallConfig(16))
	c, err := f.m.CreateKVCache(CacheOptions{InputTokens: seq(0, 8)})
	require.NoError(t, err)
	require.NoError(t, c.Resume(f.stream))
	require.NoError(t, c.Resize(8, 8))  // blocks 0 and 1: missed
	require.NoError(t, c.Resize(16, 8)) // blocks 2 and 3: generation
	require.NoError(t, c.Resize(12, 8)) // releases block 3
	assert.Equal(t, []LayerGroupStats{{AllocTotalBlocks: 3, AllocNewBlocks: 3, MissedBlocks: 2, GenAllocBlocks: 1}},
		c.PendingStats())
	require.NoError(t, c.Resize(8, 8)) // releases block 2
	assert.Equal(t, RequestStats{AllocTotalBlocks: 2, AllocNewBlocks: 2, MissedBlocks: 2}, c.PendingRequestStats())
	c.CommitPendingStats()
	require.NoError(t, c.Resize(12, 8))
	require.NoError(t, c.Resize(8, 8))
	assert.Equal(t, RequestStats{}, c.PendingRequestStats(), "a step reverted before the commit counts nothing")
	require.NoError(t, c.Resize(12, 8))
	c.CommitPendingStats()
	require.NoError(t, c.Resize(8, 8))
	assert.Equal(t, RequestStats{}, c.PendingRequestStats(), "committed allocations are not taken back")
	assert.Equal(t, LayerGroupStats{AllocTotalBlocks: 3, AllocNewBlocks: 3, MissedBlocks: 2, GenAllocBlocks: 1},
		f.m.GetAndResetLayerGroupIterationStats()[0])
	require.NoError(t, c.Close())
}

// TestLayerGroupStatsArePendingUntilCommitted: a cache's reuse and
// allocation counts reach the manager's iteration statistics only when the
// cache commits them (KVCacheManagerV2's commit_pending_stats); discarding
// or closing drops them, and a commit counts each once.
func TestLayerGroupStatsArePendingUntilCommitted(t *testing.T) {
	f := newFixture(t, smallConfig(16))
	f.serve(blockhash.Scope{}, seq(0, 8)) // closed uncommitted: counts nothing
	assert.Equal(t, LayerGroupStats{}, f.m.GetAndResetLayerGroupIterationStats()[0], "close drops the pending counts")

	c, err := f.m.CreateKVCache(CacheOptions{InputTokens: seq(0, 12)})
	require.NoError(t, err)
	require.NoError(t, c.Resume(f.stream))
	require.NoError(t, c.Resize(12, 12))
	assert.Equal(t, LayerGroupStats{}, f.m.GetAndResetLayerGroupIterationStats()[0], "pending until committed")
	want := LayerGroupStats{AllocTotalBlocks: 1, AllocNewBlocks: 1, ReusedBlocks: 2, FullReusedBlocks: 2, MissedBlocks: 1}
	assert.Equal(t, []LayerGroupStats{want}, c.PendingStats())

	c.CommitPendingStats()
	c.CommitPendingStats() // nothing pending any more
	assert.Equal(t, want, f.m.GetAndResetLayerGroupIterationStats()[0])
	assert.Equal(t, []LayerGroupStats{{}}, c.PendingStats())
	assert.Equal(t, RequestStats{}, c.PendingRequestStats())

	require.NoError(t, c.Resize(16, 12))
	c.DiscardPendingStats()
	c.CommitPendingStats()
	assert.Equal(t, LayerGroupStats{}, f.m.GetAndResetLayerGroupIterationStats()[0], "discarded counts never count")
	require.NoError(t, c.Close())
}

// TestExpectedPromptLengthIsTheGenerationBoundary: growth counts as
// generation once the history has reached the expected prompt length, which
// defaults to the input tokens; without either nothing is generation, and an
// expected length of 0 makes all growth generation.
func TestExpectedPromptLengthIsTheGenerationBoundary(t *testing.T) {
	gen := func(t *testing.T, opts CacheOptions) int64 {
		f := newFixture(t, smallConfig(16))
		c, err := f.m.CreateKVCache(opts)
		require.NoError(t, err)
		require.NoError(t, c.Resume(f.stream))
		require.NoError(t, c.Resize(4, 0))  // history 0 before
		require.NoError(t, c.Resize(8, 4))  // history 0 before
		require.NoError(t, c.Resize(12, 8)) // history 4 before
		require.NoError(t, c.Resize(16, 8)) // history 8 before
		c.CommitPendingStats()
		require.NoError(t, c.Close())
		return f.m.GetAndResetLayerGroupIterationStats()[0].GenAllocBlocks
	}
	length := func(n int) *int { return &n }
	t.Run("expected", func(t *testing.T) {
		assert.Equal(t, int64(2), gen(t, CacheOptions{ExpectedPromptLength: length(4)}))
	})
	t.Run("input tokens by default", func(t *testing.T) {
		assert.Equal(t, int64(1), gen(t, CacheOptions{InputTokens: seq(500, 8)}))
	})
	t.Run("expected over input tokens", func(t *testing.T) {
		assert.Equal(t, int64(2), gen(t, CacheOptions{InputTokens: seq(500, 8), ExpectedPromptLength: length(4)}))
	})
	t.Run("none", func(t *testing.T) {
		assert.Equal(t, int64(0), gen(t, CacheOptions{}))
	})
	t.Run("zero", func(t *testing.T) {
		assert.Equal(t, int64(4), gen(t, CacheOptions{ExpectedPromptLength: length(0)}))
	})
	t.Run("negative", func(t *testing.T) {
		f := newFixture(t, smallConfig(16))
		_, err := f.m.CreateKVCache(CacheOptions{ExpectedPromptLength: length(-1)})
		require.ErrorIs(t, err, ErrInvalidArgument)
		assert.ErrorContains(t, err, "expected_prompt_length: -1 is negative", "named as in the C ABI and Python")
	})
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
	assert.Equal(t, int64(2), got.OnboardBlocks, "page moves count when they happen")
	assert.Equal(t, moved.OffloadBytes, got.OnboardBytes, "the same cold pages travel back")
	c.CommitPendingStats()
	assert.Equal(t, int64(2), f.m.GetAndResetLayerGroupIterationStats()[0].FullReusedBlocks)
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

// TestPeakBlockStatsIncludeTheCurrentCounts: the peaks a call returns
// include the counts at the call, so a manager no operation has touched yet
// reports every slot available (KVCacheManagerV2 samples its storage first).
func TestPeakBlockStatsIncludeTheCurrentCounts(t *testing.T) {
	f := newFixture(t, smallConfig(8))
	peaks, err := f.m.GetAndResetIterationPeakBlockStats(layout.GPULevel)
	require.NoError(t, err)
	require.Len(t, peaks, 1)
	assert.Equal(t, PeakBlockStats{Index: 0, PeakUsed: 0, Total: 8, Available: 8, Unavailable: 0, Evictable: 0}, peaks[0])
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
