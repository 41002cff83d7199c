package emu_test

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core/device"
	"github.com/kvcm/kvcm/core/device/emu"
)

func TestBatchCopyBetweenEveryPairOfKinds(t *testing.T) {
	for _, srcKind := range kinds {
		for _, dstKind := range kinds {
			t.Run(fmt.Sprintf("%v to %v", srcKind, dstKind), func(t *testing.T) {
				d := newDevice(t, emu.Options{})
				s := newStream(t, d)
				src := alloc(t, d, srcKind, 4096)
				dst := alloc(t, d, dstKind, 4096)
				data := pattern(4096, 1)
				put(t, d, s, src, data)

				// Two descriptors at offsets, leaving the rest of dst untouched.
				require.NoError(t, s.BatchCopy([]device.CopyDesc{
					{Dst: dst.Ptr().Add(10), Src: src.Ptr().Add(100), Size: 1000},
					{Dst: dst.Ptr().Add(3000), Src: src.Ptr(), Size: 1096},
				}))
				require.NoError(t, s.Synchronize())

				want := make([]byte, 4096)
				copy(want[10:], data[100:1100])
				copy(want[3000:], data[:1096])
				assert.Equal(t, want, get(t, d, s, dst))
			})
		}
	}
}

func TestOverlappingCopyHasMemmoveSemantics(t *testing.T) {
	d := newDevice(t, emu.Options{})
	s := newStream(t, d)
	m := alloc(t, d, device.HostMapped, 64)
	copy(m.Host(), pattern(64, 2))
	want := append([]byte(nil), m.Host()...)
	copy(want[8:], want[:40])

	require.NoError(t, s.BatchCopy([]device.CopyDesc{{Dst: m.Ptr().Add(8), Src: m.Ptr(), Size: 40}}))
	require.NoError(t, s.Synchronize())
	assert.Equal(t, want, m.Host())
}

// Work on one stream runs in enqueue order, across and within batches, even
// when every operation is delayed by a random amount.
func TestStreamRunsWorkInOrder(t *testing.T) {
	d := newDevice(t, emu.Options{Seed: 1, MaxDelay: 200 * time.Microsecond})
	s := newStream(t, d)
	a := alloc(t, d, device.HostMapped, 256)
	x := alloc(t, d, device.DeviceMemory, 256)
	y := alloc(t, d, device.HostMapped, 256)
	var mu sync.Mutex
	var seen []int

	for i := range 20 {
		copy(a.Host(), pattern(256, i)) // safe: the previous iteration synchronized
		// Within the batch the second descriptor reads what the first wrote.
		require.NoError(t, s.BatchCopy([]device.CopyDesc{
			{Dst: x.Ptr(), Src: a.Ptr(), Size: 256},
			{Dst: y.Ptr(), Src: x.Ptr(), Size: 256},
		}))
		require.NoError(t, s.HostFunc(func() error {
			mu.Lock()
			defer mu.Unlock()
			seen = append(seen, i)
			return nil
		}))
		require.NoError(t, s.Synchronize())
		require.Equal(t, pattern(256, i), y.Host(), "iteration %d", i)
	}
	for i := range 10 {
		require.NoError(t, s.HostFunc(func() error {
			mu.Lock()
			defer mu.Unlock()
			seen = append(seen, 20+i)
			return nil
		}))
	}
	require.NoError(t, s.Synchronize())
	mu.Lock()
	defer mu.Unlock()
	for i, v := range seen {
		require.Equal(t, i, v)
	}
	assert.Len(t, seen, 30)
}

// Work runs on the stream's own goroutine after the enqueuing call returns,
// and streams do not wait for each other unless told to.
func TestStreamsRunAsynchronouslyAndConcurrently(t *testing.T) {
	d := newDevice(t, emu.Options{})
	s1 := newStream(t, d)
	s2 := newStream(t, d)
	src := alloc(t, d, device.HostMapped, 64)
	dst := alloc(t, d, device.HostMapped, 64)
	copy(src.Host(), pattern(64, 3))
	ev := newEvent(t, d)

	block, release := blocker()
	defer release()
	require.NoError(t, s1.HostFunc(block))
	require.NoError(t, s1.Record(ev))
	done, err := ev.Query()
	require.NoError(t, err)
	assert.False(t, done, "s1 is blocked, so its event is pending")

	require.NoError(t, s2.BatchCopy([]device.CopyDesc{{Dst: dst.Ptr(), Src: src.Ptr(), Size: 64}}))
	require.NoError(t, s2.Synchronize(), "s2 completes while s1 is blocked")
	assert.Equal(t, src.Host(), dst.Host())

	release()
	require.NoError(t, ev.Synchronize())
}

