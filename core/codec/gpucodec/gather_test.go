//go:build cgo

package gpucodec

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core/codec"
	"github.com/kvcm/kvcm/core/device"
	"github.com/kvcm/kvcm/core/device/cuda"
	"github.com/kvcm/kvcm/core/layout"
	"github.com/kvcm/kvcm/internal/testkit/codectest"
)

// Three groups: 16-byte aligned pools of several sizes (one spanning several
// tiles, one under a tile), tiny aligned pools, and unaligned pools (the
// byte-wise kernel). Lifecycles 0 and 2 share group 0.
var gatherSpecs = []codectest.GroupSpec{
	{NumSlots: 37, LifeCycles: []layout.LayerGroupID{0, 2}, SlotBytes: []int64{4096, 1024, 16384 + 48}},
	{NumSlots: 20, LifeCycles: []layout.LayerGroupID{1}, SlotBytes: []int64{48, 80}},
	{NumSlots: 9, LifeCycles: []layout.LayerGroupID{3}, SlotBytes: []int64{3, 10, 4099}},
}

func TestGatherRoundTripsToTheByte(t *testing.T) {
	d := gpu(t)
	for _, hotKind := range []device.MemoryKind{device.DeviceMemory, device.HostMapped} {
		t.Run(hotKind.String(), func(t *testing.T) {
			r := rig(t, d, hotKind, gatherSpecs...)
			g, err := NewGather(d)
			require.NoError(t, err)
			defer func() { require.NoError(t, g.Close()) }()
			require.True(t, g.Configure(r.Groups))
			require.False(t, g.Configure(r.Groups), "configure once")
			def := codec.NewDefault()
			require.True(t, def.Configure(r.Groups))

			for _, lc := range []layout.LayerGroupID{0, 1, 2, 3} {
				grp := r.Group(lc)
				page := grp.PageBytes()
				require.Equal(t, page, g.QueryColdPageBytes(lc), "the default codec's cold size")
				require.Equal(t, codec.Device, g.QueryPageIndexLocation(lc))
				require.Equal(t, lc, g.GetBatchingLayerGroupID(lc))
				n := int(grp.NumSlots)
				pages := make([][]byte, n)
				for s := range n {
					pages[s] = random(int(page), uint64(1000*int(lc)+s))
					require.NoError(t, r.WritePage(lc, int64(s), pages[s]))
				}
				// Encode every slot, scattered: slot s -> cold page perm(s).
				cold, err := r.Alloc(device.HostMapped, int64(n)*page)
				require.NoError(t, err)
				ref, err := r.Alloc(device.HostMapped, int64(n)*page)
				require.NoError(t, err)
				var pairs []codec.PageIndexPair
				for s := range n {
					pairs = append(pairs, codec.PageIndexPair{Dst: int32((s*7 + 3) % n), Src: int32(s)})
				}
				if n%7 == 0 {
					t.Fatalf("%d slots: the permutation needs n coprime to 7", n)
				}
				require.True(t, g.Encode(lc, cold.Ptr(), deviceIndices(t, r, r.Stream, pairs), r.Stream))
				require.True(t, def.Encode(lc, ref.Ptr(), codec.HostIndices(pairs), r.Stream))
				require.NoError(t, r.Stream.Synchronize())
				for _, p := range pairs {
					got := cold.Host()[int64(p.Dst)*page : int64(p.Dst+1)*page]
					require.True(t, bytes.Equal(pages[p.Src], got), "lifecycle %d slot %d", lc, p.Src)
				}
				require.Equal(t, ref.Host(), cold.Host(), "byte-identical to the default codec")

				// Decode back into other slots after poisoning them.
				for s := range n {
					require.NoError(t, r.WritePage(lc, int64(s), bytes.Repeat([]byte{0xee}, int(page))))
				}
				var back []codec.PageIndexPair
				for _, p := range pairs {
					back = append(back, codec.PageIndexPair{Dst: int32((int(p.Src) + 1) % n), Src: p.Dst})
				}
				require.True(t, g.Decode(lc, cold.Ptr(), deviceIndices(t, r, r.Stream, back), r.Stream))
				require.NoError(t, r.Stream.Synchronize())
				for s := range n {
					got, err := r.ReadPage(lc, int64((s+1)%n))
					require.NoError(t, err)
					require.True(t, bytes.Equal(pages[s], got), "lifecycle %d: slot %d decoded into %d", lc, s, (s+1)%n)
				}
			}
		})
	}
}

