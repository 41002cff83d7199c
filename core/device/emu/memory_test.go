package emu_test

import (
	"os"
	"sync"
	"syscall"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core/device"
	"github.com/kvcm/kvcm/core/device/emu"
)

func TestDeviceMemoryIsNotReachableFromTheHost(t *testing.T) {
	d := newDevice(t, emu.Options{})
	m := alloc(t, d, device.DeviceMemory, 4096)

	assert.Nil(t, m.Host())
	assert.NotZero(t, m.Ptr())
	assert.Equal(t, int64(4096), m.Size())
	assert.Equal(t, device.DeviceMemory, m.Kind())
}

func TestHostMappedPtrIsTheHostAddressOfItsBytes(t *testing.T) {
	d := newDevice(t, emu.Options{})
	m := alloc(t, d, device.HostMapped, 100)

	h := m.Host()
	require.Len(t, h, 100)
	assert.Equal(t, device.Ptr(uintptr(unsafe.Pointer(&h[0]))), m.Ptr())
	assert.Equal(t, device.HostMapped, m.Kind())
	assert.Equal(t, h, make([]byte, 100), "fresh memory is zeroed")
}

func TestAllocRejectsBadArguments(t *testing.T) {
	d := newDevice(t, emu.Options{})
	for _, size := range []int64{0, -1} {
		_, err := d.Alloc(device.DeviceMemory, size)
		assert.Error(t, err, "size %d", size)
	}
	_, err := d.Alloc(device.MemoryKind(7), 64)
	assert.Error(t, err)
}

func TestMemoryLimitsApplyPerKind(t *testing.T) {
	d := newDevice(t, emu.Options{DeviceMemoryLimit: 1 << 16, HostMemoryLimit: 1 << 12})

	dev := alloc(t, d, device.DeviceMemory, 1<<16)
	_, err := d.Alloc(device.DeviceMemory, 1)
	requireErrorContains(t, err, device.ErrOutOfMemory, "device")

	// The device limit does not constrain host-mapped memory, and vice versa.
	host := alloc(t, d, device.HostMapped, 1<<12)
	_, err = d.Alloc(device.HostMapped, 1)
	requireErrorContains(t, err, device.ErrOutOfMemory, "host-mapped")

	// Freeing gives the bytes back.
	require.NoError(t, dev.Free())
	alloc(t, d, device.DeviceMemory, 1<<15)
	alloc(t, d, device.DeviceMemory, 1<<15)
	require.NoError(t, host.Free())
	alloc(t, d, device.HostMapped, 1<<12)

	st := d.Stats()
	assert.Equal(t, emu.KindCounts{Device: 3, HostMapped: 2}, st.Allocs)
	assert.Equal(t, emu.KindCounts{Device: 2, HostMapped: 1}, st.LiveAllocs)
	assert.Equal(t, emu.KindCounts{Device: 1 << 16, HostMapped: 1 << 12}, st.LiveBytes)
	assert.Equal(t, int64(1<<16+1<<12), st.LiveBytes.Total())
	assert.Equal(t, int64(1<<12), st.LiveBytes.Of(device.HostMapped))
}

func TestFreeTwiceFailsAndHostViewGoesAway(t *testing.T) {
	d := newDevice(t, emu.Options{})
	m := alloc(t, d, device.HostMapped, 64)

	require.NoError(t, m.Free())
	assert.Nil(t, m.Host())
	assert.ErrorIs(t, m.Free(), emu.ErrDoubleFree)
	assert.Zero(t, d.Stats().LiveAllocs.Total())
}

func TestCopyOfFreedMemoryIsRejectedSynchronously(t *testing.T) {
	d := newDevice(t, emu.Options{})
	s := newStream(t, d)
	src := alloc(t, d, device.DeviceMemory, 64)
	dst := alloc(t, d, device.DeviceMemory, 64)
	require.NoError(t, src.Free())

	err := s.BatchCopy([]device.CopyDesc{{Dst: dst.Ptr(), Src: src.Ptr(), Size: 64}})
	requireErrorContains(t, err, device.ErrInvalidCopy, "descriptor 0")
}

