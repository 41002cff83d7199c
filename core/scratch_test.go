package core

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core/config"
	"github.com/kvcm/kvcm/core/layout"
)

// The scratch tests' layer groups: full attention (layer 0, group 0) and an
// 8-token window over four layers (layers 1-4, group 1), whose one pool
// holds eight buffers, so a scratch slot holds four blocks of one layer.
const (
	fullLG = layout.LayerGroupID(0)
	swaLG  = layout.LayerGroupID(1)
)

func scratchConfig(rewind int) config.Config {
	kv := []config.BufferConfig{{Role: config.RoleKey, Size: 64}, {Role: config.RoleValue, Size: 64}}
	cfg := config.Config{
		TokensPerBlock:  tpb,
		CacheTiers:      []config.CacheTierConfig{config.GPU(64 << 10)},
		Layers:          []config.AttentionLayerConfig{{LayerID: 0, Buffers: kv}},
		SwaScratchReuse: &config.SwaScratchReuseConfig{MaxRewindLen: rewind},
	}
	for id := int32(1); id <= 4; id++ {
		cfg.Layers = append(cfg.Layers, config.AttentionLayerConfig{LayerID: id, Buffers: kv, SlidingWindowSize: 8})
	}
	return cfg
}

func (f *fixture) usedSlots(lg layout.LayerGroupID) int64 {
	f.t.Helper()
	st, err := f.m.StorageStats(layout.GPULevel)
	require.NoError(f.t, err)
	g := st[f.m.Layout().Levels[0].LifeCycleToGroup[lg]]
	return g.Total - g.Free
}

func (f *fixture) prefill(prompt []config.Token) *KVCache {
	f.t.Helper()
	c, err := f.m.CreateKVCache(CacheOptions{InputTokens: prompt})
	require.NoError(f.t, err)
	f.t.Cleanup(func() { c.Close() })
	require.NoError(f.t, c.Resume(f.stream))
	require.NoError(f.t, c.Resize(len(prompt), -1))
	return c
}

// A prefill's blocks that are out of the window by the end of the step get no
// page: they share the cache's scratch slots, four blocks a slot here, while
// full attention and the window's last blocks get pages.
func TestScratchBlocksShareScratchSlotsInsteadOfPages(t *testing.T) {
	f := newFixture(t, scratchConfig(0))
	c := f.prefill(seq(0, 64)) // 16 blocks; the window keeps blocks 14 and 15
	d, err := c.ScratchDesc(swaLG)
	require.NoError(t, err)
	assert.Equal(t, 0, d.Begin)
	assert.Equal(t, 14, d.End)
	assert.Len(t, d.Slots, 4, "14 blocks, four a slot")
	idx, err := c.BasePageIndices(swaLG)
	require.NoError(t, err)
	for b, i := range idx {
		assert.Equal(t, b >= 14, i != BadPageIndex, "block %d", b)
		if i != BadPageIndex {
			assert.NotContains(t, d.Slots, i, "a page is never a scratch slot")
		}
	}
	assert.True(t, c.HasScratchSlots())
	assert.EqualValues(t, 2+4, f.usedSlots(swaLG), "two pages and four scratch slots instead of 16 pages")
	assert.EqualValues(t, 16, f.usedSlots(fullLG))
	full, err := c.ScratchDesc(fullLG)
	require.NoError(t, err)
	assert.True(t, full.Empty(), "full attention never uses scratch")
}

// max_rewind_len protects the step's last tokens: their blocks keep pages,
// because rejected draft tokens rewound off them leave the rest as history.
func TestMaxRewindLenKeepsTheRewindableTailInPages(t *testing.T) {
	f := newFixture(t, scratchConfig(8))
	c := f.prefill(seq(0, 64))
	d, err := c.ScratchDesc(swaLG)
	require.NoError(t, err)
	assert.Equal(t, 12, d.End, "the window at 56 tokens starts at block 12")
	assert.Len(t, d.Slots, 3)
	require.NoError(t, c.Resize(64, 56), "rewinding 8 tokens keeps blocks 12-13 with their pages")
	idx, err := c.BasePageIndices(swaLG)
	require.NoError(t, err)
	for b := 12; b < 16; b++ {
		assert.NotEqual(t, BadPageIndex, idx[b], "block %d", b)
	}
}

