package codec_test

import (
	"errors"
	"math"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core/codec"
	"github.com/kvcm/kvcm/core/device"
	"github.com/kvcm/kvcm/core/layout"
	"github.com/kvcm/kvcm/internal/testkit/codectest"
)

// The bytes of an index upload are the C array: per pair int32 dst then
// int32 src, little-endian, whatever the host.
func TestPairBytesAreTheCArrayOfPairs(t *testing.T) {
	var scratch []byte
	got := codec.PairBytes([]codec.PageIndexPair{{Dst: 1, Src: -2}, {Dst: 0x01020304, Src: 7}}, &scratch)
	assert.Equal(t, []byte{1, 0, 0, 0, 0xfe, 0xff, 0xff, 0xff, 4, 3, 2, 1, 7, 0, 0, 0}, got)
	assert.Empty(t, codec.PairBytes(nil, &scratch))
}

// PageIndexPair mirrors struct alignas(8) PageIndexPair { int32_t dst; int32_t src; }.
func TestPageIndexPairLayoutMatchesTheCStruct(t *testing.T) {
	var p codec.PageIndexPair
	assert.EqualValues(t, 8, unsafe.Sizeof(p), "sizeof(PageIndexPair) == 8")
	assert.EqualValues(t, codec.PageIndexPairBytes, unsafe.Sizeof(p))
	assert.EqualValues(t, 8, unsafe.Alignof(p), "alignas(8)")
	assert.EqualValues(t, 0, unsafe.Offsetof(p.Dst), "dst first")
	assert.EqualValues(t, 4, unsafe.Offsetof(p.Src), "src second")
	assert.EqualValues(t, 4, unsafe.Sizeof(p.Dst))

	// An array of pairs is the AoS the design describes: pair i at 8*i,
	// so one aligned 64-bit load fetches both indices.
	arr := []codec.PageIndexPair{{Dst: 1, Src: 2}, {Dst: 3, Src: 4}}
	base := uintptr(unsafe.Pointer(&arr[0]))
	assert.EqualValues(t, 8, uintptr(unsafe.Pointer(&arr[1]))-base)
	assert.Zero(t, base%8)
	words := unsafe.Slice((*int32)(unsafe.Pointer(&arr[0])), 4)
	assert.Equal(t, []int32{1, 2, 3, 4}, words, "dst, src, dst, src")
}

func TestPageIndexLocationValuesMatchTheCEnum(t *testing.T) {
	assert.EqualValues(t, -1, codec.BadLocation)
	assert.EqualValues(t, 0, codec.Host)
	assert.EqualValues(t, 1, codec.Device)
	assert.EqualValues(t, 4, unsafe.Sizeof(codec.Host), "enum class : int")
	assert.True(t, codec.Host.Valid())
	assert.True(t, codec.Device.Valid())
	assert.False(t, codec.BadLocation.Valid())
	assert.False(t, codec.PageIndexLocation(2).Valid())
	assert.Equal(t, "host", codec.Host.String())
	assert.Equal(t, "device", codec.Device.String())
	assert.Equal(t, "bad-location", codec.BadLocation.String())
	assert.Equal(t, "PageIndexLocation(7)", codec.PageIndexLocation(7).String())
}

func TestPageIndicesCarryExactlyOneLocation(t *testing.T) {
	pairs := []codec.PageIndexPair{{Dst: 1, Src: 2}, {Dst: 3, Src: 4}}
	h := codec.HostIndices(pairs)
	assert.Equal(t, codec.Host, h.Location())
	assert.Equal(t, 2, h.Len())
	assert.Equal(t, pairs, h.Host())
	assert.Zero(t, h.DevicePtr())

	d := codec.DeviceIndices(0x1000, 5)
	assert.Equal(t, codec.Device, d.Location())
	assert.Equal(t, 5, d.Len())
	assert.Equal(t, device.Ptr(0x1000), d.DevicePtr())
	assert.Nil(t, d.Host())

	var zero codec.PageIndices
	assert.Equal(t, codec.Host, zero.Location(), "the zero value is an empty host array")
	assert.Zero(t, zero.Len())
}

func configuredDefault(t *testing.T) codec.ColdPageCodec {
	t.Helper()
	c := codec.NewDefault()
	require.True(t, c.Configure([]layout.PoolGroupDesc{
		{Index: 0, NumSlots: 4, LifeCycles: []layout.LayerGroupID{0, 2}, Pools: []layout.PoolDesc{{Base: 0x10000, SlotBytes: 16}, {Base: 0x20000, SlotBytes: 48}}},
		{Index: 1, NumSlots: 4, LifeCycles: []layout.LayerGroupID{1, 3}, Pools: []layout.PoolDesc{{Base: 0x30000, SlotBytes: 32}}},
	}))
	return c
}

func TestQueryAllReportsEveryLifecycle(t *testing.T) {
	infos, err := codec.QueryAll(configuredDefault(t), []layout.LayerGroupID{0, 1, 2, 3})
	require.NoError(t, err)
	assert.Equal(t, []codec.Info{
		{LifeCycle: 0, ColdPageBytes: 64, BatchingID: 0, Location: codec.Host},
		{LifeCycle: 1, ColdPageBytes: 32, BatchingID: 1, Location: codec.Host},
		{LifeCycle: 2, ColdPageBytes: 64, BatchingID: 2, Location: codec.Host},
		{LifeCycle: 3, ColdPageBytes: 32, BatchingID: 3, Location: codec.Host},
	}, infos)
}

