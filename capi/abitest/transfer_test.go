package abitest

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestAggregatedPagesCountsMembersAndBufferTooSmall: the run count is
// always written; members need one entry per buffer; a buffer too small
// writes nothing else; each run's members are positions in the buffers
// argument, in slot order.
func TestAggregatedPagesCountsMembersAndBufferTooSmall(t *testing.T) {
	noLeaks(t)
	m, err := CreateManager(smallConfig(8, 0), nil)
	require.NoError(t, err)
	defer func() { require.NoError(t, DestroyManager(m)) }()
	// One pool: 0/key, 0/value, 1/key, 1/value (64 bytes each).
	bufs := []BufferName{{1, "value"}, {0, "value"}, {0, "key"}}

	_, n, err := GetAggregatedPages(m, bufs, 0, 0)
	require.NoError(t, err, "NULL buffers with capacity 0 ask for the count")
	assert.Equal(t, 2, n)
	_, n, err = GetAggregatedPages(m, bufs, 2, 2)
	requireCode(t, err, BufferTooSmall, "3 members")
	assert.Equal(t, 2, n)
	_, _, err = GetAggregatedPages(m, bufs, 1, 3)
	requireCode(t, err, BufferTooSmall, "2 descriptors")

	runs, n, err := GetAggregatedPages(m, bufs, 2, 3)
	require.NoError(t, err)
	require.Equal(t, 2, n)
	k0, err := GetBufferLocation(m, 0, "key")
	require.NoError(t, err)
	assert.Equal(t, []AggregatedPage{
		{Base: k0.PoolBase, Size: 128, Stride: pageBytes, Members: []int{2, 1}, Expansions: []int32{1, 1}},
		{Base: k0.PoolBase + 192, Size: 64, Stride: pageBytes, Members: []int{0}, Expansions: []int32{1}},
	}, runs)

	_, _, err = GetAggregatedPages(m, []BufferName{{0, "key"}, {2, "key"}}, 2, 2)
	requireCode(t, err, InvalidArgument, "buffers[1]")
}

// TestAggregatedPageIndicesAreBasePageIndices: for beam 0 the indices are
// the base page indices (valid_only drops BAD ones); beam 1 is refused.
func TestAggregatedPageIndicesAreBasePageIndices(t *testing.T) {
	noLeaks(t)
	m, err := CreateManager(smallConfig(8, 0), nil)
	require.NoError(t, err)
	defer func() { require.NoError(t, DestroyManager(m)) }()
	s, err := CreateStream(m)
	require.NoError(t, err)
	c, err := CreateCache(m, 0, "", seq(0, 12))
	require.NoError(t, err)
	defer func() { require.NoError(t, CloseCache(c)) }()
	require.NoError(t, Resume(c, s))
	require.NoError(t, Resize(c, 12, 12))

	_, n, err := AggregatedPageIndices(c, 0, 0, false, 0)
	require.NoError(t, err)
	assert.Equal(t, 3, n)
	idx, _, err := AggregatedPageIndices(c, 0, 0, true, 3)
	require.NoError(t, err)
	base, _, err := BasePageIndices(c, 0, 3)
	require.NoError(t, err)
	assert.Equal(t, base, idx)
	_, _, err = AggregatedPageIndices(c, 0, 1, false, 3)
	requireCode(t, err, InvalidArgument, "beam")
}
