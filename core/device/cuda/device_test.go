//go:build cgo

package cuda

import (
	"errors"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core/device"
)

// Runs everywhere: where there is no driver or no GPU, New fails with an
// error, never a crash or an exit.
func TestNewFailsCleanlyWithoutDriverOrGPU(t *testing.T) {
	_, err := New(Options{LibraryPath: "/nonexistent/libcuda.so.1"})
	require.ErrorIs(t, err, ErrUnavailable)
	assert.Contains(t, err.Error(), "/nonexistent/libcuda.so.1")

	_, err = OpenDevice(Options{Ordinal: 1 << 20})
	require.ErrorIs(t, err, ErrUnavailable, "no such ordinal, or no GPU at all")

	if !Available() {
		_, err := New(Options{})
		require.ErrorIs(t, err, ErrUnavailable)
		t.Logf("without a GPU: %v", err)
	}
}

func TestNewRejectsBadRegionSize(t *testing.T) {
	for _, r := range []int64{-4096, 1000, MaxHostRegionBytes + 4096} {
		_, err := New(Options{HostRegionBytes: r})
		require.Error(t, err, "region %d", r)
		assert.NotErrorIs(t, err, ErrUnavailable)
	}
}

func TestPropertiesAndErrorNames(t *testing.T) {
	d := gpu(t)
	p := d.Properties()
	t.Logf("%+v", p)
	assert.Equal(t, "cuda", d.Name())
	assert.NotEmpty(t, p.Name)
	assert.Positive(t, p.Multiprocessors)
	assert.Positive(t, p.TotalMemory)
	assert.GreaterOrEqual(t, p.DriverVersion, 11030)
	if p.DriverVersion >= 13000 {
		assert.Equal(t, Batch13000, p.BatchMode)
	} else if p.DriverVersion >= 12080 {
		assert.Equal(t, Batch12080, p.BatchMode)
	}
	// A driver error carries its CUresult name and wraps
	// device.ErrOutOfMemory when it is one.
	_, err := d.Alloc(device.DeviceMemory, 1<<50)
	require.Error(t, err)
	var ce *Error
	require.True(t, errors.As(err, &ce), "%v", err)
	assert.Equal(t, "CUDA_ERROR_OUT_OF_MEMORY", ce.Name)
	assert.ErrorIs(t, err, device.ErrOutOfMemory)
	assert.Contains(t, err.Error(), "CUDA_ERROR_OUT_OF_MEMORY")
}

func TestHostMappedPtrIsTheHostAddress(t *testing.T) {
	d := gpu(t)
	m := alloc(t, d, device.HostMapped, 12345)
	assert.Equal(t, device.HostMapped, m.Kind())
	assert.EqualValues(t, 12345, m.Size())
	require.Len(t, m.Host(), 12345)
	assert.Equal(t, m.Ptr(), hostAddr(m.Host()))
	dm := alloc(t, d, device.DeviceMemory, 4096)
	assert.Nil(t, dm.Host())

	m2, err := d.Alloc(device.HostMapped, 64)
	require.NoError(t, err)
	require.NoError(t, m2.Free())
	assert.ErrorIs(t, m2.Free(), ErrDoubleFree)
	assert.Nil(t, m2.Host())
	_, err = d.Alloc(device.HostMapped, 0)
	assert.Error(t, err)
}

