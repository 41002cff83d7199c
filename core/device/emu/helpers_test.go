package emu_test

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core/device"
	"github.com/kvcm/kvcm/core/device/emu"
)

var kinds = []device.MemoryKind{device.DeviceMemory, device.HostMapped}

// TestMain fails the package if any stream goroutine outlives the tests: every
// test closes its devices, and Close must stop them all.
func TestMain(m *testing.M) {
	before := runtime.NumGoroutine()
	code := m.Run()
	if code == 0 {
		if err := settleGoroutines(before, 2*time.Second); err != nil {
			fmt.Fprintln(os.Stderr, err)
			code = 1
		}
	}
	os.Exit(code)
}

func settleGoroutines(want int, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		n := runtime.NumGoroutine()
		if n <= want {
			return nil
		}
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			buf = buf[:runtime.Stack(buf, true)]
			return fmt.Errorf("goroutine leak: %d running, %d before the tests\n%s", n, want, buf)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// newDevice returns a device closed at the end of the test (unless the test
// closed it itself).
func newDevice(t *testing.T, opts emu.Options) *emu.Device {
	t.Helper()
	d := emu.New(opts)
	t.Cleanup(func() {
		if err := d.Close(); err != nil && !errors.Is(err, device.ErrClosed) {
			t.Errorf("closing device: %v", err)
		}
	})
	return d
}

func newStream(t *testing.T, d *emu.Device) device.Stream {
	t.Helper()
	s, err := d.NewStream()
	require.NoError(t, err)
	return s
}

func newEvent(t *testing.T, d *emu.Device) device.Event {
	t.Helper()
	ev, err := d.NewEvent()
	require.NoError(t, err)
	return ev
}

func alloc(t *testing.T, d *emu.Device, kind device.MemoryKind, size int64) device.Memory {
	t.Helper()
	m, err := d.Alloc(kind, size)
	require.NoError(t, err)
	return m
}

// pattern returns n bytes that differ between seeds and from zero.
func pattern(n int, seed int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7+seed*13) | 1
	}
	return b
}

// put writes data at offset 0 of m, through a host-mapped bounce buffer when
// m is device memory, and waits for it.
func put(t *testing.T, d *emu.Device, s device.Stream, m device.Memory, data []byte) {
	t.Helper()
	if m.Kind() == device.HostMapped {
		copy(m.Host(), data)
		return
	}
	bounce := alloc(t, d, device.HostMapped, int64(len(data)))
	defer func() { require.NoError(t, bounce.Free()) }()
	copy(bounce.Host(), data)
	require.NoError(t, s.BatchCopy([]device.CopyDesc{{Dst: m.Ptr(), Src: bounce.Ptr(), Size: int64(len(data))}}))
	require.NoError(t, s.Synchronize())
}

// get returns a copy of all of m's bytes, read through a host-mapped bounce
// buffer when m is device memory.
func get(t *testing.T, d *emu.Device, s device.Stream, m device.Memory) []byte {
	t.Helper()
	if m.Kind() == device.HostMapped {
		return append([]byte(nil), m.Host()...)
	}
	bounce := alloc(t, d, device.HostMapped, m.Size())
	defer func() { require.NoError(t, bounce.Free()) }()
	require.NoError(t, s.BatchCopy([]device.CopyDesc{{Dst: bounce.Ptr(), Src: m.Ptr(), Size: m.Size()}}))
	require.NoError(t, s.Synchronize())
	return append([]byte(nil), bounce.Host()...)
}

// blocker returns a host function that blocks its stream until release is
// called, and release itself (safe to call more than once).
func blocker() (fn func() error, release func()) {
	ch := make(chan struct{})
	var once sync.Once
	return func() error { <-ch; return nil }, func() { once.Do(func() { close(ch) }) }
}

func requireErrorContains(t *testing.T, err error, target error, substr string) {
	t.Helper()
	require.ErrorIs(t, err, target)
	require.True(t, strings.Contains(err.Error(), substr), "error %q should mention %q", err, substr)
}
