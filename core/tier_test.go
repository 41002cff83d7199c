package core

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core/blockhash"
	"github.com/kvcm/kvcm/core/codec"
	"github.com/kvcm/kvcm/core/codec/gpucodec"
	"github.com/kvcm/kvcm/core/config"
	"github.com/kvcm/kvcm/core/device"
	"github.com/kvcm/kvcm/core/device/emu"
	"github.com/kvcm/kvcm/core/layout"
	"github.com/kvcm/kvcm/internal/testkit/codectest"
	"github.com/kvcm/kvcm/internal/testkit/devicetest"
)

// tieredConfig: smallConfig's layers (page = 256 bytes) with gpu, host and
// disk quotas in pages; a zero count leaves the tier out.
func tieredConfig(t *testing.T, gpu, host, disk int64) config.Config {
	cfg := smallConfig(gpu)
	if host > 0 {
		cfg.CacheTiers = append(cfg.CacheTiers, config.Host(host*256))
	}
	if disk > 0 {
		cfg.CacheTiers = append(cfg.CacheTiers, config.Disk(disk*256, t.TempDir()))
	}
	return cfg
}

func newTieredFixture(t *testing.T, cfg config.Config, opts ...Option) *fixture {
	t.Helper()
	return newTieredFixtureOn(t, emu.Options{Seed: 7, MaxDelay: 50e3}, cfg, opts...) // emu: up to 50µs per op
}

// newTieredFixtureOn is newTieredFixture with the emulation's options (the
// backend KVCM_DEVICE names ignores them).
func newTieredFixtureOn(t *testing.T, emuOpts emu.Options, cfg config.Config, opts ...Option) *fixture {
	t.Helper()
	dev := devicetest.Open(t, emuOpts)
	m, err := NewManager(cfg, append([]Option{WithDevice(dev)}, opts...)...)
	require.NoError(t, err)
	s, err := dev.NewStream()
	require.NoError(t, err)
	t.Cleanup(func() {
		s.Close()
		require.NoError(t, m.Close())
		dev.Close()
	})
	return &fixture{t: t, m: m, dev: dev, stream: s}
}

// groups returns the pool-group stats of a level.
func (f *fixture) groups(level layout.CacheLevel) []PoolGroupStats {
	f.t.Helper()
	st, err := f.m.StorageStats(level)
	require.NoError(f.t, err)
	return st
}

// pattern is the content of one buffer page: a function of a tag (the
// request), the block, the layer and the role. Even bytes are zero so the
// Half codec is lossless on it.
func pattern(tag, block int, key BufferLocation, layer int32, role config.DataRole, n int64) []byte {
	out := make([]byte, n)
	seed := uint32(tag*7919+block*104729) ^ uint32(layer)*2654435761 ^ uint32(len(role))*40503
	for i := 1; i < len(out); i += 2 {
		seed = seed*1664525 + 1013904223
		out[i] = byte(seed>>24) | 1
	}
	return out
}

// writeAll fills every page of an ACTIVE cache with its pattern.
func (f *fixture) writeAll(c *KVCache, tag int) {
	f.t.Helper()
	f.eachBuffer(c, func(block int, loc BufferLocation, layer int32, role config.DataRole, base int32) {
		f.writePage(loc, base, pattern(tag, block, loc, layer, role, loc.Bytes))
	})
}

// verifyAll checks every page of an ACTIVE cache against its pattern.
func (f *fixture) verifyAll(c *KVCache, tag int) int {
	f.t.Helper()
	pages := 0
	f.eachBuffer(c, func(block int, loc BufferLocation, layer int32, role config.DataRole, base int32) {
		want := pattern(tag, block, loc, layer, role, loc.Bytes)
		require.Equal(f.t, want, f.readPage(loc, base), "block %d layer %d role %s", block, layer, role)
		pages++
	})
	return pages
}