// Committing the step makes its history reach the capacity: the scratch
// blocks are out of the window for good and the scratch slots go back.
func TestCommittingTheStepReleasesTheScratchSlots(t *testing.T) {
	f := newFixture(t, scratchConfig(0))
	prompt := seq(0, 64)
	c := f.prefill(prompt)
	require.NoError(t, c.Commit(prompt, false))
	assert.False(t, c.HasScratchSlots())
	d, err := c.ScratchDesc(swaLG)
	require.NoError(t, err)
	assert.True(t, d.Empty())
	assert.EqualValues(t, 2, f.usedSlots(swaLG))
	require.NoError(t, c.Resize(65, -1), "generation grows as without scratch reuse")
	assert.False(t, c.HasScratchSlots())

	again := f.prefill(prompt)
	assert.Equal(t, 64, again.ReusedTokens(), "the committed window is reusable: scratch blocks are never needed again")
}

// A scratch slot holds consecutive blocks of one layer: within a layer every
// (block, buffer) of the step has its own sub-page, inside the scratch slots.
func TestScratchPageIndicesNeverOverlapWithinALayer(t *testing.T) {
	f := newFixture(t, scratchConfig(0))
	c := f.prefill(seq(0, 64))
	d, err := c.ScratchDesc(swaLG)
	require.NoError(t, err)
	for layer := int32(1); layer <= 4; layer++ {
		seen := map[int64]string{}
		for _, role := range []config.DataRole{config.RoleKey, config.RoleValue} {
			loc, err := f.m.Buffer(layer, role)
			require.NoError(t, err)
			for b := d.Begin; b < d.End; b++ {
				i := loc.ScratchPageIndex(d, b)
				require.Contains(t, d.Slots, int32(i/loc.Scale), "layer %d %s block %d is in a scratch slot", layer, role, b)
				require.NotContains(t, seen, i, "layer %d %s block %d", layer, role, b)
				seen[i] = string(role)
			}
			assert.EqualValues(t, -1, loc.ScratchPageIndex(d, d.End), "past the scratch blocks")
		}
	}
}

// Scratch KV lives for one step: suspending releases the scratch slots and
// resuming takes them again for the step the cache is in.
func TestSuspendReleasesScratchSlotsAndResumeTakesThemAgain(t *testing.T) {
	f := newFixture(t, scratchConfig(0))
	c := f.prefill(seq(0, 64))
	require.NoError(t, c.Suspend())
	assert.False(t, c.HasScratchSlots())
	assert.EqualValues(t, 2, f.usedSlots(swaLG))
	require.NoError(t, c.Resume(f.stream))
	d, err := c.ScratchDesc(swaLG)
	require.NoError(t, err)
	assert.Len(t, d.Slots, 4)
	require.NoError(t, c.Close())
	st := f.groups(layout.GPULevel)
	for _, g := range st {
		assert.Equal(t, g.Total, g.Free+g.Evictable, "group %d: nothing leaked", g.Index)
	}
}

