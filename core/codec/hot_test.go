package codec_test

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core/codec"
	"github.com/kvcm/kvcm/core/device"
	"github.com/kvcm/kvcm/core/layout"
)

func lcs(ids ...layout.LayerGroupID) []layout.LayerGroupID { return ids }

func pools(slotBytes ...int64) []layout.PoolDesc {
	out := make([]layout.PoolDesc, len(slotBytes))
	for i, sb := range slotBytes {
		out[i] = layout.PoolDesc{Base: device.Ptr(0x100000 * (i + 1)), SlotBytes: sb}
	}
	return out
}

func TestHotLayoutRejectsIllFormedDescriptors(t *testing.T) {
	good := func() []layout.PoolGroupDesc {
		return []layout.PoolGroupDesc{
			{Index: 0, NumSlots: 8, LifeCycles: lcs(0, 2), Pools: pools(16, 32)},
			{Index: 1, NumSlots: 8, LifeCycles: lcs(1), Pools: pools(64)},
		}
	}
	_, err := codec.NewHotLayout(good())
	require.NoError(t, err)

	cases := []struct {
		name  string
		edit  func(d []layout.PoolGroupDesc) []layout.PoolGroupDesc
		error string
	}{
		{"empty", func(d []layout.PoolGroupDesc) []layout.PoolGroupDesc { return nil }, "no pool groups"},
		{"index mismatch", func(d []layout.PoolGroupDesc) []layout.PoolGroupDesc { d[1].Index = 0; return d }, "descriptor 1 has index 0"},
		{"out of order", func(d []layout.PoolGroupDesc) []layout.PoolGroupDesc { d[0], d[1] = d[1], d[0]; return d }, "descriptor 0 has index 1"},
		{"zero slot bytes", func(d []layout.PoolGroupDesc) []layout.PoolGroupDesc { d[0].Pools[1].SlotBytes = 0; return d }, "pool group 0 pool 1 has 0 slot bytes"},
		{"negative slot bytes", func(d []layout.PoolGroupDesc) []layout.PoolGroupDesc { d[1].Pools[0].SlotBytes = -4; return d }, "has -4 slot bytes"},
		{"null base", func(d []layout.PoolGroupDesc) []layout.PoolGroupDesc { d[1].Pools[0].Base = 0; return d }, "null base"},
		{"no pools", func(d []layout.PoolGroupDesc) []layout.PoolGroupDesc { d[1].Pools = nil; return d }, "has no pools"},
		{"no slots", func(d []layout.PoolGroupDesc) []layout.PoolGroupDesc { d[0].NumSlots = 0; return d }, "has 0 slots"},
		{"no lifecycles", func(d []layout.PoolGroupDesc) []layout.PoolGroupDesc { d[1].LifeCycles = nil; return d }, "holds no lifecycle"},
		{"lifecycle in two groups", func(d []layout.PoolGroupDesc) []layout.PoolGroupDesc { d[1].LifeCycles = lcs(1, 2); return d }, "lifecycle 2 is listed in pool groups 0 and 1"},
		{"duplicate lifecycle in a group", func(d []layout.PoolGroupDesc) []layout.PoolGroupDesc { d[0].LifeCycles = lcs(0, 0); return d }, "not strictly ascending"},
		{"descending lifecycles", func(d []layout.PoolGroupDesc) []layout.PoolGroupDesc { d[0].LifeCycles = lcs(2, 0); return d }, "not strictly ascending"},
		{"negative lifecycle", func(d []layout.PoolGroupDesc) []layout.PoolGroupDesc { d[1].LifeCycles = lcs(-1); return d }, "negative lifecycle -1"},
		{"size overflow", func(d []layout.PoolGroupDesc) []layout.PoolGroupDesc { d[0].NumSlots = math.MaxInt64 / 8; return d }, "size overflows"},
		{"address overflow", func(d []layout.PoolGroupDesc) []layout.PoolGroupDesc {
			d[1].Pools[0].Base = device.Ptr(math.MaxUint64 - 100)
			return d
		}, "address range overflows"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := codec.NewHotLayout(tc.edit(good()))
			require.ErrorIs(t, err, codec.ErrBadLayout)
			assert.Contains(t, err.Error(), tc.error)

			c := codec.NewDefault()
			assert.False(t, c.Configure(tc.edit(good())), "the default codec rejects it")
		})
	}
}

func TestHotLayoutCopiesItsInput(t *testing.T) {
	d := []layout.PoolGroupDesc{{Index: 0, NumSlots: 2, LifeCycles: lcs(0, 1), Pools: pools(8, 24)}}
	h, err := codec.NewHotLayout(d)
	require.NoError(t, err)
	d[0].Pools[0].SlotBytes = 1000
	d[0].LifeCycles[1] = 7
	assert.EqualValues(t, 32, h.PageBytes(1), "later edits of the caller's slices do not leak in")
	assert.False(t, h.Known(7))
	assert.Equal(t, lcs(0, 1), h.LifeCycles())
}

