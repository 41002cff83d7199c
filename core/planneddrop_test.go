package core

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core/blockhash"
	"github.com/kvcm/kvcm/core/config"
)

// dropConfig: full attention and an 8-token window, 4 tokens a block.
func dropConfig() config.Config {
	cfg := smallConfig(256)
	cfg.Layers[1].SlidingWindowSize = 8
	return cfg
}

// turn computes and commits tokens, stops committing and plans the drop.
func (f *fixture) turn(tokens []config.Token) (*KVCache, *PlannedDrop) {
	f.t.Helper()
	c, err := f.m.CreateKVCache(CacheOptions{InputTokens: tokens})
	require.NoError(f.t, err)
	require.NoError(f.t, c.Resume(f.stream))
	require.NoError(f.t, c.Resize(len(tokens), -1))
	require.NoError(f.t, c.Commit(tokens[c.NumCommittedTokens():], false))
	c.StopCommitting()
	d, err := c.PlanCommittedBlockDrop()
	require.NoError(f.t, err)
	return c, d
}

// A planned drop drops the window's committed pages of the turn once it is
// carried out, and only pages no other plan still names: a later turn
// extending the conversation reuses everything before that window.
func TestPlannedDropDropsTheTurnsWindowPages(t *testing.T) {
	f := newFixture(t, dropConfig())
	long := seq(0, 24)
	short := long[:8]
	lc, longDrop := f.turn(long)
	require.NotNil(t, longDrop)
	require.NoError(t, lc.Close())
	sc, shortDrop := f.turn(short)
	require.NotNil(t, shortDrop)
	require.NoError(t, sc.Close())
	scope := blockhash.Scope{}
	assert.Equal(t, 8, f.m.ProbeReuse(scope, short), "planned pages stay cached")

	require.NoError(t, shortDrop.Drop())
	assert.True(t, shortDrop.Dropped())
	assert.Equal(t, 0, f.m.ProbeReuse(scope, short), "the short turn's window is gone")
	assert.Equal(t, 24, f.m.ProbeReuse(scope, long), "the long turn needs none of it")

	require.NoError(t, longDrop.Drop())
	assert.Equal(t, 24-8, f.m.ProbeReuse(scope, long), "the window is dropped, older full-attention blocks stay")
	require.ErrorIs(t, longDrop.Drop(), ErrInvalidState, "a plan is carried out once")
}

// With reuse_match_backoff, a turn that reused less than a cached block and
// committed the rest of it follows the cached block (its own page stays
// private): the plan names the cached block's pages, as KVCacheManagerV2
// plans the block it rebased onto.
func TestPlannedDropOfAFollowedBlockPlansTheCachedOne(t *testing.T) {
	cfg := dropConfig()
	cfg.ReuseMatchBackoff = 1
	cfg.EnablePartialReuse = true
	f := newFixture(t, cfg)
	long := seq(0, 24)
	short := long[:8]
	lc, longDrop := f.turn(long)
	require.NotNil(t, longDrop)
	require.NoError(t, lc.Close())
	sc, shortDrop := f.turn(short)
	require.NotNil(t, shortDrop, "the followed blocks are planned")
	require.NoError(t, sc.Close())
	scope := blockhash.Scope{}
	assert.Equal(t, 8-1, f.m.ProbeReuse(scope, short), "planned pages stay cached")

	require.NoError(t, shortDrop.Drop())
	assert.Equal(t, 0, f.m.ProbeReuse(scope, short), "the short turn's window is gone")
	assert.Equal(t, 24-1, f.m.ProbeReuse(scope, long), "the long turn needs none of it")
	require.NoError(t, longDrop.Drop())
	// The backoff trims the content match (24 tokens) to 23; the longest
	// match within it whose window pages are all there ends at 16.
	assert.Equal(t, 24-8, f.m.ProbeReuse(scope, long))
}

// Planning needs stop_committing first; a cache with no committed full block
// has nothing to plan.
func TestPlanningADropNeedsStopCommitting(t *testing.T) {
	f := newFixture(t, dropConfig())
	c, err := f.m.CreateKVCache(CacheOptions{InputTokens: seq(0, 3)})
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.Resume(f.stream))
	require.NoError(t, c.Resize(3, -1))
	_, err = c.PlanCommittedBlockDrop()
	require.ErrorIs(t, err, ErrInvalidState)
	assert.Contains(t, err.Error(), "stop_committing")
	require.NoError(t, c.Commit(seq(0, 3), true))
	d, err := c.PlanCommittedBlockDrop()
	require.NoError(t, err)
	assert.Nil(t, d, "no full block committed")
}

// A page a cache still uses is not dropped by the plan: it stays cached.
func TestPlannedDropKeepsPagesInUse(t *testing.T) {
	f := newFixture(t, dropConfig())
	tokens := seq(0, 24)
	first, d := f.turn(tokens)
	require.NotNil(t, d)
	defer first.Close()
	require.NoError(t, d.Drop())
	assert.Equal(t, 24, f.m.ProbeReuse(blockhash.Scope{}, tokens), "the first turn's cache still holds its window")
}

// With SSM layers a plan names the SSM snapshot of the conversation's
// endpoint (the last committed full block): dropped, reuse ends at the
// snapshot before it, as in KVCacheManagerV2; shared plans drop it once
// both are carried out. Without a committed full block nothing is planned.
func TestPlannedDropNamesTheEndpointSsmSnapshot(t *testing.T) {
	f := newFixture(t, ssmConfig(64))
	prompt := seq(0, 8)
	c, err := f.m.CreateKVCache(CacheOptions{})
	require.NoError(t, err)
	require.NoError(t, c.Resume(f.stream))
	require.NoError(t, c.Resize(4, -1))
	require.NoError(t, c.Commit(prompt[:4], false)) // a snapshot at 4
	require.NoError(t, c.Resize(8, -1))
	require.NoError(t, c.Commit(prompt[4:], false)) // and at 8
	c.StopCommitting()
	first, err := c.PlanCommittedBlockDrop()
	require.NoError(t, err)
	second, err := c.PlanCommittedBlockDrop()
	require.NoError(t, err)
	require.NotNil(t, first, "full attention only: the SSM snapshot is the plan")
	require.NotNil(t, second)
	require.NoError(t, c.Close())
	scope := blockhash.Scope{}
	assert.Equal(t, 8, f.m.ProbeReuse(scope, prompt))
	require.NoError(t, first.Drop())
	assert.Equal(t, 8, f.m.ProbeReuse(scope, prompt), "the other plan still names it")
	require.NoError(t, second.Drop())
	assert.Equal(t, 4, f.m.ProbeReuse(scope, prompt), "reuse ends at the earlier snapshot")

	empty, err := f.m.CreateKVCache(CacheOptions{})
	require.NoError(t, err)
	require.NoError(t, empty.Resume(f.stream))
	empty.StopCommitting()
	d, err := empty.PlanCommittedBlockDrop()
	require.NoError(t, err)
	assert.Nil(t, d)
	require.NoError(t, empty.Close())
}
