package staging

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core/device"
)

func rq(minB, maxB, gran, align int64) Request {
	return Request{Min: minB, Max: maxB, Granularity: gran, Alignment: align}
}

func newRing(t *testing.T, d *fakeDevice, kind device.MemoryKind, size int64) *Ring {
	t.Helper()
	r, err := NewRing(d, kind, size)
	require.NoError(t, err)
	return r
}

func off(r *Ring, b *StagingBuffer) int64 { return int64(b.Ptr() - r.Base()) }

func acquire(t *testing.T, r *Ring, q Request, s device.Stream) *StagingBuffer {
	t.Helper()
	b, err := r.Acquire(q, s)
	require.NoError(t, err)
	return b
}

// start runs f on a goroutine; the returned channel is closed when f returns.
func start(f func()) <-chan struct{} {
	done := make(chan struct{})
	go func() { defer close(done); f() }()
	return done
}

// finished reports whether ch is closed within d.
func finished(ch <-chan struct{}, d time.Duration) bool {
	select {
	case <-ch:
		return true
	case <-time.After(d):
		return false
	}
}

func TestRingDerivesKindAndBaseFromItsAllocation(t *testing.T) {
	d := newFakeDevice(t)
	r := newRing(t, d, device.HostMapped, 4096)
	mem := d.mems[0]
	assert.Equal(t, device.HostMapped, r.Kind())
	assert.Equal(t, mem.Ptr(), r.Base())
	assert.EqualValues(t, 4096, r.Capacity())
	assert.Equal(t, "R[0,4096)", layout(r))

	b := acquire(t, r, rq(100, 100, 100, 4), nil)
	assert.Equal(t, r.Base(), b.Ptr())
	assert.EqualValues(t, 100, b.Size())
	assert.Equal(t, device.HostMapped, b.Kind())
	h := b.Host()
	require.Len(t, h, 100)
	assert.Equal(t, 100, cap(h), "the host view must not reach past the lease")
	h[0] = 7
	assert.EqualValues(t, 7, mem.buf[0], "the host view aliases the ring memory")
	require.NoError(t, b.Release())
	require.NoError(t, r.Close())

	dr := newRing(t, d, device.DeviceMemory, 4096)
	assert.Equal(t, device.DeviceMemory, dr.Kind())
	db := acquire(t, dr, rq(8, 8, 8, 8), nil)
	assert.Nil(t, db.Host(), "device memory has no host view")
	require.NoError(t, db.Release())
	require.NoError(t, dr.Close())
}

func TestNewRingRejectsBadArguments(t *testing.T) {
	d := newFakeDevice(t)
	_, err := NewRing(d, device.HostMapped, 0)
	assert.Error(t, err)
	_, err = NewRing(nil, device.HostMapped, 64)
	assert.Error(t, err)
	d.failAlloc = device.ErrOutOfMemory
	_, err = NewRing(d, device.HostMapped, 64)
	assert.ErrorIs(t, err, device.ErrOutOfMemory)
}

func TestNextFitScansFromCursorSkipsLiveRangesAndWrapsOnce(t *testing.T) {
	d := newFakeDevice(t)
	r := newRing(t, d, device.HostMapped, 1024)
	q := rq(256, 256, 64, 64)

	a := acquire(t, r, q, nil)
	b := acquire(t, r, q, nil)
	c := acquire(t, r, q, nil)
	e := acquire(t, r, q, nil)
	assert.Equal(t, []int64{0, 256, 512, 768}, []int64{off(r, a), off(r, b), off(r, c), off(r, e)})
	assert.EqualValues(t, 1024, r.cursor)

	_, err := r.Acquire(q, nil)
	require.ErrorIs(t, err, ErrRingFull)
	assert.EqualValues(t, 1024, r.cursor, "cursor unchanged on failure")

	require.NoError(t, a.Release())
	require.NoError(t, c.Release())
	assert.Equal(t, "R[0,256) L[256,512) R[512,768) L[768,1024)", layout(r))

	// Nothing after the cursor: the one extra pass from the beginning finds a's bytes.
	a2 := acquire(t, r, q, nil)
	assert.EqualValues(t, 0, off(r, a2))
	assert.EqualValues(t, 256, r.cursor, "cursor moves to the end of the new lease")

	// From the cursor the scan skips live b and takes c's bytes.
	c2 := acquire(t, r, q, nil)
	assert.EqualValues(t, 512, off(r, c2))
	assert.EqualValues(t, 768, r.cursor)

	before := layout(r)
	_, err = r.Acquire(q, nil)
	require.ErrorIs(t, err, ErrRingFull)
	assert.EqualValues(t, 768, r.cursor, "cursor unchanged on failure")
	assert.Equal(t, before, layout(r), "partition unchanged on failure")
	assert.Empty(t, d.takeLog()[1:], "only the allocation was logged: no waits, no syncs")
}

