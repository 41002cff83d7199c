package abimodel

import (
	"math"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core/codec"
	"github.com/kvcm/kvcm/core/device"
	"github.com/kvcm/kvcm/core/device/emu"
	"github.com/kvcm/kvcm/core/layout"
)

func emuStream(t *testing.T) device.Stream {
	t.Helper()
	d := emu.New(emu.Options{})
	t.Cleanup(func() { d.Close() })
	s, err := d.NewStream()
	require.NoError(t, err)
	return s
}

// A codec whose vtable lacks a slot fails that slot's calls (false, 0,
// BadLocation), except get_batching_layer_group_id, whose absence is the
// identity; closing it without a destroy slot does nothing.
func TestExternalCodecMissingSlotsFail(t *testing.T) {
	c := NewExternalCodec(ExternalCodec{})
	s := emuStream(t)
	assert.False(t, c.Configure(nil))
	assert.Zero(t, c.QueryColdPageBytes(3))
	assert.Equal(t, layout.LayerGroupID(3), c.GetBatchingLayerGroupID(3))
	assert.Equal(t, codec.BadLocation, c.QueryPageIndexLocation(3))
	assert.False(t, c.Encode(3, 0, codec.HostIndices(nil), s))
	assert.False(t, c.Decode(3, 0, codec.HostIndices(nil), s))
	assert.NoError(t, codec.Destroy(c))
}

// The slots get the codec's arguments as they are: the descriptors, the
// layer group, the batching and location answers.
func TestExternalCodecForwardsQueries(t *testing.T) {
	descs := []layout.PoolGroupDesc{{Index: 0, NumSlots: 4, LifeCycles: []layout.LayerGroupID{0, 1}}}
	var got []layout.PoolGroupDesc
	c := NewExternalCodec(ExternalCodec{
		Configure:               func(d []layout.PoolGroupDesc) bool { got = d; return true },
		QueryColdPageBytes:      func(lg layout.LayerGroupID) uint64 { return uint64(lg) * 100 },
		GetBatchingLayerGroupID: func(layout.LayerGroupID) layout.LayerGroupID { return 0 },
		QueryPageIndexLocation:  func(layout.LayerGroupID) codec.PageIndexLocation { return codec.Device },
	})
	assert.True(t, c.Configure(descs))
	assert.Equal(t, descs, got)
	assert.Equal(t, int64(200), c.QueryColdPageBytes(2))
	assert.Equal(t, layout.LayerGroupID(0), c.GetBatchingLayerGroupID(1))
	assert.Equal(t, codec.Device, c.QueryPageIndexLocation(1))
}

// A size_t beyond int64 (SIZE_MAX) is 0, a failure, for QueryColdPageBytes,
// and kept as returned for NativeColdPageBytes, which the manager asks so
// that its error reports it.
func TestExternalCodecNarrowsSizes(t *testing.T) {
	c := NewExternalCodec(ExternalCodec{QueryColdPageBytes: func(layout.LayerGroupID) uint64 { return math.MaxUint64 }})
	assert.Zero(t, c.QueryColdPageBytes(0))
	assert.Equal(t, uint64(math.MaxUint64), c.(codec.NativeSizer).NativeColdPageBytes(0))
}

// Encode and Decode pass the address of the index pairs (the host pairs in
// place, pinned for the call, or the device address), their count and the stream's native
// handle; without a stream they fail without calling the slot.
func TestExternalCodecTransformsPassPairsByAddress(t *testing.T) {
	s := emuStream(t)
	type call struct {
		lg   layout.LayerGroupID
		base device.Ptr
		addr uintptr
		n    int
		hdl  uintptr
	}
	var calls []call
	slot := func(lg layout.LayerGroupID, base device.Ptr, addr uintptr, n int, stream uintptr) bool {
		calls = append(calls, call{lg: lg, base: base, addr: addr, n: n, hdl: stream})
		return true
	}
	c := NewExternalCodec(ExternalCodec{Encode: slot, Decode: slot})
	host := []codec.PageIndexPair{{Dst: 1, Src: 2}, {Dst: 3, Src: 4}}
	assert.True(t, c.Encode(1, 0x1000, codec.HostIndices(host), s))
	assert.True(t, c.Decode(2, 0x2000, codec.DeviceIndices(0xd000, 5), s))
	assert.True(t, c.Encode(1, 0x1000, codec.HostIndices(nil), s))
	assert.False(t, c.Decode(2, 0x2000, codec.HostIndices(host), nil), "no stream")
	require.Len(t, calls, 3)
	assert.Equal(t, call{lg: 1, base: 0x1000, addr: uintptr(unsafe.Pointer(&host[0])), n: 2, hdl: s.Handle()}, calls[0], "the host pairs in place")
	assert.Equal(t, call{lg: 2, base: 0x2000, addr: 0xd000, n: 5, hdl: s.Handle()}, calls[1])
	assert.Equal(t, call{lg: 1, base: 0x1000, hdl: s.Handle()}, calls[2], "no pairs: address 0")
}

// Close calls the destroy slot exactly once, however often it is called.
func TestExternalCodecDestroysOnce(t *testing.T) {
	n := 0
	c := NewExternalCodec(ExternalCodec{Destroy: func() { n++ }})
	require.NoError(t, codec.Destroy(c))
	require.NoError(t, codec.Destroy(c))
	assert.Equal(t, 1, n)
}
