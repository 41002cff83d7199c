//go:build cgo

package cuda

import (
	"errors"
	"math/rand/v2"
	"os"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core/device"
)

var (
	sharedOnce sync.Once
	shared     *Device
	sharedErr  error
)

// TestMain closes the shared device, which keeps the primary context retained
// so that tests opening their own devices do not recreate it each time.
func TestMain(m *testing.M) {
	code := m.Run()
	if shared != nil {
		if err := shared.Close(); err != nil && code == 0 {
			println("closing the shared device:", err.Error())
			code = 1
		}
	}
	os.Exit(code)
}

// gpu returns the device shared by the tests, or skips the test where there
// is no usable GPU.
func gpu(t *testing.T) *Device {
	t.Helper()
	sharedOnce.Do(func() { shared, sharedErr = New(Options{}) })
	if errors.Is(sharedErr, ErrUnavailable) {
		t.Skipf("no usable CUDA GPU: %v", sharedErr)
	}
	require.NoError(t, sharedErr)
	return shared
}

// ownDevice opens a device with opts for one test and closes it after.
func ownDevice(t *testing.T, opts Options) *Device {
	t.Helper()
	gpu(t)
	d, err := New(opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = d.Close() })
	return d
}

func alloc(t *testing.T, d *Device, kind device.MemoryKind, n int64) device.Memory {
	t.Helper()
	m, err := d.Alloc(kind, n)
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Free() })
	return m
}

func stream(t *testing.T, d *Device) *Stream {
	t.Helper()
	s, err := d.newStream()
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func event(t *testing.T, d *Device) *Event {
	t.Helper()
	e, err := d.newEvent(false)
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Close() })
	return e
}

func random(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, 7))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// upload copies b to p (any kind) through a host-mapped staging buffer.
func upload(t *testing.T, d *Device, s *Stream, p device.Ptr, b []byte) {
	t.Helper()
	st := alloc(t, d, device.HostMapped, int64(len(b)))
	copy(st.Host(), b)
	require.NoError(t, s.BatchCopy([]device.CopyDesc{{Dst: p, Src: st.Ptr(), Size: int64(len(b))}}))
	require.NoError(t, s.Synchronize())
}

// download reads n bytes at p (any kind).
func download(t *testing.T, d *Device, s *Stream, p device.Ptr, n int64) []byte {
	t.Helper()
	st := alloc(t, d, device.HostMapped, n)
	require.NoError(t, s.BatchCopy([]device.CopyDesc{{Dst: st.Ptr(), Src: p, Size: n}}))
	require.NoError(t, s.Synchronize())
	return append([]byte(nil), st.Host()...)
}
