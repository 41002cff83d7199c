package core

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core/blockhash"
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