func TestGatherBadIndexFailsTheStreamAsynchronously(t *testing.T) {
	d := gpu(t)
	r := rig(t, d, device.DeviceMemory, gatherSpecs[:1]...)
	g, err := NewGather(d)
	require.NoError(t, err)
	defer g.Close()
	require.True(t, g.Configure(r.Groups))
	page := r.Group(0).PageBytes()
	want := random(int(page), 5)
	require.NoError(t, r.WritePage(0, 4, want))
	cold, err := r.Alloc(device.HostMapped, 8*page)
	require.NoError(t, err)
	ev, err := d.NewEvent()
	require.NoError(t, err)
	defer ev.Close()
	require.NoError(t, r.Stream.Synchronize())
	for _, bad := range []codec.PageIndexPair{{Dst: 1, Src: 37}, {Dst: 1, Src: -1}, {Dst: -2, Src: 3}} {
		idx := deviceIndices(t, r, r.Stream, []codec.PageIndexPair{{Dst: 0, Src: 4}, bad})
		require.True(t, g.Encode(0, cold.Ptr(), idx, r.Stream), "index values are checked on the device")
		require.NoError(t, r.Stream.Record(ev))
		err := ev.Synchronize()
		require.ErrorIs(t, err, codec.ErrBadIndex, "%+v", bad)
		require.Equal(t, want, cold.Host()[:page], "the valid pair was still copied")
	}
	idx := deviceIndices(t, r, r.Stream, []codec.PageIndexPair{{Dst: 2, Src: 4}})
	require.True(t, g.Encode(0, cold.Ptr(), idx, r.Stream))
	require.NoError(t, r.Stream.Record(ev))
	require.NoError(t, ev.Synchronize(), "the next call is clean")
	require.Equal(t, want, cold.Host()[2*page:3*page])
}

func TestGatherRejectsWhatTheHostCanCheck(t *testing.T) {
	d := gpu(t)
	r := rig(t, d, device.DeviceMemory, gatherSpecs[:1]...)
	g, err := NewGather(d)
	require.NoError(t, err)
	cold, err := r.Alloc(device.HostMapped, 1<<20)
	require.NoError(t, err)
	idx := deviceIndices(t, r, r.Stream, []codec.PageIndexPair{{Dst: 0, Src: 0}})
	assert.False(t, g.Encode(0, cold.Ptr(), idx, r.Stream), "unconfigured")
	assert.Zero(t, g.QueryColdPageBytes(0))
	require.True(t, g.Configure(r.Groups))
	assert.False(t, g.Encode(9, cold.Ptr(), idx, r.Stream), "unknown lifecycle")
	assert.Equal(t, codec.BadLocation, g.QueryPageIndexLocation(9))
	assert.Equal(t, layout.LayerGroupID(-1), g.GetBatchingLayerGroupID(9))
	assert.False(t, g.Encode(0, cold.Ptr(), codec.HostIndices([]codec.PageIndexPair{{}}), r.Stream), "host indices")
	assert.False(t, g.Encode(0, cold.Ptr(), idx, nil), "no stream")
	assert.False(t, g.Encode(0, 0, idx, r.Stream), "null cold base")
	assert.False(t, g.Encode(0, cold.Ptr(), codec.DeviceIndices(idx.DevicePtr()+4, 1), r.Stream), "misaligned indices")
	other, err := cuda.New(cuda.Options{})
	require.NoError(t, err)
	os, err := other.NewStream()
	require.NoError(t, err)
	assert.False(t, g.Encode(0, cold.Ptr(), idx, os), "a stream of another device")
	require.NoError(t, other.Close())
	assert.True(t, g.Encode(0, cold.Ptr(), codec.DeviceIndices(idx.DevicePtr(), 0), r.Stream), "empty call")
	require.NoError(t, g.Close())
	assert.False(t, g.Encode(0, cold.Ptr(), idx, r.Stream), "closed")
	assert.NoError(t, g.Close(), "idempotent")
}

