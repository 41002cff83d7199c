package staging

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core/device"
)

func TestIndexRingIsAllocatedLazilyOnFirstUse(t *testing.T) {
	d := newFakeDevice(t)
	codec := d.stream(t)
	x, err := NewIndexRing(d, 0)
	require.NoError(t, err)
	assert.False(t, x.Allocated(), "construction allocates nothing")
	assert.Nil(t, x.Ring())
	assert.Zero(t, d.countAllocs())
	assert.Equal(t, DefaultIndexRingBytes, x.Capacity())

	b, err := x.Acquire(1, MaxIndexBatchPairs, codec)
	require.NoError(t, err)
	assert.True(t, x.Allocated())
	assert.Equal(t, 1, d.countAllocs())
	assert.Equal(t, device.DeviceMemory, x.Ring().Kind())
	assert.Equal(t, MaxIndexBatchBytes, b.Size())
	assert.Zero(t, uint64(b.Ptr())%uint64(IndexAlignment))
	assert.Nil(t, b.Host(), "device staging has no host view")
	require.NoError(t, b.Release())

	// Reuse: later batches come from the same allocation.
	for range 10 {
		b, err = x.Acquire(100, 100, codec)
		require.NoError(t, err)
		assert.EqualValues(t, 800, b.Size())
		require.NoError(t, b.Release())
	}
	assert.Equal(t, 1, d.countAllocs())
	require.NoError(t, codec.Synchronize())
	require.NoError(t, x.Close())
	assert.True(t, d.mems[0].freed)
}

func TestIndexRingNeverUsedAllocatesNothing(t *testing.T) {
	d := newFakeDevice(t)
	x, err := NewIndexRing(d, 0)
	require.NoError(t, err)
	require.NoError(t, x.Close())
	assert.Zero(t, d.countAllocs())
	assert.ErrorIs(t, x.Close(), ErrClosed)
	_, err = x.Acquire(1, 1, nil)
	assert.ErrorIs(t, err, ErrClosed)
}

func TestIndexRingRetriesAllocationAfterFailure(t *testing.T) {
	d := newFakeDevice(t)
	x, err := NewIndexRing(d, 0)
	require.NoError(t, err)
	d.failAlloc = device.ErrOutOfMemory
	_, err = x.Acquire(1, 1, nil)
	require.ErrorIs(t, err, device.ErrOutOfMemory)
	assert.False(t, x.Allocated())
	d.failAlloc = nil
	b, err := x.Acquire(1, 1, nil)
	require.NoError(t, err)
	assert.True(t, x.Allocated())
	require.ErrorIs(t, x.Close(), ErrLiveLeases)
	require.NoError(t, b.Release())
	require.NoError(t, x.Close())
}

func TestIndexRingValidation(t *testing.T) {
	d := newFakeDevice(t)
	_, err := NewIndexRing(d, MaxIndexBatchBytes-8)
	assert.Error(t, err, "must hold one maximal batch")
	_, err = NewIndexRing(d, MaxIndexBatchBytes+4)
	assert.Error(t, err, "must be a multiple of the pair size")
	_, err = NewIndexRing(nil, 0)
	assert.Error(t, err)

	x, err := NewIndexRing(d, 0)
	require.NoError(t, err)
	for _, c := range [][2]int{{0, 1}, {2, 1}, {1, MaxIndexBatchPairs + 1}} {
		_, err = x.Acquire(c[0], c[1], nil)
		assert.ErrorIs(t, err, ErrInvalidRequest, "%v", c)
	}
	assert.False(t, x.Allocated(), "invalid requests do not allocate")
}

// Under capacity pressure the index ring fails instead of waiting; released
// slices are reusable at once by the codec stream (it waits on their events).
func TestIndexRingCapacityPressure(t *testing.T) {
	d := newFakeDevice(t)
	codec := d.stream(t)
	rel := codec.Hold() // codec work outstanding: no event completes
	defer rel()
	x, err := NewIndexRing(d, 0)
	require.NoError(t, err)
	var leases []*StagingBuffer
	for range IndexRingBatches {
		b, err := x.Acquire(MaxIndexBatchPairs, MaxIndexBatchPairs, codec)
		require.NoError(t, err)
		leases = append(leases, b)
	}
	var ferr error
	done := start(func() { _, ferr = x.Acquire(1, 1, codec) })
	require.True(t, finished(done, 2*time.Second), "no waiting under pressure")
	require.ErrorIs(t, ferr, ErrRingFull)

	require.NoError(t, leases[0].Release()) // event pending on the held stream
	d.takeLog()
	done = start(func() {
		var b *StagingBuffer
		b, ferr = x.Acquire(1, MaxIndexBatchPairs, codec)
		if ferr == nil {
			leases[0] = b
		}
	})
	require.True(t, finished(done, 2*time.Second), "a stream acquisition of pending bytes does not block")
	require.NoError(t, ferr)
	assert.Equal(t, MaxIndexBatchBytes, leases[0].Size())
	assert.Equal(t, []string{"wait s1 e1"}, d.takeLog())
	rel()
	for _, b := range leases {
		require.NoError(t, b.Release())
	}
	require.NoError(t, x.Close())
}