func TestNextFitPrefersBytesAfterTheCursor(t *testing.T) {
	d := newFakeDevice(t)
	r := newRing(t, d, device.HostMapped, 1024)
	q := rq(128, 128, 128, 128)
	x := acquire(t, r, q, nil)
	acquire(t, r, q, nil)
	require.NoError(t, x.Release())
	z := acquire(t, r, q, nil)
	assert.EqualValues(t, 256, off(r, z), "next fit, not first fit: free bytes at 0 are behind the cursor")
}

func TestExtraPassConsidersARunStraddlingTheCursorWhole(t *testing.T) {
	d := newFakeDevice(t)
	r := newRing(t, d, device.HostMapped, 1024)
	a := acquire(t, r, rq(192, 192, 64, 64), nil)
	acquire(t, r, rq(64, 1<<20, 64, 64), nil) // the rest, live
	require.NoError(t, a.Release())
	c := acquire(t, r, rq(64, 64, 64, 64), nil)
	require.NoError(t, c.Release())
	assert.Equal(t, "R[0,192) L[192,1024)", layout(r))
	assert.EqualValues(t, 64, r.cursor)

	// Pass 1 sees only [64,192) (128 bytes); pass 2 sees the whole run [0,192).
	b := acquire(t, r, rq(192, 192, 64, 64), nil)
	assert.EqualValues(t, 0, off(r, b))
	assert.EqualValues(t, 192, r.cursor)
}

func TestFullRingFailsInsteadOfWaiting(t *testing.T) {
	d := newFakeDevice(t)
	s := d.stream(t)
	release := s.Hold()
	defer release()
	r := newRing(t, d, device.HostMapped, 512)
	acquire(t, r, rq(256, 256, 256, 256), s)
	acquire(t, r, rq(256, 256, 256, 256), nil)
	d.takeLog()

	var err error
	done := start(func() { _, err = r.Acquire(rq(1, 1, 1, 1), nil) })
	require.True(t, finished(done, 2*time.Second), "a full ring must fail, not wait for a live lease")
	assert.ErrorIs(t, err, ErrRingFull)
	done = start(func() { _, err = r.Acquire(rq(1, 1, 1, 1), s) })
	require.True(t, finished(done, 2*time.Second))
	assert.ErrorIs(t, err, ErrRingFull)
	assert.Empty(t, d.takeLog())
	assert.EqualValues(t, 512, r.cursor)
}

func TestRetiredBytesWithPendingEventsAreNotFullForAStream(t *testing.T) {
	d := newFakeDevice(t)
	s1, s2 := d.stream(t), d.stream(t)
	release := s1.Hold()
	defer release()
	r := newRing(t, d, device.HostMapped, 512)
	b := acquire(t, r, rq(512, 512, 512, 512), s1)
	require.NoError(t, b.Release())
	d.takeLog()

	var b2 *StagingBuffer
	var err error
	done := start(func() { b2, err = r.Acquire(rq(512, 512, 512, 512), s2) })
	require.True(t, finished(done, 2*time.Second), "a stream acquisition enqueues a wait; it does not block the host")
	require.NoError(t, err)
	assert.Equal(t, []string{"wait s2 e1"}, d.takeLog())
	assert.Equal(t, device.Stream(s2), b2.Stream())
}

