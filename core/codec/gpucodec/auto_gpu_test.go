//go:build cgo

package gpucodec

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core/codec"
	"github.com/kvcm/kvcm/core/device"
	"github.com/kvcm/kvcm/core/layout"
)

// With StageNever on CUDA, small-chunk lifecycles take the gather kernel
// with device indices, below AutoCrossoverBytes.
func TestAutoWithoutStagingPicksTheKernelForSmallChunksOnCUDA(t *testing.T) {
	d := gpu(t)
	for _, hotKind := range []device.MemoryKind{device.DeviceMemory, device.HostMapped} {
		t.Run(hotKind.String(), func(t *testing.T) {
			r := rig(t, d, hotKind, autoSpecs...)
			a, err := NewAutoWith(d, AutoOptions{Staging: StageNever})
			require.NoError(t, err)
			defer func() { require.NoError(t, a.Close()) }()
			assert.True(t, a.KernelAvailable())
			assert.Equal(t, int64(AutoCrossoverBytes), a.CrossoverBytes())
			require.True(t, a.Configure(r.Groups))
			for lc, want := range map[layout.LayerGroupID]Choice{0: Kernel, 1: DMA, 2: Kernel} {
				c, ok := a.Choice(lc)
				require.True(t, ok)
				assert.Equal(t, want, c, "lifecycle %d", lc)
			}
			assert.Equal(t, codec.Device, a.QueryPageIndexLocation(0))
			assert.Equal(t, codec.Host, a.QueryPageIndexLocation(1))
			autoRoundTrip(t, r, a)
		})
	}
}

func TestAutoFallsBackToDMAWhenTheKernelRejectsTheLayout(t *testing.T) {
	d := gpu(t)
	slots := make([]int64, maxPools+1) // more pools than the kernels take
	for i := range slots {
		slots[i] = 64
	}
	r := rig(t, d, device.DeviceMemory, autoSpecs[0], autoSpecs[1])
	groups := append([]layout.PoolGroupDesc(nil), r.Groups...)
	wide := groupOf(slots...)
	wide.Index, wide.NumSlots, wide.LifeCycles = 2, 1, []layout.LayerGroupID{3}
	m, err := r.Alloc(device.DeviceMemory, 64*int64(len(slots)))
	require.NoError(t, err)
	for i := range wide.Pools {
		wide.Pools[i].Base = m.Ptr().Add(int64(i) * 64)
	}
	groups = append(groups, wide)
	a, err := NewAuto(d)
	require.NoError(t, err)
	defer a.Close()
	require.True(t, a.Configure(groups))
	for _, lc := range []layout.LayerGroupID{0, 1, 2, 3} {
		c, ok := a.Choice(lc)
		require.True(t, ok)
		assert.Equal(t, DMA, c, "lifecycle %d", lc)
		assert.Equal(t, codec.Host, a.QueryPageIndexLocation(lc))
	}
}

// By default on CUDA, lifecycles below StagedCrossoverBytes go through
// device staging over the gather kernel, with host indices, and write the
// default codec's bytes.
func TestAutoStagesOverTheKernelOnCUDAByDefault(t *testing.T) {
	d := gpu(t)
	r := rig(t, d, device.DeviceMemory, autoSpecs...)
	a, err := NewAuto(d)
	require.NoError(t, err)
	defer func() { require.NoError(t, a.Close()) }()
	assert.True(t, a.KernelAvailable())
	assert.Equal(t, int64(StagedCrossoverBytes), a.CrossoverBytes())
	require.True(t, a.Configure(r.Groups))
	for lc, want := range map[layout.LayerGroupID]Choice{0: Staged, 1: DMA, 2: Staged} {
		c, ok := a.Choice(lc)
		require.True(t, ok)
		assert.Equal(t, want, c, "lifecycle %d", lc)
		assert.Equal(t, codec.Host, a.QueryPageIndexLocation(lc))
	}
	autoRoundTrip(t, r, a)
}

// On a CUDA device New makes the kernel codecs themselves, with the spec's
// options.
func TestNewMakesTheKernelCodecsOnCUDA(t *testing.T) {
	d := gpu(t)
	g, err := New(d, Spec{Kind: KindGather})
	require.NoError(t, err)
	assert.IsType(t, &Gather{}, g)
	require.NoError(t, codec.Destroy(g))
	q, err := New(d, Spec{Kind: KindFP8, Format: BFloat16, BlockElems: 64})
	require.NoError(t, err)
	require.IsType(t, &Quant{}, q)
	assert.Equal(t, QuantOptions{Format: BFloat16, BlockElems: 64}, q.(*Quant).Options())
	require.NoError(t, codec.Destroy(q))
}
