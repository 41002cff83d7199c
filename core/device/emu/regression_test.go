package emu_test

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core/device"
	"github.com/kvcm/kvcm/core/device/emu"
)

// Size of growable memory must be readable while another goroutine resizes
// it (the CUDA backend keeps an atomic copy, curSize, for exactly this: host
// functions and pool code read Size concurrently). emu's memory.Size
// (memory.go:160) reads allocation.committed without Device.memMu, while
// Resize (memory.go:142) writes it under memMu: a data race. Fails under
// -race.
func TestRegressionGrowableSizeRacesWithResize(t *testing.T) {
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

// Device.Close documents that every later operation on anything the device
// created fails with device.ErrClosed (Free does). Growable.Resize after
// Close instead reports "resize freed memory" without wrapping ErrClosed
// (memory.go:123-124), so callers cannot tell a closed device from their own
// double free.
func TestRegressionResizeAfterDeviceCloseIsErrClosed(t *testing.T) {
	d := emu.New(emu.Options{})
	g, err := d.Reserve(4096, 1<<20)
	require.NoError(t, err)
	require.NoError(t, d.Close())
	require.ErrorIs(t, g.Free(), device.ErrClosed, "Free follows the contract")
	require.ErrorIs(t, g.Resize(8192), device.ErrClosed)
}