func TestSizeRoundingMinUpMaxDown(t *testing.T) {
	d := newFakeDevice(t)
	r := newRing(t, d, device.HostMapped, 1024)

	// Non-power-of-two granularity 24, a multiple of alignment 8.
	b := acquire(t, r, rq(30, 100, 24, 8), nil)
	assert.EqualValues(t, 96, b.Size(), "max 100 rounds down to 96")
	require.NoError(t, b.Release())

	// From the cursor (96) 928 bytes are available, below Max: the available
	// size rounds down to 912.
	b = acquire(t, r, rq(30, 1000, 24, 8), nil)
	assert.EqualValues(t, 96, off(r, b))
	assert.EqualValues(t, 912, b.Size())
	require.NoError(t, b.Release())

	// Leave exactly 40 retired bytes at the end of the ring, behind a live lease.
	r2 := newRing(t, d, device.HostMapped, 1024)
	acquire(t, r2, rq(984, 984, 8, 8), nil)
	_, err := r2.Acquire(rq(30, 100, 24, 8), nil)
	assert.ErrorIs(t, err, ErrRingFull, "min 30 rounds up to 48 > 40 available")
	small := acquire(t, r2, rq(20, 100, 24, 8), nil)
	assert.EqualValues(t, 24, small.Size(), "min 20 rounds up to 24; the 40 available round down to 24")
	assert.EqualValues(t, 984, off(r2, small))
	assert.Zero(t, uint64(small.Ptr())%8)
	assert.Equal(t, "L[0,984) L[984,1008) R[1008,1024)", layout(r2), "end slack stays retired")
}

func TestGranularitySlicesInsideALeaseAreAligned(t *testing.T) {
	d := newFakeDevice(t)
	d.base += 8 // misaligned for 16
	r := newRing(t, d, device.HostMapped, 4096)
	b := acquire(t, r, rq(48, 4096, 48, 16), nil)
	for o := int64(0); o < b.Size(); o += 48 {
		assert.Zero(t, uint64(b.Ptr().Add(o))%16, "granule at %d", o)
	}
	assert.Zero(t, b.Size()%48)
}

func TestRequestValidation(t *testing.T) {
	d := newFakeDevice(t)
	r := newRing(t, d, device.HostMapped, 1024)
	cases := []struct {
		name string
		q    Request
		want string
	}{
		{"zero granularity", rq(8, 8, 0, 8), "Granularity 0"},
		{"negative granularity", rq(8, 8, -8, 8), "Granularity -8"},
		{"zero alignment", rq(8, 8, 8, 0), "Alignment 0"},
		{"non power of two alignment", rq(24, 24, 24, 12), "Alignment 12"},
		{"granularity not a multiple of alignment", rq(20, 20, 20, 8), "Granularity 20 must be a multiple of Alignment 8"},
		{"zero min", rq(0, 8, 8, 8), "Min 0"},
		{"max below min", rq(16, 8, 8, 8), "Max 8 is below Min 16"},
		{"no multiple in range", rq(25, 40, 24, 8), "no multiple of Granularity 24"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := r.Acquire(c.q, nil)
			require.ErrorIs(t, err, ErrInvalidRequest)
			assert.Contains(t, err.Error(), c.want)
		})
	}
	_, err := r.Acquire(rq(1025, 2048, 1, 1), nil)
	assert.ErrorIs(t, err, ErrRequestTooLarge)
	_, err = r.Acquire(rq(1000, 2048, 1000, 8), nil)
	assert.NoError(t, err)
	_, err = r.Acquire(rq(1, 1<<62, 1<<61, 1), nil)
	assert.ErrorIs(t, err, ErrRequestTooLarge, "min rounds up to a granule larger than the ring")
	assert.EqualValues(t, 1000, r.cursor)
}

func TestAlignmentIsOfTheAbsoluteAddressAndPaddingStaysRetired(t *testing.T) {
	d := newFakeDevice(t)
	d.base += 8
	r := newRing(t, d, device.HostMapped, 1024)
	b := acquire(t, r, rq(64, 1<<20, 64, 64), nil)
	assert.Zero(t, uint64(b.Ptr())%64)
	assert.EqualValues(t, 56, off(r, b))
	assert.EqualValues(t, 960, b.Size())
	assert.Equal(t, "R[0,56) L[56,1016) R[1016,1024)", layout(r),
		"only the payload is live; alignment padding and end slack stay retired")
	assert.EqualValues(t, 1016, r.cursor)
}