func TestBatchCopyBetweenEveryPairOfKinds(t *testing.T) {
	d := gpu(t)
	s := stream(t, d)
	kinds := []device.MemoryKind{device.DeviceMemory, device.HostMapped}
	for i, sk := range kinds {
		for j, dk := range kinds {
			want := random(1<<20, uint64(10*i+j))
			src := alloc(t, d, sk, 1<<20)
			dst := alloc(t, d, dk, 1<<20)
			upload(t, d, s, src.Ptr(), want)
			// Scattered: 256 descriptors of 4 KiB in reversed order.
			var descs []device.CopyDesc
			for k := int64(0); k < 256; k++ {
				descs = append(descs, device.CopyDesc{Dst: dst.Ptr().Add((255 - k) * 4096), Src: src.Ptr().Add(k * 4096), Size: 4096})
			}
			require.NoError(t, s.BatchCopy(descs))
			got := download(t, d, s, dst.Ptr(), 1<<20)
			for k := 0; k < 256; k++ {
				require.Equal(t, want[k*4096:(k+1)*4096], got[(255-k)*4096:(256-k)*4096], "%v -> %v chunk %d", sk, dk, k)
			}
		}
	}
}

func TestInvalidCopyIsRejectedSynchronously(t *testing.T) {
	d := gpu(t)
	s := stream(t, d)
	a := alloc(t, d, device.DeviceMemory, 4096)
	b := alloc(t, d, device.HostMapped, 4096)
	copy(b.Host(), random(4096, 1))
	before := append([]byte(nil), b.Host()...)
	freed, err := d.Alloc(device.DeviceMemory, 4096)
	require.NoError(t, err)
	require.NoError(t, freed.Free())
	for name, bad := range map[string]device.CopyDesc{
		"zero size":    {Dst: b.Ptr(), Src: a.Ptr(), Size: 0},
		"past the end": {Dst: b.Ptr(), Src: a.Ptr().Add(1), Size: 4096},
		"freed":        {Dst: b.Ptr(), Src: freed.Ptr(), Size: 16},
		"nowhere":      {Dst: 16, Src: a.Ptr(), Size: 16},
	} {
		good := device.CopyDesc{Dst: b.Ptr(), Src: a.Ptr(), Size: 4096}
		err := s.BatchCopy([]device.CopyDesc{good, bad})
		require.ErrorIs(t, err, device.ErrInvalidCopy, name)
		assert.Contains(t, err.Error(), "descriptor 1", name)
	}
	require.NoError(t, s.Synchronize())
	assert.Equal(t, before, b.Host(), "the valid descriptor before the bad one was not enqueued")
	err = s.CopyFromHost(a.Ptr().Add(4000), make([]byte, 200))
	assert.ErrorIs(t, err, device.ErrInvalidCopy)
}

// With registration regions of 64 KiB, descriptors crossing region
// boundaries of a host-mapped allocation are split and still copy exactly.
func TestBatchCopySplitsAtRegionBoundaries(t *testing.T) {
	d := ownDevice(t, Options{HostRegionBytes: 64 << 10})
	s := stream(t, d)
	const n = 1 << 20
	host := alloc(t, d, device.HostMapped, n)
	dev := alloc(t, d, device.DeviceMemory, n)
	want := random(n, 3)
	copy(host.Host(), want)
	// One descriptor over everything, and odd ones straddling boundaries.
	require.NoError(t, s.BatchCopy([]device.CopyDesc{{Dst: dev.Ptr(), Src: host.Ptr(), Size: n}}))
	require.NoError(t, s.Synchronize())
	clear(host.Host())
	descs := []device.CopyDesc{
		{Dst: host.Ptr().Add(60 << 10), Src: dev.Ptr().Add(60 << 10), Size: 200 << 10},
		{Dst: host.Ptr(), Src: dev.Ptr(), Size: 60 << 10},
		{Dst: host.Ptr().Add(260 << 10), Src: dev.Ptr().Add(260 << 10), Size: n - 260<<10 - 3},
		{Dst: host.Ptr().Add(n - 3), Src: dev.Ptr().Add(n - 3), Size: 3},
	}
	require.NoError(t, s.BatchCopy(descs))
	require.NoError(t, s.Synchronize())
	require.Equal(t, want, host.Host())
	// Host to host across boundaries on both sides, at different phases.
	other := alloc(t, d, device.HostMapped, n)
	require.NoError(t, s.BatchCopy([]device.CopyDesc{{Dst: other.Ptr().Add(1000), Src: host.Ptr().Add(5000), Size: n - 5000}}))
	require.NoError(t, s.Synchronize())
	require.Equal(t, want[5000:], other.Host()[1000:1000+n-5000])
	// CopyFromHost into host-mapped memory across boundaries.
	src := random(300<<10, 4)
	require.NoError(t, s.CopyFromHost(other.Ptr().Add(10<<10), src))
	require.NoError(t, s.Synchronize())
	require.Equal(t, src, other.Host()[10<<10:10<<10+len(src)])
}