func (f *fixture) eachBuffer(c *KVCache, fn func(block int, loc BufferLocation, layer int32, role config.DataRole, base int32)) {
	for _, lc := range f.m.Layout().LifeCycles {
		idx, err := c.BasePageIndices(lc.ID)
		require.NoError(f.t, err)
		for _, pool := range lc.Pools {
			for _, b := range pool.Buffers {
				loc, err := f.m.Buffer(b.Layer, b.Role)
				require.NoError(f.t, err)
				for block, base := range idx {
					if base != BadPageIndex {
						fn(block, loc, b.Layer, b.Role, base)
					}
				}
			}
		}
	}
}

func (f *fixture) writePage(loc BufferLocation, base int32, data []byte) {
	f.t.Helper()
	host := f.bounceBuf(loc.Bytes)
	copy(host.Host(), data)
	dst := loc.PoolBase.Add(loc.PageIndex(base) * loc.Bytes)
	require.NoError(f.t, f.stream.BatchCopy([]device.CopyDesc{{Dst: dst, Src: host.Ptr(), Size: loc.Bytes}}))
	require.NoError(f.t, f.stream.Synchronize())
}

// compute stands for an engine step over a whole prompt: pages, KV, commit.
func (f *fixture) compute(scope blockhash.Scope, prompt []config.Token, tag int) *KVCache {
	f.t.Helper()
	c := f.open(scope, prompt)
	f.writeAll(c, tag)
	return c
}

func levelOf(t *testing.T, m *Manager, level layout.CacheLevel) PoolGroupStats {
	st, err := m.StorageStats(level)
	require.NoError(t, err)
	var sum PoolGroupStats
	for _, g := range st {
		sum.Total += g.Total
		sum.Free += g.Free
		sum.Evictable += g.Evictable
	}
	return sum
}

func TestColdTierRoundTripsToTheByte(t *testing.T) {
	for name, tiers := range map[string][2]int64{
		"gpu-host":      {8, 0},
		"gpu-disk":      {0, 8},
		"gpu-host-disk": {2, 8},
	} {
		t.Run(name, func(t *testing.T) {
			f := newTieredFixture(t, tieredConfig(t, 4, tiers[0], tiers[1]))
			prompt := seq(0, 13)
			a := f.compute(blockhash.Scope{}, prompt, 1)
			require.NoError(t, a.Close())

			// Another request takes the whole GPU: A's blocks go down.
			b := f.compute(blockhash.Scope{}, seq(1000, 16), 2)
			cold := levelOf(t, f.m, 1).Total - levelOf(t, f.m, 1).Free
			if len(f.m.levels) > 2 {
				cold += levelOf(t, f.m, 2).Total - levelOf(t, f.m, 2).Free
			}
			assert.Equal(t, int64(3), cold, "A's three blocks are cold")
			require.NoError(t, b.Close())

			c, err := f.m.CreateKVCache(CacheOptions{InputTokens: prompt})
			require.NoError(t, err)
			require.Equal(t, 12, c.ReusedTokens(), "cold blocks are still reusable")
			require.NoError(t, c.Resume(f.stream))
			assert.Equal(t, 12, f.verifyAll(c, 1), "3 blocks × 2 layers × 2 roles: decoded to the byte")
			require.NoError(t, c.Close())

			counts := f.m.MigrationStats()
			if tiers[0] > 0 {
				assert.Positive(t, counts[HotToHost].Pages)
				assert.Positive(t, counts[HostToHot].Pages+counts[DiskToHot].Pages)
			} else {
				assert.GreaterOrEqual(t, counts[HotToDisk].Pages, int64(3))
				assert.Equal(t, int64(3), counts[DiskToHot].Pages)
			}
			if tiers[0] > 0 && tiers[1] > 0 {
				assert.Positive(t, counts[HostToDisk].Pages+counts[HotToDisk].Pages, "the small host level overflowed to disk")
			}
		})
	}
}