func TestHotLayoutIdentityBatching(t *testing.T) {
	h, err := codec.NewHotLayout([]layout.PoolGroupDesc{
		{Index: 0, NumSlots: 2, LifeCycles: lcs(0, 4), Pools: pools(8)},
		{Index: 1, NumSlots: 2, LifeCycles: lcs(2), Pools: pools(8)},
	})
	require.NoError(t, err)
	for _, lc := range lcs(0, 2, 4) {
		assert.Equal(t, lc, h.GetBatchingLayerGroupID(lc))
	}
	assert.Negative(t, int(h.GetBatchingLayerGroupID(1)), "unknown lifecycle")
	assert.Negative(t, int(h.GetBatchingLayerGroupID(-3)))

	var unconfigured *codec.HotLayout
	assert.Negative(t, int(unconfigured.GetBatchingLayerGroupID(0)), "nil receiver answers as unconfigured")
	assert.Nil(t, unconfigured.GroupOf(0))
	assert.Zero(t, unconfigured.PageBytes(0))
}

func TestAppendConcatCopiesDescriptorOrder(t *testing.T) {
	h, err := codec.NewHotLayout([]layout.PoolGroupDesc{
		{Index: 0, NumSlots: 10, LifeCycles: lcs(3), Pools: []layout.PoolDesc{{Base: 0x10000, SlotBytes: 16}, {Base: 0x90000, SlotBytes: 48}}},
	})
	require.NoError(t, err)
	pairs := []codec.PageIndexPair{{Dst: 5, Src: 2}, {Dst: 0, Src: 9}}

	prefix := []device.CopyDesc{{Dst: 1, Src: 2, Size: 3}}
	got, err := h.AppendConcatCopies(prefix, 3, codec.ToCold, 0x500000, 64, pairs)
	require.NoError(t, err)
	assert.Equal(t, []device.CopyDesc{
		{Dst: 1, Src: 2, Size: 3},
		// page-major, pools in order, cold offsets accumulate within a page
		{Dst: 0x500000 + 5*64, Src: 0x10000 + 2*16, Size: 16},
		{Dst: 0x500000 + 5*64 + 16, Src: 0x90000 + 2*48, Size: 48},
		{Dst: 0x500000 + 0*64, Src: 0x10000 + 9*16, Size: 16},
		{Dst: 0x500000 + 0*64 + 16, Src: 0x90000 + 9*48, Size: 48},
	}, got)

	// Decode mirrors: Src is the cold page, Dst the hot slot; a padded
	// stride moves pages apart but not the pools within a page.
	got, err = h.AppendConcatCopies(nil, 3, codec.ToHot, 0x500000, 100, []codec.PageIndexPair{{Dst: 7, Src: 4}})
	require.NoError(t, err)
	assert.Equal(t, []device.CopyDesc{
		{Dst: 0x10000 + 7*16, Src: 0x500000 + 4*100, Size: 16},
		{Dst: 0x90000 + 7*48, Src: 0x500000 + 4*100 + 16, Size: 48},
	}, got)
}

func TestAppendConcatCopiesValidatesBeforeAppending(t *testing.T) {
	h, err := codec.NewHotLayout([]layout.PoolGroupDesc{
		{Index: 0, NumSlots: 10, LifeCycles: lcs(0), Pools: pools(16, 16)},
	})
	require.NoError(t, err)
	ok := codec.PageIndexPair{Dst: 1, Src: 1}
	cases := []struct {
		name   string
		lg     layout.LayerGroupID
		dir    codec.Direction
		base   device.Ptr
		stride int64
		pairs  []codec.PageIndexPair
	}{
		{"unknown lifecycle", 1, codec.ToCold, 0x1000, 32, []codec.PageIndexPair{ok}},
		{"hot slot = NumSlots", 0, codec.ToCold, 0x1000, 32, []codec.PageIndexPair{ok, {Dst: 0, Src: 10}}},
		{"negative hot slot", 0, codec.ToCold, 0x1000, 32, []codec.PageIndexPair{ok, {Dst: 0, Src: -1}}},
		{"negative cold page", 0, codec.ToCold, 0x1000, 32, []codec.PageIndexPair{ok, {Dst: -1, Src: 0}}},
		{"decode hot slot out of range", 0, codec.ToHot, 0x1000, 32, []codec.PageIndexPair{ok, {Dst: 10, Src: 0}}},
		{"decode negative cold page", 0, codec.ToHot, 0x1000, 32, []codec.PageIndexPair{ok, {Dst: 0, Src: -5}}},
		{"null cold base", 0, codec.ToCold, 0, 32, []codec.PageIndexPair{ok}},
		{"stride below page", 0, codec.ToCold, 0x1000, 31, []codec.PageIndexPair{ok}},
		{"cold address overflow", 0, codec.ToCold, device.Ptr(math.MaxUint64 - 64), 32, []codec.PageIndexPair{{Dst: 2, Src: 0}}},
		{"bad direction", 0, codec.Direction(9), 0x1000, 32, []codec.PageIndexPair{ok}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			prefix := []device.CopyDesc{{Dst: 1, Src: 2, Size: 3}}
			got, err := h.AppendConcatCopies(prefix, tc.lg, tc.dir, tc.base, tc.stride, tc.pairs)
			require.Error(t, err)
			assert.Equal(t, prefix, got, "nothing appended")
		})
	}
	_, err = h.AppendConcatCopies(nil, 0, codec.ToCold, 0x1000, 32, []codec.PageIndexPair{{Dst: 0, Src: 10}})
	assert.ErrorIs(t, err, codec.ErrBadIndex)
	assert.Contains(t, err.Error(), "pair 0: hot slot 10 of lifecycle 0 outside [0, 10)")
}
