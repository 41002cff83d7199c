package abitest

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The gather and FP8 codecs have CUDA kernels only: kvcm_manager_create
// refuses them on the emulated device with KVCM_ERR_CODEC_REJECTED saying so,
// and consumes the codec object; on CUDA they configure. The default and auto
// codecs make a manager on every device.
func TestBuiltinCodecsNeedTheirDevice(t *testing.T) {
	noLeaks(t)
	for _, kind := range []int32{BuiltinDefault, BuiltinGather, BuiltinFp8, BuiltinAuto} {
		t.Run(fmt.Sprint(kind), func(t *testing.T) {
			before := LiveHandles()
			codec, err := NewBuiltinCodec(BuiltinCodecOptions{Kind: kind})
			require.NoError(t, err)
			assert.Equal(t, before+1, LiveHandles(), "the codec object holds a handle")
			m, err := CreateManager(smallConfig(8, 16), codec)
			kernelOnly := kind == BuiltinGather || kind == BuiltinFp8
			if kernelOnly && testDevice() != 2 {
				requireCode(t, err, CodecRejected, "CUDA device only", "emu device")
				assert.Equal(t, before, LiveHandles(), "the refused codec object was consumed")
				requireCode(t, codec.Destroy(), InvalidHandle)
				return
			}
			require.NoError(t, err)
			require.NoError(t, DestroyManager(m))
			assert.Equal(t, before, LiveHandles())
		})
	}
}

// Bad options fail kvcm_create_builtin_cold_page_codec naming the field, and
// make no codec object.
func TestBuiltinCodecOptionsNameTheField(t *testing.T) {
	noLeaks(t)
	before := LiveHandles()
	for _, tc := range []struct {
		o     BuiltinCodecOptions
		field string
	}{
		{BuiltinCodecOptions{Kind: 4}, "options.kind"},
		{BuiltinCodecOptions{Kind: -1}, "options.kind"},
		{BuiltinCodecOptions{Kind: BuiltinFp8, Element: 2}, "options.element"},
		{BuiltinCodecOptions{Kind: BuiltinFp8, BlockElems: 100}, "options.block_elems"},
		{BuiltinCodecOptions{Kind: BuiltinFp8, BlockElems: 512}, "options.block_elems"},
		{BuiltinCodecOptions{Kind: BuiltinAuto, CrossoverBytes: -1}, "options.crossover_bytes"},
		{BuiltinCodecOptions{Kind: BuiltinGather, StructSize: 8}, "options"},
	} {
		_, err := NewBuiltinCodec(tc.o)
		requireCode(t, err, InvalidArgument, tc.field)
		assert.Equal(t, before, LiveHandles(), "%+v", tc.o)
	}
	codec, err := NewBuiltinCodec(BuiltinCodecOptions{Kind: BuiltinFp8, Element: ElementBfloat16, BlockElems: 256})
	require.NoError(t, err)
	require.NoError(t, codec.Destroy())
}

// A device codec's object only records the choice: its slots fail until a
// manager has made the codec, and it is consumed once, by
// kvcm_cold_page_codec_destroy as by kvcm_manager_create.
func TestBuiltinCodecObjectIsConsumedOnce(t *testing.T) {
	noLeaks(t)
	for _, kind := range []int32{BuiltinGather, BuiltinFp8, BuiltinAuto} {
		codec, err := NewBuiltinCodec(BuiltinCodecOptions{Kind: kind})
		require.NoError(t, err)
		assert.False(t, codec.CallConfigure(), "kind %d: a slot of an unbound device codec fails", kind)
		require.NoError(t, codec.Destroy())
		requireCode(t, codec.Destroy(), InvalidHandle)
	}
	def, err := NewBuiltinCodec(BuiltinCodecOptions{Kind: BuiltinDefault})
	require.NoError(t, err)
	require.NoError(t, def.Destroy())
	requireCode(t, def.Destroy(), InvalidHandle)
}

// A device codec's object shares the default codec's vtable, whose destroy
// slot releases it too: the object is then consumed.
func TestBuiltinCodecObjectIsReleasedByItsDestroySlot(t *testing.T) {
	noLeaks(t)
	for _, kind := range []int32{BuiltinGather, BuiltinFp8, BuiltinAuto, BuiltinDefault} {
		codec, err := NewBuiltinCodec(BuiltinCodecOptions{Kind: kind})
		require.NoError(t, err)
		codec.CallDestroy()
		requireCode(t, codec.Destroy(), InvalidHandle)
	}
}
