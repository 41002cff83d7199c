package abimodel

import (
	"math"
	"sync"
	"syscall"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core"
	"github.com/kvcm/kvcm/core/codec"
	"github.com/kvcm/kvcm/core/codec/gpucodec"
	"github.com/kvcm/kvcm/core/device"
	"github.com/kvcm/kvcm/core/device/emu"
	"github.com/kvcm/kvcm/core/layout"
)

// recordingCodec answers a fixed location and records the calls it gets.
type recordingCodec struct {
	codec.ColdPageCodec
	loc      codec.PageIndexLocation
	calls    []string
	got      []codec.PageIndices
	inCall   bool
	overlaps int
}

func (r *recordingCodec) enter(name string) {
	if r.inCall {
		r.overlaps++
	}
	r.inCall = true
	r.calls = append(r.calls, name)
	r.inCall = false
}

func (r *recordingCodec) QueryPageIndexLocation(layout.LayerGroupID) codec.PageIndexLocation {
	r.enter("location")
	return r.loc
}

func (r *recordingCodec) Encode(_ layout.LayerGroupID, _ device.Ptr, idx codec.PageIndices, _ device.Stream) bool {
	r.enter("encode")
	r.got = append(r.got, idx)
	return true
}

func (r *recordingCodec) Decode(_ layout.LayerGroupID, _ device.Ptr, idx codec.PageIndices, _ device.Stream) bool {
	r.enter("decode")
	r.got = append(r.got, idx)
	return true
}

// slotStream is a registry with one emulated device and a stream of it,
// whose handle the slots resolve.
func slotStream(t *testing.T) (*DeviceRegistry, uintptr) {
	t.Helper()
	dev := emu.New(emu.Options{})
	t.Cleanup(func() { dev.Close() })
	s, err := dev.NewStream()
	require.NoError(t, err)
	reg := &DeviceRegistry{}
	reg.Register(dev)
	return reg, s.Handle()
}

// cPairs returns n pairs in memory outside Go's heap, as a C caller's, and
// their address.
func cPairs(t *testing.T, pairs ...codec.PageIndexPair) uintptr {
	t.Helper()
	mem, err := syscall.Mmap(-1, 0, 4096, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	require.NoError(t, err)
	t.Cleanup(func() { _ = syscall.Munmap(mem) })
	copy(unsafe.Slice((*codec.PageIndexPair)(unsafe.Pointer(&mem[0])), len(pairs)), pairs)
	return uintptr(unsafe.Pointer(&mem[0]))
}

// Encode and Decode view the pairs where the codec wants them: host pairs
// as the caller's array, device pairs as their address; a location the
// codec rejects fails without calling encode or decode.
func TestDefaultCodecSlotsViewPairsWhereTheCodecWants(t *testing.T) {
	reg, stream := slotStream(t)
	r := &recordingCodec{loc: codec.Device}
	d := &DefaultCodec{c: r, reg: reg}
	assert.True(t, d.Encode(0, 0, 0x1000, 2, stream))
	assert.True(t, d.Decode(0, 0, 0x1000, 2, stream))
	assert.Equal(t, []codec.PageIndices{codec.DeviceIndices(0x1000, 2), codec.DeviceIndices(0x1000, 2)}, r.got)

	want := []codec.PageIndexPair{{Dst: 1, Src: 2}, {Dst: 3, Src: 4}}
	r.loc, r.got = codec.Host, nil
	assert.True(t, d.Encode(0, 0, cPairs(t, want...), 2, stream))
	require.Len(t, r.got, 1)
	assert.Equal(t, want, r.got[0].Host())

	r.loc, r.calls = codec.BadLocation, nil
	assert.False(t, d.Encode(0, 0, 0x1000, 2, stream))
	assert.Equal(t, []string{"location"}, r.calls, "a rejected location runs nothing")
}

// The slots refuse, calling nothing, a stream that is no live manager's,
// a negative or too large count and NULL pairs with a count.
func TestDefaultCodecSlotsRefuseBadArguments(t *testing.T) {
	reg, stream := slotStream(t)
	r := &recordingCodec{loc: codec.Host}
	d := &DefaultCodec{c: r, reg: reg}
	assert.False(t, d.Encode(0, 0, 0x1000, 2, stream+1), "unknown stream")
	assert.False(t, d.Encode(0, 0, 0x1000, -1, stream), "negative count")
	assert.False(t, d.Decode(0, 0, 0x1000, math.MaxInt32+1, stream), "count above MaxInt32")
	assert.False(t, d.Decode(0, 0, 0, 1, stream), "NULL pairs")
	assert.Empty(t, r.calls)
	assert.True(t, d.Encode(0, 0, 0, 0, stream), "no pairs at all is fine")
}

// Direct slot calls from many goroutines run one at a time.
func TestDefaultCodecSerializesCalls(t *testing.T) {
	r := &recordingCodec{loc: codec.Host}
	d := &DefaultCodec{c: r}
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 100 {
				d.QueryPageIndexLocation(0)
			}
		}()
	}
	wg.Wait()
	require.Len(t, r.calls, 800)
	assert.Zero(t, r.overlaps)
}

// The default codec object holds the library's default codec, sizes never
// negative, and destroys it.
func TestDefaultCodecIsTheDefault(t *testing.T) {
	d := NewDefaultCodec()
	assert.IsType(t, codec.NewDefault(), d.Codec())
	assert.GreaterOrEqual(t, d.QueryColdPageBytes(99), int64(0))
	d.Destroy()
}

// A built-in codec's choice is a codec object whose slots fail (false, 0,
// -1, BadLocation) and whose destroy does nothing: the manager makes the
// codec on its device.
func TestBuiltinChoiceSlotsFail(t *testing.T) {
	d := NewBuiltinChoice(gpucodec.Spec{Kind: gpucodec.KindGather})
	require.NotNil(t, d.Builtin())
	assert.Equal(t, gpucodec.KindGather, d.Builtin().Kind)
	assert.Nil(t, d.Codec())
	assert.False(t, d.Configure(nil))
	assert.Zero(t, d.QueryColdPageBytes(0))
	assert.Equal(t, layout.LayerGroupID(-1), d.GetBatchingLayerGroupID(0))
	assert.Equal(t, codec.BadLocation, d.QueryPageIndexLocation(0))
	reg, stream := slotStream(t)
	d.reg = reg
	assert.False(t, d.Encode(0, 0, 0, 0, stream))
	assert.False(t, d.Decode(0, 0, 0, 0, stream))
	d.Destroy()
	assert.Nil(t, NewDefaultCodec().Builtin())
}

// kvcm_create_builtin_cold_page_codec's object: the default codec's for
// the default kind, a choice for the others, and bad options an invalid
// argument naming the field of options.
func TestNewBuiltinCodec(t *testing.T) {
	d, err := NewBuiltinCodec(gpucodec.Spec{})
	require.NoError(t, err)
	assert.Nil(t, d.Builtin())
	assert.IsType(t, codec.NewDefault(), d.Codec())

	d, err = NewBuiltinCodec(gpucodec.Spec{Kind: gpucodec.KindAuto})
	require.NoError(t, err)
	require.NotNil(t, d.Builtin())
	assert.Equal(t, gpucodec.KindAuto, d.Builtin().Kind)

	_, err = NewBuiltinCodec(gpucodec.Spec{Kind: gpucodec.KindFP8, BlockElems: 100})
	assert.ErrorIs(t, err, core.ErrInvalidArgument)
	assert.ErrorContains(t, err, "options.block_elems")
}
