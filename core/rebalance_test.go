package core

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core/blockhash"
	"github.com/kvcm/kvcm/core/config"
	"github.com/kvcm/kvcm/core/layout"
)

// rebalanceConfig: full attention (pool group 0, 128-byte pages) and a
// 64-token window (pool group 1, 32-byte pages) sharing 64 KiB of GPU
// memory, room reserved to 256 KiB; equal slot counts at first. Targets are
// updated at every sample; the default threshold (1.25) applies.
func rebalanceConfig(minSamples int64, cooldown float64) config.Config {
	cfg := twoHotGroupConfig()
	cfg.RebalanceMinSampledKVCaches = minSamples
	cfg.RebalanceCooldownSecs = cooldown
	cfg.RebalanceTargetRatioUpdateInterval = 1
	return cfg
}

// serveLong runs n requests of 800 tokens computed at once and closes them:
// sampled at a mean history of 400 tokens (0 at creation), such a request
// holds 200 full-attention pages of 128 bytes but only 116 window pages of
// 32 bytes.
func (f *fixture) serveLong(n int) {
	f.t.Helper()
	for i := range n {
		c, err := f.m.CreateKVCache(CacheOptions{})
		require.NoError(f.t, err)
		require.NoError(f.t, c.Resume(f.stream))
		require.NoError(f.t, c.Resize(800, 800), "request %d", i)
		require.NoError(f.t, c.Close())
	}
}

func (f *fixture) slots() []int64 {
	f.t.Helper()
	var out []int64
	for _, g := range f.groups(layout.GPULevel) {
		out = append(out, g.Total)
	}
	return out
}

// An adjustment is needed only once enough caches were sampled, the
// cooldown since the last adjustment has passed and the sampled demand is
// off the current split by the ratio threshold.
func TestNeedAdjustmentWaitsForSamplesCooldownAndAMismatch(t *testing.T) {
	f := newFixture(t, rebalanceConfig(3, 10))
	clock := time.Unix(1000, 0)
	f.m.now = func() time.Time { return clock }
	f.m.rebalance.lastAdjust = clock
	f.serveLong(2)
	assert.False(t, f.m.NeedAdjustment(), "two samples of three")
	f.serveLong(1)
	assert.EqualValues(t, 3, f.m.RebalanceSamples())
	assert.False(t, f.m.NeedAdjustment(), "the cooldown runs")
	clock = clock.Add(10 * time.Second)
	assert.True(t, f.m.NeedAdjustment())

	require.NoError(t, f.m.Adjust())
	assert.False(t, f.m.NeedAdjustment(), "the cooldown restarts")
	clock = clock.Add(10 * time.Second)
	assert.False(t, f.m.NeedAdjustment(), "the split matches the demand now")
}

// Adjust splits the level's quota by the sampled demand: the full-attention
// pool group grows, the window's shrinks, the quota is kept, and a later
// ResizeLevel keeps the new split.
func TestAdjustSplitsTheQuotaBySampledDemand(t *testing.T) {
	f := newFixture(t, rebalanceConfig(0, 0))
	before := f.slots()
	assert.Equal(t, before[0], before[1], "equal slot counts at first")
	assert.False(t, f.m.NeedAdjustment(), "no sample, no target")
	f.serveLong(4)
	require.True(t, f.m.NeedAdjustment())
	require.NoError(t, f.m.Adjust())
	after := f.slots()
	assert.Greater(t, after[0], before[0])
	assert.Less(t, after[1], before[1])
	gs := f.groups(layout.GPULevel)
	q, err := f.m.Quota(layout.GPULevel)
	require.NoError(t, err)
	assert.LessOrEqual(t, after[0]*gs[0].PageBytes+after[1]*gs[1].PageBytes, q)
	assert.InEpsilon(t, 200.0*128/(116*32), float64(after[0]*gs[0].PageBytes)/float64(after[1]*gs[1].PageBytes), 0.02,
		"bytes split as the pages the sampled request holds")

	require.NoError(t, f.m.ResizeLevel(layout.GPULevel, 2*q))
	grown := f.slots()
	assert.InDelta(t, float64(after[0])/float64(after[1]), float64(grown[0])/float64(grown[1]), 0.05)
}

// setupHighSlots leaves a suspended cache whose window pages sit in slots
// 200-299 of the window's pool group, with patterned KV.
func (f *fixture) setupHighSlots() *KVCache {
	f.t.Helper()
	a, err := f.m.CreateKVCache(CacheOptions{})
	require.NoError(f.t, err)
	require.NoError(f.t, a.Resume(f.stream))
	require.NoError(f.t, a.Resize(800, 0))
	b, err := f.m.CreateKVCache(CacheOptions{})
	require.NoError(f.t, err)
	f.t.Cleanup(func() { b.Close() })
	require.NoError(f.t, b.Resume(f.stream))
	require.NoError(f.t, b.Resize(400, 0))
	f.writeAll(b, 7)
	idx, err := b.BasePageIndices(1)
	require.NoError(f.t, err)
	require.EqualValues(f.t, 200, idx[0], "b's window pages sit above a's")
	require.NoError(f.t, a.Close())
	return b
}