func TestInvalidCopyIsRejectedSynchronouslyAndEnqueuesNothing(t *testing.T) {
	d := newDevice(t, emu.Options{})
	s := newStream(t, d)
	src := alloc(t, d, device.HostMapped, 4096)
	dst := alloc(t, d, device.DeviceMemory, 4096)
	copy(src.Host(), pattern(4096, 4))
	good := device.CopyDesc{Dst: dst.Ptr(), Src: src.Ptr(), Size: 4096}

	cases := map[string]device.CopyDesc{
		"zero size":                {Dst: dst.Ptr(), Src: src.Ptr(), Size: 0},
		"negative size":            {Dst: dst.Ptr(), Src: src.Ptr(), Size: -1},
		"source past the end":      {Dst: dst.Ptr(), Src: src.Ptr().Add(1), Size: 4096},
		"destination past the end": {Dst: dst.Ptr().Add(4000), Src: src.Ptr(), Size: 100},
		"source nowhere":           {Dst: dst.Ptr(), Src: 8, Size: 1},
		"destination nowhere":      {Dst: 8, Src: src.Ptr(), Size: 1},
		// Offsets beyond 2^63 from the highest allocation must not wrap
		// into it (the copy ran on the stream worker and crashed it).
		"source at the top of the address space":      {Dst: dst.Ptr(), Src: ^device.Ptr(0) - 4, Size: 1},
		"destination at the top of the address space": {Dst: ^device.Ptr(0) - 4, Src: src.Ptr(), Size: 1},
		// Adjacent mappings must not be treated as one allocation.
		"spanning two allocations": {Dst: dst.Ptr(), Src: src.Ptr().Add(4095), Size: 2},
	}
	for name, bad := range cases {
		t.Run(name, func(t *testing.T) {
			before := d.Stats()
			err := s.BatchCopy([]device.CopyDesc{good, bad, good})
			requireErrorContains(t, err, device.ErrInvalidCopy, "descriptor 1")
			assert.Equal(t, before, d.Stats(), "a rejected batch is not counted")

			// The valid first descriptor did not run either.
			require.NoError(t, s.Synchronize())
			assert.Equal(t, make([]byte, 4096), get(t, d, s, dst))
		})
	}
}

func TestBatchCopySplitsAtHostRegionBoundaries(t *testing.T) {
	const region = 4096
	d := newDevice(t, emu.Options{HostRegionBytes: region})
	s := newStream(t, d)
	host := alloc(t, d, device.HostMapped, 3*region)
	host2 := alloc(t, d, device.HostMapped, 3*region)
	dev := alloc(t, d, device.DeviceMemory, 3*region)
	dev2 := alloc(t, d, device.DeviceMemory, 3*region)
	data := pattern(3*region, 5)
	copy(host.Host(), data)

	// Host [4000, 9000) crosses boundaries at 4096 and 8192: three pieces.
	require.NoError(t, s.BatchCopy([]device.CopyDesc{{Dst: dev.Ptr(), Src: host.Ptr().Add(4000), Size: 5000}}))
	st := d.Stats()
	assert.Equal(t, int64(1), st.BatchCalls)
	assert.Equal(t, int64(3), st.Descriptors)
	assert.Equal(t, int64(2), st.RegionSplits)

	// Device-to-device copies are never split, whatever they cross.
	require.NoError(t, s.BatchCopy([]device.CopyDesc{{Dst: dev2.Ptr(), Src: dev.Ptr(), Size: 3 * region}}))
	st = d.Stats()
	assert.Equal(t, int64(4), st.Descriptors)
	assert.Equal(t, int64(2), st.RegionSplits)

	// Both sides host-mapped and misaligned: cut at each side's boundaries.
	// Src [100, 8292) crosses 4096 and 8192; dst [0, 8192) crosses 4096.
	require.NoError(t, s.BatchCopy([]device.CopyDesc{{Dst: host2.Ptr(), Src: host.Ptr().Add(100), Size: 2 * region}}))
	st = d.Stats()
	assert.Equal(t, int64(4+4), st.Descriptors, "cuts at src 3996, dst 4096, src 8092")
	assert.Equal(t, int64(2+3), st.RegionSplits)

	require.NoError(t, s.Synchronize())
	assert.Equal(t, data[4000:9000], get(t, d, s, dev)[:5000])
	assert.Equal(t, data[4000:9000], get(t, d, s, dev2)[:5000])
	assert.Equal(t, data[100:100+2*region], host2.Host()[:2*region])
	assert.Equal(t, int64(5000+3*region+2*region), d.Stats().BytesCopied-2*3*region, "minus the two get bounces")
}

