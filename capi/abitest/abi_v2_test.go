package abitest

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The additions of ABI version 2: kvcm_manager_config's appended fields are
// read only when struct_size covers them; per-layer-group iteration
// statistics; block events with priorities.

// TestConfigV2FieldsNeedTheirStructSize: a negative reuse_match_backoff is
// rejected naming the field, but only from a caller whose struct_size
// covers it (a caller built against version 1 never wrote it).
func TestConfigV2FieldsNeedTheirStructSize(t *testing.T) {
	noLeaks(t)
	cfg := smallConfig(8, 0)
	cfg.ReuseMatchBackoff = -1
	_, err := CreateManager(cfg, nil)
	requireCode(t, err, InvalidConfig, "reuse_match_backoff")
	cfg.StructSize = ConfigSizeV1
	m, err := CreateManager(cfg, nil)
	require.NoError(t, err, "a version 1 struct ends before reuse_match_backoff")
	require.NoError(t, DestroyManager(m))
	assert.Equal(t, uint32(2), ABIVersion())
}

// TestLayerGroupIterationStatsResetOnlyWhenReturned: the entries come one
// per layer group; a size query or a buffer too small resets nothing.
func TestLayerGroupIterationStatsResetOnlyWhenReturned(t *testing.T) {
	noLeaks(t)
	m, err := CreateManager(smallConfig(8, 0), nil)
	require.NoError(t, err)
	defer func() { require.NoError(t, DestroyManager(m)) }()
	s, err := CreateStream(m)
	require.NoError(t, err)
	c, err := CreateCache(m, 0, "", seq(0, 12))
	require.NoError(t, err)
	require.NoError(t, Resume(c, s))
	require.NoError(t, Resize(c, 12, 12))
	require.NoError(t, CommitPendingStats(c))
	require.NoError(t, CloseCache(c))

	_, n, err := LayerGroupIterationStats(m, 0)
	requireCode(t, err, BufferTooSmall)
	assert.Equal(t, 1, n)
	got, n, err := LayerGroupIterationStats(m, 1)
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	assert.Equal(t, []LayerGroupStats{{LayerGroup: 0, AllocNew: 3, Missed: 3}}, got, "the size query reset nothing")
	got, _, err = LayerGroupIterationStats(m, 1)
	require.NoError(t, err)
	assert.Equal(t, []LayerGroupStats{{LayerGroup: 0}}, got, "reset by the previous call")
}

// TestLayerGroupStatsArePendingUntilCommitted: a cache's per-layer-group
// counts reach kvcm_manager_get_and_reset_layer_group_iteration_stats when
// kvcm_kv_cache_commit_pending_stats commits them, once;
// kvcm_kv_cache_discard_pending_stats and closing drop them.
// kvcm_kv_cache_get_pending_stats sums what is pending (KVCacheManagerV2's
// per-request counts: a fresh 12-token prompt's 3 prefill blocks are 3
// allocations, all missed).
func TestLayerGroupStatsArePendingUntilCommitted(t *testing.T) {
	noLeaks(t)
	m, err := CreateManager(smallConfig(8, 0), nil)
	require.NoError(t, err)
	defer func() { require.NoError(t, DestroyManager(m)) }()
	s, err := CreateStream(m)
	require.NoError(t, err)
	c, err := CreateCache(m, 0, "", seq(0, 12))
	require.NoError(t, err)
	require.NoError(t, Resume(c, s))
	require.NoError(t, Resize(c, 12, 12))
	got, _, err := LayerGroupIterationStats(m, 1)
	require.NoError(t, err)
	assert.Equal(t, []LayerGroupStats{{LayerGroup: 0}}, got, "pending")
	pending, err := PendingStats(c)
	require.NoError(t, err)
	assert.Equal(t, [4]int64{3, 3, 0, 3}, pending)
	require.NoError(t, CommitPendingStats(c))
	require.NoError(t, CommitPendingStats(c))
	pending, err = PendingStats(c)
	require.NoError(t, err)
	assert.Equal(t, [4]int64{}, pending, "committed: nothing pending")
	got, _, err = LayerGroupIterationStats(m, 1)
	require.NoError(t, err)
	assert.Equal(t, []LayerGroupStats{{LayerGroup: 0, AllocNew: 3, Missed: 3}}, got, "committed once")
	require.NoError(t, Resize(c, 16, 12))
	require.NoError(t, DiscardPendingStats(c))
	require.NoError(t, Resize(c, 20, 12))
	require.NoError(t, CloseCache(c))
	got, _, err = LayerGroupIterationStats(m, 1)
	require.NoError(t, err)
	assert.Equal(t, []LayerGroupStats{{LayerGroup: 0}}, got, "discarded and closed")
}

