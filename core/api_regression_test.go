package core

import (
	"errors"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core/blockhash"
	"github.com/kvcm/kvcm/core/codec"
	"github.com/kvcm/kvcm/core/codec/codectest"
	"github.com/kvcm/kvcm/core/config"
	"github.com/kvcm/kvcm/core/device/emu"
	"github.com/kvcm/kvcm/core/layout"
)

// sentinels are every error kind the package documents.
var sentinels = []error{
	ErrOutOfPages, ErrInvalidState, ErrInvalidArgument, ErrResumeRefused,
	ErrDataLost, ErrCodecRejected, ErrCodecFailed, ErrIO, ErrInvalidConfig, ErrClosed,
}

func wrapsSentinel(err error) bool {
	for _, s := range sentinels {
		if errors.Is(err, s) {
			return true
		}
	}
	return false
}

// leakyFixture is a fixture whose cleanup skips closing when a test leaves a
// call stuck holding the manager's lock (Close would block forever).
func leakyFixture(t *testing.T, cfg config.Config) (*fixture, *bool) {
	t.Helper()
	dev := emu.New(emu.Options{Seed: 1})
	m, err := NewManager(cfg, WithDevice(dev))
	require.NoError(t, err)
	s, err := dev.NewStream()
	require.NoError(t, err)
	stuck := new(bool)
	t.Cleanup(func() {
		if *stuck {
			return // the manager's lock is held forever; leak it
		}
		s.Close()
		m.Close()
		dev.Close()
	})
	return &fixture{t: t, m: m, dev: dev, stream: s}, stuck
}

// Resize(math.MaxInt, -1): layout.BlocksFor computes (n+tpb-1)/tpb, which
// overflows to a negative block count. Resize then treats every block as
// beyond the new capacity, unreferences all of the cache's pages, and panics
// slicing c.blocks[:negative] — with the pages already released.
func TestResizeHugeCapacityDoesNotPanic(t *testing.T) {
	f := newFixture(t, smallConfig(16))
	c := f.open(blockhash.Scope{}, seq(0, 8))
	before, err := c.BasePageIndices(0)
	require.NoError(t, err)

	var rerr error
	require.NotPanics(t, func() { rerr = c.Resize(math.MaxInt, -1) }, "an absurd capacity is an error, not a panic")
	assert.True(t, errors.Is(rerr, ErrInvalidArgument) || errors.Is(rerr, ErrOutOfPages), "got %v", rerr)
	assert.Equal(t, 8, c.Capacity(), "a failed resize changes nothing")
	after, err := c.BasePageIndices(0)
	require.NoError(t, err)
	assert.Equal(t, before, after, "a failed resize keeps the cache's pages")
	require.NoError(t, c.Close())
}

// Resize(1<<40, -1): Resize counts the pages it needs block by block, from the
// current block count up to BlocksFor(capacity), before checking that the
// level has them: 2^38 iterations under the manager's lock (hours) before it
// can return ErrOutOfPages. Every other call on the manager blocks meanwhile.
func TestResizeHugeCapacityFailsPromptly(t *testing.T) {
	f, stuck := leakyFixture(t, smallConfig(16))
	c := f.open(blockhash.Scope{}, seq(0, 8))
	done := make(chan error, 1)
	go func() { done <- c.Resize(MaxCapacity, -1) }()
	select {
	case err := <-done:
		assert.ErrorIs(t, err, ErrOutOfPages)
		assert.ErrorIs(t, c.Resize(1<<40, -1), ErrInvalidArgument, "beyond MaxCapacity")
		assert.Equal(t, 8, c.Capacity(), "nothing changed")
		require.NoError(t, c.Close())
	case <-time.After(5 * time.Second):
		*stuck = true
		t.Fatal("Resize(MaxCapacity) still runs after 5s, holding the manager's lock")
	}
}

// twoHotGroupConfig has two hot pool groups (a full-attention layer with
// 128-byte pages and a windowed layer with 32-byte pages) and room to grow.
func twoHotGroupConfig() config.Config {
	cfg := smallConfig(0)
	cfg.Layers[1].SlidingWindowSize = 64
	cfg.Layers[1].Buffers = []config.BufferConfig{{Role: config.RoleKey, Size: 32}}
	cfg.CacheTiers[0].Quota = 64 << 10
	cfg.CacheTiers[0].MaxQuota = 256 << 10
	return cfg
}