func TestFailNextFailsTheNextSubmittedDescriptorsAsynchronously(t *testing.T) {
	d := newDevice(t, emu.Options{})
	s := newStream(t, d)
	src := alloc(t, d, device.HostMapped, 300)
	dst := alloc(t, d, device.HostMapped, 300)
	copy(src.Host(), pattern(300, 6))

	d.FailNext(2)
	require.NoError(t, s.BatchCopy([]device.CopyDesc{
		{Dst: dst.Ptr(), Src: src.Ptr(), Size: 100},
		{Dst: dst.Ptr().Add(100), Src: src.Ptr().Add(100), Size: 100},
		{Dst: dst.Ptr().Add(200), Src: src.Ptr().Add(200), Size: 100},
	}), "injected failures are never synchronous")
	err := s.Synchronize()
	requireErrorContains(t, err, device.ErrInjected, "descriptor 0")

	assert.Equal(t, make([]byte, 200), dst.Host()[:200], "failed descriptors copy nothing")
	assert.Equal(t, src.Host()[200:], dst.Host()[200:], "later descriptors of the batch still run")
	assert.Equal(t, int64(100), d.Stats().BytesCopied)

	// The count is spent: the same batch now succeeds.
	require.NoError(t, s.BatchCopy([]device.CopyDesc{{Dst: dst.Ptr(), Src: src.Ptr(), Size: 300}}))
	require.NoError(t, s.Synchronize())
	assert.Equal(t, src.Host(), dst.Host())

	// Only work submitted after FailNext is chosen, even if earlier work has
	// not run yet.
	block, release := blocker()
	defer release()
	earlier, later := newEvent(t, d), newEvent(t, d)
	s2 := newStream(t, d)
	require.NoError(t, s2.HostFunc(block))
	require.NoError(t, s2.BatchCopy([]device.CopyDesc{{Dst: dst.Ptr(), Src: src.Ptr(), Size: 300}}))
	require.NoError(t, s2.Record(earlier))
	d.FailNext(1)
	require.NoError(t, s2.BatchCopy([]device.CopyDesc{{Dst: dst.Ptr(), Src: src.Ptr(), Size: 300}}))
	require.NoError(t, s2.Record(later))
	release()
	assert.NoError(t, earlier.Synchronize())
	assert.ErrorIs(t, later.Synchronize(), device.ErrInjected)

	// FailNext replaces a pending count, and 0 cancels it.
	d.FailNext(5)
	d.FailNext(0)
	require.NoError(t, s.BatchCopy([]device.CopyDesc{{Dst: dst.Ptr(), Src: src.Ptr(), Size: 300}}))
	require.NoError(t, s.Synchronize())
}

func TestFailRateInjectsSeededFailures(t *testing.T) {
	run := func(seed int64, rate float64) (failed int) {
		d := newDevice(t, emu.Options{Seed: seed, FailRate: rate})
		s := newStream(t, d)
		src := alloc(t, d, device.HostMapped, 1)
		dst := alloc(t, d, device.HostMapped, 1)
		ev := newEvent(t, d)
		for range 200 {
			require.NoError(t, s.BatchCopy([]device.CopyDesc{{Dst: dst.Ptr(), Src: src.Ptr(), Size: 1}}))
			require.NoError(t, s.Record(ev))
			if err := ev.Synchronize(); err != nil {
				require.ErrorIs(t, err, device.ErrInjected)
				failed++
			}
		}
		return failed
	}
	assert.Equal(t, 0, run(1, 0))
	assert.Equal(t, 200, run(1, 1))
	half := run(7, 0.5)
	assert.Greater(t, half, 50)
	assert.Less(t, half, 150)
	assert.Equal(t, half, run(7, 0.5), "same seed, same failures")
}

func TestHostFuncFailuresAreAsynchronous(t *testing.T) {
	d := newDevice(t, emu.Options{})
	s := newStream(t, d)
	boom := errors.New("boom")

	require.NoError(t, s.HostFunc(func() error { return boom }))
	assert.ErrorIs(t, s.Synchronize(), boom)

	require.NoError(t, s.HostFunc(func() error { panic("kaboom") }))
	err := s.Synchronize()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "kaboom")

	require.NoError(t, s.HostFunc(func() error { panic(boom) }))
	assert.ErrorIs(t, s.Synchronize(), boom, "a panic with an error value keeps it in the chain")

	assert.Error(t, s.HostFunc(nil))
	require.NoError(t, s.Synchronize(), "the stream keeps working after failures")
}