func TestSuspendedCachePagesMoveDownAndComeBack(t *testing.T) {
	f := newTieredFixture(t, tieredConfig(t, 4, 2, 8))
	a := f.compute(blockhash.Scope{}, seq(0, 16), 1)
	require.NoError(t, a.Suspend())

	b := f.compute(blockhash.Scope{}, seq(500, 16), 2) // needs the whole GPU
	require.NoError(t, b.Suspend())

	require.NoError(t, a.Prefetch(1), "disk→host without pinning")
	assert.Positive(t, f.m.MigrationStats()[DiskToHost].Pages)
	require.NoError(t, a.Resume(f.stream))
	assert.Equal(t, 16, f.verifyAll(a, 1), "4 blocks × 4 buffers")
	require.NoError(t, a.Close())
	require.NoError(t, b.Resume(f.stream))
	assert.Equal(t, 16, f.verifyAll(b, 2))
	require.NoError(t, b.Close())
}

func TestHeldPagesAreNeverDropped(t *testing.T) {
	f := newTieredFixture(t, tieredConfig(t, 4, 4, 0))
	a := f.compute(blockhash.Scope{}, seq(0, 16), 1)
	require.NoError(t, a.Suspend())
	b := f.compute(blockhash.Scope{}, seq(500, 16), 2)
	require.NoError(t, b.Suspend())

	c, err := f.m.CreateKVCache(CacheOptions{InputTokens: seq(900, 16)})
	require.NoError(t, err)
	require.NoError(t, c.Resume(f.stream))
	err = c.Resize(16, 0)
	require.ErrorIs(t, err, ErrOutOfPages, "both levels hold suspended data: nothing may be dropped")
	require.NoError(t, c.Close())
	require.ErrorIs(t, a.Resume(f.stream), ErrOutOfPages, "B's suspended pages cannot make room either")
	require.NoError(t, b.Close())
	require.NoError(t, a.Resume(f.stream), "B's closed blocks are only cached: they may go")
	assert.Equal(t, 16, f.verifyAll(a, 1), "4 blocks × 4 buffers")
	require.NoError(t, a.Close())
}

// Two lifecycles share one hot pool group but encode to different sizes: they
// land in two cold pool groups.
func TestOneHotGroupSplitsIntoTwoColdGroups(t *testing.T) {
	cfg := tieredConfig(t, 8, 16, 0)
	cfg.Layers[1].SlidingWindowSize = 17 // keeps every block of 16 tokens; a floor of 5 slots
	bat := codectest.NewBatching(codectest.BatchingOptions{
		ColdPageBytes: map[layout.LayerGroupID]int64{0: 256, 1: 320},
	})
	f := newTieredFixture(t, cfg, WithColdPageCodec(codec.Own(bat)))
	hot, cold := f.groups(0), f.groups(1)
	require.Len(t, hot, 1)
	require.Len(t, cold, 2, "cold grouping follows the encoded sizes")
	assert.Equal(t, []int64{256, 320}, []int64{cold[0].PageBytes, cold[1].PageBytes})
	f.evictAndRestore()
}

// Two lifecycles with different hot layouts encode to one size: they share a
// cold pool group.
func TestTwoHotGroupsShareOneColdGroup(t *testing.T) {
	cfg := tieredConfig(t, 8, 16, 0)
	cfg.Layers[1].SlidingWindowSize = 17 // keeps every block of 16 tokens; a floor of 5 slots
	cfg.Layers[1].Buffers = []config.BufferConfig{{Role: config.RoleKey, Size: 96}}
	bat := codectest.NewBatching(codectest.BatchingOptions{
		ColdPageBytes: map[layout.LayerGroupID]int64{0: 256, 1: 256},
	})
	f := newTieredFixture(t, cfg, WithColdPageCodec(codec.Own(bat)))
	hot, cold := f.groups(0), f.groups(1)
	assert.Len(t, hot, 2)
	assert.Len(t, cold, 1)
	f.evictAndRestore()
}