// Padding that covers several previous ranges stays split at their
// boundaries; each fragment keeps its own event, and a later acquisition of
// those bytes waits on every one of them.
func TestPaddingFragmentsKeepTheirOwnEvents(t *testing.T) {
	d := newFakeDevice(t)
	s1, s2, s3, s4, s5 := d.stream(t), d.stream(t), d.stream(t), d.stream(t), d.stream(t)
	r := newRing(t, d, device.HostMapped, 1024)
	q16 := rq(16, 16, 16, 16)
	p := acquire(t, r, q16, nil)
	b := acquire(t, r, q16, s1)
	c := acquire(t, r, q16, s2)
	e := acquire(t, r, q16, s3)
	rest := acquire(t, r, rq(16, 1<<20, 16, 16), nil)
	rel1, rel2, rel3 := s1.Hold(), s2.Hold(), s3.Hold()
	defer rel1()
	defer rel2()
	defer rel3()
	require.NoError(t, b.Release())
	require.NoError(t, c.Release())
	require.NoError(t, e.Release())
	require.NoError(t, rest.Release())
	assert.Equal(t, "L[0,16) R[16,32)e1 R[32,48)e2 R[48,64)e3 R[64,1024)", layout(r))
	d.takeLog()

	// 64-byte alignment: the payload starts at 64; the padding [16,64) spans
	// three previous ranges and stays split at their boundaries.
	x := acquire(t, r, rq(64, 64, 64, 64), s4)
	assert.EqualValues(t, 64, off(r, x))
	assert.Equal(t, "L[0,16) R[16,32)e1 R[32,48)e2 R[48,64)e3 L[64,128) R[128,1024)", layout(r))
	assert.Empty(t, d.takeLog(), "the payload had no event; padding events are neither waited on nor closed")
	for _, n := range []string{"e1", "e2", "e3"} {
		assert.Equal(t, 1, refs(t, r, n))
	}

	// Now take the padding bytes (and P's) on s5: it must wait on all three.
	require.NoError(t, p.Release())
	acquire(t, r, rq(16, 1<<20, 16, 16), nil) // [128,1024) live, so the scan wraps
	d.takeLog()
	y := acquire(t, r, rq(64, 64, 16, 16), s5)
	assert.EqualValues(t, 0, off(r, y))
	assert.Equal(t, []string{"wait s5 e1", "wait s5 e2", "wait s5 e3"}, d.takeLog())
	ran := make(chan struct{})
	require.NoError(t, s5.HostFunc(func() error { close(ran); return nil }))
	rel1()
	rel3()
	assert.False(t, finished(ran, 50*time.Millisecond), "s5 must still wait for s2's event")
	rel2()
	assert.True(t, finished(ran, 2*time.Second))

	// Unreferenced but possibly still awaited: closed once complete, each once.
	_, err := r.Acquire(q16, nil) // reaps; the ring is full
	require.ErrorIs(t, err, ErrRingFull)
	for _, n := range []string{"e1", "e2", "e3"} {
		assert.Equal(t, 1, d.event(n).closeCount(), n)
	}
}

func TestPaddingInsideOneRangeSharesItsEventUntilSynchronized(t *testing.T) {
	d := newFakeDevice(t)
	d.base += 32
	s1, s2 := d.stream(t), d.stream(t)
	r := newRing(t, d, device.HostMapped, 1024)
	all := acquire(t, r, rq(1024, 1024, 32, 32), s1)
	rel := s1.Hold()
	defer rel()
	require.NoError(t, all.Release())
	d.takeLog()

	x := acquire(t, r, rq(128, 128, 64, 64), s2)
	assert.EqualValues(t, 32, off(r, x))
	assert.Equal(t, "R[0,32)e1 L[32,160) R[160,1024)e1", layout(r))
	assert.Equal(t, 2, refs(t, r, "e1"))
	assert.Equal(t, []string{"wait s2 e1"}, d.takeLog(), "waited on, not invalidated")
	assert.Zero(t, d.event("e1").closeCount())

	// A synchronous acquisition of the tail synchronizes e1; it is complete,
	// so it is dropped from every fragment and closed exactly once.
	var y *StagingBuffer
	var err error
	done := start(func() { y, err = r.Acquire(rq(64, 64, 64, 64), nil) })
	assert.False(t, finished(done, 50*time.Millisecond), "synchronous acquisition waits for the previous owner")
	rel()
	require.True(t, finished(done, 2*time.Second))
	require.NoError(t, err)
	assert.EqualValues(t, 160, off(r, y))
	assert.Equal(t, []string{"evsync e1", "close e1"}, d.takeLog())
	assert.Equal(t, "R[0,32) L[32,160) L[160,224) R[224,1024)", layout(r))
	assert.Equal(t, 1, d.event("e1").closeCount())
}

