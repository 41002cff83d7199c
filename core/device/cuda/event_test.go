//go:build cgo

package cuda

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core/device"
)

var errBoom = errors.New("boom")

func fail(err error) func() error { return func() error { return err } }

func TestHostFuncsRunInStreamOrder(t *testing.T) {
	d := gpu(t)
	s := stream(t, d)
	src := alloc(t, d, device.DeviceMemory, 4096)
	out := alloc(t, d, device.HostMapped, 4096)
	var mu sync.Mutex
	var seen [][]byte
	for i := range 20 {
		require.NoError(t, s.CopyFromHost(src.Ptr(), random(4096, uint64(i))))
		require.NoError(t, s.BatchCopy([]device.CopyDesc{{Dst: out.Ptr(), Src: src.Ptr(), Size: 4096}}))
		require.NoError(t, s.HostFunc(func() error {
			// Runs after the copy before it and before the next upload.
			mu.Lock()
			seen = append(seen, append([]byte(nil), out.Host()...))
			mu.Unlock()
			return nil
		}))
	}
	require.NoError(t, s.Synchronize())
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, seen, 20)
	for i, b := range seen {
		require.Equal(t, random(4096, uint64(i)), b, "host function %d", i)
	}
}

// A stream that waits on another stream's event sees everything that stream
// did before the Record, even when a slow host function holds the writer.
func TestWaitOrdersWorkAcrossStreams(t *testing.T) {
	d := gpu(t)
	writer, reader := stream(t, d), stream(t, d)
	src := alloc(t, d, device.HostMapped, 1<<20)
	mid := alloc(t, d, device.DeviceMemory, 1<<20)
	out := alloc(t, d, device.HostMapped, 1<<20)
	written, read := event(t, d), event(t, d)
	for i := range 10 {
		want := random(1<<20, uint64(100+i))
		copy(src.Host(), want) // safe: the previous iteration's read finished
		require.NoError(t, writer.HostFunc(func() error { time.Sleep(2 * time.Millisecond); return nil }))
		require.NoError(t, writer.BatchCopy([]device.CopyDesc{{Dst: mid.Ptr(), Src: src.Ptr(), Size: 1 << 20}}))
		require.NoError(t, writer.Record(written))
		require.NoError(t, reader.Wait(written))
		require.NoError(t, reader.BatchCopy([]device.CopyDesc{{Dst: out.Ptr(), Src: mid.Ptr(), Size: 1 << 20}}))
		require.NoError(t, reader.Record(read))
		require.NoError(t, writer.Wait(read))
		require.NoError(t, read.Synchronize())
		require.Equal(t, want, out.Host(), "iteration %d", i)
	}
}

func TestFailureIsAttributedToTheNextRecord(t *testing.T) {
	d := gpu(t)
	s := stream(t, d)
	before, failed, after := event(t, d), event(t, d), event(t, d)
	require.NoError(t, s.HostFunc(fail(nil)))
	require.NoError(t, s.Record(before))
	require.NoError(t, s.HostFunc(fail(errBoom)))
	require.NoError(t, s.HostFunc(fail(errors.New("second"))))
	require.NoError(t, s.Record(failed))
	require.NoError(t, s.HostFunc(fail(nil)))
	require.NoError(t, s.Record(after))

	assert.NoError(t, before.Synchronize(), "work before the failure")
	err := failed.Synchronize()
	assert.ErrorIs(t, err, errBoom, "the interval's first failure")
	assert.NoError(t, after.Synchronize(), "a later Record starts a clean interval")
	done, err := failed.Query()
	assert.True(t, done)
	assert.ErrorIs(t, err, errBoom, "Query reports the same failure")
}

func TestWaitInheritsTheFailureOfTheEvent(t *testing.T) {
	d := gpu(t)
	s1, s2, s3 := stream(t, d), stream(t, d), stream(t, d)
	e1, e2, e2clean, e3 := event(t, d), event(t, d), event(t, d), event(t, d)

	require.NoError(t, s1.HostFunc(func() error { time.Sleep(5 * time.Millisecond); return errBoom }))
	require.NoError(t, s1.Record(e1))
	require.NoError(t, s2.Wait(e1))
	require.NoError(t, s2.Record(e2))
	require.NoError(t, s2.Record(e2clean))
	require.NoError(t, s3.Wait(e2))
	require.NoError(t, s3.Record(e3))

	assert.ErrorIs(t, e1.Synchronize(), errBoom)
	assert.ErrorIs(t, e2.Synchronize(), errBoom, "inherited through Wait")
	assert.NoError(t, e2clean.Synchronize(), "the next interval is clean")
	assert.ErrorIs(t, e3.Synchronize(), errBoom, "inherited transitively")
}

