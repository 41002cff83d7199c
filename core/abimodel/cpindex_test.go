package abimodel

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core"
	"github.com/kvcm/kvcm/core/blockhash"
	"github.com/kvcm/kvcm/core/config"
	"github.com/kvcm/kvcm/core/cp"
)

func cpOpts() cp.ManagerBackedOptions { return cp.ManagerBackedOptions{} }

// external is an external CP index that records the calls it gets.
type external struct {
	mu                 sync.Mutex
	allocated, freed   map[string]int // keys notified, per request
	destroyed          int
	score              float64
	order              []string
	predicts, priority int
}

func newExternal() *external {
	return &external{allocated: map[string]int{}, freed: map[string]int{}}
}

func (e *external) index() *CPIndex {
	return NewDelegatingIndex(cp.External{
		PredictPrefixReuse: func(string, []config.Token) (float64, error) {
			e.mu.Lock()
			defer e.mu.Unlock()
			e.predicts++
			return e.score, nil
		},
		NotifyBlocksAllocated: func(id string, keys []blockhash.Key) error {
			e.mu.Lock()
			defer e.mu.Unlock()
			e.allocated[id] += len(keys)
			return nil
		},
		NotifyBlocksFreed: func(id string, keys []blockhash.Key) error {
			e.mu.Lock()
			defer e.mu.Unlock()
			e.freed[id] += len(keys)
			return nil
		},
		GetAllocationPriority: func([]string) ([]string, error) {
			e.mu.Lock()
			defer e.mu.Unlock()
			e.priority++
			return e.order, nil
		},
	}, func() {
		e.mu.Lock()
		defer e.mu.Unlock()
		e.destroyed++
	})
}

func (e *external) destroyCount() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.destroyed
}

// An index lives while its creator, an attaching manager or a cache created
// while it was attached holds it; the last to let go runs its destroy
// function, exactly once.
func TestCPIndexLivesUntilItsLastReference(t *testing.T) {
	m := newManager(t, Options{})
	s, err := m.CreateStream()
	require.NoError(t, err)
	ext := newExternal()
	x := ext.index()
	require.NoError(t, m.AttachCP(x))
	c := active(t, m, s, CacheOptions{RequestID: "r"}, seq(0, 8))
	require.NoError(t, x.Destroy())
	assert.False(t, x.Closed(), "the manager and the cache hold it")
	m.DetachCP()
	assert.False(t, x.Closed(), "the cache holds it")
	require.NoError(t, c.Close())
	assert.True(t, x.Closed())
	assert.Equal(t, 1, ext.destroyCount())
	assert.Equal(t, 2, ext.allocated["r"], "the committed blocks")
	assert.Equal(t, 2, ext.freed["r"], "the terminal free")
}

// A cache created while an index is attached, with a request id, notifies
// it; without a request id, or with no index attached, nothing is notified.
func TestCachesNotifyTheIndexAttachedAtCreation(t *testing.T) {
	m := newManager(t, Options{})
	s, err := m.CreateStream()
	require.NoError(t, err)
	ext := newExternal()
	x := ext.index()
	defer x.Destroy()
	plain := active(t, m, s, CacheOptions{RequestID: "before"}, seq(0, 8))
	require.NoError(t, m.AttachCP(x))
	anon := active(t, m, s, CacheOptions{}, seq(100, 8))
	tracked := active(t, m, s, CacheOptions{RequestID: "r"}, seq(0, 12))
	m.DetachCP()
	require.NoError(t, tracked.Commit(nil, false))
	for _, c := range []*Cache{plain, anon, tracked} {
		require.NoError(t, c.Close())
	}
	assert.Equal(t, map[string]int{"r": 3}, ext.allocated, "2 reused at creation, 1 committed")
	assert.Equal(t, map[string]int{"r": 3}, ext.freed)
}

// Closing the manager closes its tracked caches, which notify their terminal
// free, and lets go of the attached index.
func TestCloseNotifiesTheIndexAndReleasesIt(t *testing.T) {
	m := newManager(t, Options{})
	s, err := m.CreateStream()
	require.NoError(t, err)
	ext := newExternal()
	x := ext.index()
	require.NoError(t, m.AttachCP(x))
	active(t, m, s, CacheOptions{RequestID: "r"}, seq(0, 8))
	require.NoError(t, m.Close())
	assert.Equal(t, 2, ext.freed["r"])
	assert.False(t, x.Closed(), "the creator still holds it")
	require.NoError(t, x.Destroy())
	assert.Equal(t, 1, ext.destroyCount())
}

// After Destroy every method, a second Destroy and attaching fail with
// ErrDestroyed, and the external index is not called.
func TestCPIndexAfterDestroy(t *testing.T) {
	m := newManager(t, Options{})
	ext := newExternal()
	x := ext.index()
	require.NoError(t, x.Destroy())
	assert.ErrorIs(t, x.Destroy(), ErrDestroyed)
	assert.ErrorIs(t, m.AttachCP(x), ErrDestroyed)
	_, err := x.PredictPrefixReuse("r", seq(0, 4))
	assert.ErrorIs(t, err, ErrDestroyed)
	_, err = x.GetCachedBlocks("r")
	assert.ErrorIs(t, err, ErrDestroyed)
	assert.ErrorIs(t, x.NotifyBlocksAllocated("r", nil), ErrDestroyed)
	assert.ErrorIs(t, x.NotifyBlocksFreed("r", nil), ErrDestroyed)
	_, err = x.GetAllocationPriority(requestIDs("a"))
	assert.ErrorIs(t, err, ErrDestroyed)
	_, err = x.FaultCount()
	assert.ErrorIs(t, err, ErrDestroyed)
	assert.Zero(t, ext.predicts+ext.priority)
	assert.Equal(t, 1, ext.destroyCount())
}