func TestSharedEventIsClosedOnlyWhenNoFragmentReferencesIt(t *testing.T) {
	d := newFakeDevice(t)
	d.base += 32
	s1, s2 := d.stream(t), d.stream(t)
	r := newRing(t, d, device.HostMapped, 1024)
	all := acquire(t, r, rq(1024, 1024, 32, 32), s1)
	rel := s1.Hold()
	defer rel()
	require.NoError(t, all.Release())
	e1 := d.event("e1")

	acquire(t, r, rq(128, 128, 64, 64), s2)
	assert.Equal(t, 2, refs(t, r, "e1"))
	tail := acquire(t, r, rq(32, 1<<20, 32, 32), s2)
	assert.EqualValues(t, 160, off(r, tail))
	assert.Equal(t, 1, refs(t, r, "e1"))
	head := acquire(t, r, rq(32, 1<<20, 32, 32), s2)
	assert.EqualValues(t, 0, off(r, head))
	assert.Equal(t, 0, refs(t, r, "e1"))
	assert.Equal(t, "L[0,32) L[32,160) L[160,1024)", layout(r))
	assert.Zero(t, e1.closeCount(), "s2 may still be waiting on e1")
	require.Len(t, r.draining, 1)

	_, err := r.Acquire(rq(1, 1, 1, 1), nil)
	require.ErrorIs(t, err, ErrRingFull)
	assert.Zero(t, e1.closeCount(), "still pending")
	rel()
	require.NoError(t, e1.Synchronize())
	_, err = r.Acquire(rq(1, 1, 1, 1), nil)
	require.ErrorIs(t, err, ErrRingFull)
	assert.Equal(t, 1, e1.closeCount(), "closed once complete and unreferenced")
	assert.Empty(t, r.draining)
}

func TestAdjacentRetiredRangesMergeOnlyWithoutLosingProtection(t *testing.T) {
	d := newFakeDevice(t)
	s1 := d.stream(t)
	r := newRing(t, d, device.HostMapped, 1024)
	q := rq(256, 256, 256, 256)
	a, b, c, e := acquire(t, r, q, nil), acquire(t, r, q, nil), acquire(t, r, q, s1), acquire(t, r, q, s1)
	require.NoError(t, a.Release())
	require.NoError(t, b.Release())
	assert.Equal(t, "R[0,512) L[512,768) L[768,1024)", layout(r), "two ranges without events merge")
	require.NoError(t, c.Release())
	require.NoError(t, e.Release())
	assert.Equal(t, "R[0,512) R[512,768)e1 R[768,1024)e2", layout(r), "ranges with different events stay apart")
}

// The core guarantee of synchronous acquisition: the previous owner's
// asynchronous work is complete before Acquire returns, so the CPU may
// overwrite the bytes at once.
func TestSynchronousAcquisitionCompletesPreviousOwnerBeforeCPUOverwrite(t *testing.T) {
	d := newFakeDevice(t)
	s1 := d.stream(t)
	r := newRing(t, d, device.HostMapped, 256)
	b := acquire(t, r, rq(256, 256, 256, 256), s1)
	rel := s1.Hold()
	defer rel()
	h := b.Host()
	var written bool
	require.NoError(t, s1.HostFunc(func() error {
		time.Sleep(10 * time.Millisecond)
		for i := range h {
			h[i] = 0xAA
		}
		written = true
		return nil
	}))
	require.NoError(t, b.Release())
	d.takeLog()

	var nb *StagingBuffer
	var err error
	var sawWritten bool
	done := start(func() {
		nb, err = r.Acquire(rq(256, 256, 256, 256), nil)
		sawWritten = written
	})
	assert.False(t, finished(done, 50*time.Millisecond), "acquire must not return while the old owner's work is pending")
	rel()
	require.True(t, finished(done, 2*time.Second))
	require.NoError(t, err)
	assert.True(t, sawWritten, "the previous owner's work completed before Acquire returned")
	assert.Nil(t, nb.Stream())
	for i := range nb.Host() {
		nb.Host()[i] = 0x55
	}
	require.NoError(t, s1.Synchronize())
	for _, v := range nb.Host() {
		require.EqualValues(t, 0x55, v, "no late write of the previous owner clobbers the CPU's data")
	}
	assert.Equal(t, []string{"evsync e1", "close e1", "sync s1"}, d.takeLog())
}