func TestStreamSynchronizeReportsFailuresSinceLastRecordOrSynchronize(t *testing.T) {
	d := gpu(t)
	s, other := stream(t, d), stream(t, d)
	ev, oe := event(t, d), event(t, d)

	require.NoError(t, s.HostFunc(fail(errBoom)))
	assert.ErrorIs(t, s.Synchronize(), errBoom)
	assert.NoError(t, s.Synchronize(), "reported once")

	require.NoError(t, s.HostFunc(fail(errBoom)))
	require.NoError(t, s.Record(ev))
	assert.NoError(t, s.Synchronize(), "the Record took the failure")
	assert.ErrorIs(t, ev.Synchronize(), errBoom)

	require.NoError(t, s.HostFunc(fail(errBoom)))
	assert.ErrorIs(t, s.Synchronize(), errBoom)
	require.NoError(t, s.Record(ev))
	assert.ErrorIs(t, ev.Synchronize(), errBoom, "Synchronize does not start a new event interval")

	require.NoError(t, other.HostFunc(fail(errBoom)))
	require.NoError(t, other.Record(oe))
	require.NoError(t, s.Wait(oe))
	assert.ErrorIs(t, s.Synchronize(), errBoom, "inherited into Synchronize")
}

func TestHostFuncPanicIsAFailure(t *testing.T) {
	d := gpu(t)
	s := stream(t, d)
	e := event(t, d)
	require.NoError(t, s.HostFunc(func() error { panic(errBoom) }))
	require.NoError(t, s.Record(e))
	assert.ErrorIs(t, e.Synchronize(), errBoom)
	require.NoError(t, s.HostFunc(func() error { panic("text") }))
	assert.ErrorContains(t, s.Synchronize(), "text")
}

func TestUnrecordedAndRerecordedEvents(t *testing.T) {
	d := gpu(t)
	s, w := stream(t, d), stream(t, d)
	e := event(t, d)
	done, err := e.Query()
	assert.True(t, done)
	assert.NoError(t, err)
	assert.NoError(t, e.Synchronize())
	require.NoError(t, w.Wait(e), "waiting on a never-recorded event does nothing")

	var release sync.WaitGroup
	release.Add(1)
	require.NoError(t, s.HostFunc(func() error { release.Wait(); return errBoom }))
	require.NoError(t, s.Record(e))
	done, err = e.Query()
	assert.False(t, done)
	assert.NoError(t, err)
	// A Wait made now keeps this capture even if e is recorded again.
	require.NoError(t, w.Wait(e))
	other := stream(t, d)
	require.NoError(t, other.Record(e))
	require.NoError(t, e.Synchronize(), "the new capture is clean and done")
	release.Done()
	assert.ErrorIs(t, w.Synchronize(), errBoom, "the earlier Wait inherited the first capture")
}

func TestEventsOfAnotherDeviceAreRejected(t *testing.T) {
	d := gpu(t)
	d2 := ownDevice(t, Options{})
	s := stream(t, d)
	e2, err := d2.NewEvent()
	require.NoError(t, err)
	assert.Error(t, s.Record(e2))
	assert.Error(t, s.Wait(e2))
}

func TestClosedEventRejectsOperations(t *testing.T) {
	d := gpu(t)
	s := stream(t, d)
	e, err := d.NewEvent()
	require.NoError(t, err)
	require.NoError(t, e.Close())
	assert.ErrorIs(t, e.Close(), device.ErrClosed)
	assert.ErrorIs(t, s.Record(e), device.ErrClosed)
	assert.ErrorIs(t, s.Wait(e), device.ErrClosed)
	_, err = e.Query()
	assert.ErrorIs(t, err, device.ErrClosed)
}

