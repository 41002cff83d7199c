package abimodel

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core/codec"
	"github.com/kvcm/kvcm/core/codec/gpucodec"
	"github.com/kvcm/kvcm/core/device"
	"github.com/kvcm/kvcm/core/layout"
)

// recordingCodec answers a fixed location and records the calls it gets.
type recordingCodec struct {
	codec.ColdPageCodec
	loc      codec.PageIndexLocation
	calls    []string
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
	return idx.Len() == 2
}

func (r *recordingCodec) Decode(_ layout.LayerGroupID, _ device.Ptr, idx codec.PageIndices, _ device.Stream) bool {
	r.enter("decode")
	return idx.Len() == 2
}

// Transform views the pairs in the location the codec selects and runs
// encode or decode on them; a location the codec rejects, or pairs that
// cannot be viewed there, fail without calling encode or decode.
func TestDefaultCodecTransformViewsPairsWhereTheCodecWants(t *testing.T) {
	r := &recordingCodec{loc: codec.Device}
	d := &DefaultCodec{c: r}
	var asked []codec.PageIndexLocation
	view := func(ok bool) func(codec.PageIndexLocation) (codec.PageIndices, bool) {
		return func(loc codec.PageIndexLocation) (codec.PageIndices, bool) {
			asked = append(asked, loc)
			return codec.DeviceIndices(0x1000, 2), ok
		}
	}
	assert.True(t, d.Transform(true, 0, 0, view(true), nil))
	assert.True(t, d.Transform(false, 0, 0, view(true), nil))
	assert.False(t, d.Transform(true, 0, 0, view(false), nil))
	assert.Equal(t, []codec.PageIndexLocation{codec.Device, codec.Device, codec.Device}, asked)
	assert.Equal(t, []string{"location", "encode", "location", "decode", "location"}, r.calls)

	r.loc, r.calls, asked = codec.BadLocation, nil, nil
	assert.False(t, d.Transform(true, 0, 0, view(true), nil))
	assert.Empty(t, asked, "a rejected location views nothing")
	assert.Equal(t, []string{"location"}, r.calls)
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
	assert.NoError(t, d.Destroy())
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
	assert.False(t, d.Transform(true, 0, 0, func(codec.PageIndexLocation) (codec.PageIndices, bool) { return codec.HostIndices(nil), true }, nil))
	assert.NoError(t, d.Destroy())
	assert.Nil(t, NewDefaultCodec().Builtin())
}
