package core

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core/device/emu"
)

// A fence that grew while its events were pending drops all of them at its
// next addition once they have completed, handing their device events back.
func TestFenceShrinksBackOnceEventsComplete(t *testing.T) {
	dev := emu.New(emu.Options{})
	defer dev.Close()
	s, err := dev.NewStream()
	require.NoError(t, err)
	defer s.Close()
	pool := eventPool{dev: dev}
	defer pool.close()

	gate := make(chan struct{})
	require.NoError(t, s.HostFunc(func() error { <-gate; return nil }))
	var f fence
	for range 8 {
		ev, err := pool.record(s)
		require.NoError(t, err)
		f.add(&pool, ev)
		pool.release(ev)
	}
	assert.Len(t, f, 8, "pending events stay")
	close(gate)
	require.NoError(t, s.Synchronize())

	last, err := pool.record(s)
	require.NoError(t, err)
	require.NoError(t, s.Synchronize())
	f.add(&pool, last)
	pool.release(last)
	assert.Equal(t, fence{last}, f, "every completed event is dropped")
	assert.Len(t, pool.free, 8, "their device events are back in the pool")
}