func TestCopyFromHostConsumesSourceBeforeReturning(t *testing.T) {
	for _, legacy := range []bool{false, true} {
		d := gpu(t)
		if legacy {
			d = ownDevice(t, Options{ForceLegacyCopies: true})
			require.Equal(t, BatchLegacy, d.Properties().BatchMode)
		}
		s := stream(t, d)
		dst := alloc(t, d, device.DeviceMemory, 64<<10)
		for _, n := range []int{8, 4064, 4065, 10000, 64 << 10} {
			src := random(n, uint64(n))
			want := append([]byte(nil), src...)
			require.NoError(t, s.CopyFromHost(dst.Ptr(), src))
			clear(src) // the call has consumed it
			got := download(t, d, s, dst.Ptr(), int64(n))
			require.Equal(t, want, got, "legacy=%v n=%d", legacy, n)
		}
		// Unaligned destination.
		src := random(5000, 9)
		require.NoError(t, s.CopyFromHost(dst.Ptr().Add(3), src))
		require.Equal(t, src, download(t, d, s, dst.Ptr().Add(3), 5000), "legacy=%v unaligned", legacy)
	}
}

func TestLegacyBatchCopy(t *testing.T) {
	d := ownDevice(t, Options{ForceLegacyCopies: true})
	s := stream(t, d)
	src := alloc(t, d, device.DeviceMemory, 1<<20)
	dst := alloc(t, d, device.HostMapped, 1<<20)
	want := random(1<<20, 5)
	upload(t, d, s, src.Ptr(), want)
	var descs []device.CopyDesc
	for k := int64(0); k < 64; k++ {
		descs = append(descs, device.CopyDesc{Dst: dst.Ptr().Add(k * 16384), Src: src.Ptr().Add((63 - k) * 16384), Size: 16384})
	}
	require.NoError(t, s.BatchCopy(descs))
	require.NoError(t, s.Synchronize())
	for k := 0; k < 64; k++ {
		require.Equal(t, want[(63-k)*16384:(64-k)*16384], dst.Host()[k*16384:(k+1)*16384])
	}
}

func TestRawBatchMatchesBatchCopy(t *testing.T) {
	d := gpu(t)
	s := stream(t, d)
	src := alloc(t, d, device.HostMapped, 1<<16)
	dst := alloc(t, d, device.DeviceMemory, 1<<16)
	copy(src.Host(), random(1<<16, 6))
	raw := NewRawBatch([]device.CopyDesc{{Dst: dst.Ptr(), Src: src.Ptr(), Size: 1 << 16}})
	require.Equal(t, 1, raw.Len())
	require.NoError(t, s.SubmitRaw(raw))
	require.Equal(t, src.Host(), download(t, d, s, dst.Ptr(), 1<<16))
}

func TestMemset(t *testing.T) {
	d := gpu(t)
	s := stream(t, d)
	m := alloc(t, d, device.DeviceMemory, 4096)
	require.NoError(t, s.Memset(m.Ptr().Add(100), 0xab, 1000))
	got := download(t, d, s, m.Ptr().Add(100), 1000)
	for _, b := range got {
		require.Equal(t, byte(0xab), b)
	}
	assert.ErrorIs(t, s.Memset(m.Ptr(), 0, 5000), device.ErrInvalidCopy)
}