func TestTimingEvents(t *testing.T) {
	d := gpu(t)
	s := stream(t, d)
	a, err := d.NewTimingEvent()
	require.NoError(t, err)
	b, err := d.NewTimingEvent()
	require.NoError(t, err)
	m := alloc(t, d, device.DeviceMemory, 64<<20)
	h := alloc(t, d, device.HostMapped, 64<<20)
	require.NoError(t, s.Record(a))
	require.NoError(t, s.BatchCopy([]device.CopyDesc{{Dst: h.Ptr(), Src: m.Ptr(), Size: 64 << 20}}))
	require.NoError(t, s.Record(b))
	require.NoError(t, b.Synchronize())
	el, err := ElapsedTime(a, b)
	require.NoError(t, err)
	assert.Positive(t, el)
	t.Logf("64 MiB D2H: %v (%.1f GB/s)", el, float64(64<<20)/el.Seconds()/1e9)
	_, err = ElapsedTime(a, event(t, d))
	assert.Error(t, err, "not a timing event")
}

func TestConcurrentUseIsSafe(t *testing.T) {
	d := gpu(t)
	var wg sync.WaitGroup
	var failures atomic.Int64
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := d.NewStream()
			if err != nil {
				failures.Add(1)
				return
			}
			defer s.Close()
			src, _ := d.Alloc(device.HostMapped, 1<<16)
			dst, _ := d.Alloc(device.DeviceMemory, 1<<16)
			back, _ := d.Alloc(device.HostMapped, 1<<16)
			defer src.Free()
			defer dst.Free()
			defer back.Free()
			e, _ := d.NewEvent()
			defer e.Close()
			for i := range 50 {
				want := random(1<<16, uint64(g*1000+i))
				copy(src.Host(), want)
				if s.BatchCopy([]device.CopyDesc{{Dst: dst.Ptr(), Src: src.Ptr(), Size: 1 << 16}}) != nil ||
					s.BatchCopy([]device.CopyDesc{{Dst: back.Ptr(), Src: dst.Ptr(), Size: 1 << 16}}) != nil ||
					s.HostFunc(fail(nil)) != nil || s.Record(e) != nil || e.Synchronize() != nil {
					failures.Add(1)
					return
				}
				if string(back.Host()) != string(want) {
					failures.Add(1)
					return
				}
			}
		}()
	}
	wg.Wait()
	assert.Zero(t, failures.Load())
}

func TestHostChecksAreBatchedAndKeepTheFailureOrder(t *testing.T) {
	d := gpu(t)
	s := stream(t, d)
	e1, e2 := event(t, d), event(t, d)
	var ran atomic.Int64
	second := errors.New("second")
	for i := range 10 {
		require.NoError(t, s.HostCheck(func() error {
			ran.Add(1)
			if i == 3 {
				return errBoom
			}
			if i == 7 {
				return second
			}
			return nil
		}))
	}
	require.NoError(t, s.Record(e1))
	require.NoError(t, s.HostCheck(fail(nil)))
	require.NoError(t, s.Record(e2))
	assert.ErrorIs(t, e1.Synchronize(), errBoom, "the first failure in enqueue order")
	assert.NoError(t, e2.Synchronize())
	assert.EqualValues(t, 10, ran.Load())
	// A check enqueued before a failing HostFunc reports first.
	require.NoError(t, s.HostCheck(fail(errBoom)))
	require.NoError(t, s.HostFunc(fail(second)))
	assert.ErrorIs(t, s.Synchronize(), errBoom)
	// Many checks without a Record are flushed on their own.
	for range 200 {
		require.NoError(t, s.HostCheck(func() error { ran.Add(1); return nil }))
	}
	require.NoError(t, s.Synchronize())
	assert.EqualValues(t, 210, ran.Load())
}

// TestHostFuncLatency logs what one host function costs on the GPU timeline
// (a round trip to a driver thread and into Go).
func TestHostFuncLatency(t *testing.T) {
	d := gpu(t)
	s := stream(t, d)
	a, err := d.NewTimingEvent()
	require.NoError(t, err)
	b, err := d.NewTimingEvent()
	require.NoError(t, err)
	for _, n := range []int{1, 100} {
		require.NoError(t, s.Record(a))
		for range n {
			require.NoError(t, s.HostFunc(fail(nil)))
		}
		require.NoError(t, s.Record(b))
		require.NoError(t, b.Synchronize())
		el, err := ElapsedTime(a, b)
		require.NoError(t, err)
		t.Logf("%d host functions: %v on the GPU timeline, %v each", n, el, el/time.Duration(n))
	}
}
