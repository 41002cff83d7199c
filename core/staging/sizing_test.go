package staging

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core/device"
)

func TestPageRingBytes(t *testing.T) {
	const MiB = int64(1) << 20
	for _, c := range []struct{ page, want int64 }{
		{1, 64 * MiB},
		{4096, 64 * MiB},
		{21 * MiB, 64 * MiB},
		{22 * MiB, 66 * MiB},
		{30 * MiB, 90 * MiB},
		{math.MaxInt64 / 3, math.MaxInt64 / 3 * 3},
	} {
		got, err := PageRingBytes(c.page)
		require.NoError(t, err, "%d", c.page)
		assert.Equal(t, c.want, got, "max(64 MiB, 3*%d)", c.page)
	}
	_, err := PageRingBytes(math.MaxInt64/3 + 1)
	assert.ErrorContains(t, err, "overflow", "checked multiplication")
	_, err = PageRingBytes(math.MaxInt64)
	assert.ErrorContains(t, err, "overflow")
	_, err = PageRingBytes(0)
	assert.ErrorIs(t, err, ErrBadPageSize, "a zero cold-page size is a codec failure")
	_, err = PageRingBytes(-1)
	assert.ErrorIs(t, err, ErrBadPageSize)
}

func TestNewPageRingIsPinnedHostMemory(t *testing.T) {
	d := newFakeDevice(t)
	r, err := NewPageRing(d, 30<<20)
	require.NoError(t, err)
	assert.Equal(t, device.HostMapped, r.Kind())
	assert.EqualValues(t, 90<<20, r.Capacity())
	require.NoError(t, r.Close())
	_, err = NewPageRing(d, 0)
	assert.Error(t, err)
}

func TestPageRequest(t *testing.T) {
	assert.EqualValues(t, 8, PageAlignment(3000))
	assert.EqualValues(t, 32, PageAlignment(96))
	assert.EqualValues(t, 1, PageAlignment(3))
	assert.EqualValues(t, MaxPageAlignment, PageAlignment(2<<20))

	q, err := PageRequest(3000, 2, 5)
	require.NoError(t, err)
	assert.Equal(t, Request{Min: 6000, Max: 15000, Granularity: 3000, Alignment: 8}, q)
	_, err = q.normalize()
	require.NoError(t, err, "a page request is always valid")

	_, err = PageRequest(0, 1, 1)
	assert.ErrorIs(t, err, ErrBadPageSize)
	_, err = PageRequest(4096, 0, 1)
	assert.ErrorIs(t, err, ErrInvalidRequest)
	_, err = PageRequest(4096, 2, 1)
	assert.ErrorIs(t, err, ErrInvalidRequest)
	_, err = PageRequest(1<<40, 1, 1<<30)
	assert.ErrorIs(t, err, ErrInvalidRequest, "overflow")

	// Disk staging through the page ring: whole pages, page-aligned granules.
	d := newFakeDevice(t)
	d.base += 8
	r, err := NewRing(d, device.HostMapped, 64<<10)
	require.NoError(t, err)
	q, err = PageRequest(3000, 1, 100)
	require.NoError(t, err)
	b, err := r.Acquire(q, nil)
	require.NoError(t, err)
	assert.Zero(t, b.Size()%3000)
	assert.EqualValues(t, (64<<10)/3000*3000, b.Size())
	assert.Zero(t, uint64(b.Ptr())%8)
	require.NoError(t, b.Release())
	require.NoError(t, r.Close())
}
