package devicetest

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core/device/backend"
	"github.com/kvcm/kvcm/core/device/emu"
)

func TestNameDefaultsToEmuNotAuto(t *testing.T) {
	t.Setenv(backend.EnvVar, "")
	assert.Equal(t, "emu", Name())
	r, err := Resolved()
	require.NoError(t, err)
	assert.Equal(t, "emu", r)
	d := Open(t, emu.Options{Seed: 1})
	assert.True(t, IsEmu(d))
	require.NoError(t, d.Close())

	t.Setenv(backend.EnvVar, " CUDA ")
	assert.Equal(t, "cuda", Name())
	t.Setenv(backend.EnvVar, "tpu")
	_, err = Resolved()
	assert.ErrorContains(t, err, "unknown")
}

func TestDeviceIndexCodecOnEmu(t *testing.T) {
	d := emu.New(emu.Options{})
	defer d.Close()
	c, pairs, err := DeviceIndexCodec(d)
	require.NoError(t, err)
	assert.Empty(t, pairs())
	require.NoError(t, c.(interface{ Close() error }).Close())
}

func TestSkipUnlessEmuRunsOnEmu(t *testing.T) {
	d := emu.New(emu.Options{})
	defer d.Close()
	SkipUnlessEmu(t, d, "for the test")
	assert.False(t, t.Skipped())
}
