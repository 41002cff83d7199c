package gpucodec

import (
	"math/rand/v2"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core/codec"
	"github.com/kvcm/kvcm/core/device"
	"github.com/kvcm/kvcm/core/device/emu"
	"github.com/kvcm/kvcm/core/layout"
	"github.com/kvcm/kvcm/internal/testkit/codectest"
)

func groupOf(slotBytes ...int64) layout.PoolGroupDesc {
	g := layout.PoolGroupDesc{NumSlots: 1, LifeCycles: []layout.LayerGroupID{0}}
	for _, b := range slotBytes {
		g.Pools = append(g.Pools, layout.PoolDesc{Base: 1 << 20, SlotBytes: b})
	}
	return g
}

func TestChooseAtTheMeasuredCrossover(t *testing.T) {
	const x = AutoCrossoverBytes
	assert.Equal(t, int64(256<<10), int64(x), "between the 64 KiB and 1 MiB rows of docs/benchmarks.md")
	for _, tc := range []struct {
		slots []int64
		want  Choice
	}{
		{[]int64{4 << 10, 4 << 10, 4 << 10, 4 << 10}, Kernel}, // 4 KiB x 4: DMA at 0.17 of the limit
		{[]int64{64 << 10, 64 << 10}, Kernel},                 // DMA at 0.77
		{[]int64{x - 16}, Kernel},
		{[]int64{x}, DMA},
		{[]int64{1 << 20, 1 << 20, 1 << 20, 1 << 20}, DMA}, // DMA at 0.98
		{[]int64{4 << 10, 1 << 20}, DMA},                   // mean 514 KiB a descriptor
		{[]int64{16, 16, x}, Kernel},                       // mean just above 85 KiB
		{nil, DMA},
	} {
		assert.Equal(t, tc.want, Choose(groupOf(tc.slots...), x, true), "%v", tc.slots)
		assert.Equal(t, DMA, Choose(groupOf(tc.slots...), x, false), "no kernel: always DMA")
	}
	assert.Equal(t, Kernel, Choose(groupOf(1<<20), 2<<20, true), "the crossover is an option")
	assert.Equal(t, "dma", DMA.String())
	assert.Equal(t, "gather", Kernel.String())
	assert.Equal(t, "Choice(7)", Choice(7).String())
}

// autoSpecs: lifecycle 0 has 4 KiB chunks (kernel or staging on a GPU),
// lifecycle 1 a 2 MiB and a 16-byte pool (mean above both crossovers: DMA),
// lifecycle 2 shares group 0 with lifecycle 0.
var autoSpecs = []codectest.GroupSpec{
	{NumSlots: 9, LifeCycles: []layout.LayerGroupID{0, 2}, SlotBytes: []int64{4096, 4096, 1024}},
	{NumSlots: 5, LifeCycles: []layout.LayerGroupID{1}, SlotBytes: []int64{2 << 20, 16}},
}

// autoRoundTrip encodes every slot of every lifecycle of r with a (host or
// device indices, as a says), checks the cold bytes against the default
// codec's, decodes them into shifted slots and checks every byte.
func autoRoundTrip(t *testing.T, r *codectest.Rig, a *Auto) {
	t.Helper()
	def := codec.NewDefault()
	require.True(t, def.Configure(r.Groups))
	rng := rand.New(rand.NewPCG(3, 4))
	indices := func(lc layout.LayerGroupID, pairs []codec.PageIndexPair) codec.PageIndices {
		if a.QueryPageIndexLocation(lc) == codec.Host {
			return codec.HostIndices(pairs)
		}
		require.Equal(t, codec.Device, a.QueryPageIndexLocation(lc))
		m, err := r.Alloc(device.DeviceMemory, int64(len(pairs))*codec.PageIndexPairBytes)
		require.NoError(t, err)
		b := unsafe.Slice((*byte)(unsafe.Pointer(&pairs[0])), len(pairs)*codec.PageIndexPairBytes)
		require.NoError(t, r.Stream.CopyFromHost(m.Ptr(), b))
		return codec.DeviceIndices(m.Ptr(), len(pairs))
	}
	for _, lc := range []layout.LayerGroupID{0, 1, 2} {
		g := r.Group(lc)
		page, n := g.PageBytes(), int(g.NumSlots)
		require.Equal(t, page, a.QueryColdPageBytes(lc), "the default codec's cold size")
		require.Equal(t, lc, a.GetBatchingLayerGroupID(lc))
		pages := make([][]byte, n)
		var pairs []codec.PageIndexPair
		for s := range n {
			pages[s] = make([]byte, page)
			for i := range pages[s] {
				pages[s][i] = byte(rng.Uint32())
			}
			require.NoError(t, r.WritePage(lc, int64(s), pages[s]))
			pairs = append(pairs, codec.PageIndexPair{Dst: int32(n - 1 - s), Src: int32(s)})
		}
		cold, err := r.Alloc(device.HostMapped, int64(n)*page)
		require.NoError(t, err)
		ref, err := r.Alloc(device.HostMapped, int64(n)*page)
		require.NoError(t, err)
		require.True(t, a.Encode(lc, cold.Ptr(), indices(lc, pairs), r.Stream))
		require.True(t, def.Encode(lc, ref.Ptr(), codec.HostIndices(pairs), r.Stream))
		require.NoError(t, r.Stream.Synchronize())
		require.Equal(t, ref.Host(), cold.Host(), "lifecycle %d: byte-identical to the default codec", lc)

		var back []codec.PageIndexPair
		for _, p := range pairs {
			back = append(back, codec.PageIndexPair{Dst: int32((int(p.Src) + 1) % n), Src: p.Dst})
		}
		require.True(t, a.Decode(lc, cold.Ptr(), indices(lc, back), r.Stream))
		require.NoError(t, r.Stream.Synchronize())
		for s := range n {
			got, err := r.ReadPage(lc, int64((s+1)%n))
			require.NoError(t, err)
			require.Equal(t, pages[s], got, "lifecycle %d slot %d", lc, s)
		}
	}
}

