//go:build cgo

package cuda

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core/codec"
	"github.com/kvcm/kvcm/core/device"
	"github.com/kvcm/kvcm/core/layout"
)

// fakeDevice has an allocation registry and no driver: enough for plan.
func fakeDevice(region int64, allocs ...*allocation) *Device {
	d := &Device{region: region}
	for _, a := range allocs {
		a.dev = d
		a.split = a.kind == device.HostMapped && a.size > region
		d.register(a)
	}
	return d
}

func TestPlanSplitsOnlyAtRegionBoundaries(t *testing.T) {
	host := &allocation{base: 1 << 40, size: 10 << 20, kind: device.HostMapped}
	dev := &allocation{base: 1 << 41, size: 10 << 20, kind: device.DeviceMemory}
	d := fakeDevice(4<<20, host, dev)
	descs := []device.CopyDesc{
		{Dst: host.base.Add(3 << 20), Src: dev.base, Size: 6 << 20},               // crosses 4 MiB and 8 MiB
		{Dst: dev.base, Src: host.base.Add(1 << 20), Size: 1 << 20},               // inside one region
		{Dst: host.base.Add(8 << 20), Src: host.base.Add(5 << 20), Size: 2 << 20}, // both sides inside one region
	}
	dsts, srcs, sizes, err := d.plan(descs, nil, nil, nil)
	require.NoError(t, err)
	require.Equal(t, []uint64{1 << 20, 4 << 20, 1 << 20, 1 << 20, 2 << 20}, sizes)
	require.Equal(t, uint64(host.base.Add(4<<20)), dsts[1])
	require.Equal(t, uint64(dev.base.Add(1<<20)), srcs[1])
	require.Equal(t, uint64(host.base.Add(8<<20)), dsts[2])
	_, _, _, err = d.plan([]device.CopyDesc{{Dst: dev.base, Src: host.base.Add(10<<20 - 4), Size: 8}}, nil, nil, nil)
	require.ErrorIs(t, err, device.ErrInvalidCopy)
}

// BenchmarkDefaultCodecPrep measures the host work the default codec and
// BatchCopy add per descriptor before the driver call: building the
// descriptors from index pairs and validating them into the driver's arrays
// (4 pools of 4 KiB, 1 GiB).
func BenchmarkDefaultCodecPrep(b *testing.B) {
	const pools, chunk, pages = 4, 4096, 65536
	var allocs []*allocation
	g := layout.PoolGroupDesc{NumSlots: pages, LifeCycles: []layout.LayerGroupID{0}}
	for p := range pools {
		a := &allocation{base: device.Ptr(1<<40 + p<<32), size: pages * chunk, kind: device.DeviceMemory}
		allocs = append(allocs, a)
		g.Pools = append(g.Pools, layout.PoolDesc{Base: a.base, SlotBytes: chunk})
	}
	cold := &allocation{base: 1 << 44, size: pools * pages * chunk, kind: device.HostMapped}
	for i := range 5 { // other live allocations, as in the benchmark
		allocs = append(allocs, &allocation{base: device.Ptr(1<<45 + i<<32), size: 1 << 30, kind: device.HostMapped})
	}
	d := fakeDevice(MaxHostRegionBytes, append(allocs, cold)...)
	hl, err := codec.NewHotLayout([]layout.PoolGroupDesc{g})
	require.NoError(b, err)
	pairs := make([]codec.PageIndexPair, pages)
	for i := range pairs {
		pairs[i] = codec.PageIndexPair{Dst: int32(i), Src: int32((i * 7919) % pages)}
	}
	var descs []device.CopyDesc
	var dsts, srcs, sizes []uint64
	b.Run("AppendConcatCopies", func(b *testing.B) {
		for b.Loop() {
			descs, _ = hl.AppendConcatCopies(descs[:0], 0, codec.ToCold, cold.base, pools*chunk, pairs)
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(pools*pages), "ns/desc")
	})
	b.Run("plan", func(b *testing.B) {
		for b.Loop() {
			dsts, srcs, sizes, err = d.plan(descs, dsts[:0], srcs[:0], sizes[:0])
		}
		require.NoError(b, err)
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(pools*pages), "ns/desc")
	})
}