// Stream.Synchronize reports the first failure since the previous Record or
// Synchronize on the stream.
func TestStreamSynchronizeReportsFailuresSinceLastRecordOrSynchronize(t *testing.T) {
	d := newDevice(t, emu.Options{})
	s := newStream(t, d)
	ev := newEvent(t, d)
	first, second := errors.New("first"), errors.New("second")

	require.NoError(t, s.HostFunc(func() error { return first }))
	require.NoError(t, s.HostFunc(func() error { return second }))
	assert.ErrorIs(t, s.Synchronize(), first)
	assert.NoError(t, s.Synchronize(), "the previous Synchronize consumed it")
	require.NoError(t, s.Record(ev))
	assert.ErrorIs(t, ev.Synchronize(), first, "but an event's interval runs from Record to Record")

	require.NoError(t, s.HostFunc(func() error { return first }))
	require.NoError(t, s.Record(ev))
	assert.NoError(t, s.Synchronize(), "the Record closed that interval")
	assert.ErrorIs(t, ev.Synchronize(), first)
}

func TestStatsCountSubmissions(t *testing.T) {
	d := newDevice(t, emu.Options{})
	s := newStream(t, d)
	a := alloc(t, d, device.DeviceMemory, 64)
	b := alloc(t, d, device.DeviceMemory, 64)

	block, release := blocker()
	require.NoError(t, s.HostFunc(block))
	require.NoError(t, s.BatchCopy([]device.CopyDesc{
		{Dst: b.Ptr(), Src: a.Ptr(), Size: 32},
		{Dst: b.Ptr().Add(32), Src: a.Ptr().Add(32), Size: 32},
	}))
	require.NoError(t, s.BatchCopy(nil), "an empty batch is a no-op")
	st := d.Stats()
	assert.Equal(t, int64(1), st.BatchCalls, "counted at submission, before the work runs")
	assert.Equal(t, int64(2), st.Descriptors)
	assert.Equal(t, int64(1), st.HostFuncs)
	assert.Zero(t, st.BytesCopied, "counted at execution")

	release()
	require.NoError(t, s.Synchronize())
	assert.Equal(t, int64(64), d.Stats().BytesCopied)
	assert.Equal(t, emu.KindCounts{Device: 2}, d.Stats().LiveAllocs)
}

func TestCopyFromHostConsumesSourceBeforeReturning(t *testing.T) {
	d := emu.New(emu.Options{Seed: 3, MaxDelay: 2 * time.Millisecond})
	defer d.Close()
	s, err := d.NewStream()
	require.NoError(t, err)
	dst, err := d.Alloc(device.HostMapped, 8)
	require.NoError(t, err)

	src := []byte{1, 2, 3, 4, 5, 6, 7, 8}
	require.NoError(t, s.CopyFromHost(dst.Ptr(), src))
	for i := range src {
		src[i] = 0xEE // reused at once, as the contract allows
	}
	require.NoError(t, s.Synchronize())
	assert.Equal(t, []byte{1, 2, 3, 4, 5, 6, 7, 8}, dst.Host())

	err = s.CopyFromHost(dst.Ptr().Add(4), src)
	assert.ErrorIs(t, err, device.ErrInvalidCopy, "past the allocation's end")
}

// WaitHost holds the work enqueued after it until its channel closes, and
// holds no host function meanwhile: under SharedHostThread another stream's
// host functions still run.
func TestWaitHostHoldsLaterWorkWithoutAHostFunction(t *testing.T) {
	d := newDevice(t, emu.Options{SharedHostThread: true})
	s, other := newStream(t, d), newStream(t, d)
	done := make(chan struct{})
	require.NoError(t, s.(device.HostWaiter).WaitHost(done))
	ran := make(chan struct{})
	require.NoError(t, s.HostFunc(func() error { close(ran); return nil }))

	require.NoError(t, other.HostFunc(func() error { return nil }))
	require.NoError(t, other.Synchronize(), "another stream's host function runs while s waits")
	select {
	case <-ran:
		t.Fatal("work after WaitHost ran before its channel closed")
	default:
	}
	close(done)
	require.NoError(t, s.Synchronize())
	<-ran
}

// SharedHostThread runs the host functions of all streams one at a time: a
// host function that blocks delays another stream's, as on CUDA's driver
// thread.
func TestSharedHostThreadSerializesHostFunctions(t *testing.T) {
	d := newDevice(t, emu.Options{SharedHostThread: true})
	s, other := newStream(t, d), newStream(t, d)
	fn, release := blocker()
	started := make(chan struct{})
	require.NoError(t, s.HostFunc(func() error { close(started); return fn() }))
	<-started
	ran := make(chan struct{})
	require.NoError(t, other.HostFunc(func() error { close(ran); return nil }))
	select {
	case <-ran:
		t.Fatal("a host function ran while another stream's host function blocked")
	case <-time.After(20 * time.Millisecond):
	}
	release()
	require.NoError(t, other.Synchronize())
	<-ran
	require.NoError(t, s.Synchronize())
}
