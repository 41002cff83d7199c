package emu_test

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core/device"
	"github.com/kvcm/kvcm/core/device/emu"
)

// A stream that waits on another stream's event sees everything that stream
// did before the Record, however the random delays fall.
func TestWaitOrdersWorkAcrossStreams(t *testing.T) {
	for seed := range int64(20) {
		d := newDevice(t, emu.Options{Seed: seed, MaxDelay: 100 * time.Microsecond})
		writer := newStream(t, d)
		reader := newStream(t, d)
		src := alloc(t, d, device.HostMapped, 512)
		mid := alloc(t, d, device.DeviceMemory, 512)
		out := alloc(t, d, device.HostMapped, 512)
		written := newEvent(t, d)
		read := newEvent(t, d)

		for i := range 10 {
			copy(src.Host(), pattern(512, i)) // safe: the previous read finished
			require.NoError(t, writer.BatchCopy([]device.CopyDesc{{Dst: mid.Ptr(), Src: src.Ptr(), Size: 512}}))
			require.NoError(t, writer.Record(written))
			require.NoError(t, reader.Wait(written))
			require.NoError(t, reader.BatchCopy([]device.CopyDesc{{Dst: out.Ptr(), Src: mid.Ptr(), Size: 512}}))
			require.NoError(t, reader.Record(read))
			// The next write into mid must not overtake this read either.
			require.NoError(t, writer.Wait(read))
			require.NoError(t, read.Synchronize())
			require.Equal(t, pattern(512, i), out.Host(), "seed %d iteration %d", seed, i)
		}
		require.NoError(t, d.Close())
	}
}

func TestFailureIsAttributedToTheNextRecord(t *testing.T) {
	d := newDevice(t, emu.Options{})
	s := newStream(t, d)
	src := alloc(t, d, device.HostMapped, 64)
	dst := alloc(t, d, device.DeviceMemory, 64)
	cp := []device.CopyDesc{{Dst: dst.Ptr(), Src: src.Ptr(), Size: 64}}
	before, failed, after := newEvent(t, d), newEvent(t, d), newEvent(t, d)

	require.NoError(t, s.BatchCopy(cp))
	require.NoError(t, s.Record(before))
	d.FailNext(1)
	require.NoError(t, s.BatchCopy(cp))
	require.NoError(t, s.BatchCopy(cp))
	require.NoError(t, s.Record(failed))
	require.NoError(t, s.BatchCopy(cp))
	require.NoError(t, s.Record(after))

	assert.NoError(t, before.Synchronize(), "work before the failure")
	assert.ErrorIs(t, failed.Synchronize(), device.ErrInjected, "the interval that holds the failure")
	assert.NoError(t, after.Synchronize(), "a later Record starts a clean interval")
	done, err := failed.Query()
	assert.True(t, done)
	assert.ErrorIs(t, err, device.ErrInjected, "Query reports the same failure")
}

func TestWaitInheritsTheFailureOfTheEvent(t *testing.T) {
	d := newDevice(t, emu.Options{})
	s1 := newStream(t, d)
	s2 := newStream(t, d)
	s3 := newStream(t, d)
	boom := errors.New("boom")
	e1, e2, e2clean, e3 := newEvent(t, d), newEvent(t, d), newEvent(t, d), newEvent(t, d)

	require.NoError(t, s1.HostFunc(func() error { return boom }))
	require.NoError(t, s1.Record(e1))
	require.NoError(t, s2.Wait(e1))
	require.NoError(t, s2.Record(e2))
	require.NoError(t, s2.Record(e2clean))
	require.NoError(t, s3.Wait(e2)) // transitively
	require.NoError(t, s3.Record(e3))

	assert.ErrorIs(t, e2.Synchronize(), boom)
	assert.NoError(t, e2clean.Synchronize(), "inherited into one interval only")
	assert.ErrorIs(t, e3.Synchronize(), boom)
	assert.NoError(t, s2.Synchronize(), "the Record of e2 consumed the failure")
}

func TestWaitInheritsIntoStreamSynchronize(t *testing.T) {
	d := newDevice(t, emu.Options{})
	s1 := newStream(t, d)
	s2 := newStream(t, d)
	boom := errors.New("boom")
	ev := newEvent(t, d)

	require.NoError(t, s1.HostFunc(func() error { return boom }))
	require.NoError(t, s1.Record(ev))
	require.NoError(t, s2.Wait(ev))
	assert.ErrorIs(t, s2.Synchronize(), boom)
}