// Attaching another index lets go of the previous one.
func TestAttachReplacesTheAttachedIndex(t *testing.T) {
	m := newManager(t, Options{})
	a, b := newExternal(), newExternal()
	xa, xb := a.index(), b.index()
	require.NoError(t, m.AttachCP(xa))
	require.NoError(t, xa.Destroy())
	require.NoError(t, m.AttachCP(xb))
	assert.True(t, xa.Closed())
	assert.Equal(t, 1, a.destroyCount())
	require.NoError(t, xb.Destroy())
	assert.False(t, xb.Closed(), "attached")
	require.NoError(t, m.Close())
	assert.Equal(t, 1, b.destroyCount())
}

// Scores are clamped to [0, 1]; the allocation order is a permutation of
// the input indices whatever the index answers, equal ids taking their
// indices in input order.
func TestCPIndexAnswersAreRepaired(t *testing.T) {
	ext := newExternal()
	x := ext.index()
	defer x.Destroy()
	ext.score = 7
	got, err := x.PredictPrefixReuse("r", nil)
	require.NoError(t, err)
	assert.Equal(t, 1.0, got)
	ext.order = []string{"c", "zz", "a", "c"}
	order, err := x.GetAllocationPriority(requestIDs("a", "b", "c", "a"))
	require.NoError(t, err)
	assert.ElementsMatch(t, []int{0, 1, 2, 3}, order)
	assert.Equal(t, []int{2, 0}, order[:2], "the index's order first")
	assert.Less(t, slicesIndex(order, 0), slicesIndex(order, 3), "equal ids in input order")
	empty, err := x.GetAllocationPriority(nil)
	require.NoError(t, err)
	assert.Empty(t, empty)
}

func slicesIndex(s []int, v int) int {
	for i, x := range s {
		if x == v {
			return i
		}
	}
	return -1
}

// The null index knows nothing and keeps the caller's order.
func TestNullIndex(t *testing.T) {
	x := NewNullIndex()
	defer x.Destroy()
	score, err := x.PredictPrefixReuse("r", seq(0, 8))
	require.NoError(t, err)
	assert.Zero(t, score)
	order, err := x.GetAllocationPriority(requestIDs("a", "b"))
	require.NoError(t, err)
	assert.Equal(t, []int{0, 1}, order)
	n, err := x.FaultCount()
	require.NoError(t, err)
	assert.Zero(t, n)
}

// A manager-backed index sees the manager's blocks; it must be created
// before the first commit, answers as the null index once the manager is
// closed, and stops listening when its last reference goes.
func TestManagerBackedIndex(t *testing.T) {
	m := newManager(t, Options{})
	x, err := m.NewManagerBackedIndex(cpOpts())
	require.NoError(t, err)
	s, err := m.CreateStream()
	require.NoError(t, err)
	c := active(t, m, s, CacheOptions{}, seq(0, 8))
	require.NoError(t, c.Close())
	score, err := x.PredictPrefixReuse("r", seq(0, 8))
	require.NoError(t, err)
	assert.Positive(t, score, "the prefix is cached")
	_, err = m.NewManagerBackedIndex(cpOpts())
	assert.ErrorIs(t, err, core.ErrInvalidState, "created after the first commit")

	require.NoError(t, m.Close())
	score, err = x.PredictPrefixReuse("r2", seq(0, 8))
	require.NoError(t, err)
	assert.Zero(t, score, "answers as Null once its manager is closed")
	require.NoError(t, x.Destroy())
	assert.True(t, x.Closed())
}

// AttachCP racing Destroy either fails or holds a live index: an attached
// index is never closed under the manager.
func TestAttachRacingDestroy(t *testing.T) {
	m := newManager(t, Options{})
	for round := range 500 {
		ext := newExternal()
		x := ext.index()
		var attachErr error
		var wg sync.WaitGroup
		wg.Add(2)
		go func() { defer wg.Done(); attachErr = m.AttachCP(x) }()
		go func() { defer wg.Done(); x.Destroy() }()
		wg.Wait()
		if attachErr == nil {
			require.False(t, x.Closed(), "round %d: attached, yet closed", round)
			m.DetachCP()
		} else {
			require.ErrorIs(t, attachErr, ErrDestroyed)
		}
		require.True(t, x.Closed(), "round %d", round)
		require.Equal(t, 1, ext.destroyCount(), "round %d", round)
	}
}

// A call in flight holds the index: Destroy during the call closes it only
// when the call returns, and the destroy function runs once, after it.
func TestCallInFlightHoldsTheIndex(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	var destroyedDuringCall bool
	destroyed := 0
	x := NewDelegatingIndex(cp.External{
		PredictPrefixReuse: func(string, []config.Token) (float64, error) {
			close(entered)
			<-release
			destroyedDuringCall = destroyed > 0
			return 0.5, nil
		},
	}, func() { destroyed++ })
	done := make(chan float64)
	go func() {
		s, _ := x.PredictPrefixReuse("r", nil)
		done <- s
	}()
	<-entered
	require.NoError(t, x.Destroy())
	assert.False(t, x.Closed(), "the call holds it")
	close(release)
	assert.Equal(t, 0.5, <-done)
	assert.False(t, destroyedDuringCall)
	assert.True(t, x.Closed())
	assert.Equal(t, 1, destroyed)
}
