package core

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core/blockhash"
	"github.com/kvcm/kvcm/core/config"
	"github.com/kvcm/kvcm/core/device"
	"github.com/kvcm/kvcm/core/device/emu"
	"github.com/kvcm/kvcm/core/layout"
)

func TestGPULevelShrinksAndGrowsInPlace(t *testing.T) {
	cfg := tieredConfig(t, 8, 16, 0)
	cfg.CacheTiers[0].MaxQuota = 16 * 256
	f := newTieredFixture(t, cfg)
	base := f.m.PoolGroupDescs()[0].Pools[0].Base

	a := f.compute(blockhash.Scope{}, seq(0, 16), 1)   // slots 0-3, suspended below
	b := f.compute(blockhash.Scope{}, seq(100, 16), 2) // slots 4-7, stays ACTIVE
	require.NoError(t, a.Suspend())

	err := f.m.ResizeLevel(layout.GPULevel, 4*256)
	require.ErrorIs(t, err, ErrInvalidState, "B pins slots 4-7")
	q, err := f.m.Quota(layout.GPULevel)
	require.NoError(t, err)
	assert.Equal(t, int64(8*256), q, "a failed resize changes nothing")

	require.NoError(t, b.Suspend())
	require.NoError(t, a.Resume(f.stream))
	require.NoError(t, a.Suspend())
	require.NoError(t, b.Close())
	require.NoError(t, f.m.ResizeLevel(layout.GPULevel, 4*256), "B's cached pages are evicted, A's stay")
	assert.Equal(t, int64(4), f.hotGroup().Total)
	assert.Equal(t, base, f.m.PoolGroupDescs()[0].Pools[0].Base, "base addresses never move")

	require.NoError(t, f.m.ResizeLevel(layout.GPULevel, 16*256))
	assert.Equal(t, int64(16), f.hotGroup().Total)
	assert.Equal(t, base, f.m.PoolGroupDescs()[0].Pools[0].Base)
	assert.ErrorIs(t, f.m.ResizeLevel(layout.GPULevel, 32*256), ErrInvalidArgument, "beyond max_quota")

	require.NoError(t, a.Resume(f.stream))
	assert.Equal(t, 16, f.verifyAll(a, 1), "resizes kept every byte")
	require.NoError(t, a.Close())
}

func TestShrinkDefragmentsSurvivors(t *testing.T) {
	f := newTieredFixture(t, tieredConfig(t, 8, 0, 0))
	a := f.compute(blockhash.Scope{}, seq(0, 16), 1)
	b := f.compute(blockhash.Scope{}, seq(100, 16), 2)
	require.NoError(t, a.Close()) // A (slots 0-3) is released first: evicted first
	require.NoError(t, b.Suspend())

	require.NoError(t, f.m.ResizeLevel(layout.GPULevel, 4*256))
	assert.Positive(t, f.m.MigrationStats()[HotToHot].Pages, "B moved from slots 4-7 into 0-3")
	require.NoError(t, b.Resume(f.stream))
	idx, err := b.BasePageIndices(0)
	require.NoError(t, err)
	for _, s := range idx {
		assert.Less(t, s, int32(4))
	}
	assert.Equal(t, 16, f.verifyAll(b, 2))
	require.NoError(t, b.Close())
}

func TestColdLevelsResizeKeepingBlobs(t *testing.T) {
	for name, tiers := range map[string][2]int64{"host": {16, 0}, "disk": {0, 16}} {
		t.Run(name, func(t *testing.T) {
			f := newTieredFixture(t, tieredConfig(t, 4, tiers[0], tiers[1]))
			a := f.compute(blockhash.Scope{}, seq(0, 16), 1)
			require.NoError(t, a.Suspend())
			for i := range 3 {
				x := f.compute(blockhash.Scope{}, seq(100*(i+1), 16), 2+i)
				require.NoError(t, x.Close())
			}
			cold := layout.CacheLevel(1)
			require.NoError(t, f.m.ResizeLevel(cold, 6*256), "cached blocks go, A's held blobs stay")
			q, err := f.m.Quota(cold)
			require.NoError(t, err)
			assert.Equal(t, int64(6*256), q)
			err = f.m.ResizeLevel(cold, 2*256)
			require.ErrorIs(t, err, ErrOutOfPages, "A holds 4 cold pages")
			require.NoError(t, f.m.ResizeLevel(cold, 32*256))
			require.NoError(t, a.Resume(f.stream))
			assert.Equal(t, 16, f.verifyAll(a, 1))
			require.NoError(t, a.Close())
		})
	}
}

func (f *fixture) hotGroup() PoolGroupStats {
	st, err := f.m.StorageStats(layout.GPULevel)
	require.NoError(f.t, err)
	return st[0]
}

// A resized cold group can hold exactly its slots, on the host and on disk
// alike: its capacity follows its size.
func TestColdLevelResizeKeepsCapacityEqualToSlots(t *testing.T) {
	f := newTieredFixture(t, tieredConfig(t, 4, 4, 4))
	for _, lvl := range []layout.CacheLevel{1, 2} {
		for _, pages := range []int64{9, 2} {
			require.NoError(t, f.m.ResizeLevel(lvl, pages*256))
			g := f.m.levels[lvl].groups[0]
			assert.Equal(t, g.numSlots, g.capacity, "level %d at %d pages", lvl, pages)
			assert.NoError(t, f.m.CheckInvariants())
		}
	}
}

// A shrink whose final reallocation fails (here over the host memory limit)
// leaves the level usable: every slot that was free is free again.
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

// sentinels are every error kind the package documents.
var sentinels = []error{
	ErrOutOfPages, ErrInvalidState, ErrInvalidArgument, ErrResumeRefused,
	ErrDataLost, ErrCodecRejected, ErrCodecFailed, ErrIO, ErrInvalidConfig, ErrClosed,
}

// wrapsSentinel reports whether err wraps one of the documented kinds.
func wrapsSentinel(err error) bool {
	for _, s := range sentinels {
		if errors.Is(err, s) {
			return true
		}
	}
	return false
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

// A failed ResizeLevel changes nothing: when a later pool group cannot
// grow, the groups grown before it shrink back and Quota still reports the
// old quota.
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

// A grow that the device cannot back fails with an error of one of the
// package's documented kinds (ErrOutOfPages), as every error the package
// returns does.
func TestResizeLevelOutOfMemoryIsADocumentedKind(t *testing.T) {
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
