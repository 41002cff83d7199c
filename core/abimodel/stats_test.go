package abimodel

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core/layout"
)

// reuseOnce commits a prompt in one cache, closes it and reuses the prompt
// in a second cache with its stats committed, so that every iteration
// counter has something to count.
func reuseOnce(t *testing.T, m *Manager) {
	t.Helper()
	s, err := m.CreateStream()
	require.NoError(t, err)
	a := active(t, m, s, CacheOptions{}, seq(0, 8))
	require.NoError(t, a.Close())
	b := active(t, m, s, CacheOptions{}, seq(0, 9))
	b.Core().CommitPendingStats()
	require.Positive(t, b.Core().ReusedTokens())
}

// A get-and-reset query takes (and resets) its rows only when the room the
// caller has holds all of them: a size query (room 0) and a room too small
// return the number of rows and reset nothing.
func TestGetAndResetTakesOnlyWhatFits(t *testing.T) {
	m := newManager(t, Options{})
	reuseOnce(t, m)
	nlg, nlevels := m.Core().NumLayerGroups(), len(m.Core().Layout().Levels)

	for _, room := range []int{0, nlg - 1} {
		rows, n, err := m.GetAndResetLayerGroupIterationStats(room)
		require.NoError(t, err)
		assert.Nil(t, rows, "room %d", room)
		assert.Equal(t, nlg, n)
	}
	rows, n, err := m.GetAndResetLayerGroupIterationStats(nlg)
	require.NoError(t, err)
	require.Len(t, rows, nlg)
	assert.Equal(t, nlg, n)
	for i, r := range rows {
		assert.Equal(t, layout.LayerGroupID(i), r.LayerGroup, "rows are in layer group order")
	}
	assert.Positive(t, rows[0].FullReusedBlocks, "the size queries reset nothing")
	rows, _, err = m.GetAndResetLayerGroupIterationStats(nlg)
	require.NoError(t, err)
	assert.Zero(t, rows[0].FullReusedBlocks, "taking them reset them")

	levels, n, err := m.GetAndResetIterationCachedTokensByLevel(0)
	require.NoError(t, err)
	assert.Nil(t, levels)
	assert.Equal(t, nlevels, n)
	levels, _, err = m.GetAndResetIterationCachedTokensByLevel(nlevels)
	require.NoError(t, err)
	require.Len(t, levels, nlevels)
	assert.Positive(t, levels[layout.GPULevel])

	reused, n, err := m.GetAndResetIterationReusedBlocksByLevel(nlg*nlevels - 1)
	require.NoError(t, err)
	assert.Nil(t, reused)
	assert.Equal(t, nlg*nlevels, n)
	reused, _, err = m.GetAndResetIterationReusedBlocksByLevel(nlg * nlevels)
	require.NoError(t, err)
	require.Len(t, reused, nlg*nlevels)
	assert.Equal(t, ReusedBlocksAtLevel{LayerGroup: 0, Level: 1}, ReusedBlocksAtLevel{LayerGroup: reused[1].LayerGroup, Level: reused[1].Level},
		"rows are layer group major, then level")
	assert.Positive(t, reused[0].FullBlocks, "layer group 0 reused from the GPU level")
}

// Without SSM layers there are no snapshot rows: a query of any room
// returns none and needs none.
func TestGetAndResetSsmSnapshotWithoutSsmLayers(t *testing.T) {
	m := newManager(t, Options{})
	for _, room := range []int{0, 4} {
		rows, n, err := m.GetAndResetSsmSnapshotIterationStats(room)
		require.NoError(t, err)
		assert.Empty(t, rows)
		assert.Zero(t, n)
	}
}