// evictAndRestore computes a request, pushes it to the cold level, brings it
// back and checks every byte.
func (f *fixture) evictAndRestore() {
	f.t.Helper()
	a := f.compute(blockhash.Scope{}, seq(0, 16), 1)
	require.NoError(f.t, a.Suspend())
	b := f.compute(blockhash.Scope{}, seq(100, 16), 2)
	require.NoError(f.t, b.Suspend())
	b2 := f.compute(blockhash.Scope{}, seq(200, 16), 3)
	require.NoError(f.t, b2.Close())
	require.NoError(f.t, b.Close())
	require.NoError(f.t, a.Resume(f.stream))
	f.verifyAll(a, 1)
	require.NoError(f.t, a.Close())
	assert.Positive(f.t, f.m.MigrationStats()[HostToHot].Pages)
}

func TestCompressingCodecRoundTripsExactly(t *testing.T) {
	dev := devicetest.Open(t, emu.Options{Seed: 3})
	half := codectest.NewHalf(dev)
	cfg := tieredConfig(t, 4, 2, 8)
	m, err := NewManager(cfg, WithDevice(dev), WithColdPageCodec(codec.Own(half)))
	require.NoError(t, err)
	s, err := dev.NewStream()
	require.NoError(t, err)
	f := &fixture{t: t, m: m, dev: dev, stream: s}
	defer func() {
		s.Close()
		require.NoError(t, m.Close())
		dev.Close()
	}()
	cold, err := m.StorageStats(1)
	require.NoError(t, err)
	assert.Equal(t, int64(128), cold[0].PageBytes, "half the 256-byte hot page")
	a := f.compute(blockhash.Scope{}, seq(0, 16), 1)
	require.NoError(t, a.Suspend())
	for i := range 3 {
		x := f.compute(blockhash.Scope{}, seq(100*(i+1), 16), 2+i)
		require.NoError(t, x.Close())
	}
	require.NoError(t, a.Resume(f.stream))
	assert.Equal(t, 16, f.verifyAll(a, 1), "4 blocks × 4 buffers")
	require.NoError(t, a.Close())
	assert.Positive(t, m.MigrationStats()[HotToDisk].Pages+m.MigrationStats()[HostToDisk].Pages)
}

// The auto codec through every cold path: the staged codec over the gather
// kernel on CUDA (the 64-byte slots are far below the crossover), the
// default codec on emu.
func TestAutoCodecRoundTripsThroughHostAndDisk(t *testing.T) {
	dev := devicetest.Open(t, emu.Options{Seed: 11, MaxDelay: 20e3})
	auto, err := gpucodec.NewAuto(dev)
	require.NoError(t, err)
	m, err := NewManager(tieredConfig(t, 4, 4, 8), WithDevice(dev), WithColdPageCodec(codec.Own(auto)))
	require.NoError(t, err)
	s, err := dev.NewStream()
	require.NoError(t, err)
	f := &fixture{t: t, m: m, dev: dev, stream: s}
	defer func() {
		s.Close()
		require.NoError(t, m.Close())
		dev.Close()
	}()
	want := gpucodec.DMA
	if !devicetest.IsEmu(dev) {
		want = gpucodec.Staged
	}
	got, ok := auto.Choice(0)
	require.True(t, ok)
	assert.Equal(t, want, got)
	a := f.compute(blockhash.Scope{}, seq(0, 16), 1)
	require.NoError(t, a.Suspend())
	for i := range 3 {
		x := f.compute(blockhash.Scope{}, seq(100*(i+1), 16), 2+i)
		require.NoError(t, x.Close())
	}
	require.NoError(t, a.Prefetch(1), "disk→host")
	require.NoError(t, a.Resume(f.stream))
	assert.Equal(t, 16, f.verifyAll(a, 1), "4 blocks × 4 buffers")
	require.NoError(t, a.Close())
	ms := m.MigrationStats()
	assert.Positive(t, ms[DiskToHost].Pages)
	assert.Positive(t, ms[HotToHost].Pages)
	assert.Positive(t, ms[HotToDisk].Pages+ms[HostToDisk].Pages)
	assert.Positive(t, ms[HostToHot].Pages+ms[DiskToHot].Pages)
}

