package core

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core/blockhash"
	"github.com/kvcm/kvcm/core/config"
	"github.com/kvcm/kvcm/core/layout"
)

// windowConfig: full attention, a 12-token window with 2 sinks and an
// 8-token window, 4 tokens a block.
func windowConfig() config.Config {
	cfg := smallConfig(256)
	kv := cfg.Layers[0].Buffers
	cfg.Layers = append(cfg.Layers, config.AttentionLayerConfig{LayerID: 2, Buffers: kv})
	cfg.Layers[1].SlidingWindowSize, cfg.Layers[1].NumSinkTokens = 12, 2
	cfg.Layers[2].SlidingWindowSize = 8
	return cfg
}

// wantPages says, per layer group and block, whether a cache of capacity
// tokens with history computed holds a page.
func wantPages(lt *layout.Layout, capacity, history int) [][]bool {
	out := make([][]bool, len(lt.LifeCycles))
	for lc := range out {
		for b := range lt.BlocksFor(capacity) {
			out[lc] = append(out[lc], lt.Needs(layout.LayerGroupID(lc), b, history))
		}
	}
	return out
}

func heldPages(t *testing.T, c *KVCache) [][]bool {
	t.Helper()
	out := make([][]bool, c.m.NumLayerGroups())
	for lc := range out {
		idx, err := c.BasePageIndices(layout.LayerGroupID(lc))
		require.NoError(t, err)
		for _, i := range idx {
			out[lc] = append(out[lc], i != BadPageIndex)
		}
	}
	return out
}

// A sliding window holds exactly the sink blocks and the blocks in the
// window, whether the history grows one token at a time, in chunks or at
// once, and when the capacity shrinks and grows again.
func TestWindowsHoldTheirBlocksWhateverTheSteps(t *testing.T) {
	f := newFixture(t, windowConfig())
	lt := f.m.Layout()
	steps := map[string][]int{"one token": nil, "chunks of 5": nil, "at once": {61}}
	for n := 1; n <= 61; n++ {
		steps["one token"] = append(steps["one token"], n)
		if n%5 == 0 || n == 61 {
			steps["chunks of 5"] = append(steps["chunks of 5"], n)
		}
	}
	for name, hs := range steps {
		t.Run(name, func(t *testing.T) {
			c, err := f.m.CreateKVCache(CacheOptions{InputTokens: seq(0, 61)})
			require.NoError(t, err)
			defer c.Close()
			require.NoError(t, c.Resume(f.stream))
			for _, h := range hs {
				require.NoError(t, c.Resize(h, h))
				require.Equal(t, wantPages(lt, h, h), heldPages(t, c), "history %d", h)
			}
			require.NoError(t, c.Resize(62, 61))
			require.NoError(t, c.Resize(61, 61), "shrinking drops the last block")
			require.NoError(t, c.Resize(70, 66), "growing again slides the windows on")
			assert.Equal(t, wantPages(lt, 70, 66), heldPages(t, c))
		})
	}
	st := f.hotStats()
	assert.Equal(t, st.Total, st.Free+st.Evictable, "every page is free or cached once the caches closed")
}

// With partial reuse, a match ending in a partial block is usable where every
// layer group has the pages it needs at that endpoint: a window that moves
// on over the partial block's tokens needs no page of a block it left,
// though its page is missing at the block boundary (KVCacheManagerV2's
// rewind endpoint); the reused pages hold the KV byte for byte.
func TestPartialMatchNeedsTheWindowsPagesAtItsEndpoint(t *testing.T) {
	cfg := smallConfig(64)
	cfg.EnablePartialReuse = true
	cfg.Layers[1].SlidingWindowSize = 2 // half a block
	f := newFixture(t, cfg)
	long := seq(0, 20)
	a := f.open(blockhash.Scope{}, long) // history 20 at once: the window's pages of blocks 0-3 are never taken
	f.writeAll(a, 1)
	require.NoError(t, a.Close())
	base := long[:10]
	assert.Zero(t, f.m.ProbeReuse(blockhash.Scope{}, base), "block 2's window page is missing")
	b := f.open(blockhash.Scope{}, base)
	assert.Zero(t, b.ReusedTokens())
	f.writeAll(b, 1)
	require.NoError(t, b.Close()) // a partial block of 2 tokens with both layer groups' pages

	rewind := append(slices.Clone(base), 99)
	assert.Equal(t, 10, f.m.ProbeReuse(blockhash.Scope{}, rewind),
		"at 10 tokens the window needs block 2 only: block 1's missing page does not cut the match")
	c, err := f.m.CreateKVCache(CacheOptions{InputTokens: rewind})
	require.NoError(t, err)
	assert.Equal(t, 10, c.ReusedTokens())
	require.NoError(t, c.Resume(f.stream))
	assert.Equal(t, 3*2+2, f.verifyAll(c, 1), "blocks 0-2 of the full-attention layer, block 2 of the window's")
	require.NoError(t, c.Close())
	require.NoError(t, f.m.CheckInvariants())
}
