package codectest_test

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core/codec"
	"github.com/kvcm/kvcm/core/device"
	"github.com/kvcm/kvcm/core/device/emu"
	"github.com/kvcm/kvcm/core/layout"
	"github.com/kvcm/kvcm/internal/testkit/codectest"
)

func TestBatchingDeclaresClassesAndSizes(t *testing.T) {
	_, rig := newRig(t, emu.Options{})
	b := codectest.NewBatching(codectest.BatchingOptions{
		Classes:       [][]layout.LayerGroupID{{3, 1}},
		ColdPageBytes: map[layout.LayerGroupID]int64{1: 300, 3: 300, 2: 512},
	})
	require.True(t, b.Configure(rig.Groups))
	infos, err := codec.QueryAll(b, []layout.LayerGroupID{0, 1, 2, 3})
	require.NoError(t, err)
	assert.Equal(t, []codec.Info{
		{LifeCycle: 0, ColdPageBytes: 264, BatchingID: 0, Location: codec.Host},
		{LifeCycle: 1, ColdPageBytes: 300, BatchingID: 1, Location: codec.Host},
		{LifeCycle: 2, ColdPageBytes: 512, BatchingID: 2, Location: codec.Host},
		{LifeCycle: 3, ColdPageBytes: 300, BatchingID: 1, Location: codec.Host}, // smallest member
	}, infos)
	_, err = codec.QueryAll(b, []layout.LayerGroupID{5})
	assert.Error(t, err, "unknown lifecycles fail every query")
}

func TestBatchingCanDeclareInvalidClassesOnPurpose(t *testing.T) {
	_, rig := newRig(t, emu.Options{})
	b := codectest.NewBatching(codectest.BatchingOptions{
		Classes:        [][]layout.LayerGroupID{{0, 1}},                         // different hot groups
		Representative: map[layout.LayerGroupID]layout.LayerGroupID{2: 3, 3: 2}, // greater rep; rep not mapping to itself
		ColdPageBytes:  map[layout.LayerGroupID]int64{1: 400},                   // class members with different sizes
	})
	require.True(t, b.Configure(rig.Groups))
	assert.EqualValues(t, 0, b.GetBatchingLayerGroupID(1))
	assert.EqualValues(t, 3, b.GetBatchingLayerGroupID(2))
	assert.EqualValues(t, 2, b.GetBatchingLayerGroupID(3))
	assert.NotEqual(t, b.QueryColdPageBytes(0), b.QueryColdPageBytes(1))

	tooSmall := codectest.NewBatching(codectest.BatchingOptions{ColdPageBytes: map[layout.LayerGroupID]int64{1: 255}})
	assert.False(t, tooSmall.Configure(rig.Groups), "a cold page cannot be smaller than the concatenation")
	assert.False(t, b.Configure(rig.Groups), "configure exactly once")
}

func TestBatchingRoundTripOfAConcatenatedClass(t *testing.T) {
	// Lifecycles 1 and 3 share a hot group and a class with representative
	// 1: the manager concatenates their pairs and calls once with ID 1.
	dev, rig := newRig(t, emu.Options{Seed: 31})
	rng := rand.New(rand.NewPCG(31, 31))
	orig := fill(t, rig, 1, randomBytes(rng)) // slots of the group shared by 1 and 3
	b := codectest.NewBatching(codectest.BatchingOptions{
		Classes:       [][]layout.LayerGroupID{{1, 3}},
		ColdPageBytes: map[layout.LayerGroupID]int64{1: 320, 3: 320},
	})
	require.True(t, b.Configure(rig.Groups))
	stride := b.QueryColdPageBytes(b.GetBatchingLayerGroupID(3))
	require.EqualValues(t, 320, stride)
	cold, err := rig.Alloc(device.HostMapped, 8*stride)
	require.NoError(t, err)
	for i := range cold.Host() {
		cold.Host()[i] = 0x11
	}

	fromLC1 := []codec.PageIndexPair{{Dst: 0, Src: 2}, {Dst: 5, Src: 4}}
	fromLC3 := []codec.PageIndexPair{{Dst: 3, Src: 7}}
	before := dev.Stats()
	require.True(t, b.Encode(1, cold.Ptr(), codec.HostIndices(append(fromLC1, fromLC3...)), rig.Stream))
	d := statsDelta(before, dev.Stats())
	assert.EqualValues(t, 1, d.BatchCalls)
	assert.EqualValues(t, 3, d.Descriptors)
	require.NoError(t, rig.Stream.Synchronize())
	for _, p := range append(fromLC1, fromLC3...) {
		page := cold.Host()[int64(p.Dst)*stride : int64(p.Dst+1)*stride]
		assert.Equal(t, orig[p.Src], page[:256], "payload at the lifecycle's stride")
		for _, x := range page[256:] {
			require.EqualValues(t, 0x11, x, "padding untouched")
		}
	}

	poison(t, rig, 1, 0)
	require.True(t, b.Decode(1, cold.Ptr(), codec.HostIndices([]codec.PageIndexPair{{Dst: 6, Src: 5}, {Dst: 1, Src: 3}}), rig.Stream))
	require.NoError(t, rig.Stream.Synchronize())
	assert.Equal(t, orig[4], readPage(t, rig, 1, 6))
	assert.Equal(t, orig[7], readPage(t, rig, 1, 1))
	require.NoError(t, codec.Destroy(b))
	assert.False(t, b.Encode(1, cold.Ptr(), codec.HostIndices(fromLC1), rig.Stream), "closed")
}