// ResizeLevel grows the groups of a level one after the other and, when a
// later group fails, returns without shrinking the earlier ones back: the
// failed call leaves the first group grown (while Quota still reports the
// old quota). Its doc says "On error nothing was released", and the package
// rule is that a failed call changes nothing.
func TestResizeLevelFailedGrowChangesNothing(t *testing.T) {
	cfg := twoHotGroupConfig()
	// First learn the sizes on an unlimited device.
	probe := newFixture(t, cfg)
	before := probe.groups(layout.GPULevel)
	require.Len(t, before, 2)
	probe.m.mu.Lock()
	target, err := probe.m.slotsFor(probe.m.levels[0], cfg.CacheTiers[0].MaxQuota)
	probe.m.mu.Unlock()
	require.NoError(t, err)
	var live int64
	for _, g := range before {
		live += g.Total * g.PageBytes
	}
	grow0 := (target[0] - before[0].Total) * before[0].PageBytes
	grow1 := (target[1] - before[1].Total) * before[1].PageBytes
	require.Positive(t, grow0)
	require.Positive(t, grow1)

	// The first group's growth fits the device limit, the second's does not.
	dev := emu.New(emu.Options{Seed: 1, DeviceMemoryLimit: live + grow0 + grow1/2})
	m, err := NewManager(cfg, WithDevice(dev))
	require.NoError(t, err)
	defer func() {
		require.NoError(t, m.Close())
		dev.Close()
	}()
	err = m.ResizeLevel(layout.GPULevel, cfg.CacheTiers[0].MaxQuota)
	require.Error(t, err, "the second group cannot grow")
	after, err := m.StorageStats(layout.GPULevel)
	require.NoError(t, err)
	q, err := m.Quota(layout.GPULevel)
	require.NoError(t, err)
	assert.Equal(t, cfg.CacheTiers[0].Quota, q)
	for i := range before {
		assert.Equal(t, before[i].Total, after[i].Total, "group %d: a failed resize changes nothing", i)
	}
}

// A grow that the device cannot back fails with the device's own error:
// nothing in the chain is one of the package's documented kinds (every
// returned error "wraps one of them"); running out of memory for the level
// is ErrOutOfPages.
func TestResizeLevelOutOfMemoryIsErrOutOfPages(t *testing.T) {
	cfg := smallConfig(8)
	cfg.CacheTiers[0].MaxQuota = 32 * 256
	dev := emu.New(emu.Options{Seed: 1, DeviceMemoryLimit: 12 * 256})
	m, err := NewManager(cfg, WithDevice(dev))
	require.NoError(t, err)
	defer func() {
		require.NoError(t, m.Close())
		dev.Close()
	}()
	err = m.ResizeLevel(layout.GPULevel, 32*256)
	require.Error(t, err)
	assert.True(t, wrapsSentinel(err), "error of an unknown kind: %v", err)
}

// A priority callback runs in the middle of Commit, after the tokens were
// appended: when it panics, the cache keeps the tokens as committed though
// the block was never published (and later commits skip it forever).
func TestPanickingPriorityChangesNothing(t *testing.T) {
	f := newFixture(t, smallConfig(16))
	calls := 0
	c, err := f.m.CreateKVCache(CacheOptions{InputTokens: seq(0, 8), Priority: func(int, layout.LifeCycleID) int {
		calls++
		if calls == 1 {
			panic("priority callback bug")
		}
		return 50
	}})
	require.NoError(t, err)
	require.NoError(t, c.Resume(f.stream))
	require.NoError(t, c.Resize(8, 8))
	func() {
		defer func() { _ = recover() }()
		_ = c.Commit(seq(0, 8), false)
	}()
	assert.Equal(t, 0, c.NumCommittedTokens(), "the panicking commit committed nothing")
	// Retrying the commit must publish both blocks.
	require.NoError(t, c.Commit(seq(0, 8), false))
	assert.Equal(t, 8, f.m.ProbeReuse(blockhash.Scope{}, seq(0, 9)), "both blocks are reusable")
	require.NoError(t, c.Close())
}

// Close publishes a pending partial block (Commit with isEnd and partial
// reuse) without checking that its pages survived: a page lost to an
// asynchronous codec failure while the cache was suspended is adopted into
// the tree. A lost page is never evictable and, owned by a node, never freed:
// its slot leaks for the manager's lifetime.
func TestPendingPartialOfLostPageIsNotPublished(t *testing.T) {
	faulty := codectest.NewFaulty(codec.NewDefault())
	cfg := tieredConfig(t, 4, 8, 0)
	cfg.EnablePartialReuse = true
	f := newTieredFixture(t, cfg, WithColdPageCodec(codec.Own(faulty)))

	a, err := f.m.CreateKVCache(CacheOptions{InputTokens: seq(0, 14)})
	require.NoError(t, err)
	require.NoError(t, a.Resume(f.stream))
	require.NoError(t, a.Resize(14, 14))
	require.NoError(t, a.Commit(seq(0, 14), true)) // 3 full blocks and a pending partial of 2
	require.NoError(t, a.Suspend())

	faulty.FailAsync(codectest.OpEncode, 0, 1, fmt.Errorf("boom"))
	b := f.compute(blockhash.Scope{LoRAID: 1}, seq(100, 16), 2) // A's pages fail on their way down
	require.NoError(t, b.Close())
	require.ErrorIs(t, a.Resume(f.stream), ErrDataLost)
	require.NoError(t, a.Close())

	// Push everything else down and out, so every slot is free or evictable.
	for i := range 4 {
		x := f.compute(blockhash.Scope{LoRAID: 2}, seq(1000*(i+1), 16), 3+i)
		require.NoError(t, x.Close())
	}
	f.m.mu.Lock()
	f.m.settle()
	f.m.mu.Unlock()
	for _, lvl := range []layout.CacheLevel{layout.GPULevel, 1} {
		for _, g := range f.groups(lvl) {
			assert.Equal(t, g.Total, g.Available, "level %d group %d: no slot leaks once every cache is closed", lvl, g.Index)
		}
	}
}