func TestAutoIsTheDefaultCodecOnTheEmulatedDevice(t *testing.T) {
	dev := emu.New(emu.Options{Seed: 2})
	defer dev.Close()
	r, err := codectest.NewRig(dev, device.DeviceMemory, autoSpecs...)
	require.NoError(t, err)
	defer r.Close()
	a, err := NewAuto(dev)
	require.NoError(t, err)
	assert.False(t, a.KernelAvailable())
	assert.Equal(t, int64(AutoCrossoverBytes), a.CrossoverBytes())
	_, ok := a.Choice(0)
	assert.False(t, ok, "no choice before Configure")
	require.True(t, a.Configure(r.Groups))
	require.False(t, a.Configure(r.Groups), "configure once")
	for _, lc := range []layout.LayerGroupID{0, 1, 2} {
		c, ok := a.Choice(lc)
		require.True(t, ok)
		assert.Equal(t, DMA, c, "lifecycle %d: no kernel on emu", lc)
		assert.Equal(t, codec.Host, a.QueryPageIndexLocation(lc))
	}
	_, ok = a.Choice(9)
	assert.False(t, ok)
	assert.Equal(t, codec.BadLocation, a.QueryPageIndexLocation(9))
	assert.False(t, a.Encode(9, 1<<20, codec.HostIndices([]codec.PageIndexPair{{}}), r.Stream), "unknown lifecycle")
	autoRoundTrip(t, r, a)
	require.NoError(t, a.Close())
	assert.False(t, a.Encode(0, 1<<20, codec.HostIndices([]codec.PageIndexPair{{}}), r.Stream), "closed")
}

func TestAutoRejectsABadLayout(t *testing.T) {
	a, err := NewAutoWith(nil, AutoOptions{CrossoverBytes: 1 << 20})
	require.NoError(t, err)
	assert.Equal(t, int64(1<<20), a.CrossoverBytes())
	bad := []layout.PoolGroupDesc{groupOf(64)}
	bad[0].NumSlots = 0
	assert.False(t, a.Configure(bad))
	assert.NoError(t, a.Close())
}

// With Staged, lifecycles below the crossover go through device staging
// (over the default codec on emu, with host indices) and round-trip the
// default codec's bytes; lifecycles above it keep DMA.
func TestAutoStagedTakesSmallPagesThroughDeviceStaging(t *testing.T) {
	dev := emu.New(emu.Options{Seed: 3, MaxDelay: 10e3})
	defer dev.Close()
	r, err := codectest.NewRig(dev, device.DeviceMemory, autoSpecs...)
	require.NoError(t, err)
	defer r.Close()
	a, err := NewAutoWith(dev, AutoOptions{Staging: StageAlways})
	require.NoError(t, err)
	require.True(t, a.Configure(r.Groups))
	for lc, want := range map[layout.LayerGroupID]Choice{0: Staged, 1: DMA, 2: Staged} {
		c, ok := a.Choice(lc)
		require.True(t, ok)
		assert.Equal(t, want, c, "lifecycle %d", lc)
		assert.Equal(t, codec.Host, a.QueryPageIndexLocation(lc))
	}
	assert.Equal(t, "staged", Staged.String())
	autoRoundTrip(t, r, a)
	require.NoError(t, a.Close())
	_, err = NewAutoWith(nil, AutoOptions{Staging: StageAlways})
	assert.Error(t, err, "staging needs a device")
	_, err = NewAutoWith(dev, AutoOptions{Staging: 7})
	assert.ErrorContains(t, err, "Staging")
}
