package staging

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core/device"
)

// Every row of the design's ownership table, with the exact device calls it
// makes.
func TestSetStreamTransitionTable(t *testing.T) {
	rows := []struct {
		name     string
		from, to string // "", "A" or "B"
		calls    []string
	}{
		{"nil to nil: no action", "", "", nil},
		{"nil to stream: no action, CPU access already complete", "", "A", nil},
		{"A to A: no action", "A", "A", nil},
		{"A to B: record an event on A and make B wait", "A", "B", []string{"new e1", "record e1 s1", "wait s2 e1"}},
		{"stream to nil: host-synchronize the old stream", "A", "", []string{"sync s1"}},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			d := newFakeDevice(t)
			streams := map[string]device.Stream{"": nil, "A": d.stream(t), "B": d.stream(t)}
			r := newRing(t, d, device.HostMapped, 256)
			b := acquire(t, r, rq(256, 256, 256, 256), streams[row.from])
			d.takeLog()

			require.NoError(t, b.SetStream(streams[row.to]))
			// The transfer event is closed as soon as it is complete, which
			// may already be the case; closing is checked separately.
			assert.Equal(t, row.calls, withoutCloses(d.takeLog()))
			assert.Equal(t, streams[row.to], b.Stream())
		})
	}
}

func TestSetStreamSameHandleIsTheSameStream(t *testing.T) {
	d := newFakeDevice(t)
	s1 := d.stream(t)
	alias, err := d.StreamFromHandle(s1.Handle())
	require.NoError(t, err)
	r := newRing(t, d, device.HostMapped, 256)
	b := acquire(t, r, rq(256, 256, 256, 256), s1)
	d.takeLog()
	require.NoError(t, b.SetStream(alias))
	assert.Empty(t, d.takeLog())
}

func TestSetStreamAToBMakesBWaitForA(t *testing.T) {
	d := newFakeDevice(t)
	a, b := d.stream(t), d.stream(t)
	r := newRing(t, d, device.HostMapped, 256)
	buf := acquire(t, r, rq(256, 256, 256, 256), a)
	rel := a.Hold()
	defer rel()
	require.NoError(t, buf.SetStream(b))
	ran := make(chan struct{})
	require.NoError(t, b.HostFunc(func() error { close(ran); return nil }))
	assert.False(t, finished(ran, 50*time.Millisecond), "B's later work must wait for A's")
	rel()
	assert.True(t, finished(ran, 2*time.Second))

	// The transfer event belongs to no range: it is closed once complete.
	_, err := r.Acquire(rq(1, 1, 1, 1), nil) // reaps
	require.ErrorIs(t, err, ErrRingFull)
	assert.Equal(t, 1, d.event("e1").closeCount())
	assert.Equal(t, "L[0,256)", layout(r))
}

func TestSetStreamToNilBlocksUntilTheOldStreamIsDone(t *testing.T) {
	d := newFakeDevice(t)
	a := d.stream(t)
	r := newRing(t, d, device.HostMapped, 256)
	buf := acquire(t, r, rq(256, 256, 256, 256), a)
	rel := a.Hold()
	defer rel()
	var done bool
	require.NoError(t, a.HostFunc(func() error { done = true; return nil }))
	var sawDone bool
	var err error
	ch := start(func() { err = buf.SetStream(nil); sawDone = done })
	assert.False(t, finished(ch, 50*time.Millisecond))
	rel()
	require.True(t, finished(ch, 2*time.Second))
	require.NoError(t, err)
	assert.True(t, sawDone, "old stream's work complete when SetStream(nil) returns")
	assert.Nil(t, buf.Stream())
}

func TestSetStreamToNilReportsAsyncFailureAndStillTransfers(t *testing.T) {
	d := newFakeDevice(t)
	a := d.stream(t)
	r := newRing(t, d, device.HostMapped, 256)
	buf := acquire(t, r, rq(256, 256, 256, 256), a)
	require.NoError(t, a.HostFunc(func() error { return device.ErrInjected }))
	err := buf.SetStream(nil)
	assert.ErrorIs(t, err, device.ErrInjected)
	assert.Nil(t, buf.Stream(), "the stream's work is complete; the CPU owns the slice")
}

func TestSetStreamAToBInheritsFailureThroughTheWait(t *testing.T) {
	d := newFakeDevice(t)
	a, b := d.stream(t), d.stream(t)
	r := newRing(t, d, device.HostMapped, 256)
	buf := acquire(t, r, rq(256, 256, 256, 256), a)
	require.NoError(t, a.HostFunc(func() error { return device.ErrInjected }))
	require.NoError(t, buf.SetStream(b))
	assert.ErrorIs(t, b.Synchronize(), device.ErrInjected)
}

func TestSetStreamAToBKeepsAOnSynchronousError(t *testing.T) {
	d := newFakeDevice(t)
	a, b := d.stream(t), d.stream(t)
	r := newRing(t, d, device.HostMapped, 256)
	buf := acquire(t, r, rq(256, 256, 256, 256), a)

	a.failRecord = device.ErrClosed
	require.ErrorIs(t, buf.SetStream(b), device.ErrClosed)
	assert.Equal(t, device.Stream(a), buf.Stream())
	assert.Equal(t, 1, d.event("e1").closeCount(), "the unrecorded transfer event is closed")
	a.failRecord = nil

	b.failWait = device.ErrClosed
	require.ErrorIs(t, buf.SetStream(b), device.ErrClosed)
	assert.Equal(t, device.Stream(a), buf.Stream())
	b.failWait = nil

	d.failNewEvent = device.ErrOutOfMemory
	require.ErrorIs(t, buf.SetStream(b), device.ErrOutOfMemory)
	assert.Equal(t, device.Stream(a), buf.Stream())
}