func TestConstructionConsumesTheCodec(t *testing.T) {
	t.Run("success", func(t *testing.T) {
		faulty := codectest.NewFaulty(codec.NewDefault())
		owned := codec.Own(faulty)
		m, err := NewManager(smallConfig(4), WithColdPageCodec(owned))
		require.NoError(t, err)
		assert.True(t, owned.Consumed())
		_, err = NewManager(smallConfig(4), WithColdPageCodec(owned))
		assert.ErrorIs(t, err, codec.ErrConsumed, "a consumed codec cannot be handed over twice")
		assert.Equal(t, 1, faulty.ConfigureCalls(), "a GPU-only manager still configures the codec")
		require.NoError(t, m.Close())
		assert.Equal(t, 1, faulty.Closes(), "the manager destroys its codec")
	})
	t.Run("failure", func(t *testing.T) {
		faulty := codectest.NewFaulty(codec.NewDefault())
		faulty.RejectConfigure(true)
		owned := codec.Own(faulty)
		_, err := NewManager(smallConfig(4), WithColdPageCodec(owned))
		require.ErrorIs(t, err, ErrCodecRejected)
		assert.True(t, owned.Consumed(), "consumed even though construction failed")
		assert.Equal(t, 1, faulty.Closes(), "and destroyed")
	})
	t.Run("invalid config", func(t *testing.T) {
		faulty := codectest.NewFaulty(codec.NewDefault())
		owned := codec.Own(faulty)
		cfg := smallConfig(4)
		cfg.TokensPerBlock = 0
		_, err := NewManager(cfg, WithColdPageCodec(owned))
		require.ErrorIs(t, err, ErrInvalidConfig)
		assert.True(t, owned.Consumed())
		assert.Equal(t, 1, faulty.Closes())
	})
}

func TestBatchingRepresentativesAreValidated(t *testing.T) {
	// Lifecycles 0 (layers 0, 1) and 1 (layers 2, 3, windowed) share a hot
	// group; lifecycle 2 (layer 4) has a layout of its own.
	cfg := smallConfig(8)
	kv := cfg.Layers[0].Buffers
	cfg.Layers = append(cfg.Layers,
		config.AttentionLayerConfig{LayerID: 2, SlidingWindowSize: 32, Buffers: kv},
		config.AttentionLayerConfig{LayerID: 3, SlidingWindowSize: 32, Buffers: kv},
		config.AttentionLayerConfig{LayerID: 4, SlidingWindowSize: 64, Buffers: []config.BufferConfig{{Role: config.RoleKey, Size: 64}}},
	)
	cfg.CacheTiers[0].Quota = 1 << 20
	for name, tc := range map[string]struct {
		mutate func(f *codectest.Faulty)
		msg    string
	}{
		"unknown": {func(f *codectest.Faulty) { f.SetBatchingID(1, 9) }, "not a configured lifecycle"},
		"greater": {func(f *codectest.Faulty) { f.SetBatchingID(0, 1) }, "greater than its member"},
		"not self": {func(f *codectest.Faulty) {
			f.SetBatchingID(0, 0)
			f.SetBatchingID(1, 1)
			f.SetBatchingID(2, 1)
			f.SetBatchingID(1, 0)
		}, ""},
		"other hot group":   {func(f *codectest.Faulty) { f.SetBatchingID(2, 0) }, "hot pool group"},
		"other cold size":   {func(f *codectest.Faulty) { f.SetBatchingID(1, 0); f.SetColdPageBytes(1, 512) }, "cold pages"},
		"other location":    {func(f *codectest.Faulty) { f.SetBatchingID(1, 0); f.SetLocation(1, codec.Device) }, "indices"},
		"zero cold bytes":   {func(f *codectest.Faulty) { f.SetColdPageBytes(2, 0) }, "QueryColdPageBytes"},
		"bad location":      {func(f *codectest.Faulty) { f.SetLocation(0, codec.BadLocation) }, "QueryPageIndexLocation"},
		"negative batching": {func(f *codectest.Faulty) { f.SetBatchingID(2, -1) }, "GetBatchingLayerGroupID"},
	} {
		t.Run(name, func(t *testing.T) {
			faulty := codectest.NewFaulty(codec.NewDefault())
			tc.mutate(faulty)
			_, err := NewManager(cfg, WithColdPageCodec(codec.Own(faulty)))
			require.ErrorIs(t, err, ErrCodecRejected)
			assert.Contains(t, err.Error(), tc.msg)
			assert.Equal(t, 1, faulty.Closes())
		})
	}
	t.Run("valid class", func(t *testing.T) {
		faulty := codectest.NewFaulty(codec.NewDefault())
		faulty.SetBatchingID(1, 0) // same hot group, same size, same location
		m, err := NewManager(cfg, WithColdPageCodec(codec.Own(faulty)))
		require.NoError(t, err)
		require.NoError(t, m.Close())
	})
}

