package backend

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core/device/cuda"
)

func TestOpenEmu(t *testing.T) {
	d, err := Open("EMU")
	require.NoError(t, err)
	assert.Equal(t, "emu", d.Name())
	require.NoError(t, d.Close())
}

func TestAutoPicksCUDAExactlyWhenAGPUIsPresent(t *testing.T) {
	want := Emu
	if cuda.Available() {
		want = CUDA
	}
	got, err := Resolve(Auto)
	require.NoError(t, err)
	assert.Equal(t, want, got)
	d, err := Open("auto")
	require.NoError(t, err)
	assert.Equal(t, want, d.Name())
	require.NoError(t, d.Close())
}

func TestCUDAWithoutGPUFailsCleanly(t *testing.T) {
	if cuda.Available() {
		d, err := Open(CUDA)
		require.NoError(t, err)
		assert.Equal(t, "cuda", d.Name())
		require.NoError(t, d.Close())
		return
	}
	_, err := Open(CUDA)
	assert.ErrorIs(t, err, cuda.ErrUnavailable)
}

func TestEmptyNameReadsTheEnvironment(t *testing.T) {
	t.Setenv(EnvVar, "emu")
	got, err := Resolve("")
	require.NoError(t, err)
	assert.Equal(t, Emu, got)
	t.Setenv(EnvVar, "")
	got, err = Resolve("")
	require.NoError(t, err)
	auto, _ := Resolve(Auto)
	assert.Equal(t, auto, got)
}

func TestUnknownName(t *testing.T) {
	_, err := Open("tpu")
	assert.ErrorContains(t, err, "unknown")
	assert.Len(t, Names(), 3)
}