func TestSynchronousAcquisitionReportsAsyncFailureOfPreviousOwner(t *testing.T) {
	d := newFakeDevice(t)
	s1 := d.stream(t)
	r := newRing(t, d, device.HostMapped, 256)
	b := acquire(t, r, rq(128, 128, 128, 128), s1)
	require.NoError(t, s1.HostFunc(func() error { return device.ErrInjected }))
	require.NoError(t, b.Release())
	cursor := r.cursor
	d.takeLog()

	_, err := r.Acquire(rq(256, 256, 256, 256), nil)
	require.ErrorIs(t, err, ErrSourceFailed)
	require.ErrorIs(t, err, device.ErrInjected)
	assert.Equal(t, cursor, r.cursor, "cursor unchanged on failure")
	assert.Equal(t, "R[0,256)", layout(r), "bytes stay retired; the completed event is dropped")
	assert.Equal(t, []string{"evsync e1", "close e1"}, d.takeLog())

	nb, err := r.Acquire(rq(256, 256, 256, 256), nil)
	require.NoError(t, err, "the failure was reported once; a retry succeeds")
	assert.Empty(t, d.takeLog())
	require.NoError(t, nb.Release())
}

func TestStreamAcquisitionInheritsAsyncFailureThroughWait(t *testing.T) {
	d := newFakeDevice(t)
	s1, s2 := d.stream(t), d.stream(t)
	r := newRing(t, d, device.HostMapped, 256)
	b := acquire(t, r, rq(256, 256, 256, 256), s1)
	require.NoError(t, s1.HostFunc(func() error { return device.ErrInjected }))
	require.NoError(t, b.Release())

	nb, err := r.Acquire(rq(256, 256, 256, 256), s2)
	require.NoError(t, err, "a stream acquisition does not inspect the events")
	assert.ErrorIs(t, s2.Synchronize(), device.ErrInjected, "the stream inherits the failure per the device model")
	require.NoError(t, nb.Release())
}

func TestStreamWaitErrorLeavesThePartitionUnchanged(t *testing.T) {
	d := newFakeDevice(t)
	s1, s2 := d.stream(t), d.stream(t)
	r := newRing(t, d, device.HostMapped, 256)
	b := acquire(t, r, rq(256, 256, 256, 256), s1)
	require.NoError(t, b.Release())
	s2.failWait = device.ErrClosed
	_, err := r.Acquire(rq(256, 256, 256, 256), s2)
	require.ErrorIs(t, err, device.ErrClosed)
	assert.Equal(t, "R[0,256)e1", layout(r))
	assert.Zero(t, r.Live())
}

func TestReuseOfReleasedBytes(t *testing.T) {
	d := newFakeDevice(t)
	s := d.stream(t)
	r := newRing(t, d, device.HostMapped, 512)
	q := rq(256, 256, 256, 256)
	seen := map[int64]int{}
	for range 10 {
		b := acquire(t, r, q, s)
		seen[off(r, b)]++
		require.NoError(t, b.Release())
	}
	assert.Equal(t, map[int64]int{0: 5, 256: 5}, seen, "the cursor walks the ring and wraps")
	require.NoError(t, s.Synchronize())
	require.NoError(t, r.Close())
}

