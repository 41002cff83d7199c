package emu_test

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core/device"
	"github.com/kvcm/kvcm/core/device/emu"
)

func TestStreamFromHandle(t *testing.T) {
	d := newDevice(t, emu.Options{})
	other := newDevice(t, emu.Options{})
	s1 := newStream(t, d)
	s2 := newStream(t, d)
	s3 := newStream(t, other)

	assert.NotZero(t, s1.Handle())
	assert.NotEqual(t, s1.Handle(), s2.Handle())
	assert.NotEqual(t, s1.Handle(), s3.Handle(), "handles are unique across devices")

	got, err := d.StreamFromHandle(s2.Handle())
	require.NoError(t, err)
	assert.Same(t, s2, got)

	_, err = d.StreamFromHandle(0)
	assert.ErrorIs(t, err, device.ErrUnknownStream)
	_, err = d.StreamFromHandle(s3.Handle())
	assert.ErrorIs(t, err, device.ErrUnknownStream, "another device's stream")

	require.NoError(t, s2.Close())
	_, err = d.StreamFromHandle(s2.Handle())
	assert.ErrorIs(t, err, device.ErrUnknownStream, "a closed stream")
}

// AdoptStream: any engine handle is an emulated stream of its own, the same
// one every time and found by StreamFromHandle afterwards; a handle the
// emulation made is never adopted (another device's, a closed one's).
func TestAdoptStreamMakesAnEmulatedStreamPerHandle(t *testing.T) {
	d := newDevice(t, emu.Options{})
	other := newDevice(t, emu.Options{})
	a, err := d.AdoptStream(0)
	require.NoError(t, err)
	assert.Zero(t, a.Handle())
	b, err := d.AdoptStream(0x7f0000001000)
	require.NoError(t, err)
	assert.NotSame(t, a, b)
	again, err := d.AdoptStream(0x7f0000001000)
	require.NoError(t, err)
	assert.Same(t, b, again)
	found, err := d.StreamFromHandle(0x7f0000001000)
	require.NoError(t, err)
	assert.Same(t, b, found)
	require.NoError(t, b.Synchronize(), "it runs work")

	s := newStream(t, other)
	_, err = d.AdoptStream(s.Handle())
	assert.ErrorIs(t, err, device.ErrUnknownStream, "another device's stream")
	mine := newStream(t, d)
	h := mine.Handle()
	require.NoError(t, mine.Close())
	_, err = d.AdoptStream(h)
	assert.ErrorIs(t, err, device.ErrUnknownStream, "a closed stream stays closed")
}

func TestStreamCloseDrainsThenRejectsWork(t *testing.T) {
	d := newDevice(t, emu.Options{Seed: 3, MaxDelay: time.Millisecond})
	s := newStream(t, d)
	ev := newEvent(t, d)
	m := alloc(t, d, device.DeviceMemory, 64)
	var ran atomic.Int32
	for range 5 {
		require.NoError(t, s.HostFunc(func() error { ran.Add(1); return nil }))
	}
	require.NoError(t, s.Record(ev))

	require.NoError(t, s.Close())
	assert.Equal(t, int32(5), ran.Load(), "Close ran everything enqueued")
	done, err := ev.Query()
	assert.True(t, done)
	assert.NoError(t, err)

	cp := []device.CopyDesc{{Dst: m.Ptr(), Src: m.Ptr(), Size: 1}}
	assert.ErrorIs(t, s.BatchCopy(cp), device.ErrClosed)
	assert.ErrorIs(t, s.BatchCopy(nil), device.ErrClosed)
	assert.ErrorIs(t, s.HostFunc(func() error { return nil }), device.ErrClosed)
	assert.ErrorIs(t, s.Record(ev), device.ErrClosed)
	assert.ErrorIs(t, s.Wait(ev), device.ErrClosed)
	assert.ErrorIs(t, s.Synchronize(), device.ErrClosed)
	assert.ErrorIs(t, s.Close(), device.ErrClosed)

	// The device and its other streams carry on.
	s2 := newStream(t, d)
	require.NoError(t, s2.Synchronize())
}