func TestReleaseOfAStreamOwnedSliceRecordsItsEvent(t *testing.T) {
	d := newFakeDevice(t)
	a := d.stream(t)
	r := newRing(t, d, device.HostMapped, 256)
	buf := acquire(t, r, rq(256, 256, 256, 256), a)
	d.takeLog()
	require.NoError(t, buf.Release())
	assert.Equal(t, []string{"new e1", "record e1 s1"}, d.takeLog())
	assert.Equal(t, "R[0,256)e1", layout(r), "retired with the reusable event")
	assert.Zero(t, r.Live())
}

func TestReleaseOfASynchronouslyOwnedSliceIsImmediatelyReusable(t *testing.T) {
	d := newFakeDevice(t)
	a := d.stream(t)
	r := newRing(t, d, device.HostMapped, 256)
	buf := acquire(t, r, rq(256, 256, 256, 256), a)
	require.NoError(t, buf.SetStream(nil))
	d.takeLog()
	require.NoError(t, buf.Release())
	assert.Empty(t, d.takeLog())
	assert.Equal(t, "R[0,256)", layout(r), "retired without an event")

	again := acquire(t, r, rq(256, 256, 256, 256), nil)
	assert.Empty(t, d.takeLog(), "nothing to synchronize")
	require.NoError(t, again.Release())
	again = acquire(t, r, rq(256, 256, 256, 256), a)
	assert.Empty(t, d.takeLog(), "nothing to wait on")
	require.NoError(t, again.Release())
}

func TestAcquireWithStreamWaitsAndWithoutStreamSynchronizes(t *testing.T) {
	d := newFakeDevice(t)
	a, b := d.stream(t), d.stream(t)
	r := newRing(t, d, device.HostMapped, 256)
	buf := acquire(t, r, rq(256, 256, 256, 256), a)
	require.NoError(t, buf.Release())
	d.takeLog()

	onB := acquire(t, r, rq(256, 256, 256, 256), b)
	assert.Equal(t, []string{"wait s2 e1"}, withoutCloses(d.takeLog()), "a stream acquisition waits on the source event")
	assert.Equal(t, device.Stream(b), onB.Stream())
	require.NoError(t, onB.Release())
	// e1 drained when b took its only range; Release may reap it by now.
	assert.Equal(t, []string{"new e2", "record e2 s2"}, withoutCloses(d.takeLog()))

	sync := acquire(t, r, rq(256, 256, 256, 256), nil)
	assert.Equal(t, []string{"evsync e2", "close e2"}, about(d.takeLog(), "e2"), "a synchronous acquisition synchronizes it")
	assert.Nil(t, sync.Stream())
}

func TestReleaseFallsBackToSynchronizingWhenItCannotRecord(t *testing.T) {
	d := newFakeDevice(t)
	a := d.stream(t)
	r := newRing(t, d, device.HostMapped, 256)
	buf := acquire(t, r, rq(256, 256, 256, 256), a)
	d.failNewEvent = device.ErrOutOfMemory
	d.takeLog()
	err := buf.Release()
	require.ErrorIs(t, err, device.ErrOutOfMemory)
	assert.Equal(t, []string{"sync s1"}, d.takeLog())
	assert.Equal(t, "R[0,256)", layout(r), "the lease ended; the bytes are complete")
	assert.ErrorIs(t, buf.Release(), ErrReleased)
	assert.ErrorIs(t, buf.SetStream(nil), ErrReleased)
	assert.Zero(t, buf.Size())
	assert.Nil(t, buf.Host())
	assert.Zero(t, buf.Ptr())
	d.failNewEvent = nil

	buf = acquire(t, r, rq(256, 256, 256, 256), a)
	a.failRecord = errors.New("record refused")
	d.takeLog()
	err = buf.Release()
	require.Error(t, err)
	assert.Equal(t, []string{"new e1", "sync s1", "close e1"}, sortedCloseLast(d.takeLog()))
	assert.Equal(t, "R[0,256)", layout(r))
}

// about keeps the entries that name event ev.
func about(log []string, ev string) []string {
	var out []string
	for _, l := range log {
		if slices.Contains(strings.Fields(l), ev) {
			out = append(out, l)
		}
	}
	return out
}

// withoutCloses drops "close" entries.
func withoutCloses(log []string) []string {
	var out []string
	for _, l := range log {
		if !strings.HasPrefix(l, "close ") {
			out = append(out, l)
		}
	}
	return out
}

// sortedCloseLast moves "close" entries to the end (their position relative
// to the fallback synchronization is not part of the contract).
func sortedCloseLast(log []string) []string {
	var out, closes []string
	for _, l := range log {
		if strings.HasPrefix(l, "close ") {
			closes = append(closes, l)
		} else {
			out = append(out, l)
		}
	}
	return append(out, closes...)
}