// A rebalance moves the pages in slots that go, with their bytes, into slots
// that stay: a suspended cache's KV is intact after it.
func TestAdjustMovesPagesWithTheirBytes(t *testing.T) {
	f := newFixture(t, rebalanceConfig(0, 0))
	b := f.setupHighSlots()
	require.NoError(t, b.Suspend())
	f.serveLong(20)
	require.True(t, f.m.NeedAdjustment())
	require.NoError(t, f.m.Adjust())
	require.Less(t, f.slots()[1], int64(300), "the window's group shrank below b's pages")
	require.NoError(t, b.Resume(f.stream))
	idx, err := b.BasePageIndices(1)
	require.NoError(t, err)
	for _, i := range idx {
		assert.Less(t, int64(i), f.slots()[1])
	}
	assert.Equal(t, 100*3, f.verifyAll(b, 7), "every buffer of b's 100 blocks kept its bytes")
}

// An adjustment that would move an ACTIVE cache's pages fails and changes
// nothing; once the cache is suspended it succeeds.
func TestAdjustThatWouldMoveActivePagesChangesNothing(t *testing.T) {
	f := newFixture(t, rebalanceConfig(0, 0))
	b := f.setupHighSlots()
	f.serveLong(20)
	before := f.slots()
	err := f.m.Adjust()
	require.ErrorIs(t, err, ErrInvalidState)
	assert.Equal(t, before, f.slots())
	assert.Equal(t, 100*3, f.verifyAll(b, 7))
	assert.True(t, f.m.NeedAdjustment(), "still needed")
	require.NoError(t, b.Suspend())
	require.NoError(t, f.m.Adjust())
	assert.NotEqual(t, before, f.slots())
}

// The GPU level rebalances within the slots cache_tiers[0].max_quota
// reserved: a target that would grow a pool group beyond them is no
// adjustment.
func TestGPURebalanceStaysWithinTheReservation(t *testing.T) {
	cfg := rebalanceConfig(0, 0)
	cfg.CacheTiers[0].MaxQuota = 0
	f := newFixture(t, cfg)
	f.serveLong(4)
	before := f.slots()
	assert.False(t, f.m.NeedAdjustment())
	require.NoError(t, f.m.Adjust())
	assert.Equal(t, before, f.slots())
}

// The moving average weighs recent samples more, normalized from the first.
func TestMovingAverageIsExactFromTheFirstSample(t *testing.T) {
	a := movingAverage{decay: 0.5}
	a.update(4)
	assert.InDelta(t, 4, a.avg, 1e-12)
	a.update(10)
	assert.InDelta(t, (4*0.5+10)/1.5, a.avg, 1e-12)
}

// Cold levels are split by the mean reused length: requests reusing long
// prefixes of which the window holds few pages shift a host level towards
// full attention, keeping its cached pages' bytes.
func TestAdjustSplitsColdLevelsByTheReusedLength(t *testing.T) {
	cfg := rebalanceConfig(0, 0)
	cfg.CacheTiers = append(cfg.CacheTiers, config.Host(64<<10))
	f := newFixture(t, cfg)
	prompt := seq(0, 800)
	c := f.compute(blockhash.Scope{}, prompt, 3)
	require.NoError(t, c.Close())
	for range 4 {
		r, err := f.m.CreateKVCache(CacheOptions{InputTokens: prompt})
		require.NoError(t, err)
		require.Equal(t, 800, r.ReusedTokens())
		require.NoError(t, r.Resume(f.stream))
		require.NoError(t, r.Close())
	}
	// A long request pushes the prompt's pages down to the host level.
	big := f.open(blockhash.Scope{LoRAID: 1}, seq(10000, 1600))
	require.NoError(t, big.Close())
	require.Positive(t, levelOf(t, f.m, 1).Total-levelOf(t, f.m, 1).Free, "the host level holds pages")
	before := f.groups(1)
	require.True(t, f.m.NeedAdjustment())
	require.NoError(t, f.m.Adjust())
	after := f.groups(1)
	assert.Greater(t, after[0].Total, before[0].Total, "the host level grows its full-attention group")
	assert.Less(t, after[1].Total, before[1].Total)

	again := f.open(blockhash.Scope{}, prompt)
	defer again.Close()
	assert.Equal(t, 800, again.ReusedTokens())
	assert.Positive(t, f.verifyAll(again, 3), "the reused prefix, back from the host level, kept its bytes")
}
