package abimodel

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core"
	"github.com/kvcm/kvcm/core/device"
	"github.com/kvcm/kvcm/core/device/emu"
)

// A registered device's streams resolve by native handle; memory allocated
// through a stream is freed by Free once, or when the device is
// unregistered.
func TestDeviceRegistry(t *testing.T) {
	reg := &DeviceRegistry{}
	d := emu.New(emu.Options{})
	defer d.Close()
	s, err := d.NewStream()
	require.NoError(t, err)
	_, err = reg.Stream(s.Handle())
	assert.ErrorIs(t, err, core.ErrInvalidArgument, "not registered yet")
	reg.Register(d)
	got, err := reg.Stream(s.Handle())
	require.NoError(t, err)
	assert.Equal(t, s.Handle(), got.Handle())
	_, err = reg.Stream(0)
	assert.ErrorIs(t, err, core.ErrInvalidArgument)

	p, err := reg.Alloc(s.Handle(), device.DeviceMemory, 128)
	require.NoError(t, err)
	_, err = reg.Alloc(s.Handle(), device.DeviceMemory, 0)
	assert.ErrorIs(t, err, core.ErrInvalidArgument)
	require.NoError(t, reg.Free(s.Handle(), p))
	assert.ErrorIs(t, reg.Free(s.Handle(), p), core.ErrInvalidArgument, "freed twice")

	_, err = reg.Alloc(s.Handle(), device.HostMapped, 128)
	require.NoError(t, err)
	assert.Equal(t, int64(1), d.Stats().LiveAllocs.Total())
	reg.Unregister(d)
	assert.Zero(t, d.Stats().LiveAllocs.Total(), "unregistering frees what was allocated through it")
	_, err = reg.Stream(s.Handle())
	assert.ErrorIs(t, err, core.ErrInvalidArgument)
}