// The default concatenating codec on CUDA, with 64 KiB registration regions
// so that descriptors cross region boundaries of the cold allocation.
func TestDefaultCodecOnCUDARoundTripsAcrossRegions(t *testing.T) {
	gpu(t)
	d, err := cuda.New(cuda.Options{HostRegionBytes: 64 << 10})
	require.NoError(t, err)
	t.Cleanup(func() { _ = d.Close() }) // after the rig's cleanup
	r := rig(t, d, device.DeviceMemory, codectest.GroupSpec{NumSlots: 50, LifeCycles: []layout.LayerGroupID{0}, SlotBytes: []int64{5000, 12288, 7}})
	c := codec.NewDefault()
	require.True(t, c.Configure(r.Groups))
	page := r.Group(0).PageBytes()
	cold, err := r.Alloc(device.HostMapped, 50*page)
	require.NoError(t, err)
	pages := make([][]byte, 50)
	var pairs []codec.PageIndexPair
	for s := range 50 {
		pages[s] = random(int(page), uint64(s+77))
		require.NoError(t, r.WritePage(0, int64(s), pages[s]))
		pairs = append(pairs, codec.PageIndexPair{Dst: int32(49 - s), Src: int32(s)})
	}
	require.True(t, c.Encode(0, cold.Ptr(), codec.HostIndices(pairs), r.Stream))
	require.NoError(t, r.Stream.Synchronize())
	for _, p := range pairs {
		require.Equal(t, pages[p.Src], cold.Host()[int64(p.Dst)*page:int64(p.Dst+1)*page], "slot %d", p.Src)
	}
	for s := range 50 {
		require.NoError(t, r.WritePage(0, int64(s), make([]byte, page)))
	}
	var back []codec.PageIndexPair
	for _, p := range pairs {
		back = append(back, codec.PageIndexPair{Dst: p.Src, Src: p.Dst})
	}
	require.True(t, c.Decode(0, cold.Ptr(), codec.HostIndices(back), r.Stream))
	require.NoError(t, r.Stream.Synchronize())
	for s := range 50 {
		got, err := r.ReadPage(0, int64(s))
		require.NoError(t, err)
		require.Equal(t, pages[s], got, fmt.Sprint("slot ", s))
	}
}

func TestGatherKernelVariantsRoundTrip(t *testing.T) {
	d := gpu(t)
	_, err := NewGatherWith(d, GatherOptions{Kernel: "nope"})
	require.Error(t, err)
	for name := range GatherKernels {
		t.Run(name, func(t *testing.T) {
			r := rig(t, d, device.DeviceMemory, gatherSpecs...)
			g, err := NewGatherWith(d, GatherOptions{Kernel: name})
			require.NoError(t, err)
			defer g.Close()
			require.True(t, g.Configure(r.Groups))
			for _, lc := range []layout.LayerGroupID{0, 3} { // 16-byte and byte-wise kernels
				grp := r.Group(lc)
				page, n := grp.PageBytes(), int(grp.NumSlots)
				cold, err := r.Alloc(device.HostMapped, int64(n)*page)
				require.NoError(t, err)
				var pairs []codec.PageIndexPair
				for s := range n {
					require.NoError(t, r.WritePage(lc, int64(s), random(int(page), uint64(s))))
					pairs = append(pairs, codec.PageIndexPair{Dst: int32(n - 1 - s), Src: int32(s)})
				}
				require.True(t, g.Encode(lc, cold.Ptr(), deviceIndices(t, r, r.Stream, pairs), r.Stream))
				require.NoError(t, r.Stream.Synchronize())
				for s := range n {
					require.Equal(t, random(int(page), uint64(s)), cold.Host()[int64(n-1-s)*page:int64(n-s)*page], "%s lifecycle %d slot %d", name, lc, s)
				}
				for s := range n {
					require.NoError(t, r.WritePage(lc, int64(s), make([]byte, page)))
				}
				var back []codec.PageIndexPair
				for _, p := range pairs {
					back = append(back, codec.PageIndexPair{Dst: p.Src, Src: p.Dst})
				}
				require.True(t, g.Decode(lc, cold.Ptr(), deviceIndices(t, r, r.Stream, back), r.Stream))
				require.NoError(t, r.Stream.Synchronize())
				for s := range n {
					got, err := r.ReadPage(lc, int64(s))
					require.NoError(t, err)
					require.Equal(t, random(int(page), uint64(s)), got, "%s lifecycle %d slot %d", name, lc, s)
				}
			}
		})
	}
}