func TestQueryOfUnrecordedEventIsCompleteAndClean(t *testing.T) {
	d := newDevice(t, emu.Options{})
	s := newStream(t, d)
	ev := newEvent(t, d)

	done, err := ev.Query()
	assert.True(t, done)
	assert.NoError(t, err)
	assert.NoError(t, ev.Synchronize())
	require.NoError(t, s.Wait(ev), "waiting on it is a no-op")
	assert.NoError(t, s.Synchronize())
}

// Re-recording replaces the event's capture, but a Wait made earlier still
// waits for the capture it saw (as in CUDA).
func TestRerecordingReplacesTheCapture(t *testing.T) {
	d := newDevice(t, emu.Options{})
	s1 := newStream(t, d)
	s2 := newStream(t, d)
	s3 := newStream(t, d)
	ev := newEvent(t, d)

	require.NoError(t, s1.HostFunc(func() error { return errors.New("old") }))
	require.NoError(t, s1.Record(ev))
	require.Error(t, ev.Synchronize())

	block, release := blocker()
	defer release()
	require.NoError(t, s2.HostFunc(block))
	require.NoError(t, s2.Record(ev))
	done, err := ev.Query()
	assert.False(t, done, "the new capture is pending")
	assert.NoError(t, err)

	// s3 waits for the pending capture, so it is blocked too.
	require.NoError(t, s3.Wait(ev))
	marker := newEvent(t, d)
	require.NoError(t, s3.Record(marker))
	require.NoError(t, s1.Synchronize())
	done, _ = marker.Query()
	assert.False(t, done)

	release()
	assert.NoError(t, ev.Synchronize(), "the old failure went with the old capture")
	assert.NoError(t, marker.Synchronize())
}

func TestEventsOfAnotherDeviceAreRejected(t *testing.T) {
	d := newDevice(t, emu.Options{})
	other := newDevice(t, emu.Options{})
	s := newStream(t, d)
	foreign := newEvent(t, other)

	assert.Error(t, s.Record(foreign))
	assert.Error(t, s.Wait(foreign))
	assert.Error(t, s.Record(nil))
}

func TestClosedEventRejectsOperations(t *testing.T) {
	d := newDevice(t, emu.Options{})
	s := newStream(t, d)
	ev := newEvent(t, d)
	require.NoError(t, s.Record(ev))
	require.NoError(t, ev.Close())

	assert.ErrorIs(t, ev.Close(), device.ErrClosed)
	assert.ErrorIs(t, s.Record(ev), device.ErrClosed)
	assert.ErrorIs(t, s.Wait(ev), device.ErrClosed)
	assert.ErrorIs(t, ev.Synchronize(), device.ErrClosed)
	_, err := ev.Query()
	assert.ErrorIs(t, err, device.ErrClosed)
}

// A Record or Wait on an idle stream completes when it is made, without
// waking the stream's goroutine or allocating, and still carries the failure
// of the interval it closes; behind queued work it stays pending until that
// work has run.
func TestRecordOnAnIdleStreamCompletesAtOnce(t *testing.T) {
	d := newDevice(t, emu.Options{})
	s := newStream(t, d)
	ev := newEvent(t, d)

	require.NoError(t, s.Record(ev))
	done, err := ev.Query()
	assert.True(t, done, "nothing was enqueued before the Record")
	assert.NoError(t, err)
	assert.Zero(t, testing.AllocsPerRun(100, func() {
		_ = s.Record(ev)
		_ = s.Wait(ev)
	}), "an idle stream's Record and Wait allocate nothing")

	src := alloc(t, d, device.HostMapped, 64)
	dst := alloc(t, d, device.HostMapped, 64)
	d.FailNext(1)
	require.NoError(t, s.BatchCopy([]device.CopyDesc{{Dst: dst.Ptr(), Src: src.Ptr(), Size: 64}}))
	require.ErrorIs(t, s.Synchronize(), device.ErrInjected)
	failed := newEvent(t, d)
	require.NoError(t, s.Record(failed), "the stream is idle again")
	done, err = failed.Query()
	assert.True(t, done)
	assert.ErrorIs(t, err, device.ErrInjected, "Synchronize does not end the event interval")

	other := newStream(t, d)
	require.NoError(t, other.Wait(failed))
	inherited := newEvent(t, d)
	require.NoError(t, other.Record(inherited))
	assert.ErrorIs(t, inherited.Synchronize(), device.ErrInjected, "a Wait made inline inherits the failure")

	block, release := blocker()
	defer release()
	require.NoError(t, s.HostFunc(block))
	pending := newEvent(t, d)
	require.NoError(t, s.Record(pending))
	done, _ = pending.Query()
	assert.False(t, done, "the Record is behind a blocked host function")
	release()
	assert.NoError(t, pending.Synchronize())
}