// Freeing memory that queued work still names is a caller bug; the emulator
// reports it as an asynchronous failure instead of touching unmapped pages.
func TestUseAfterFreeIsAnAsynchronousFailure(t *testing.T) {
	for _, side := range []string{"source", "destination"} {
		t.Run(side, func(t *testing.T) {
			d := newDevice(t, emu.Options{})
			s := newStream(t, d)
			src := alloc(t, d, device.HostMapped, 4096)
			dst := alloc(t, d, device.DeviceMemory, 4096)
			ev := newEvent(t, d)

			block, release := blocker()
			defer release()
			require.NoError(t, s.HostFunc(block))
			require.NoError(t, s.BatchCopy([]device.CopyDesc{{Dst: dst.Ptr(), Src: src.Ptr(), Size: 4096}}))
			require.NoError(t, s.Record(ev))
			victim := src
			if side == "destination" {
				victim = dst
			}
			require.NoError(t, victim.Free(), "free does not wait for queued work")
			release()

			err := ev.Synchronize()
			requireErrorContains(t, err, device.ErrInvalidCopy, "descriptor 0")
			assert.Contains(t, err.Error(), side)
			assert.Zero(t, d.Stats().BytesCopied, "a failed descriptor copies nothing")
		})
	}
}

func TestReserveGrowsAndShrinksInPlace(t *testing.T) {
	d := emu.New(emu.Options{DeviceMemoryLimit: 1 << 20})
	defer d.Close()
	s, err := d.NewStream()
	require.NoError(t, err)
	g, err := d.Reserve(4096, 1<<30)
	require.NoError(t, err)
	base := g.Ptr()
	assert.Equal(t, int64(4096), g.Size())
	assert.Equal(t, int64(1<<30), g.Capacity())
	assert.Equal(t, int64(4096), d.Stats().LiveBytes.Device, "only committed bytes count")

	host, err := d.Alloc(device.HostMapped, 8192)
	require.NoError(t, err)
	err = s.BatchCopy([]device.CopyDesc{{Dst: base.Add(4096), Src: host.Ptr(), Size: 4096}})
	assert.ErrorIs(t, err, device.ErrInvalidCopy, "beyond the committed size")

	require.NoError(t, g.Resize(8192))
	assert.Equal(t, base, g.Ptr(), "growing never moves the base")
	require.NoError(t, s.BatchCopy([]device.CopyDesc{{Dst: base.Add(4096), Src: host.Ptr(), Size: 4096}}))
	require.NoError(t, s.Synchronize())

	assert.ErrorIs(t, g.Resize(2<<20), device.ErrOutOfMemory, "the limit counts committed bytes")
	require.NoError(t, g.Resize(4096))
	assert.Equal(t, int64(4096), d.Stats().LiveBytes.Device)
	assert.Error(t, g.Resize(0))
	require.NoError(t, g.Free())
}

// Size of growable memory is readable while another goroutine resizes it: host
// functions and pool code read it in stream order (checked under -race).
func TestGrowableSizeIsSafeDuringResize(t *testing.T) {
	d := newDevice(t, emu.Options{})
	g, err := d.Reserve(4096, 1<<20)
	require.NoError(t, err)
	s := newStream(t, d)

	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := range 200 {
			if err := g.Resize(int64(4096 * (1 + i%8))); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	// A host function reading Size, as pool code running in stream order may.
	for range 200 {
		require.NoError(t, s.HostFunc(func() error {
			_ = g.Size()
			return nil
		}))
	}
	wg.Wait()
	require.NoError(t, s.Synchronize())
}

// After Device.Close every operation on what the device created fails with
// device.ErrClosed, Resize of growable memory too.
func TestResizeAfterDeviceCloseIsErrClosed(t *testing.T) {
	d := emu.New(emu.Options{})
	g, err := d.Reserve(4096, 1<<20)
	require.NoError(t, err)
	require.NoError(t, d.Close())
	require.ErrorIs(t, g.Free(), device.ErrClosed, "Free follows the contract")
	require.ErrorIs(t, g.Resize(8192), device.ErrClosed)
}

// With ResidentHostMemory, host-mapped memory is resident from Alloc (as
// pinned memory is), not faulted in at first use.
func TestResidentHostMemoryIsFaultedInAtAlloc(t *testing.T) {
	d := newDevice(t, emu.Options{ResidentHostMemory: true})
	m := alloc(t, d, device.HostMapped, 1<<20)
	vec := make([]byte, (1<<20)/os.Getpagesize())
	h := m.Host()
	_, _, errno := syscall.Syscall(syscall.SYS_MINCORE, uintptr(unsafe.Pointer(&h[0])), uintptr(len(h)), uintptr(unsafe.Pointer(&vec[0])))
	require.Zero(t, errno, "mincore")
	for i, v := range vec {
		require.NotZero(t, v&1, "page %d is resident", i)
	}
}