func TestDeviceCloseCancelsQueuedWorkAndFreesEverything(t *testing.T) {
	d := emu.New(emu.Options{})
	s := newStream(t, d)
	s2 := newStream(t, d)
	m := alloc(t, d, device.HostMapped, 1<<20)
	alloc(t, d, device.DeviceMemory, 1<<20)
	running, pending, waiter := newEvent(t, d), newEvent(t, d), newEvent(t, d)

	started := make(chan struct{})
	block, release := blocker()
	defer release()
	require.NoError(t, s.HostFunc(func() error { close(started); return block() }))
	require.NoError(t, s.Record(running))
	var ranAfter atomic.Bool
	require.NoError(t, s.HostFunc(func() error { ranAfter.Store(true); return nil }))
	require.NoError(t, s.Record(pending))
	require.NoError(t, s2.Wait(pending))
	require.NoError(t, s2.Record(waiter))
	<-started

	closed := make(chan error, 1)
	go func() { closed <- d.Close() }()
	// Once the device refuses new work, Close has cancelled the queues; only
	// then let the running host function finish.
	require.Eventually(t, func() bool {
		_, err := d.NewEvent()
		return err != nil
	}, 2*time.Second, time.Millisecond)
	release()
	require.NoError(t, <-closed)

	assert.False(t, ranAfter.Load(), "queued work after the running function was dropped")
	assert.ErrorIs(t, pending.Synchronize(), device.ErrClosed)
	st := d.Stats()
	assert.Zero(t, st.LiveAllocs.Total())
	assert.Zero(t, st.LiveBytes.Total())

	// Everything now fails with ErrClosed.
	assert.ErrorIs(t, d.Close(), device.ErrClosed)
	_, err := d.Alloc(device.DeviceMemory, 1)
	assert.ErrorIs(t, err, device.ErrClosed)
	_, err = d.NewStream()
	assert.ErrorIs(t, err, device.ErrClosed)
	_, err = d.NewEvent()
	assert.ErrorIs(t, err, device.ErrClosed)
	_, err = d.StreamFromHandle(s.Handle())
	assert.ErrorIs(t, err, device.ErrClosed)
	assert.ErrorIs(t, s.HostFunc(func() error { return nil }), device.ErrClosed)
	assert.ErrorIs(t, s.BatchCopy([]device.CopyDesc{{Dst: m.Ptr(), Src: m.Ptr(), Size: 1}}), device.ErrClosed)
	assert.ErrorIs(t, s2.Synchronize(), device.ErrClosed)
	assert.ErrorIs(t, s.Close(), device.ErrClosed)
	assert.ErrorIs(t, m.Free(), device.ErrClosed, "Close freed it")
	assert.Nil(t, m.Host())
	_, err = waiter.Query()
	assert.ErrorIs(t, err, device.ErrClosed)
}

// Close must not wait out the random delays of queued work.
func TestDeviceCloseIsPromptUnderLongDelays(t *testing.T) {
	d := emu.New(emu.Options{Seed: 1, MaxDelay: time.Hour})
	for range 3 {
		s := newStream(t, d)
		for range 10 {
			require.NoError(t, s.HostFunc(func() error { return nil }))
		}
	}
	start := time.Now()
	require.NoError(t, d.Close())
	assert.Less(t, time.Since(start), time.Second)
}

// Many goroutines share one device: allocating, copying, waiting on each
// other's events and freeing, with random delays and failures. The assertion
// is that nothing races, deadlocks or crashes, and that all memory is given
// back.
func TestConcurrentUseIsSafe(t *testing.T) {
	d := newDevice(t, emu.Options{Seed: 9, MaxDelay: 50 * time.Microsecond, FailRate: 0.1, HostRegionBytes: 1024})
	events := make([]device.Event, 4)
	for i := range events {
		events[i] = newEvent(t, d)
	}
	var wg sync.WaitGroup
	for g := range 4 {
		s := newStream(t, d)
		wg.Go(func() {
			for i := range 30 {
				src, err := d.Alloc(device.HostMapped, 4096)
				if !assert.NoError(t, err) {
					return
				}
				dst, err := d.Alloc(device.DeviceMemory, 4096)
				if !assert.NoError(t, err) {
					return
				}
				assert.NoError(t, s.Wait(events[(g+i)%len(events)]))
				assert.NoError(t, s.BatchCopy([]device.CopyDesc{{Dst: dst.Ptr(), Src: src.Ptr().Add(100), Size: 3000}}))
				assert.NoError(t, s.Record(events[g]))
				if err := s.Synchronize(); err != nil {
					assert.ErrorIs(t, err, device.ErrInjected)
				}
				assert.NoError(t, src.Free())
				assert.NoError(t, dst.Free())
			}
		})
	}
	wg.Wait()
	assert.Zero(t, d.Stats().LiveAllocs.Total())
}
