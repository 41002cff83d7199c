//go:build cgo

package cuda

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// WaitHost holds the work enqueued after it until its channel closes, in the
// order of the waits, and holds no host-function thread meanwhile: another
// stream's host functions run while the stream waits.
func TestWaitHostHoldsLaterWorkWithoutAHostFunction(t *testing.T) {
	d := gpu(t)
	s, other := stream(t, d), stream(t, d)
	first, second := make(chan struct{}), make(chan struct{})
	passed := make(chan int, 2)
	require.NoError(t, s.WaitHost(first))
	require.NoError(t, s.HostFunc(func() error { passed <- 1; return nil }))
	require.NoError(t, s.WaitHost(second))
	require.NoError(t, s.HostFunc(func() error { passed <- 2; return nil }))
	s.mu.Lock()
	word := s.word
	s.mu.Unlock()
	require.NotNil(t, word, "the driver waits on registered host memory (cuStreamWaitValue32), no host-function fallback")

	require.NoError(t, other.HostFunc(func() error { return nil }))
	require.NoError(t, other.Synchronize(), "another stream's host function runs while s waits")
	close(second) // released out of order: s still waits for first
	require.NoError(t, other.HostFunc(func() error { return nil }))
	require.NoError(t, other.Synchronize())
	require.Empty(t, passed, "nothing after the first wait ran before its channel closed")
	close(first)
	require.NoError(t, s.Synchronize())
	require.Equal(t, 1, <-passed)
	require.Equal(t, 2, <-passed)
}

// A destroyed stream's host word goes back to the device and serves the
// next stream: streams that wait come and go without registering host
// memory again.
func TestWaitHostWordsAreReused(t *testing.T) {
	d := ownDevice(t, Options{})
	for range 3 * wordsPerPage {
		s, err := d.NewStream()
		require.NoError(t, err)
		done := make(chan struct{})
		require.NoError(t, s.(*Stream).WaitHost(done))
		close(done)
		require.NoError(t, s.Close())
	}
	d.privMu.Lock()
	defer d.privMu.Unlock()
	require.Len(t, d.words.pages, 1, "one page of words served every stream")
}
