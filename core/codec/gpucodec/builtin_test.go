package gpucodec

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core/codec"
	"github.com/kvcm/kvcm/core/device/emu"
	"github.com/kvcm/kvcm/core/layout"
)

// The kernel codecs (gather, FP8) have no emulation: New refuses them on the
// emulated device with ErrNeedsCUDA, naming the codec and the device.
func TestNewRefusesKernelCodecsOnTheEmulatedDevice(t *testing.T) {
	dev := emu.New(emu.Options{})
	defer dev.Close()
	for _, k := range []Kind{KindGather, KindFP8} {
		c, err := New(dev, Spec{Kind: k})
		require.ErrorIs(t, err, ErrNeedsCUDA, "%v", k)
		assert.Nil(t, c)
		assert.Contains(t, err.Error(), k.String()+" codec on the emu device")
	}
}

// The default codec and Auto work on every device; on the emulated one Auto
// is the default codec (host indices, the default codec's identity).
func TestNewMakesDefaultAndAutoOnTheEmulatedDevice(t *testing.T) {
	dev := emu.New(emu.Options{})
	defer dev.Close()
	for _, k := range []Kind{KindDefault, KindAuto} {
		c, err := New(dev, Spec{Kind: k})
		require.NoError(t, err, "%v", k)
		require.True(t, c.Configure([]layout.PoolGroupDesc{groupOf(4096, 4096)}), "%v", k)
		assert.Equal(t, codec.Host, c.QueryPageIndexLocation(0), "%v", k)
		id, ok := codec.IdentityOf(c)
		assert.True(t, ok, "%v", k)
		assert.Equal(t, codec.ConcatIdentity, id, "%v", k)
		require.NoError(t, codec.Destroy(c))
	}
	a, err := New(dev, Spec{Kind: KindAuto, CrossoverBytes: 1 << 20})
	require.NoError(t, err)
	assert.Equal(t, int64(1<<20), a.(*Auto).CrossoverBytes(), "the crossover is passed on")
	require.NoError(t, codec.Destroy(a))
}

// Bad options are refused before any device is touched, naming the field.
func TestSpecValidateNamesTheField(t *testing.T) {
	for _, tc := range []struct {
		s     Spec
		field string
	}{
		{Spec{Kind: Kind(9)}, "kind"},
		{Spec{Kind: KindFP8, Format: Format(5)}, "element"},
		{Spec{Kind: KindFP8, BlockElems: 96}, "block_elems"},
		{Spec{Kind: KindFP8, BlockElems: 4}, "block_elems"},
		{Spec{Kind: KindAuto, CrossoverBytes: -1}, "crossover_bytes"},
	} {
		err := tc.s.Validate()
		require.Error(t, err, "%+v", tc.s)
		var se *SpecError
		require.ErrorAs(t, err, &se)
		assert.Equal(t, tc.field, se.Field, "%+v", tc.s)
		_, err = New(nil, tc.s)
		assert.Error(t, err)
	}
	assert.NoError(t, Spec{Kind: KindFP8, Format: BFloat16, BlockElems: 256}.Validate())
}
