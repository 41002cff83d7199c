//go:build cgo

package gpucodec

import (
	"errors"
	"math/rand/v2"
	"os"
	"sync"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core/codec"
	"github.com/kvcm/kvcm/core/device"
	"github.com/kvcm/kvcm/core/device/cuda"
	"github.com/kvcm/kvcm/internal/testkit/codectest"
)

var (
	sharedOnce sync.Once
	shared     *cuda.Device
	sharedErr  error
)

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

// gpu returns the shared CUDA device or skips the test.
func gpu(t *testing.T) *cuda.Device {
	t.Helper()
	sharedOnce.Do(func() { shared, sharedErr = cuda.New(cuda.Options{}) })
	if errors.Is(sharedErr, cuda.ErrUnavailable) {
		t.Skipf("no usable CUDA GPU: %v", sharedErr)
	}
	require.NoError(t, sharedErr)
	return shared
}

func rig(t *testing.T, d device.Device, kind device.MemoryKind, specs ...codectest.GroupSpec) *codectest.Rig {
	t.Helper()
	r, err := codectest.NewRig(d, kind, specs...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = r.Close() })
	return r
}

func random(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, 11))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func pairBytes(pairs []codec.PageIndexPair) []byte {
	if len(pairs) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&pairs[0])), len(pairs)*codec.PageIndexPairBytes)
}

// deviceIndices uploads pairs into device memory the test owns.
func deviceIndices(t *testing.T, r *codectest.Rig, s device.Stream, pairs []codec.PageIndexPair) codec.PageIndices {
	t.Helper()
	m, err := r.Alloc(device.DeviceMemory, int64(max(1, len(pairs)))*codec.PageIndexPairBytes)
	require.NoError(t, err)
	require.NoError(t, s.CopyFromHost(m.Ptr(), pairBytes(pairs)))
	return codec.DeviceIndices(m.Ptr(), len(pairs))
}
