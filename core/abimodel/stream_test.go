package abimodel

import (
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core"
	"github.com/kvcm/kvcm/core/layout"
)

// DestroyStream refuses a stream an ACTIVE cache uses, naming the cache and
// changing nothing; once the cache is suspended the stream goes, and the
// manager then closes without error (nothing leaked).
func TestDestroyStreamInUseIsRefused(t *testing.T) {
	m := newManager(t, Options{})
	s, err := m.CreateStream()
	require.NoError(t, err)
	c := active(t, m, s, CacheOptions{}, seq(0, 8))

	err = m.DestroyStream(s.Handle())
	require.ErrorIs(t, err, core.ErrInvalidState)
	assert.ErrorContains(t, err, fmt.Sprintf("ACTIVE cache %d", c.Core().ID()))
	require.NoError(t, s.Synchronize(), "the stream is alive")
	require.NoError(t, c.Commit(nil, false), "the cache still runs on it")

	require.NoError(t, c.Suspend())
	require.NoError(t, m.DestroyStream(s.Handle()))
	require.NoError(t, c.Close())
	require.NoError(t, m.Close())
}

// A stream is destroyed once; a handle the manager did not create is an
// argument error for DestroyStream, and Resume takes only live streams of the
// manager's device: its own, or the engine's, which it adopts (0, the
// default stream's handle, included).
func TestStreamHandles(t *testing.T) {
	m := newManager(t, Options{})
	other := newManager(t, Options{})
	s, err := m.CreateStream()
	require.NoError(t, err)
	os, err := other.CreateStream()
	require.NoError(t, err)
	assert.ErrorIs(t, m.DestroyStream(os.Handle()), core.ErrInvalidArgument, "another manager's stream")
	_, err = m.Stream(os.Handle())
	assert.ErrorIs(t, err, core.ErrInvalidArgument, "another device's stream")
	engine, err := m.Stream(0)
	require.NoError(t, err, "the engine's default stream")
	assert.Zero(t, engine.Handle())
	assert.ErrorIs(t, m.DestroyStream(0), core.ErrInvalidArgument, "the engine's stream is not the manager's to destroy")
	got, err := m.Stream(s.Handle())
	require.NoError(t, err)
	assert.Equal(t, s.Handle(), got.Handle())
	require.NoError(t, m.DestroyStream(s.Handle()))
	assert.ErrorIs(t, m.DestroyStream(s.Handle()), core.ErrInvalidArgument, "destroyed twice")
	c, err := m.CreateCache(CacheOptions{})
	require.NoError(t, err)
	assert.ErrorIs(t, c.Resume(s), core.ErrInvalidArgument, "a destroyed stream")
	assert.ErrorIs(t, c.Resume(os), core.ErrInvalidArgument, "another device's stream")
	assert.Equal(t, core.Suspended, c.Core().Status())
}

// Closing the manager with a cache ACTIVE on one of its streams closes the
// cache first, then the stream: nothing is refused and nothing leaks.
func TestCloseWithAnActiveCacheOnAManagerStream(t *testing.T) {
	m := newManager(t, Options{})
	s, err := m.CreateStream()
	require.NoError(t, err)
	c := active(t, m, s, CacheOptions{}, seq(0, 8))
	require.NoError(t, m.Close())
	assert.Equal(t, core.Closed, c.Core().Status())
	_, err = m.Core().StorageStats(layout.GPULevel)
	assert.ErrorIs(t, err, core.ErrClosed)
}

// A Resume racing DestroyStream on the same stream never leaves a cache
// ACTIVE on a destroyed stream: one of the two fails.
func TestDestroyStreamRacingResume(t *testing.T) {
	m := newManager(t, Options{})
	for round := range 200 {
		s, err := m.CreateStream()
		require.NoError(t, err)
		c, err := m.CreateCache(CacheOptions{})
		require.NoError(t, err)
		var resumeErr, destroyErr error
		var wg sync.WaitGroup
		wg.Add(2)
		go func() { defer wg.Done(); resumeErr = c.Resume(s) }()
		go func() { defer wg.Done(); destroyErr = m.DestroyStream(s.Handle()) }()
		wg.Wait()
		require.True(t, resumeErr != nil || destroyErr != nil, "round %d: the cache is ACTIVE on a destroyed stream", round)
		if resumeErr == nil {
			require.NoError(t, c.Suspend(), "round %d", round)
			require.NoError(t, m.DestroyStream(s.Handle()), "round %d", round)
		}
		require.NoError(t, c.Close(), "round %d", round)
	}
}
