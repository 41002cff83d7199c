package abimodel

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core"
	"github.com/kvcm/kvcm/core/device/backend"
)

// plan commits a 16-token turn in a cache with an 8-token window, stops
// committing and plans the drop of its window pages.
func plan(t *testing.T, m *Manager) *core.PlannedDrop {
	t.Helper()
	s, err := m.CreateStream()
	require.NoError(t, err)
	c := active(t, m, s, CacheOptions{}, seq(0, 16))
	c.StopCommitting()
	d, err := c.Core().PlanCommittedBlockDrop()
	require.NoError(t, err)
	require.NotNil(t, d)
	return d
}

func swaManager(t *testing.T) *Manager {
	t.Helper()
	cfg := smallConfig(16)
	cfg.Layers[1].SlidingWindowSize = 8
	m, err := New(cfg, Options{Device: backend.Emu, Registry: &DeviceRegistry{}})
	require.NoError(t, err)
	t.Cleanup(func() { m.Close() })
	return m
}

// Destroying a plan that was not carried out carries it out; destroying
// one that was changes nothing more, and after the manager's close there is
// nothing left to drop and no error.
func TestDestroyPlannedDropCarriesOutThePlan(t *testing.T) {
	m := swaManager(t)
	d := plan(t, m)
	require.NoError(t, DestroyPlannedDrop(d))
	assert.True(t, d.Dropped())
	assert.NoError(t, DestroyPlannedDrop(d), "a plan carried out is destroyed as is")

	closed := plan(t, m)
	require.NoError(t, m.Close())
	assert.NoError(t, DestroyPlannedDrop(closed))
	assert.ErrorIs(t, closed.Drop(), core.ErrClosed, "carrying it out after the close is an error")
}