// TestBlockEventsCarryPriorities: a stored block reports its priority; a
// later block committed with a higher one raises its ancestors, each
// reported as a priority update from the old value, which
// kvcm_manager_drain_events skips.
func TestBlockEventsCarryPriorities(t *testing.T) {
	noLeaks(t)
	cfg := smallConfig(8, 0)
	cfg.EventQueueCapacity = 64
	m, err := CreateManager(cfg, nil)
	require.NoError(t, err)
	defer func() { require.NoError(t, DestroyManager(m)) }()
	s, err := CreateStream(m)
	require.NoError(t, err)
	a, err := CreateCache(m, 0, "", seq(0, 8))
	require.NoError(t, err)
	require.NoError(t, Resume(a, s))
	require.NoError(t, Resize(a, 8, 8))
	require.NoError(t, Commit(a, seq(0, 8), false))
	require.NoError(t, CloseCache(a))
	evs, err := DrainBlockEvents(m)
	require.NoError(t, err)
	require.Len(t, evs, 2)
	for _, e := range evs {
		assert.Equal(t, BlockEvent{Kind: 0, Priority: 35, OldPriority: 35, Key: e.Key, Tokens: e.Tokens}, e, "stored at the default priority")
	}

	b, err := CreateCacheWithPriority(m, seq(0, 13), 90)
	require.NoError(t, err)
	require.NoError(t, Resume(b, s))
	require.NoError(t, Resize(b, 12, 12))
	require.NoError(t, Commit(b, seq(8, 4), false))
	require.NoError(t, CloseCache(b))
	evs, err = DrainBlockEvents(m)
	require.NoError(t, err)
	var kinds []int32
	for _, e := range evs {
		kinds = append(kinds, e.Kind)
		if e.Kind == 3 {
			assert.Equal(t, [2]int32{35, 90}, [2]int32{e.OldPriority, e.Priority})
		}
	}
	assert.Equal(t, []int32{3, 3, 0}, kinds, "both ancestors raised, then the new block stored")
	assert.Equal(t, int32(90), evs[2].Priority)

	c, err := CreateCacheWithPriority(m, seq(0, 17), 100)
	require.NoError(t, err)
	require.NoError(t, Resume(c, s))
	require.NoError(t, Resize(c, 16, 16))
	require.NoError(t, Commit(c, seq(12, 4), false))
	require.NoError(t, CloseCache(c))
	v1, _, err := DrainEvents(m, 16, 64)
	require.NoError(t, err)
	require.Len(t, v1, 1, "the v1 drain skips the 3 priority updates")
	assert.Equal(t, int32(0), v1[0].Kind)
}

// TestCacheStatsAndCachedTokensByLevel: a cache reports its own block
// counters and, one count per level, its tokens with computed KV; a buffer
// too small names the levels it needs.
func TestCacheStatsAndCachedTokensByLevel(t *testing.T) {
	noLeaks(t)
	m, err := CreateManager(smallConfig(8, 4), nil)
	require.NoError(t, err)
	defer func() { require.NoError(t, DestroyManager(m)) }()
	s, err := CreateStream(m)
	require.NoError(t, err)
	c, err := CreateCache(m, 0, "", seq(0, 12))
	require.NoError(t, err)
	require.NoError(t, Resume(c, s))
	require.NoError(t, Resize(c, 12, 10))
	st, err := CacheStats(c)
	require.NoError(t, err)
	assert.Equal(t, [4]int64{3, 3, 0, 3}, st, "3 new blocks, the prompt's 3 full blocks missed")
	_, n, err := CachedTokensByLevel(c, 1)
	requireCode(t, err, BufferTooSmall)
	assert.Equal(t, 2, n)
	got, _, err := CachedTokensByLevel(c, 2)
	require.NoError(t, err)
	assert.Equal(t, []int64{10, 0}, got)
	require.NoError(t, CloseCache(c))
}