func TestReserveGrowsAndShrinksInPlace(t *testing.T) {
	d := gpu(t)
	s := stream(t, d)
	g, err := d.Reserve(3<<20, 64<<20)
	require.NoError(t, err)
	defer func() { require.NoError(t, g.Free()) }()
	base := g.Ptr()
	assert.EqualValues(t, 3<<20, g.Size())
	assert.EqualValues(t, 64<<20, g.Capacity())
	want := random(3<<20, 8)
	upload(t, d, s, base, want)
	require.NoError(t, g.Resize(40<<20))
	assert.Equal(t, base, g.Ptr(), "the base never moves")
	assert.EqualValues(t, 40<<20, g.Size())
	got := download(t, d, s, base, 40<<20)
	require.Equal(t, want, got[:3<<20], "committed bytes survive growth")
	require.Equal(t, make([]byte, 37<<20), got[3<<20:], "grown bytes read as zero")
	require.NoError(t, g.Resize(1<<20))
	require.Equal(t, want[:1<<20], download(t, d, s, base, 1<<20))
	err = s.BatchCopy([]device.CopyDesc{{Dst: base, Src: base.Add(2 << 20), Size: 16}})
	assert.ErrorIs(t, err, device.ErrInvalidCopy, "the released tail is no longer addressable")
	require.NoError(t, g.Resize(5<<20))
	got = download(t, d, s, base, 5<<20)
	require.Equal(t, want[:1<<20], got[:1<<20])
	require.Equal(t, make([]byte, 4<<20), got[1<<20:], "no stale bytes after shrink and regrow")
	assert.Error(t, g.Resize(0))
	assert.Error(t, g.Resize(65<<20))
}

func TestModuleLoadErrorCarriesTheLog(t *testing.T) {
	d := gpu(t)
	_, err := d.LoadModule([]byte(".version 7.8\n.target sm_90\n.address_size 64\nthis is not ptx\n"))
	require.Error(t, err)
	var ce *Error
	require.True(t, errors.As(err, &ce))
	assert.True(t, strings.HasPrefix(ce.Name, "CUDA_ERROR_"), ce.Name)
	t.Logf("%v", err)
}

func TestStreamFromHandleAndClose(t *testing.T) {
	d := ownDevice(t, Options{})
	s, err := d.NewStream()
	require.NoError(t, err)
	got, err := d.StreamFromHandle(s.Handle())
	require.NoError(t, err)
	assert.Same(t, s, got)
	assert.NotZero(t, s.Handle())
	_, err = d.StreamFromHandle(12345)
	assert.ErrorIs(t, err, device.ErrUnknownStream)
	var ran atomic.Bool
	require.NoError(t, s.HostFunc(func() error { ran.Store(true); return nil }))
	require.NoError(t, s.Close(), "close drains")
	assert.True(t, ran.Load())
	_, err = d.StreamFromHandle(s.Handle())
	assert.ErrorIs(t, err, device.ErrUnknownStream)
	assert.ErrorIs(t, s.HostFunc(func() error { return nil }), device.ErrClosed)
	assert.ErrorIs(t, s.Close(), device.ErrClosed)

	m, err := d.Alloc(device.HostMapped, 4096)
	require.NoError(t, err)
	e, err := d.NewEvent()
	require.NoError(t, err)
	require.NoError(t, d.Close())
	assert.ErrorIs(t, d.Close(), device.ErrClosed)
	assert.ErrorIs(t, m.Free(), device.ErrClosed, "Close freed it")
	_, qerr := e.Query()
	assert.ErrorIs(t, qerr, device.ErrClosed)
	_, err = d.NewStream()
	assert.ErrorIs(t, err, device.ErrClosed)
	_, err = d.Alloc(device.DeviceMemory, 16)
	assert.ErrorIs(t, err, device.ErrClosed)
}

func hostAddr(b []byte) device.Ptr { return device.Ptr(uintptrOf(b)) }