func TestHotColdMigrationsBatchByRepresentative(t *testing.T) {
	cfg := tieredConfig(t, 5, 32, 0)
	// Two lifecycles, one hot group of 10 slots (the window's floor of 5
	// each); the window keeps every block of 16 tokens.
	cfg.Layers[1].SlidingWindowSize = 17
	faulty := codectest.NewFaulty(codec.NewDefault())
	faulty.SetBatchingID(1, 0)
	f := newTieredFixture(t, cfg, WithColdPageCodec(codec.Own(faulty)))
	a := f.compute(blockhash.Scope{}, seq(0, 16), 1) // 4 blocks × 2 lifecycles = 8 of the 10 slots
	require.NoError(t, a.Suspend())
	faulty.ResetCalls()
	b := f.compute(blockhash.Scope{}, seq(100, 16), 2)
	assert.Equal(t, 1, faulty.CallCount(codectest.OpEncode), "both lifecycles' pages in one call")
	assert.Equal(t, []int{6}, faulty.PairsPerCall(codectest.OpEncode), "the 8 b needs less the 2 free slots, of both lifecycles")
	require.NoError(t, b.Close())
	require.NoError(t, a.Resume(f.stream))
	assert.Equal(t, 16, f.verifyAll(a, 1), "4 blocks × 4 buffers")
	require.NoError(t, a.Close())
}

func TestDeviceIndexCodecUsesLazyRingAndChunks(t *testing.T) {
	cfg := smallConfig(0)
	cfg.Layers = cfg.Layers[:1]
	cfg.Layers[0].Buffers = []config.BufferConfig{{Role: config.RoleKey, Size: 16}}
	cfg.CacheTiers = []config.CacheTierConfig{config.GPU(10000 * 16), config.Host(20000 * 16)}
	dev := devicetest.Open(t, emu.Options{Seed: 5})
	// codectest.DeviceIndexed on emu; on CUDA the gather kernel codec, as
	// DeviceIndexed submits copies from a host function.
	di, pairsPerCall, err := devicetest.DeviceIndexCodec(dev)
	require.NoError(t, err)
	m, err := NewManager(cfg, WithDevice(dev), WithColdPageCodec(codec.Own(di)))
	require.NoError(t, err)
	s, err := dev.NewStream()
	require.NoError(t, err)
	f := &fixture{t: t, m: m, dev: dev, stream: s}
	defer func() {
		s.Close()
		require.NoError(t, m.Close())
		dev.Close()
	}()
	assert.False(t, m.indexRing.Allocated(), "nothing allocated before the first device-index call")

	const n = 9000 * tpb
	a := f.compute(blockhash.Scope{}, seq(0, n), 1)
	require.NoError(t, a.Suspend())
	b := f.compute(blockhash.Scope{}, seq(n, n), 2) // pushes 8000 of A's 9000 pages down
	require.NoError(t, b.Close())
	assert.True(t, m.indexRing.Allocated())
	for _, k := range pairsPerCall() {
		assert.LessOrEqual(t, k*codec.PageIndexPairBytes, 64<<10, "a codec call gets at most 64 KiB of indices")
	}
	require.NoError(t, a.Resume(f.stream))
	assert.Equal(t, 9000, f.verifyAll(a, 1), "4 blocks × 4 buffers")
	require.NoError(t, a.Close())
	assert.Greater(t, len(pairsPerCall()), 2, "large batches were split into chunks")
}