// A device-index codec flow: a large batch is chunked at 64 KiB and each
// chunk is staged on the codec stream; a ring of several batches cycles.
func TestIndexRingChunkedBatchFlow(t *testing.T) {
	d := newFakeDevice(t)
	codec := d.stream(t)
	x, err := NewIndexRing(d, 0)
	require.NoError(t, err)
	const pairs = 5*MaxIndexBatchPairs + 123
	total := 0
	for _, c := range IndexChunks(pairs) {
		b, err := x.Acquire(c.Count, c.Count, codec)
		require.NoError(t, err)
		require.Equal(t, c.Bytes(), b.Size())
		require.NoError(t, codec.BatchCopy([]device.CopyDesc{{Dst: b.Ptr(), Src: 0, Size: c.Bytes()}}))
		require.NoError(t, codec.HostFunc(func() error { return nil })) // "codec work"
		require.NoError(t, b.Release())
		total += c.Count
	}
	assert.Equal(t, pairs, total)
	assert.Equal(t, 1, d.countAllocs())
	require.NoError(t, x.Close())
}

func TestIndexChunksSplitAt64KiB(t *testing.T) {
	assert.Equal(t, 8192, MaxIndexBatchPairs)
	assert.EqualValues(t, 64<<10, MaxIndexBatchBytes)
	assert.Nil(t, IndexChunks(0))
	assert.Nil(t, IndexChunks(-1))
	assert.Equal(t, []IndexChunk{{0, 1}}, IndexChunks(1))
	assert.Equal(t, []IndexChunk{{0, 8192}}, IndexChunks(8192))
	assert.Equal(t, []IndexChunk{{0, 8192}, {8192, 1}}, IndexChunks(8193))
	assert.Equal(t, []IndexChunk{{0, 8192}, {8192, 8192}, {16384, 3616}}, IndexChunks(20000))
	for _, n := range []int{1, 8191, 8192, 8193, 3*8192 + 7, math.MaxInt32} {
		cs := IndexChunks(n)
		next := 0
		for i, c := range cs {
			require.Equal(t, next, c.Start)
			require.LessOrEqual(t, c.Bytes(), MaxIndexBatchBytes)
			if i < len(cs)-1 {
				require.Equal(t, MaxIndexBatchPairs, c.Count, "all chunks but the last are full")
			}
			next += c.Count
		}
		require.Equal(t, n, next)
	}
}

func TestIndexRingUploadStagesOneChunkOnTheStream(t *testing.T) {
	d := newFakeDevice(t)
	codec := d.stream(t)
	x, err := NewIndexRing(d, 0)
	require.NoError(t, err)
	pairs := []byte{1, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0, 4, 0, 0, 0}
	d.takeLog()
	b, err := x.Upload(pairs, codec)
	require.NoError(t, err)
	assert.Equal(t, []string{"alloc device 262144", "h2d s1 16"}, d.takeLog())
	assert.EqualValues(t, 16, b.Size())
	assert.Equal(t, device.Stream(codec), b.Stream())
	require.NoError(t, codec.Synchronize())
	m := d.mems[0]
	assert.Equal(t, pairs, m.buf[b.Ptr()-m.ptr:][:16])
	require.NoError(t, b.Release())

	for _, bad := range [][]byte{nil, make([]byte, 12), make([]byte, MaxIndexBatchBytes+8)} {
		_, err = x.Upload(bad, codec)
		assert.ErrorIs(t, err, ErrInvalidRequest, "%d bytes", len(bad))
	}
	_, err = x.Upload(pairs, nil)
	assert.ErrorIs(t, err, ErrInvalidRequest)
	require.NoError(t, codec.Synchronize())
	require.NoError(t, x.Close())
}
