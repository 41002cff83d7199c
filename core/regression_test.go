package core

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core/blockhash"
	"github.com/kvcm/kvcm/core/codec"
	"github.com/kvcm/kvcm/core/codec/codectest"
	"github.com/kvcm/kvcm/core/config"
	"github.com/kvcm/kvcm/core/device"
	"github.com/kvcm/kvcm/core/device/emu"
	"github.com/kvcm/kvcm/core/layout"
)

// initial_pool_ratio is a byte ratio per layer group. ByteWeights raises every
// weight to the lifecycle's page bytes, a different unit, so the ratios
// (always <= 1) are replaced by page sizes and the configuration is ignored.
func TestInitialPoolRatioIsHonoured(t *testing.T) {
	cfg := smallConfig(0)
	cfg.Layers[1].SlidingWindowSize = 64
	cfg.Layers[1].Buffers = []config.BufferConfig{{Role: config.RoleKey, Size: 32}} // 32-byte pages
	cfg.CacheTiers[0].Quota = 1 << 20
	cfg.InitialPoolRatio = []float64{0.5, 0.5}
	f := newFixture(t, cfg)
	st, err := f.m.StorageStats(layout.GPULevel)
	require.NoError(t, err)
	require.Len(t, st, 2)
	b0 := float64(st[0].Total * st[0].PageBytes)
	b1 := float64(st[1].Total * st[1].PageBytes)
	assert.InDelta(t, 0.5, b0/(b0+b1), 0.01, "equal byte ratios give equal bytes (got %d×%d and %d×%d)",
		st[0].Total, st[0].PageBytes, st[1].Total, st[1].PageBytes)
}

// A synchronous codec failure on the GPU→disk path: encodeToDisk returns its
// staging lease's release function together with the error, and runUnit
// drops it, so the pinned page-ring lease stays live forever.
func TestSyncDiskEncodeFailureReleasesStaging(t *testing.T) {
	faulty := codectest.NewFaulty(codec.NewDefault())
	f := newTieredFixture(t, tieredConfig(t, 4, 0, 8), WithColdPageCodec(codec.Own(faulty)))
	a := f.compute(blockhash.Scope{}, seq(0, 16), 1)
	require.NoError(t, a.Suspend())
	faulty.FailSync(codectest.OpEncode, 0, 1)
	b, err := f.m.CreateKVCache(CacheOptions{InputTokens: seq(100, 16)})
	require.NoError(t, err)
	require.NoError(t, b.Resume(f.stream))
	require.ErrorIs(t, b.Resize(16, 16), ErrOutOfPages)
	assert.Zero(t, f.m.pageRing.Live(), "the failed unit's staging lease was released")
	require.NoError(t, b.Close())
	require.NoError(t, a.Close())
}

// The same on the disk→GPU path.
func TestSyncDiskDecodeFailureReleasesStaging(t *testing.T) {
	faulty := codectest.NewFaulty(codec.NewDefault())
	f := newTieredFixture(t, tieredConfig(t, 4, 0, 8), WithColdPageCodec(codec.Own(faulty)))
	a := f.compute(blockhash.Scope{}, seq(0, 16), 1)
	require.NoError(t, a.Suspend())
	b := f.compute(blockhash.Scope{}, seq(100, 16), 2)
	require.NoError(t, b.Close())
	require.Equal(t, 0, f.m.pageRing.Live())
	faulty.FailSync(codectest.OpDecode, 0, 1)
	require.ErrorIs(t, a.Resume(f.stream), ErrCodecFailed)
	assert.Zero(t, f.m.pageRing.Live(), "the failed unit's staging lease was released")
	require.ErrorIs(t, a.Resume(f.stream), ErrDataLost, "a failed decode drops its pages")
	require.NoError(t, a.Close())
}

// An asynchronous failure of one transaction must only lose that
// transaction's pages. The failed event stays in the fences of the slots it
// touched forever (fence.add prunes only clean events); every later user of
// those slots waits on it and, as waits carry failures, inherits it: B's
// pages, which reused A's GPU slots, are lost when they are evicted later.
func TestAsyncFailureDoesNotSpreadToOtherPages(t *testing.T) {
	faulty := codectest.NewFaulty(codec.NewDefault())
	f := newTieredFixture(t, tieredConfig(t, 4, 8, 0), WithColdPageCodec(codec.Own(faulty)))
	a := f.compute(blockhash.Scope{}, seq(0, 16), 1)
	require.NoError(t, a.Suspend())
	faulty.FailAsync(codectest.OpEncode, 0, 1, fmt.Errorf("boom"))
	b := f.compute(blockhash.Scope{}, seq(100, 16), 2) // A's pages fail on their way down
	require.NoError(t, b.Close())
	require.ErrorIs(t, a.Resume(f.stream), ErrDataLost)
	require.NoError(t, a.Close())
	require.Equal(t, int64(4), f.m.Stats().LostPages, "A's four pages")

	c := f.compute(blockhash.Scope{}, seq(200, 16), 3) // B's cached pages go to the host
	require.NoError(t, c.Close())
	assert.Equal(t, int64(4), f.m.Stats().LostPages, "no page outside the failed transaction is lost")
	assert.Equal(t, 16, f.m.ProbeReuse(blockhash.Scope{}, seq(100, 17)), "B's blocks are still cached")
}

