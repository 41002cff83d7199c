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
	requireCode(t, err, BufferTooSmall, "2 descs")

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
// the base page indices (valid_only drops BAD ones); a beam outside the
// beam width is refused, and within it the indices are the beam's.
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

	require.NoError(t, SetBeamWidth(c, 2))
	for beam := range int32(2) {
		idx, _, err := AggregatedPageIndices(c, 0, beam, false, 3)
		require.NoError(t, err)
		want, err := BeamPageIndices(c, 0, beam, 3)
		require.NoError(t, err)
		assert.Equal(t, want, idx, "beam %d", beam)
	}
}

// TestBlockKeysWithDigestsThroughTheABI: kvcm_block_keys gives the
// specified keys (blockkeys.keys' image line), counts with a NULL buffer,
// and refuses digest bytes that are not 32 per digest, and misplaced
// digests, naming them.
func TestBlockKeysWithDigestsThroughTheABI(t *testing.T) {
	a := make([]byte, 32)
	for i := range a {
		a[i] = byte(i)
	}
	toks := []int32{1, 2, 3, 4, 0, 1001, 1002, 1003, 5}
	_, n, err := BlockKeys(4, toks, []uint64{4}, a, true, 0)
	require.NoError(t, err)
	assert.Equal(t, 3, n)
	keys, _, err := BlockKeys(4, toks, []uint64{4}, a, true, 3)
	require.NoError(t, err)
	assert.Equal(t, []uint64{0x360d651c5f3d3835, 0x49318da9655b654e, 0x514815ef05d2367b}, keys)
	_, _, err = BlockKeys(4, toks, []uint64{4}, a, true, 2)
	requireCode(t, err, BufferTooSmall)

	_, _, err = BlockKeys(4, toks, []uint64{4}, a[:31], true, 3)
	requireCode(t, err, InvalidArgument, "digest_positions", "1 digests need 32 digest bytes, got 31")
	_, _, err = BlockKeys(4, toks, []uint64{9}, a, true, 3)
	requireCode(t, err, InvalidArgument, "position 9 outside the 9 tokens")
}
