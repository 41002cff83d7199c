package codectest_test

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core/device"
	"github.com/kvcm/kvcm/core/device/emu"
	"github.com/kvcm/kvcm/core/layout"
	"github.com/kvcm/kvcm/internal/testkit/codectest"
)

// Lifecycles 0 and 2 share a three-pool group; 1 and 3 share a one-pool group.
var specs = []codectest.GroupSpec{
	{NumSlots: 16, LifeCycles: []layout.LayerGroupID{0, 2}, SlotBytes: []int64{64, 192, 8}},
	{NumSlots: 8, LifeCycles: []layout.LayerGroupID{1, 3}, SlotBytes: []int64{256}},
}

func newRig(t *testing.T, opts emu.Options) (*emu.Device, *codectest.Rig) {
	t.Helper()
	dev := emu.New(opts)
	rig, err := codectest.NewRig(dev, device.DeviceMemory, specs...)
	require.NoError(t, err)
	t.Cleanup(func() {
		assert.NoError(t, rig.Close())
		assert.NoError(t, dev.Close())
	})
	return dev, rig
}

// fill writes every slot of lc's group with gen's bytes and returns the pages.
func fill(t *testing.T, rig *codectest.Rig, lc layout.LayerGroupID, gen func(i int) byte) [][]byte {
	t.Helper()
	g := rig.Group(lc)
	pages := make([][]byte, g.NumSlots)
	for s := range pages {
		pages[s] = make([]byte, g.PageBytes())
		for i := range pages[s] {
			pages[s][i] = gen(i)
		}
		require.NoError(t, rig.WritePage(lc, int64(s), pages[s]))
	}
	return pages
}

func randomBytes(rng *rand.Rand) func(int) byte {
	return func(int) byte { return byte(rng.Uint32()) }
}

// zeroLow gives random high bytes and zero low bytes of 16-bit little-endian
// elements.
func zeroLow(rng *rand.Rand) func(int) byte {
	return func(i int) byte {
		if i%2 == 0 {
			return 0
		}
		return byte(rng.Uint32())
	}
}

func poison(t *testing.T, rig *codectest.Rig, lc layout.LayerGroupID, b byte) {
	t.Helper()
	g := rig.Group(lc)
	page := make([]byte, g.PageBytes())
	for i := range page {
		page[i] = b
	}
	for s := range g.NumSlots {
		require.NoError(t, rig.WritePage(lc, s, page))
	}
}

func readPage(t *testing.T, rig *codectest.Rig, lc layout.LayerGroupID, s int32) []byte {
	t.Helper()
	b, err := rig.ReadPage(lc, int64(s))
	require.NoError(t, err)
	return b
}

func statsDelta(before, after emu.Stats) emu.Stats {
	return emu.Stats{
		BatchCalls:  after.BatchCalls - before.BatchCalls,
		Descriptors: after.Descriptors - before.Descriptors,
		HostFuncs:   after.HostFuncs - before.HostFuncs,
	}
}