// A shrink whose final reallocation fails (here the host memory limit) must
// leave the level usable. defragment has already removed every free slot at
// or beyond the target from the free list, and nothing puts them back: the
// slots leak (neither free nor owned) while numSlots stays unchanged.
func TestFailedShrinkKeepsFreeSlots(t *testing.T) {
	dev := emu.New(emu.Options{Seed: 1, HostMemoryLimit: 16*256 + 1024})
	m, err := NewManager(tieredConfig(t, 4, 16, 0), WithDevice(dev))
	require.NoError(t, err)
	defer func() {
		require.NoError(t, m.Close())
		dev.Close()
	}()
	err = m.ResizeLevel(1, 8*256) // needs a second 2 KiB host allocation: over the limit
	require.ErrorIs(t, err, device.ErrOutOfMemory)
	st, err := m.StorageStats(1)
	require.NoError(t, err)
	require.Len(t, st, 1)
	assert.Equal(t, st[0].Total, st[0].Free, "an empty level keeps every slot free after a failed resize")
}

// Roots are created for every cache's scope but only removed when their last
// child is pruned: a cache that commits nothing leaves its root behind, so
// per-request scopes (salts) grow the root map without bound.
func TestRootsOfUncommittedScopesAreRemoved(t *testing.T) {
	f := newFixture(t, smallConfig(8))
	for i := range 10 {
		c, err := f.m.CreateKVCache(CacheOptions{Scope: blockhash.Scope{Salt: fmt.Sprint(i)}, InputTokens: seq(0, 8)})
		require.NoError(t, err)
		require.NoError(t, c.Close())
	}
	f.m.mu.Lock()
	n := len(f.m.roots)
	f.m.mu.Unlock()
	assert.Zero(t, n, "no root survives a scope with no cache and no block")
}

// A block whose windowed page was dropped is reported as BlockUpdated at
// DroppedLevel; when another cache later commits the same block, publish fills
// the gap with its own page but emits nothing, so a listener still believes
// that layer group's page is gone.
func TestGapFillIsReported(t *testing.T) {
	cfg := smallConfig(9) // 18 slots of 128 bytes shared by both lifecycles
	cfg.Layers[1].SlidingWindowSize = 4
	var events []CacheEvent
	dev := emu.New(emu.Options{Seed: 1})
	m, err := NewManager(cfg, WithDevice(dev), WithEventListener(func(e CacheEvent) { events = append(events, e) }))
	require.NoError(t, err)
	s, err := dev.NewStream()
	require.NoError(t, err)
	f := &fixture{t: t, m: m, dev: dev, stream: s}
	defer func() {
		s.Close()
		m.Close()
		dev.Close()
	}()
	keys := blockhash.Chain(blockhash.Scope{}, tpb, seq(0, 8))

	// A: chunked prefill, so block 0 gets a windowed page that is released
	// (and becomes the oldest victim) when the window moves on.
	a, err := m.CreateKVCache(CacheOptions{InputTokens: seq(0, 9)})
	require.NoError(t, err)
	require.NoError(t, a.Resume(s))
	require.NoError(t, a.Resize(4, 4))
	require.NoError(t, a.Commit(seq(0, 4), false))
	require.NoError(t, a.Resize(8, 8))
	require.NoError(t, a.Commit(seq(4, 4), false))
	require.NoError(t, a.Close())

	// 15 pages in another scope: exactly one eviction, block 0's windowed page.
	events = nil
	f.serve(blockhash.Scope{LoRAID: 1}, seq(0, 56))
	dropped := false
	for _, e := range events {
		if e.Kind == BlockUpdated && e.Key == keys[0] && e.LayerGroup == 1 && e.Level == DroppedLevel {
			dropped = true
		}
	}
	require.True(t, dropped, "block 0 lost its windowed page: %+v", events)

	// B computes block 0 itself and commits it: its windowed page fills the gap.
	events = nil
	b, err := m.CreateKVCache(CacheOptions{InputTokens: seq(0, 4)})
	require.NoError(t, err)
	require.Zero(t, b.ReusedTokens())
	require.NoError(t, b.Resume(s))
	require.NoError(t, b.Resize(4, 4))
	require.NoError(t, b.Commit(seq(0, 4), false))
	m.mu.Lock()
	var n *node
	for _, r := range m.roots {
		if c := r.child(keys[0]); c != nil {
			n = c
		}
	}
	require.NotNil(t, n)
	filled := n.pages[1] != nil
	m.mu.Unlock()
	require.True(t, filled, "B's page filled the gap")
	reported := false
	for _, e := range events {
		if e.Key == keys[0] && (e.Kind == BlockStored || (e.Kind == BlockUpdated && e.LayerGroup == 1 && e.Level == 0)) {
			reported = true
		}
	}
	assert.True(t, reported, "the refilled page is reported: %+v", events)
	require.NoError(t, b.Close())
}

// Buffer and PoolGroupDescs index m.levels[0], which release() sets to nil:
// calling them after Close panics instead of failing.
func TestQueriesAfterCloseDoNotPanic(t *testing.T) {
	dev := emu.New(emu.Options{Seed: 1})
	defer dev.Close()
	m, err := NewManager(smallConfig(4), WithDevice(dev))
	require.NoError(t, err)
	require.NoError(t, m.Close())
	assert.NotPanics(t, func() { _, _ = m.Buffer(0, config.RoleKey) })
	assert.NotPanics(t, func() { _ = m.PoolGroupDescs() })
}