func TestAsyncCodecFailureIsFenced(t *testing.T) {
	faulty := codectest.NewFaulty(codec.NewDefault())
	var events []CacheEvent
	f := newTieredFixture(t, tieredConfig(t, 4, 8, 0), WithColdPageCodec(codec.Own(faulty)),
		WithEventListener(func(e CacheEvent) { events = append(events, e) }))
	a := f.compute(blockhash.Scope{}, seq(0, 16), 1)
	require.NoError(t, a.Suspend())
	faulty.FailAsync(codectest.OpEncode, 0, 1, fmt.Errorf("boom"))
	b := f.compute(blockhash.Scope{}, seq(100, 16), 2)
	require.NoError(t, b.Close())

	err := a.Resume(f.stream)
	require.ErrorIs(t, err, ErrDataLost, "the encode failed after submission: A's data is gone")
	assert.Equal(t, Suspended, a.Status())
	require.NoError(t, a.Close())
	assert.Zero(t, f.m.ProbeReuse(blockhash.Scope{}, seq(0, 17)), "lost blocks left the tree")
	assert.Positive(t, f.m.Stats().LostPages)
	removed := 0
	for _, e := range events {
		if e.Kind == BlockRemoved {
			removed++
		}
	}
	assert.Positive(t, removed)

	c := f.compute(blockhash.Scope{}, seq(0, 16), 3)
	assert.Equal(t, 16, f.verifyAll(c, 3), "recycled slots are usable again")
	require.NoError(t, c.Close())
}

func TestSyncCodecFailureLeavesSourceRetryable(t *testing.T) {
	faulty := codectest.NewFaulty(codec.NewDefault())
	f := newTieredFixture(t, tieredConfig(t, 4, 8, 0), WithColdPageCodec(codec.Own(faulty)))
	a := f.compute(blockhash.Scope{}, seq(0, 16), 1)
	require.NoError(t, a.Suspend())
	faulty.FailSync(codectest.OpEncode, 0, 1)
	b, err := f.m.CreateKVCache(CacheOptions{InputTokens: seq(100, 16)})
	require.NoError(t, err)
	require.NoError(t, b.Resume(f.stream))
	require.ErrorIs(t, b.Resize(16, 16), ErrOutOfPages, "the held pages could not move")
	assert.Zero(t, b.Capacity())
	require.NoError(t, b.Resize(16, 16), "retry succeeds")
	require.NoError(t, b.Close())
	require.NoError(t, a.Resume(f.stream))
	assert.Equal(t, 16, f.verifyAll(a, 1), "4 blocks × 4 buffers")
	require.NoError(t, a.Close())
}

