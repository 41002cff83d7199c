package core

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core/blockhash"
	"github.com/kvcm/kvcm/core/config"
	"github.com/kvcm/kvcm/core/layout"
)

// partialCoverageFixture: full attention (layer 0) and a sliding window of
// half a block (layer 1), partial reuse on, as TensorRT-LLM's
// TestPartialCoverageReuse configures them (window 16 at 32 tokens a block).
func partialCoverageFixture(t *testing.T) (f *fixture, full, swa layout.LayerGroupID) {
	cfg := smallConfig(256)
	cfg.Layers[1].SlidingWindowSize = tpb / 2
	cfg.EnablePartialReuse = true
	f = newFixture(t, cfg)
	var err error
	full, err = f.m.LayerGroupOf(0)
	require.NoError(t, err)
	swa, err = f.m.LayerGroupOf(1)
	require.NoError(t, err)
	return f, full, swa
}

func covered(t *testing.T, pages []ReusePage) []int {
	t.Helper()
	out := make([]int, len(pages))
	for i, p := range pages {
		out[i] = p.Covered
		if p.Covered == 0 {
			assert.Equal(t, ReusePage{Matched: p.Matched, Level: -1, Slot: BadPageIndex}, p, "block %d has no page", i)
		}
	}
	return out
}

// A block position is covered by the widest page any block committed there
// holds of its matched tokens: after a longer request committed the full
// block over a partial one (its window page never kept, the history being
// known up front), the full block's own page covers it for full attention
// and the partial block's page covers its tokens for the window, as
// KVCacheManagerV2's partial-coverage pages do; the match is the rewind
// endpoint's, and reuse there and at the longer endpoint is whole.
func TestReusePagesCoverABlockWithTheWidestPage(t *testing.T) {
	f, full, swa := partialCoverageFixture(t)
	base := seq(0, 2*tpb+tpb/2)
	extended := append(append([]config.Token{}, base...), seq(100, 2*tpb+tpb/2)...)
	rewind := append(append([]config.Token{}, base...), 999)
	require.Equal(t, 0, f.serve(blockhash.Scope{}, base))
	require.Equal(t, len(base), f.serve(blockhash.Scope{}, extended))

	n, pages, err := f.m.ReusePages(blockhash.Scope{}, rewind, full, true)
	require.NoError(t, err)
	assert.Equal(t, len(base), n)
	assert.Equal(t, []int{tpb, tpb, tpb}, covered(t, pages), "the full block's own page")
	_, pages, err = f.m.ReusePages(blockhash.Scope{}, rewind, swa, true)
	require.NoError(t, err)
	assert.Equal(t, []int{0, 0, tpb / 2}, covered(t, pages), "out of the window but the partial block's page")
	assert.Equal(t, layout.GPULevel, pages[2].Level)
	assert.Equal(t, []int{tpb, tpb, tpb / 2}, []int{pages[0].Matched, pages[1].Matched, pages[2].Matched}, "the tokens of each block matched")
	assert.Equal(t, len(base), f.m.ProbeReuse(blockhash.Scope{}, rewind))
	assert.Equal(t, len(extended), f.m.ProbeReuse(blockhash.Scope{}, extended), "the partial page does not limit the longer endpoint")
}

// Coverage only grows: a longer partial block's page covers a shorter
// rewind endpoint, and committing the shorter one again changes nothing.
// Without partial a match ends in a partial block only where input holds
// it whole.
func TestReusePagesCoverageOnlyGrows(t *testing.T) {
	f, _, swa := partialCoverageFixture(t)
	base := seq(0, 2*tpb+tpb/2)
	longer := append(append([]config.Token{}, base...), 500)
	rewind := append(append([]config.Token{}, base...), 999)
	f.serve(blockhash.Scope{}, base)
	_, pages, err := f.m.ReusePages(blockhash.Scope{}, rewind, swa, true)
	require.NoError(t, err)
	assert.Equal(t, tpb/2, covered(t, pages)[2])
	require.Equal(t, len(base), f.serve(blockhash.Scope{}, longer))
	for range 2 {
		_, pages, err = f.m.ReusePages(blockhash.Scope{}, rewind, swa, true)
		require.NoError(t, err)
		assert.Equal(t, tpb/2+1, covered(t, pages)[2], "the wider page")
		assert.Equal(t, len(longer), f.m.ProbeReuse(blockhash.Scope{}, append(append([]config.Token{}, longer...), 999)))
		require.Equal(t, len(base), f.serve(blockhash.Scope{}, base))
	}
	n, pages, err := f.m.ReusePages(blockhash.Scope{}, base, swa, false)
	require.NoError(t, err)
	assert.Equal(t, len(base), n)
	assert.Len(t, pages, 3)
	n, pages, err = f.m.ReusePages(blockhash.Scope{}, seq(0, 2*tpb+1), swa, false)
	require.NoError(t, err)
	assert.Equal(t, 2*tpb, n, "no partial block is held whole")
	assert.Len(t, pages, 2)
	_, _, err = f.m.ReusePages(blockhash.Scope{}, base, 7, true)
	assert.ErrorIs(t, err, ErrInvalidArgument)
	assert.ErrorContains(t, err, "layer_group")
}