// Scratch reuse needs each step computed before the next: a capacity change
// with the previous step's history short of it, a partial history advance
// that would bring scratch blocks back into the window and a shrink while
// scratch slots are held all fail, changing nothing.
func TestScratchStepsMustBeComputedWhole(t *testing.T) {
	f := newFixture(t, scratchConfig(0))
	prompt := seq(0, 64)
	c := f.prefill(prompt)
	before, err := c.BasePageIndices(swaLG)
	require.NoError(t, err)

	err = c.Resize(80, 32)
	require.ErrorIs(t, err, ErrInvalidArgument)
	assert.Contains(t, err.Error(), "history_length")
	err = c.Commit(prompt[:40], false)
	require.ErrorIs(t, err, ErrInvalidArgument, "history 40 needs blocks 8-13, computed in scratch")
	err = c.Resize(60, -1)
	require.ErrorIs(t, err, ErrInvalidArgument)
	assert.Contains(t, err.Error(), "capacity")

	after, err := c.BasePageIndices(swaLG)
	require.NoError(t, err)
	assert.Equal(t, before, after)
	assert.Equal(t, 0, c.NumCommittedTokens())
	assert.Equal(t, 64, c.Capacity())
	assert.True(t, c.HasScratchSlots())
}

// A chunked prefill takes scratch slots per chunk: each chunk's blocks that
// leave the window within it, no more.
func TestChunkedPrefillUsesScratchPerChunk(t *testing.T) {
	f := newFixture(t, scratchConfig(0))
	prompt := seq(0, 64)
	c := f.prefill(prompt[:32])
	d, err := c.ScratchDesc(swaLG)
	require.NoError(t, err)
	assert.Equal(t, [2]int{0, 6}, [2]int{d.Begin, d.End})
	require.NoError(t, c.Commit(prompt[:32], false))
	require.NoError(t, c.Resize(64, -1))
	d, err = c.ScratchDesc(swaLG)
	require.NoError(t, err)
	assert.Equal(t, [2]int{8, 14}, [2]int{d.Begin, d.End}, "the second chunk's new blocks out of the window at 64")
	idx, err := c.BasePageIndices(swaLG)
	require.NoError(t, err)
	assert.Equal(t, BadPageIndex, idx[5], "the first chunk's scratch blocks stay pageless")
	assert.NotEqual(t, BadPageIndex, idx[6], "the first chunk's window blocks are read by the second chunk")
	assert.NotEqual(t, BadPageIndex, idx[14])
	require.NoError(t, c.Commit(prompt[32:], false))
	assert.False(t, c.HasScratchSlots())
	idx, err = c.BasePageIndices(swaLG)
	require.NoError(t, err)
	assert.Equal(t, BadPageIndex, idx[6], "and leave the window once it is computed")
}

// Scratch reuse is switched per cache between steps: on only where the
// manager is configured for it, and never while the current step has
// scratch blocks.
func TestScratchReuseSwitchesOnlyBetweenSteps(t *testing.T) {
	off := scratchConfig(0)
	off.SwaScratchReuse = nil
	g := newFixture(t, off)
	plain := g.prefill(seq(0, 64))
	assert.False(t, plain.SwaScratchReuse())
	assert.False(t, plain.HasScratchSlots(), "without the configuration every block has its page")
	require.ErrorIs(t, plain.SetSwaScratchReuse(true), ErrInvalidArgument)

	f := newFixture(t, scratchConfig(0))
	c := f.prefill(seq(0, 64))
	assert.True(t, c.SwaScratchReuse())
	require.ErrorIs(t, c.SetSwaScratchReuse(false), ErrInvalidState)
	require.NoError(t, c.Commit(seq(0, 64), false))
	require.NoError(t, c.SetSwaScratchReuse(false))
	require.NoError(t, c.Resize(128, 64))
	assert.False(t, c.HasScratchSlots())
	require.ErrorIs(t, c.SetSwaScratchReuse(true), ErrInvalidState, "this step would have scratch blocks")
}

// swa_scratch_reuse.max_rewind_len must not be negative.
func TestNegativeMaxRewindLenIsInvalid(t *testing.T) {
	cfg := scratchConfig(-1)
	err := cfg.Validate(2)
	require.ErrorIs(t, err, config.ErrInvalid)
	assert.Contains(t, err.Error(), "swa_scratch_reuse.max_rewind_len")
}
