package abitest

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Beam search through the C ABI: the width's getter and setter, the page
// indices of each beam, a reordering commit, and the arguments it refuses.
func TestBeamSearchThroughTheABI(t *testing.T) {
	noLeaks(t)
	m, err := CreateManager(smallConfig(16, 0), nil)
	require.NoError(t, err)
	defer DestroyManager(m)
	s, err := CreateStream(m)
	require.NoError(t, err)
	c, err := CreateCacheV2(m, Scope{}, nil, false, 0)
	require.NoError(t, err)
	w, err := BeamWidth(c)
	require.NoError(t, err)
	assert.Equal(t, int32(1), w)
	requireCode(t, SetBeamWidth(c, 2), InvalidState)
	require.NoError(t, Resume(c, s))
	require.NoError(t, Resize(c, 6, -1))
	require.NoError(t, Commit(c, seq(1, 6), false))
	requireCode(t, SetBeamWidth(c, 0), InvalidArgument)
	require.NoError(t, SetBeamWidth(c, 2))

	zero, err := BeamPageIndices(c, 0, 0, 8)
	require.NoError(t, err)
	one, err := BeamPageIndices(c, 0, 1, 8)
	require.NoError(t, err)
	require.Len(t, one, 2)
	assert.Equal(t, zero[0], one[0], "the full block is shared")
	assert.NotEqual(t, zero[1], one[1], "the diverging block is copied")
	_, err = BeamPageIndices(c, 0, 2, 8)
	requireCode(t, err, InvalidArgument)
	_, err = BeamPageIndices(c, 0, 1, 1)
	requireCode(t, err, BufferTooSmall)

	requireCode(t, CommitBeamSearch(c, nil, nil, 2), InvalidArgument)
	requireCode(t, CommitBeamSearch(c, nil, []int32{0, 2}, 2), InvalidArgument)
	require.NoError(t, CommitBeamSearch(c, nil, []int32{1, 1}, 2))
	zero2, err := BeamPageIndices(c, 0, 0, 8)
	require.NoError(t, err)
	assert.Equal(t, one[1], zero2[1], "beam 0 took over beam 1's diverging block")
	require.NoError(t, CommitBeamSearch(c, nil, nil, 0), "NULL keeps the beams")
	require.NoError(t, CloseCache(c))
}
