package core

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The clamped length is the longest that fits the GPU slots next to
// batchSize-1 one-token requests: it can be allocated, one block more cannot.
func TestClampedSequenceLengthFitsAndOneBlockMoreDoesNot(t *testing.T) {
	for _, batch := range []int{1, 3} {
		f := newFixture(t, windowConfig())
		n, err := f.m.ClampMaxSeqLenForMem(batch, 1<<20)
		require.NoError(t, err)
		require.Positive(t, n)
		assert.Zero(t, n%tpb)
		short, err := f.m.ClampMaxSeqLenForMem(batch, 5)
		require.NoError(t, err)
		assert.Equal(t, 5, short, "an upper bound that fits is the answer")
		for range batch - 1 {
			c, err := f.m.CreateKVCache(CacheOptions{})
			require.NoError(t, err)
			require.NoError(t, c.Resume(f.stream))
			require.NoError(t, c.Resize(1, 1))
		}
		c, err := f.m.CreateKVCache(CacheOptions{})
		require.NoError(t, err)
		require.NoError(t, c.Resume(f.stream))
		require.NoError(t, c.Resize(n, n), "batch %d: %d tokens fit", batch, n)
		require.ErrorIs(t, c.Resize(n+tpb, n+tpb), ErrOutOfPages, "batch %d: one block more does not", batch)
	}
}

// A batch size below 1 is refused, naming it.
func TestClampNeedsAPositiveBatchSize(t *testing.T) {
	f := newFixture(t, smallConfig(64))
	_, err := f.m.ClampMaxSeqLenForMem(0, 100)
	require.ErrorIs(t, err, ErrInvalidArgument)
	assert.Contains(t, err.Error(), "batch_size")
}