func TestQueryAllNamesTheLifecycleAndMethodOfEveryFailure(t *testing.T) {
	f := codectest.NewFaulty(codec.NewDefault())
	require.True(t, f.Configure(configuredDefaultDescs()))
	f.SetColdPageBytes(1, 0)
	f.SetBatchingID(2, -1)
	f.SetLocation(0, codec.BadLocation)
	f.SetLocation(3, codec.PageIndexLocation(5))

	infos, err := codec.QueryAll(f, []layout.LayerGroupID{0, 1, 2, 3})
	require.Error(t, err)
	assert.Len(t, infos, 4, "the values are returned even on failure")
	assert.ErrorIs(t, err, codec.ErrQuery)
	msg := err.Error()
	assert.Contains(t, msg, "lifecycle 1: QueryColdPageBytes returned 0 bytes")
	assert.Contains(t, msg, "lifecycle 2: GetBatchingLayerGroupID returned -1")
	assert.Contains(t, msg, "lifecycle 0: QueryPageIndexLocation returned bad-location")
	assert.Contains(t, msg, "lifecycle 3: QueryPageIndexLocation returned PageIndexLocation(5)")
	assert.NotContains(t, msg, "\n", "one line, fit for a C status message")

	var qe *codec.QueryError
	require.ErrorAs(t, err, &qe)
	assert.Equal(t, layout.LayerGroupID(0), qe.LifeCycle, "failures are reported in lifecycle order")
	assert.Equal(t, "QueryPageIndexLocation", qe.Method)
	assert.Equal(t, int64(codec.BadLocation), qe.Value)

	// A single failure is a *QueryError itself; an unknown lifecycle fails
	// all three queries.
	_, err = codec.QueryAll(configuredDefault(t), []layout.LayerGroupID{0, 9})
	require.Error(t, err)
	assert.Equal(t, "codec: lifecycle 9: QueryColdPageBytes returned 0 bytes (0 is failure); "+
		"codec: lifecycle 9: GetBatchingLayerGroupID returned -1 (negative is failure or unknown lifecycle); "+
		"codec: lifecycle 9: QueryPageIndexLocation returned bad-location (not host or device)", err.Error())

	f.ClearOverrides()
	f.SetColdPageBytes(2, -8)
	_, err = codec.QueryAll(f, []layout.LayerGroupID{2})
	require.ErrorAs(t, err, &qe)
	assert.Equal(t, "codec: lifecycle 2: QueryColdPageBytes returned -8 bytes (negative size)", err.Error())

	_, err = codec.QueryAll(nil, nil)
	assert.ErrorIs(t, err, codec.ErrQuery)
}

// nativeSized reports size_t-like cold-page sizes, as a C codec does.
type nativeSized struct {
	codec.ColdPageCodec
	native map[layout.LayerGroupID]uint64
}

func (n nativeSized) NativeColdPageBytes(lg layout.LayerGroupID) uint64 {
	if v, ok := n.native[lg]; ok {
		return v
	}
	return uint64(n.QueryColdPageBytes(lg))
}

// QueryAll reports what the codec returned: a native size beyond int64 (a C
// codec's SIZE_MAX) is named as returned, not as "0 bytes" or a wrapped
// negative value.
func TestQueryAllReportsNativeSizesBeyondInt64AsReturned(t *testing.T) {
	c := nativeSized{configuredDefault(t), map[layout.LayerGroupID]uint64{1: math.MaxUint64, 2: 1 << 63}}
	infos, err := codec.QueryAll(c, []layout.LayerGroupID{0, 1, 2, 3})
	require.ErrorIs(t, err, codec.ErrQuery)
	assert.Equal(t, "codec: lifecycle 1: QueryColdPageBytes returned 18446744073709551615 bytes (SIZE_MAX, more than an int64 holds); "+
		"codec: lifecycle 2: QueryColdPageBytes returned 9223372036854775808 bytes (more than an int64 holds)", err.Error())
	assert.Equal(t, int64(64), infos[0].ColdPageBytes, "a size that fits is used as is")
	assert.Zero(t, infos[1].ColdPageBytes)
	var qe *codec.QueryError
	require.ErrorAs(t, err, &qe)
	assert.Equal(t, uint64(math.MaxUint64), qe.Native)
}

// The manager guards every codec it owns: a guarded native codec's sizes are
// still reported as the codec returned them.
func TestQueryAllReportsAGuardedCodecsNativeSizes(t *testing.T) {
	c := codec.Guard(nativeSized{configuredDefault(t), map[layout.LayerGroupID]uint64{1: math.MaxUint64}})
	_, err := codec.QueryAll(c, []layout.LayerGroupID{0, 1})
	require.ErrorIs(t, err, codec.ErrQuery)
	assert.Contains(t, err.Error(), "returned 18446744073709551615 bytes (SIZE_MAX")
}

func configuredDefaultDescs() []layout.PoolGroupDesc {
	return []layout.PoolGroupDesc{
		{Index: 0, NumSlots: 4, LifeCycles: []layout.LayerGroupID{0, 2}, Pools: []layout.PoolDesc{{Base: 0x10000, SlotBytes: 16}, {Base: 0x20000, SlotBytes: 48}}},
		{Index: 1, NumSlots: 4, LifeCycles: []layout.LayerGroupID{1, 3}, Pools: []layout.PoolDesc{{Base: 0x30000, SlotBytes: 32}}},
	}
}

type closer struct {
	codec.ColdPageCodec
	closed int
	err    error
}

func (c *closer) Close() error { c.closed++; return c.err }

func TestDestroyClosesOnlyClosers(t *testing.T) {
	assert.NoError(t, codec.Destroy(nil))
	assert.NoError(t, codec.Destroy(codec.NewDefault()))
	boom := errors.New("boom")
	c := &closer{ColdPageCodec: codec.NewDefault(), err: boom}
	assert.ErrorIs(t, codec.Destroy(c), boom)
	assert.Equal(t, 1, c.closed)
}