func TestCloseIsRefusedWithLiveLeases(t *testing.T) {
	d := newFakeDevice(t)
	r := newRing(t, d, device.HostMapped, 256)
	b := acquire(t, r, rq(64, 64, 64, 64), nil)
	d.takeLog()
	err := r.Close()
	require.ErrorIs(t, err, ErrLiveLeases)
	assert.Empty(t, d.takeLog(), "no memory is freed under a lease")
	assert.False(t, d.mems[0].freed)
	b.Host()[0] = 1 // still usable
	require.NoError(t, b.Release())
	require.NoError(t, r.Close())
	assert.True(t, d.mems[0].freed)
	assert.ErrorIs(t, r.Close(), ErrClosed)
	_, err = r.Acquire(rq(64, 64, 64, 64), nil)
	assert.ErrorIs(t, err, ErrClosed)
}

func TestCloseSynchronizesRetiredAndDrainingEventsBeforeFreeing(t *testing.T) {
	d := newFakeDevice(t)
	s1, s2, s3 := d.stream(t), d.stream(t), d.stream(t)
	r := newRing(t, d, device.HostMapped, 256)
	a := acquire(t, r, rq(128, 128, 128, 128), s1)
	b := acquire(t, r, rq(128, 128, 128, 128), s2)
	rel1, rel2 := s1.Hold(), s2.Hold()
	defer rel1()
	defer rel2()
	require.NoError(t, a.Release()) // e1 pending on s1
	require.NoError(t, b.Release()) // e2 pending on s2
	// The cursor wraps: s3 takes a's bytes (waiting on e1, which no range
	// holds any more and so drains) and returns them with e3, which
	// completes after e1.
	c := acquire(t, r, rq(128, 128, 128, 128), s3)
	require.Len(t, r.draining, 1)
	require.NoError(t, c.Release())
	assert.Equal(t, "R[0,128)e3 R[128,256)e2", layout(r))
	d.takeLog()

	var err error
	done := start(func() { err = r.Close() })
	assert.False(t, finished(done, 50*time.Millisecond), "Close must wait for retired events")
	rel2()
	assert.False(t, finished(done, 50*time.Millisecond), "the draining e1, and e3 behind it, are pending")
	rel1()
	require.True(t, finished(done, 2*time.Second))
	require.NoError(t, err)
	log := d.takeLog()
	require.NotEmpty(t, log)
	assert.Equal(t, "free host-mapped", log[len(log)-1], "memory is freed last")
	assert.Subset(t, log, []string{"evsync e1", "evsync e2", "evsync e3"})
	for _, n := range []string{"e1", "e2", "e3"} {
		assert.Equal(t, 1, d.event(n).closeCount(), n)
	}
}

func TestCloseReportsFailuresOfRetiredRangesButStillFrees(t *testing.T) {
	d := newFakeDevice(t)
	s1, s2 := d.stream(t), d.stream(t)
	r := newRing(t, d, device.HostMapped, 256)
	a := acquire(t, r, rq(128, 128, 128, 128), s1)
	b := acquire(t, r, rq(128, 128, 128, 128), s1)
	require.NoError(t, s1.HostFunc(func() error { return device.ErrInjected }))
	require.NoError(t, a.Release()) // e1 captures the failure
	require.NoError(t, b.Release()) // e2: clean interval
	// s2 takes a's bytes: it inherits e1's failure; e1 drains.
	c := acquire(t, r, rq(128, 128, 128, 128), s2)
	require.ErrorIs(t, s2.Synchronize(), device.ErrInjected)
	require.NoError(t, c.SetStream(nil))
	require.NoError(t, c.Release())
	require.NoError(t, r.Close(), "the draining e1's failure was inherited by s2; e2 is clean")

	r = newRing(t, d, device.HostMapped, 256)
	a = acquire(t, r, rq(256, 256, 256, 256), s1)
	require.NoError(t, s1.HostFunc(func() error { return device.ErrInjected }))
	require.NoError(t, a.Release())
	err := r.Close()
	assert.ErrorIs(t, err, ErrSourceFailed, "no acquisition will ever report it")
	assert.ErrorIs(t, err, device.ErrInjected)
	assert.True(t, d.mems[1].freed)
	assert.True(t, errors.Is(r.Close(), ErrClosed))
}