func TestColdPoolRatiosProjectThroughSlotCounts(t *testing.T) {
	cfg := tieredConfig(t, 100, 100, 0)
	cfg.Layers[1].SlidingWindowSize = 64
	cfg.Layers[1].Buffers = []config.BufferConfig{{Role: config.RoleKey, Size: 96}, {Role: config.RoleValue, Size: 32}}
	cfg.InitialPoolRatio = []float64{0.5, 0.5}
	// Both lifecycles have 128-byte hot pages; cold pages are 128 and 256 bytes.
	bat := codectest.NewBatching(codectest.BatchingOptions{
		ColdPageBytes: map[layout.LayerGroupID]int64{0: 128, 1: 256},
	})
	f := newTieredFixture(t, cfg, WithColdPageCodec(codec.Own(bat)))
	hot, cold := f.groups(0), f.groups(1)
	require.Len(t, hot, 2)
	require.Len(t, cold, 2)
	assert.Equal(t, hot[0].Total, hot[1].Total, "equal hot byte ratios and equal hot page sizes: equal slots")
	assert.Equal(t, cold[0].Total, cold[1].Total, "slot proportions survive different cold sizes")
}

func TestConstraintFloorsStayOnTheHotLevel(t *testing.T) {
	cfg := tieredConfig(t, 64, 0, 0)
	cfg.Layers[1].SlidingWindowSize = 8
	cfg.Layers[1].Buffers = []config.BufferConfig{{Role: config.RoleKey, Size: 96}, {Role: config.RoleValue, Size: 32}}
	cfg.InitialPoolRatio = []float64{0.999, 0.001}
	cfg.Constraints = []config.BatchDesc{{Requests: []config.RequestDesc{{Capacity: 64}}}}
	cfg.CacheTiers = append(cfg.CacheTiers, config.Host(64*128))
	f := newTieredFixture(t, cfg)
	hot, cold := f.groups(0), f.groups(1)
	require.Len(t, hot, 2)
	require.Len(t, cold, 1, "both lifecycles encode to 128 bytes")
	assert.GreaterOrEqual(t, hot[1].Total, int64(16), "a 64-token prefill needs 16 blocks: the floor beats the 0.1% ratio on the GPU")
	assert.Equal(t, int64(64), cold[0].Total, "cold slots follow the quota alone")
}

// The private copy of a partially reused block is evictable to a colder
// level while its new cache is SUSPENDED, like every page a suspended cache
// holds.
func TestPartialCopyOfASuspendedCacheIsEvictable(t *testing.T) {
	cfg := tieredConfig(t, 4, 8, 0)
	cfg.EnablePartialReuse = true
	f := newTieredFixture(t, cfg)
	require.NoError(t, f.open(blockhash.Scope{}, seq(0, 8)).Close())

	c, err := f.m.CreateKVCache(CacheOptions{InputTokens: append(seq(0, 6), 50, 51, 52)})
	require.NoError(t, err)
	require.Equal(t, 6, c.ReusedTokens(), "block 0 shared, the head of block 1 copied")
	gpu := f.groups(layout.GPULevel)[0]
	assert.Equal(t, gpu.Total-gpu.Free, gpu.Evictable, "the two cached pages and the suspended cache's copy")
	assert.NoError(t, f.m.CheckInvariants())
	require.NoError(t, c.Close())
}

// A shared tier in the configuration changes nothing yet: the manager keeps
// only the local levels, needs no server, and its caches work as without it.
func TestSharedTierAddsNoLocalLevel(t *testing.T) {
	cfg := tieredConfig(t, 4, 8, 0)
	cfg.CacheTiers = append(cfg.CacheTiers, config.Shared(config.SharedCacheTierConfig{
		Addresses: []string{"127.0.0.1:9"}, Namespace: "unused"}))
	f := newTieredFixture(t, cfg)
	assert.Len(t, f.m.levels, 2)
	a := f.compute(blockhash.Scope{}, seq(0, 13), 1)
	require.NoError(t, a.Close())
	c, err := f.m.CreateKVCache(CacheOptions{InputTokens: seq(0, 13)})
	require.NoError(t, err)
	assert.Equal(t, 12, c.ReusedTokens())
	require.NoError(t, c.Close())
}
