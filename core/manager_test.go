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
	"github.com/kvcm/kvcm/core/config"
	"github.com/kvcm/kvcm/core/device"
	"github.com/kvcm/kvcm/core/device/emu"
	"github.com/kvcm/kvcm/core/layout"
	"github.com/kvcm/kvcm/internal/testkit/devicetest"
)

const tpb = 4

// smallConfig: two full-attention layers (key+value, 64 bytes a block each),
// quota for exactly `slots` pages.
func smallConfig(slots int64) config.Config {
	layer := func(id int32) config.AttentionLayerConfig {
		return config.AttentionLayerConfig{LayerID: id, Buffers: []config.BufferConfig{
			{Role: config.RoleKey, Size: 64}, {Role: config.RoleValue, Size: 64},
		}}
	}
	return config.Config{
		TokensPerBlock: tpb,
		CacheTiers:     []config.CacheTierConfig{config.GPU(slots * 256)},
		Layers:         []config.AttentionLayerConfig{layer(0), layer(1)},
	}
}

type fixture struct {
	t      *testing.T
	m      *Manager
	dev    device.Device // the emulation, or the backend KVCM_DEVICE names (devicetest)
	stream device.Stream
	// bounce is the pinned buffer writePage and readPage copy through, kept
	// for the test: freeing pinned memory (cuMemHostUnregister) would
	// synchronize every stream of the device, the manager's too.
	bounce device.Memory
}

func newFixture(t *testing.T, cfg config.Config, opts ...Option) *fixture {
	t.Helper()
	dev := devicetest.Open(t, emu.Options{Seed: 1})
	m, err := NewManager(cfg, append([]Option{WithDevice(dev)}, opts...)...)
	require.NoError(t, err)
	s, err := dev.NewStream()
	require.NoError(t, err)
	t.Cleanup(func() {
		s.Close()
		m.Close()
		dev.Close()
	})
	return &fixture{t: t, m: m, dev: dev, stream: s}
}

func seq(start, n int) []config.Token {
	out := make([]config.Token, n)
	for i := range out {
		out[i] = config.Token(start + i)
	}
	return out
}

// serve runs a request: create with reuse, resume, compute the rest of the
// prompt, commit it all, close. It returns the reused token count.
func (f *fixture) serve(scope blockhash.Scope, prompt []config.Token) int {
	f.t.Helper()
	c := f.open(scope, prompt)
	reused := c.ReusedTokens()
	require.NoError(f.t, c.Close())
	return reused
}

// open is serve without the close: the cache stays ACTIVE.
func (f *fixture) open(scope blockhash.Scope, prompt []config.Token) *KVCache {
	f.t.Helper()
	c, err := f.m.CreateKVCache(CacheOptions{Scope: scope, InputTokens: prompt})
	require.NoError(f.t, err)
	require.NoError(f.t, c.Resume(f.stream))
	require.NoError(f.t, c.Resize(len(prompt), len(prompt)))
	require.NoError(f.t, c.Commit(prompt[c.NumCommittedTokens():], false))
	return c
}

func (f *fixture) hotStats() PoolGroupStats {
	st, err := f.m.StorageStats(layout.GPULevel)
	require.NoError(f.t, err)
	require.Len(f.t, st, 1)
	return st[0]
}

func TestCacheStateMachine(t *testing.T) {
	f := newFixture(t, smallConfig(16))
	c, err := f.m.CreateKVCache(CacheOptions{InputTokens: seq(0, 8)})
	require.NoError(t, err)
	assert.Equal(t, Suspended, c.Status())

	assert.ErrorIs(t, c.Suspend(), ErrInvalidState, "suspend needs ACTIVE")
	assert.ErrorIs(t, c.Resize(4, 0), ErrInvalidState, "resize needs ACTIVE")
	assert.ErrorIs(t, c.Commit(seq(0, 1), false), ErrInvalidState, "commit needs ACTIVE")
	_, err = c.BasePageIndices(0)
	assert.ErrorIs(t, err, ErrInvalidState)
	assert.ErrorIs(t, c.Resume(nil), ErrInvalidArgument)

	require.NoError(t, c.Resume(f.stream))
	assert.Equal(t, Active, c.Status())
	assert.ErrorIs(t, c.Resume(f.stream), ErrInvalidState, "already ACTIVE")
	require.NoError(t, c.Suspend())
	require.NoError(t, c.Resume(f.stream))
	require.NoError(t, c.Close())
	assert.Equal(t, Closed, c.Status())
	assert.ErrorIs(t, c.Resume(f.stream), ErrInvalidState, "CLOSED is terminal")
	assert.NoError(t, c.Close(), "closing twice is harmless")
}

func TestCommittedHistoryCapacityInvariant(t *testing.T) {
	f := newFixture(t, smallConfig(16))
	c, err := f.m.CreateKVCache(CacheOptions{InputTokens: seq(0, 10)})
	require.NoError(t, err)
	require.NoError(t, c.Resume(f.stream))

	assert.ErrorIs(t, c.Resize(4, 6), ErrInvalidArgument, "history above capacity")
	require.NoError(t, c.Resize(8, 4))
	assert.ErrorIs(t, c.Resize(8, 3), ErrInvalidArgument, "history never decreases")
	assert.ErrorIs(t, c.Commit(seq(0, 9), false), ErrInvalidArgument, "commit past capacity")
	assert.Equal(t, 0, c.NumCommittedTokens(), "a failed commit commits nothing")
	assert.Equal(t, 4, c.HistoryLength())
	require.NoError(t, c.Commit(seq(0, 4), false))
	assert.Equal(t, 4, c.NumCommittedTokens())
	assert.ErrorIs(t, c.Resize(3, -1), ErrInvalidArgument, "capacity below history")

	idx, err := c.BasePageIndices(0)
	require.NoError(t, err)
	assert.Len(t, idx, 2, "8 tokens span two blocks")
	assert.NotEqual(t, idx[0], idx[1])
	require.NoError(t, c.Close())
}

// Committed tokens are history: a commit past the history length advances
// it (KVCacheManagerV2's commit), without a resize first.
func TestCommitAdvancesHistoryLength(t *testing.T) {
	f := newFixture(t, smallConfig(16))
	c, err := f.m.CreateKVCache(CacheOptions{})
	require.NoError(t, err)
	require.NoError(t, c.Resume(f.stream))
	require.NoError(t, c.Resize(8, -1))
	assert.Zero(t, c.HistoryLength())
	require.NoError(t, c.Commit(seq(0, 6), false))
	assert.Equal(t, 6, c.HistoryLength())
	assert.Equal(t, 8, c.Capacity())
	require.NoError(t, c.Resize(8, 7))
	require.NoError(t, c.Commit(seq(6, 1), false))
	assert.Equal(t, 7, c.HistoryLength(), "a commit within the history leaves it")
	require.NoError(t, c.Close())
	assert.Equal(t, 4, f.m.ProbeReuse(blockhash.Scope{}, seq(0, 8)), "the full block was published")
}

// A commit that advances the history releases the pages a sliding window
// no longer needs, after publishing them: they stay reusable.
func TestCommitAdvancingHistoryReleasesOutOfWindowPagesAfterPublishing(t *testing.T) {
	cfg := smallConfig(64)
	cfg.Layers[1].SlidingWindowSize = 4
	f := newFixture(t, cfg)
	swa, err := f.m.LayerGroupOf(1)
	require.NoError(t, err)
	c, err := f.m.CreateKVCache(CacheOptions{})
	require.NoError(t, err)
	require.NoError(t, c.Resume(f.stream))
	require.NoError(t, c.Resize(16, -1))
	require.NoError(t, c.Commit(seq(0, 16), false))
	idx, err := c.BasePageIndices(swa)
	require.NoError(t, err)
	assert.Equal(t, []int32{BadPageIndex, BadPageIndex, BadPageIndex}, idx[:3], "out of the window")
	assert.NotEqual(t, BadPageIndex, idx[3])
	require.NoError(t, c.Close())
	assert.Equal(t, 16, f.m.ProbeReuse(blockhash.Scope{}, seq(0, 16)))
}

// The priority callback is asked once per layer group of every block, as
// its pages are allocated (each layer group's page keeps its own priority).
func TestPriorityCallbackIsAskedPerLayerGroup(t *testing.T) {
	cfg := smallConfig(64)
	cfg.Layers[1].SlidingWindowSize = 8
	f := newFixture(t, cfg)
	type call struct {
		block int
		lc    layout.LayerGroupID
	}
	var calls []call
	c, err := f.m.CreateKVCache(CacheOptions{Priority: func(b int, lc layout.LayerGroupID) int {
		calls = append(calls, call{b, lc})
		return 10 + int(lc)
	}})
	require.NoError(t, err)
	require.NoError(t, c.Resume(f.stream))
	require.NoError(t, c.Resize(8, -1))
	require.NoError(t, c.Commit(seq(0, 8), false))
	assert.Equal(t, []call{{0, 0}, {0, 1}, {1, 0}, {1, 1}}, calls)
	require.NoError(t, c.Close())
}

func TestPrefixReuseSharesPages(t *testing.T) {
	f := newFixture(t, smallConfig(32))
	prompt := seq(100, 13) // three full blocks and one token
	a := f.open(blockhash.Scope{}, prompt)
	aIdx, err := a.BasePageIndices(0)
	require.NoError(t, err)

	assert.Equal(t, 12, f.m.ProbeReuse(blockhash.Scope{}, prompt), "all full blocks, less the last token")
	b, err := f.m.CreateKVCache(CacheOptions{InputTokens: prompt})
	require.NoError(t, err)
	assert.Equal(t, 12, b.ReusedTokens())
	assert.Equal(t, 12, b.NumCommittedTokens())
	require.NoError(t, b.Resume(f.stream))
	bIdx, err := b.BasePageIndices(0)
	require.NoError(t, err)
	assert.Equal(t, aIdx[:3], bIdx, "reused blocks are the same pages")

	other := blockhash.Scope{LoRAID: 7}
	assert.Zero(t, f.m.ProbeReuse(other, prompt), "scopes never share")
	assert.Zero(t, f.m.ProbeReuse(blockhash.Scope{}, prompt[:1]), "a single token is never reused")
	assert.Equal(t, 4, f.m.ProbeReuse(blockhash.Scope{}, append(seq(100, 4), 9, 9, 9, 9, 9)))

	require.NoError(t, a.Close())
	require.NoError(t, b.Close())
	st := f.m.Stats()
	assert.Equal(t, int64(3), st.ReusedBlocks)
}

// With the XXH3 block key, blocks are keyed by blockhash's XXH3 chain (as
// cache events report) and prefixes are reused exactly as with SHA-256.
func TestXXH3BlockKeyReusesPrefixesAndReportsItsKeys(t *testing.T) {
	cfg := smallConfig(32)
	cfg.BlockKey = blockhash.XXH3
	dev := devicetest.Open(t, emu.Options{Seed: 1})
	var stored []blockhash.Key
	m, err := NewManager(cfg, WithDevice(dev), WithEventListener(func(e CacheEvent) {
		if e.Kind == BlockStored {
			stored = append(stored, e.Key)
		}
	}))
	require.NoError(t, err)
	s, err := dev.NewStream()
	require.NoError(t, err)
	t.Cleanup(func() {
		s.Close()
		m.Close()
		dev.Close()
	})
	f := &fixture{t: t, m: m, dev: dev, stream: s}
	prompt := seq(100, 13)
	assert.Zero(t, f.serve(blockhash.Scope{}, prompt))
	assert.Equal(t, 12, f.serve(blockhash.Scope{}, prompt), "all full blocks, less the last token")
	assert.Equal(t, 4, m.ProbeReuse(blockhash.Scope{}, append(seq(100, 4), 9, 9, 9, 9, 9)))

	h, err := blockhash.NewHasherFor(blockhash.XXH3)
	require.NoError(t, err)
	var want []blockhash.Key
	for k, b := (blockhash.Scope{}).Root(), 0; b < 3; b++ {
		k = h.Next(k, prompt[b*tpb:(b+1)*tpb])
		want = append(want, k)
	}
	assert.Equal(t, want, stored)
	assert.NotEqual(t, blockhash.Chain(blockhash.Scope{}, tpb, prompt), stored, "not the SHA-256 keys")
}

// A prompt that is cached whole is reused whole, as KVCacheManagerV2 does:
// leaving the last token to compute is the engine's choice, not the manager's.
func TestFullyCachedPromptIsReusedWhole(t *testing.T) {
	f := newFixture(t, smallConfig(32))
	f.serve(blockhash.Scope{}, seq(0, 8))
	assert.Equal(t, 8, f.m.ProbeReuse(blockhash.Scope{}, seq(0, 8)))
	assert.Equal(t, 8, f.m.ProbeReuse(blockhash.Scope{}, seq(0, 9)))
	assert.Equal(t, 4, f.m.ProbeReuse(blockhash.Scope{}, seq(0, 7)), "only full blocks without partial reuse")
	c, err := f.m.CreateKVCache(CacheOptions{InputTokens: seq(0, 8)})
	require.NoError(t, err)
	defer c.Close()
	assert.Equal(t, 8, c.ReusedTokens())
	assert.Equal(t, 8, c.NumCommittedTokens())
	assert.Equal(t, 8, c.HistoryLength())
	assert.Equal(t, 8, c.Capacity())
}

// With partial reuse, a fully cached prompt is still reused whole, and a
// prompt ending inside a cached block reuses that block's matching head.
func TestPartialReuseMatchesUpToTheLastPromptToken(t *testing.T) {
	cfg := smallConfig(32)
	cfg.EnablePartialReuse = true
	f := newFixture(t, cfg)
	f.serve(blockhash.Scope{}, seq(0, 8))
	assert.Equal(t, 8, f.m.ProbeReuse(blockhash.Scope{}, seq(0, 8)))
	assert.Equal(t, 7, f.m.ProbeReuse(blockhash.Scope{}, seq(0, 7)))
	assert.Equal(t, 6, f.m.ProbeReuse(blockhash.Scope{}, append(seq(0, 6), 99)))
}

// ReuseMatchBackoff trims that many tokens off the tail of every match; a
// trimmed match that ends inside a block keeps only the full blocks before
// it, unless partial reuse copies the block's head.
func TestReuseMatchBackoffTrimsTheMatch(t *testing.T) {
	for _, tc := range []struct {
		name    string
		partial bool
		back    int
		want    map[int]int // prompt length -> reused tokens
	}{
		{"no backoff", false, 0, map[int]int{8: 8, 12: 8, 7: 4}},
		{"one token, full blocks", false, 1, map[int]int{8: 4, 12: 4, 7: 0, 4: 0}},
		{"one token, partial", true, 1, map[int]int{8: 7, 12: 7, 7: 6, 4: 3, 1: 0}},
		{"a block, partial", true, 4, map[int]int{8: 4, 6: 2}},
		{"more than the match", true, 9, map[int]int{8: 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := smallConfig(32)
			cfg.EnablePartialReuse = tc.partial
			cfg.ReuseMatchBackoff = tc.back
			f := newFixture(t, cfg)
			f.serve(blockhash.Scope{}, seq(0, 8))
			for n, want := range tc.want {
				prompt := append(seq(0, min(n, 8)), seq(900, max(n-8, 0))...)
				assert.Equal(t, want, f.m.ProbeReuse(blockhash.Scope{}, prompt), "prompt of %d tokens", n)
				c, err := f.m.CreateKVCache(CacheOptions{InputTokens: prompt})
				require.NoError(t, err)
				assert.Equal(t, want, c.ReusedTokens(), "create with a prompt of %d tokens", n)
				require.NoError(t, c.Close())
			}
		})
	}
}

func TestEvictionDropsLeastRecentlyReleasedTailFirst(t *testing.T) {
	f := newFixture(t, smallConfig(6))
	f.serve(blockhash.Scope{}, seq(0, 12))   // blocks A1 A2 A3
	f.serve(blockhash.Scope{}, seq(100, 12)) // blocks B1 B2 B3: pool now full
	assert.Equal(t, int64(6), f.hotStats().Evictable)

	// Two new pages: A's tail goes first (A3, then A2), A1 and B stay.
	c, err := f.m.CreateKVCache(CacheOptions{InputTokens: seq(500, 8)})
	require.NoError(t, err)
	require.NoError(t, c.Resume(f.stream))
	require.NoError(t, c.Resize(8, 8))
	assert.Equal(t, 4, f.m.ProbeReuse(blockhash.Scope{}, seq(0, 13)), "A1 survives")
	assert.Equal(t, 12, f.m.ProbeReuse(blockhash.Scope{}, seq(100, 13)), "B is intact")
	assert.Equal(t, int64(2), f.m.Stats().Evictions)
	require.NoError(t, c.Close())
}

func TestEvictionHonoursPriorities(t *testing.T) {
	f := newFixture(t, smallConfig(4))
	keep := func(int, layout.LayerGroupID) int { return MaxPriority }
	c, err := f.m.CreateKVCache(CacheOptions{InputTokens: seq(0, 8), Priority: keep})
	require.NoError(t, err)
	require.NoError(t, c.Resume(f.stream))
	require.NoError(t, c.Resize(8, 8))
	require.NoError(t, c.Commit(seq(0, 8), false))
	require.NoError(t, c.Close())
	f.serve(blockhash.Scope{}, seq(100, 8)) // released later, but default priority

	d := f.open(blockhash.Scope{}, seq(500, 8))
	assert.Equal(t, 8, f.m.ProbeReuse(blockhash.Scope{}, seq(0, 9)), "high priority blocks stay")
	assert.Zero(t, f.m.ProbeReuse(blockhash.Scope{}, seq(100, 9)), "default priority went first")
	require.NoError(t, d.Close())
}

func TestOutOfPagesChangesNothing(t *testing.T) {
	f := newFixture(t, smallConfig(4))
	a := f.open(blockhash.Scope{}, seq(0, 12)) // 3 pinned pages
	f.serve(blockhash.Scope{}, seq(100, 4))    // 1 evictable page
	before := f.hotStats()

	b, err := f.m.CreateKVCache(CacheOptions{InputTokens: seq(200, 8)})
	require.NoError(t, err)
	require.NoError(t, b.Resume(f.stream))
	err = b.Resize(8, 0)
	require.ErrorIs(t, err, ErrOutOfPages)
	assert.Contains(t, err.Error(), "needs 2 slots")
	assert.Equal(t, before, f.hotStats(), "nothing evicted by a failed call")
	assert.Zero(t, b.Capacity())
	assert.Equal(t, 4, f.m.ProbeReuse(blockhash.Scope{}, seq(100, 5)), "the cached block survived")

	require.NoError(t, b.Resize(4, 0), "one page fits after evicting")
	require.NoError(t, a.Close())
	require.NoError(t, b.Close())
}

func TestSlidingWindowReleasesOutOfWindowBlocks(t *testing.T) {
	cfg := smallConfig(64)
	cfg.Layers[1].SlidingWindowSize = 8
	cfg.Layers[1].NumSinkTokens = 2
	f := newFixture(t, cfg)
	require.Equal(t, 2, f.m.NumLayerGroups())
	swa, err := f.m.LayerGroupOf(1)
	require.NoError(t, err)

	c, err := f.m.CreateKVCache(CacheOptions{InputTokens: seq(0, 24)})
	require.NoError(t, err)
	require.NoError(t, c.Resume(f.stream))
	require.NoError(t, c.Resize(24, 20))
	idx, err := c.BasePageIndices(swa)
	require.NoError(t, err)
	// History 20, window 8: tokens from 12 on are needed, so blocks 3..5,
	// plus block 0 for the sink tokens.
	assert.NotEqual(t, BadPageIndex, idx[0], "sink block kept")
	assert.Equal(t, []int32{BadPageIndex, BadPageIndex}, idx[1:3])
	for _, i := range idx[3:] {
		assert.NotEqual(t, BadPageIndex, i)
	}
	full, err := c.BasePageIndices(0)
	require.NoError(t, err)
	assert.NotContains(t, full, BadPageIndex, "full attention keeps everything")
	assert.Equal(t, int64(6), f.m.Stats().AllocNewBlocks, "blocks, not pages of each layer group")
	require.NoError(t, c.Close())
}

func TestPartialReuseCopiesMatchedHead(t *testing.T) {
	cfg := smallConfig(16)
	cfg.EnablePartialReuse = true
	f := newFixture(t, cfg)
	src := f.open(blockhash.Scope{}, seq(0, 8))
	srcIdx, err := src.BasePageIndices(0)
	require.NoError(t, err)
	loc, err := f.m.Buffer(0, config.RoleKey)
	require.NoError(t, err)
	pattern := f.fillPage(loc, srcIdx[1], 7)
	require.NoError(t, src.Close())

	// Shares block 0 and the first two tokens of block 1.
	prompt := append(seq(0, 6), 50, 51, 52)
	c, err := f.m.CreateKVCache(CacheOptions{InputTokens: prompt})
	require.NoError(t, err)
	assert.Equal(t, 6, c.ReusedTokens())
	require.NoError(t, c.Resume(f.stream))
	idx, err := c.BasePageIndices(0)
	require.NoError(t, err)
	require.Len(t, idx, 2)
	assert.Equal(t, srcIdx[0], idx[0], "full block shared")
	assert.NotEqual(t, srcIdx[1], idx[1], "partial block copied into a private page")
	assert.Equal(t, pattern, f.readPage(loc, idx[1]), "copied to the byte")
	require.NoError(t, c.Close())
}

// fillPage writes a pattern into one buffer page through the device.
func (f *fixture) fillPage(loc BufferLocation, base int32, seed byte) []byte {
	f.t.Helper()
	host, err := f.dev.Alloc(device.HostMapped, loc.Bytes)
	require.NoError(f.t, err)
	defer host.Free()
	for i := range host.Host() {
		host.Host()[i] = seed + byte(i*31)
	}
	dst := loc.PoolBase.Add(loc.PageIndex(base) * loc.Bytes)
	require.NoError(f.t, f.stream.BatchCopy([]device.CopyDesc{{Dst: dst, Src: host.Ptr(), Size: loc.Bytes}}))
	require.NoError(f.t, f.stream.Synchronize())
	return append([]byte(nil), host.Host()...)
}

func (f *fixture) readPage(loc BufferLocation, base int32) []byte {
	f.t.Helper()
	host := f.bounceBuf(loc.Bytes)
	src := loc.PoolBase.Add(loc.PageIndex(base) * loc.Bytes)
	require.NoError(f.t, f.stream.BatchCopy([]device.CopyDesc{{Dst: host.Ptr(), Src: src, Size: loc.Bytes}}))
	require.NoError(f.t, f.stream.Synchronize())
	return append([]byte(nil), host.Host()[:loc.Bytes]...)
}

// bounceBuf returns the fixture's pinned bounce buffer, at least n bytes
// long; it is allocated once per size class and freed when the test ends.
func (f *fixture) bounceBuf(n int64) device.Memory {
	f.t.Helper()
	if f.bounce != nil && f.bounce.Size() >= n {
		return f.bounce
	}
	if f.bounce != nil {
		require.NoError(f.t, f.stream.Synchronize())
		require.NoError(f.t, f.bounce.Free())
	}
	host, err := f.dev.Alloc(device.HostMapped, max(n, 64<<10))
	require.NoError(f.t, err)
	f.bounce = host
	f.t.Cleanup(func() {
		if f.bounce == host {
			f.bounce = nil
			host.Free()
		}
	})
	return host
}

func TestResumeRefusedAboveMaxUtil(t *testing.T) {
	cfg := smallConfig(4)
	cfg.MaxUtilForResume = 0.5
	f := newFixture(t, cfg)
	a := f.open(blockhash.Scope{}, seq(0, 12)) // 3 of 4 pages pinned
	b, err := f.m.CreateKVCache(CacheOptions{InputTokens: seq(100, 4)})
	require.NoError(t, err)
	assert.ErrorIs(t, b.Resume(f.stream), ErrResumeRefused)
	assert.Equal(t, Suspended, b.Status())
	require.NoError(t, a.Close())
	require.NoError(t, b.Resume(f.stream), "cached pages of a closed cache are evictable, not busy")
	require.NoError(t, b.Close())
}

func TestConstraintFloorsOnHotLevel(t *testing.T) {
	cfg := smallConfig(0)
	cfg.Layers[1].SlidingWindowSize = 8
	cfg.CacheTiers[0].Quota = 100 * 128
	cfg.InitialPoolRatio = []float64{0.99, 0.01}
	cfg.Constraints = []config.BatchDesc{{Requests: []config.RequestDesc{{Capacity: 64, HistoryLength: 0}}}}
	f := newFixture(t, cfg)
	st, err := f.m.StorageStats(layout.GPULevel)
	require.NoError(t, err)
	require.Len(t, st, 1, "both lifecycles have the same slot layout: one group")

	cfg.Layers[1].Buffers = []config.BufferConfig{{Role: config.RoleKey, Size: 32}}
	f = newFixture(t, cfg)
	st, err = f.m.StorageStats(layout.GPULevel)
	require.NoError(t, err)
	require.Len(t, st, 2)
	assert.GreaterOrEqual(t, st[1].Total, int64(16), "the floor (64 tokens = 16 blocks) beats the 1%% ratio")

	// A constraint beyond the quota raises the quota to the floors, as in
	// KVCacheManagerV2: 4096 tokens are 1024 blocks a layer group, with room
	// for the resume gate (0.97).
	cfg.Constraints[0].Requests[0].Capacity = 4096
	f = newFixture(t, cfg)
	st, err = f.m.StorageStats(layout.GPULevel)
	require.NoError(t, err)
	floor := int64(math.Ceil(1024 / config.DefaultMaxUtilForResume))
	assert.Equal(t, []int64{floor, floor}, []int64{st[0].Total, st[1].Total}, "both groups at their floors")
	q, err := f.m.Quota(layout.GPULevel)
	require.NoError(t, err)
	assert.Equal(t, floor*128+floor*32, q, "the level's quota is what its pools take")
}

// The hot level gets at least a window's worth of slots per layer group
// (KVCacheManagerV2's structural floor: sinks + (window + tpb - 2) / tpb + 1
// for a sliding window, the largest of those for full attention), raising a
// quota below that.
func TestStructuralFloorsRaiseTheQuota(t *testing.T) {
	cfg := smallConfig(1) // two 128-byte layer groups, a quota of 2 slots
	cfg.Layers[1].SlidingWindowSize = 2 * tpb
	f := newFixture(t, cfg)
	st, err := f.m.StorageStats(layout.GPULevel)
	require.NoError(t, err)
	require.Len(t, st, 1)
	floor := int64((2*tpb+tpb-2)/tpb + 1)
	assert.Equal(t, 2*floor, st[0].Total, "a window's floor for each layer group")
	q, err := f.m.Quota(layout.GPULevel)
	require.NoError(t, err)
	assert.Equal(t, 2*floor*128, q)
}

// With config.KVCM2PoolGranularity the GPU pools are whole granules of
// KVCacheManagerV2's size (2 MiB for these quotas) and a group gets every
// slot they hold; the level's quota, at construction and on resize, is rounded
// up to the granule.
func TestKVCM2PoolGranularityRoundsTheGPUPools(t *testing.T) {
	const gran = 2 << 20
	cfg := smallConfig(8) // one pool of 256-byte slots
	cfg.CacheTiers[0].PoolGranularity = config.KVCM2PoolGranularity
	cfg.CacheTiers[0].MaxQuota = 4 * gran
	f := newFixture(t, cfg)
	st, err := f.m.StorageStats(layout.GPULevel)
	require.NoError(t, err)
	require.Len(t, st, 1)
	assert.Equal(t, int64(gran/256), st[0].Total, "8 slots' quota rounds up to one granule")
	q, err := f.m.Quota(layout.GPULevel)
	require.NoError(t, err)
	assert.Equal(t, int64(gran), q)
	require.NoError(t, f.m.ResizeLevel(layout.GPULevel, 2*gran+1))
	st, err = f.m.StorageStats(layout.GPULevel)
	require.NoError(t, err)
	assert.Equal(t, int64(3*gran/256), st[0].Total)
	q, err = f.m.Quota(layout.GPULevel)
	require.NoError(t, err)
	assert.Equal(t, int64(3*gran), q)
}

func TestBadConfigurationsNameTheField(t *testing.T) {
	for name, tc := range map[string]struct {
		mutate func(*config.Config)
		field  string
	}{
		"zero block":        {func(c *config.Config) { c.TokensPerBlock = 0 }, "tokens_per_block"},
		"no tiers":          {func(c *config.Config) { c.CacheTiers = nil }, "cache_tiers"},
		"host first":        {func(c *config.Config) { c.CacheTiers[0].Kind = config.HostTier }, "cache_tiers[0].kind"},
		"zero quota":        {func(c *config.Config) { c.CacheTiers[0].Quota = 0 }, "cache_tiers[0].quota"},
		"no layers":         {func(c *config.Config) { c.Layers = nil }, "layers"},
		"duplicate layer":   {func(c *config.Config) { c.Layers[1].LayerID = 0 }, "layers[1].layer_id"},
		"bad buffer":        {func(c *config.Config) { c.Layers[1].Buffers[1].Size = -1 }, "layers[1].buffers[1].size"},
		"duplicate role":    {func(c *config.Config) { c.Layers[0].Buffers[1].Role = config.RoleKey }, "layers[0].buffers[1].role"},
		"sinks without swa": {func(c *config.Config) { c.Layers[0].NumSinkTokens = 4 }, "layers[0].num_sink_tokens"},
		"util":              {func(c *config.Config) { c.MaxUtilForResume = 1.5 }, "max_util_for_resume"},
		"ratio length":      {func(c *config.Config) { c.InitialPoolRatio = []float64{1, 1} }, "initial_pool_ratio"},
		"ratio value":       {func(c *config.Config) { c.InitialPoolRatio = []float64{0} }, "initial_pool_ratio[0]"},
		"block key":         {func(c *config.Config) { c.BlockKey = 2 }, "block_key"},
		"typical step": {func(c *config.Config) {
			c.TypicalStep = &config.BatchDesc{Requests: []config.RequestDesc{{Capacity: 4, HistoryLength: 5}}}
		}, "typical_step.kv_caches[0].history_length"},
		"host granularity": {func(c *config.Config) {
			c.CacheTiers = append(c.CacheTiers, config.CacheTierConfig{Kind: config.HostTier, Quota: 1 << 20, PoolGranularity: 4096})
		}, "cache_tiers[1].pool_granularity"},
		"bad granularity": {func(c *config.Config) { c.CacheTiers[0].PoolGranularity = -2 }, "cache_tiers[0].pool_granularity"},
		"disk without path": {func(c *config.Config) {
			c.CacheTiers = append(c.CacheTiers, config.Disk(1<<20, ""))
		}, "cache_tiers[1].path"},
	} {
		t.Run(name, func(t *testing.T) {
			cfg := smallConfig(8)
			tc.mutate(&cfg)
			_, err := NewManager(cfg)
			require.ErrorIs(t, err, ErrInvalidConfig)
			var ce *config.Error
			require.ErrorAs(t, err, &ce)
			assert.Equal(t, tc.field, ce.Field)
		})
	}
}

// Quotas and byte counts are multiplied with checked arithmetic: a quota too
// large for the slots a pool group can index (up to 2^63-1) is a
// configuration error naming its field, never a wrapped size or an
// allocation of the wrapped count.
func TestHugeQuotasNameTheField(t *testing.T) {
	for name, tc := range map[string]struct {
		mutate func(*config.Config)
		field  string
	}{
		"gpu quota":     {func(c *config.Config) { c.CacheTiers[0].Quota = math.MaxInt64 }, "cache_tiers[0].quota"},
		"gpu max_quota": {func(c *config.Config) { c.CacheTiers[0].MaxQuota = math.MaxInt64 }, "cache_tiers[0].max_quota"},
		"host quota": {func(c *config.Config) {
			c.CacheTiers = append(c.CacheTiers, config.Host(math.MaxInt64))
		}, "cache_tiers[1].quota"},
		"disk quota": {func(c *config.Config) {
			c.CacheTiers = append(c.CacheTiers, config.Disk(math.MaxInt64, t.TempDir()))
		}, "cache_tiers[1].quota"},
		"more slots than int32": {func(c *config.Config) { c.CacheTiers[0].Quota = 256 << 31 }, "cache_tiers[0].quota"},
	} {
		t.Run(name, func(t *testing.T) {
			cfg := smallConfig(8)
			tc.mutate(&cfg)
			_, err := NewManager(cfg, WithDevice(emu.New(emu.Options{Seed: 1})))
			require.ErrorIs(t, err, ErrInvalidConfig)
			var ce *config.Error
			require.ErrorAs(t, err, &ce)
			assert.Equal(t, tc.field, ce.Field, "error: %v", err)
			assert.Contains(t, err.Error(), "more than the 2147483647 a pool group can index")
		})
	}
}

// ResizeLevel multiplies with checked arithmetic too: a huge quota fails
// naming the argument, and changes nothing.
func TestResizeLevelHugeQuotaNamesTheArgument(t *testing.T) {
	f := newTieredFixture(t, tieredConfig(t, 8, 16, 0))
	for _, level := range []layout.CacheLevel{layout.GPULevel, 1} {
		before, err := f.m.Quota(level)
		require.NoError(t, err)
		err = f.m.ResizeLevel(level, math.MaxInt64)
		require.ErrorIs(t, err, ErrInvalidArgument)
		assert.Contains(t, err.Error(), "quota: ")
		assert.Contains(t, err.Error(), "more than the 2147483647 a pool group can index")
		after, err := f.m.Quota(level)
		require.NoError(t, err)
		assert.Equal(t, before, after, "a failed resize changes nothing")
	}
}

func TestIterationPeakAndStorageStats(t *testing.T) {
	f := newFixture(t, smallConfig(8))
	a := f.open(blockhash.Scope{}, seq(0, 12))
	require.NoError(t, a.Close())
	peaks, err := f.m.GetAndResetIterationPeakBlockStats(layout.GPULevel)
	require.NoError(t, err)
	require.Len(t, peaks, 1)
	assert.Equal(t, int64(3), peaks[0].PeakUsed)
	st := f.hotStats()
	assert.Equal(t, PoolGroupStats{
		Level: 0, Tier: config.GPUTier, Index: 0, LifeCycles: []layout.LayerGroupID{0},
		PageBytes: 256, Total: 8, Free: 5, Evictable: 3, Available: 8,
	}, st)
	_, err = f.m.StorageStats(3)
	assert.ErrorIs(t, err, ErrInvalidArgument)

	iter := f.m.GetAndResetIterationStats()
	assert.Equal(t, int64(3), iter.AllocNewBlocks)
	assert.Zero(t, f.m.GetAndResetIterationStats().AllocNewBlocks, "reset")
}

func TestSlidingWindowReuseNeedsOnlyWindowAndSinkPages(t *testing.T) {
	cfg := smallConfig(9) // 18 slots of 128 bytes shared by both lifecycles
	cfg.Layers[1].SlidingWindowSize = 8
	f := newFixture(t, cfg)
	prompt := seq(0, 33)
	c, err := f.m.CreateKVCache(CacheOptions{InputTokens: prompt})
	require.NoError(t, err)
	require.NoError(t, c.Resume(f.stream))
	for pos := 0; pos < 32; pos += 4 { // chunked prefill: the window slides
		require.NoError(t, c.Resize(pos+4, pos+4))
		require.NoError(t, c.Commit(prompt[pos:pos+4], false))
	}
	require.NoError(t, c.Close())
	assert.Equal(t, 12, f.m.ProbeReuse(blockhash.Scope{}, prompt[:13]), "released window pages stay cached")

	// Two more pages are needed than are free: the oldest go, and those are
	// the windowed pages the prefill released first (blocks 0 and 1).
	f.serve(blockhash.Scope{LoRAID: 1}, seq(0, 8))
	assert.Equal(t, 32, f.m.ProbeReuse(blockhash.Scope{}, prompt),
		"reusing 32 tokens needs windowed pages of the last 8 tokens only")
	assert.Equal(t, 0, f.m.ProbeReuse(blockhash.Scope{}, prompt[:13]),
		"reusing 12 tokens needs the windowed page of block 1, evicted")
}

// initial_pool_ratio divides a level's bytes between its pool groups: equal
// ratios give equal bytes, whatever the groups' page sizes.
func TestInitialPoolRatioIsARatioOfBytes(t *testing.T) {
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

// A scope's root lives only while a cache or a block uses it: caches that
// commit nothing leave no root behind, so per-request scopes (salts) do not
// grow the manager.
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

// A page that fills a gap is reported: when a block has lost its windowed
// page (BlockUpdated at DroppedLevel) and another cache commits the same
// block, its page takes the gap and a listener learns that the layer group's
// page is back.
func TestPageFillingADroppedGapIsReported(t *testing.T) {
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
		if c := m.child(r, keys[0]); c != nil {
			n = c
		}
	}
	require.NotNil(t, n)
	filled := m.pagesOf(n)[1] != nil
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

// Buffer and PoolGroupDescs after Close return without panicking.
func TestQueriesAfterCloseDoNotPanic(t *testing.T) {
	dev := emu.New(emu.Options{Seed: 1})
	defer dev.Close()
	m, err := NewManager(smallConfig(4), WithDevice(dev))
	require.NoError(t, err)
	require.NoError(t, m.Close())
	assert.NotPanics(t, func() { _, _ = m.Buffer(0, config.RoleKey) })
	assert.NotPanics(t, func() { _ = m.PoolGroupDescs() })
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

// Resize to a capacity whose block count overflows (math.MaxInt) is an
// error, not a panic, and changes nothing: the cache keeps its capacity and
// its pages.
func TestResizeToAnOverflowingCapacityChangesNothing(t *testing.T) {
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

// Resize checks that the level can hold the new capacity before it counts
// the pages block by block: Resize(MaxCapacity) fails with ErrOutOfPages at
// once (the manager's lock is not held for long), and a capacity beyond
// MaxCapacity is ErrInvalidArgument.
func TestResizeBeyondTheLevelFailsPromptly(t *testing.T) {
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

// A priority callback that panics during Commit (for a block whose page was
// not allocated by Resize: a partial-reuse copy) leaves the cache as it was:
// no token is committed, and a retried Commit publishes the block.
func TestPanickingPriorityCallbackCommitsNothing(t *testing.T) {
	cfg := smallConfig(16)
	cfg.EnablePartialReuse = true
	f := newFixture(t, cfg)
	f.serve(blockhash.Scope{}, seq(0, 6)) // publishes the partial block of 6 tokens at close
	fail := true
	c, err := f.m.CreateKVCache(CacheOptions{InputTokens: seq(0, 7), Priority: func(int, layout.LayerGroupID) int {
		if fail {
			panic("priority callback bug")
		}
		return 50
	}})
	require.NoError(t, err)
	require.Equal(t, 6, c.NumCommittedTokens(), "a partial-reuse copy of 6 tokens")
	require.NoError(t, c.Resume(f.stream))
	require.NoError(t, c.Resize(8, 8), "the copy's block has its page already: Resize asks nothing")
	err = c.Commit(seq(6, 2), false)
	require.ErrorIs(t, err, ErrInvalidArgument)
	assert.Equal(t, 6, c.NumCommittedTokens(), "the failed commit committed nothing")
	fail = false
	require.NoError(t, c.Commit(seq(6, 2), false))
	assert.Equal(t, 8, f.m.ProbeReuse(blockhash.Scope{}, seq(0, 9)), "the block is reusable")
	require.NoError(t, c.Close())
}

func TestEventsReportStoredDroppedAndRemovedBlocks(t *testing.T) {
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

	c := f.open(blockhash.Scope{}, seq(0, 8))
	require.NoError(t, c.Close())
	require.Len(t, events, 2)
	keys := blockhash.Chain(blockhash.Scope{}, tpb, seq(0, 8))
	for i, e := range events {
		assert.Equal(t, BlockStored, e.Kind)
		assert.Equal(t, keys[i], e.Key)
		assert.Equal(t, c.ID(), e.CacheID, "the committing cache is named")
		assert.Equal(t, uint64(i+1), e.Seq)
	}

	// Cached now: both full-attention pages and the windowed page of block
	// 1 (a 4-token window never needed block 0's). A 68-token request needs
	// all 18 slots (17 full-attention pages, 1 windowed), so all three go.
	events = nil
	f.serve(blockhash.Scope{LoRAID: 1}, seq(0, 68))
	var dropped, removed int
	for _, e := range events {
		switch {
		case e.Kind == BlockUpdated && e.Level == DroppedLevel:
			dropped++
		case e.Kind == BlockRemoved:
			removed++
		}
	}
	assert.Equal(t, 1, dropped, "block 1 losing one of its two pages: an update to DroppedLevel")
	assert.Equal(t, 2, removed, "each block's last page: the block is removed")
}

// TestEventsCarryPrioritiesAndTheLevelLeft: a stored block reports its
// priority; a later block committed with a higher one raises its stored
// ancestors, each reported with the priority before; a page moving down
// reports the level it left.
func TestEventsCarryPrioritiesAndTheLevelLeft(t *testing.T) {
	var events []CacheEvent
	f := newTieredFixture(t, tieredConfig(t, 4, 8, 0), WithEventListener(func(e CacheEvent) { events = append(events, e) }))
	f.serve(blockhash.Scope{}, seq(0, 8))
	require.Len(t, events, 2)
	for _, e := range events {
		assert.Equal(t, [3]int{int(BlockStored), DefaultPriority, DefaultPriority}, [3]int{int(e.Kind), e.Priority, e.OldPriority})
	}

	events = nil
	c, err := f.m.CreateKVCache(CacheOptions{InputTokens: seq(0, 13), Priority: func(int, layout.LayerGroupID) int { return 80 }})
	require.NoError(t, err)
	require.NoError(t, c.Resume(f.stream))
	require.NoError(t, c.Resize(12, 12))
	require.NoError(t, c.Commit(seq(8, 4), false))
	require.NoError(t, c.Close())
	var kinds []EventKind
	for _, e := range events {
		kinds = append(kinds, e.Kind)
		if e.Kind == BlockPriorityUpdated {
			assert.Equal(t, [2]int{DefaultPriority, 80}, [2]int{e.OldPriority, e.Priority})
		}
	}
	assert.Equal(t, []EventKind{BlockPriorityUpdated, BlockPriorityUpdated, BlockStored}, kinds)

	events = nil
	f.serve(blockhash.Scope{}, seq(100, 16)) // needs the whole GPU: the cached blocks go to the host
	moved := 0
	for _, e := range events {
		if e.Kind == BlockUpdated {
			assert.Equal(t, [2]layout.CacheLevel{0, 1}, [2]layout.CacheLevel{e.OldLevel, e.Level})
			moved++
		}
	}
	assert.Equal(t, 3, moved)
}

// Close closes the caches still open (ACTIVE or SUSPENDED) and releases
// every page and the levels' memory; the caches are then CLOSED for good.
func TestManagerCloseClosesOpenCaches(t *testing.T) {
	dev := emu.New(emu.Options{Seed: 1})
	defer dev.Close()
	m, err := NewManager(smallConfig(16), WithDevice(dev))
	require.NoError(t, err)
	s, err := dev.NewStream()
	require.NoError(t, err)
	defer s.Close()
	f := &fixture{t: t, m: m, dev: dev, stream: s}
	active := f.open(blockhash.Scope{}, seq(0, 8))
	suspended := f.open(blockhash.Scope{}, seq(100, 8))
	require.NoError(t, suspended.Suspend())

	require.NoError(t, m.Close(), "open caches do not block Close")
	assert.Equal(t, Closed, active.Status())
	assert.Equal(t, Closed, suspended.Status())
	assert.NoError(t, active.Close(), "closing a cache the manager closed is harmless")
	assert.ErrorIs(t, active.Resume(s), ErrInvalidState)
	_, err = m.Quota(layout.GPULevel)
	assert.ErrorIs(t, err, ErrClosed)
	assert.NoError(t, m.Close(), "closing twice is harmless")
	assert.Zero(t, dev.Stats().LiveAllocs.Total(), "every level's memory is freed")
}

// Close releases everything even when an ACTIVE cache's stream is gone: the
// failure to fence the cache's pages is reported, nothing is kept.
func TestManagerCloseReleasesWhenStreamIsGone(t *testing.T) {
	dev := emu.New(emu.Options{Seed: 1})
	defer dev.Close()
	m, err := NewManager(smallConfig(16), WithDevice(dev))
	require.NoError(t, err)
	s, err := dev.NewStream()
	require.NoError(t, err)
	f := &fixture{t: t, m: m, dev: dev, stream: s}
	c := f.open(blockhash.Scope{}, seq(0, 8))
	require.NoError(t, s.Close())

	err = m.Close()
	require.Error(t, err, "the lost fence is reported")
	assert.Contains(t, err.Error(), "close cache")
	assert.Equal(t, Closed, c.Status())
	assert.Zero(t, dev.Stats().LiveAllocs.Total(), "every level's memory is freed")
}

// Shutdown refuses while caches are open (KVCacheManagerV2's living-cache
// guard) and changes nothing; once they are closed it closes the manager.
func TestShutdownRefusesWhileCachesAreOpen(t *testing.T) {
	f := newFixture(t, smallConfig(16))
	c := f.open(blockhash.Scope{}, seq(0, 8))
	err := f.m.Shutdown()
	require.ErrorIs(t, err, ErrInvalidState)
	assert.Contains(t, err.Error(), "1 KV caches still open")
	assert.Equal(t, Active, c.Status(), "the refused shutdown changed nothing")
	require.NoError(t, c.Close())
	require.NoError(t, f.m.Shutdown())
	assert.ErrorIs(t, f.m.ClearReusableBlocks(), ErrClosed)
	require.NoError(t, f.m.Shutdown(), "a closed manager shuts down as a no-op")
}

// ClearReusableBlocks drops every committed block, on every level, and
// refuses while caches are open.
func TestClearReusableBlocksDropsEveryCommittedBlock(t *testing.T) {
	cfg := smallConfig(16)
	cfg.CacheTiers = append(cfg.CacheTiers, config.Host(16*256))
	f := newFixture(t, cfg)
	f.serve(blockhash.Scope{}, seq(0, 8))
	f.serve(blockhash.LoRA(0), seq(0, 12))
	f.serve(blockhash.Scope{}, seq(1000, 56)) // 14 blocks: the others go to the host level
	st, err := f.m.StorageStats(1)
	require.NoError(t, err)
	require.NotEqual(t, st[0].Total, st[0].Free, "blocks on the host level")
	c := f.open(blockhash.Scope{}, seq(100, 4))
	require.ErrorIs(t, f.m.ClearReusableBlocks(), ErrInvalidState)
	assert.Equal(t, 8, f.m.ProbeReuse(blockhash.Scope{}, seq(0, 8)), "the refused call changed nothing")
	require.NoError(t, c.Close())

	require.NoError(t, f.m.ClearReusableBlocks())
	assert.Zero(t, f.m.ProbeReuse(blockhash.Scope{}, seq(0, 8)))
	assert.Zero(t, f.m.ProbeReuse(blockhash.LoRA(0), seq(0, 12)))
	for _, lvl := range []layout.CacheLevel{0, 1} {
		st, err := f.m.StorageStats(lvl)
		require.NoError(t, err)
		for _, g := range st {
			assert.Equal(t, g.Total, g.Free, "level %d holds nothing", lvl)
		}
	}
	assert.Empty(t, f.m.roots, "the tree is empty")
}

// LoRA adapter 0 and no adapter never share blocks.
func TestLoRAZeroAndNoLoRAAreDifferentScopes(t *testing.T) {
	f := newFixture(t, smallConfig(16))
	f.serve(blockhash.LoRA(0), seq(0, 8))
	assert.Equal(t, 8, f.m.ProbeReuse(blockhash.LoRA(0), seq(0, 8)))
	assert.Zero(t, f.m.ProbeReuse(blockhash.Scope{}, seq(0, 8)))
}

// Resume without a stream resumes on the stream the cache last had (or was
// given with SetStream); a cache that never had one needs one.
func TestResumeWithoutAStreamUsesTheLastOne(t *testing.T) {
	f := newFixture(t, smallConfig(16))
	c, err := f.m.CreateKVCache(CacheOptions{})
	require.NoError(t, err)
	require.ErrorIs(t, c.Resume(nil), ErrInvalidArgument)
	require.NoError(t, c.Resume(f.stream))
	require.NoError(t, c.Suspend())
	require.NoError(t, c.Resume(nil))
	assert.Equal(t, f.stream, c.Stream())
	require.NoError(t, c.Suspend())

	other, err := f.dev.NewStream()
	require.NoError(t, err)
	defer other.Close()
	require.NoError(t, c.SetStream(other))
	assert.Nil(t, c.Stream(), "a suspended cache has no stream until it resumes")
	require.NoError(t, c.Resume(nil))
	assert.Equal(t, other, c.Stream())
	require.NoError(t, c.Close())
	assert.ErrorIs(t, c.SetStream(other), ErrInvalidState)
}

// SetStream moves an ACTIVE cache: its work continues on the new stream,
// ordered after the old one's.
func TestSetStreamMovesAnActiveCache(t *testing.T) {
	f := newFixture(t, smallConfig(16))
	c := f.open(blockhash.Scope{}, seq(0, 8))
	other, err := f.dev.NewStream()
	require.NoError(t, err)
	defer other.Close()
	before, err := c.BasePageIndices(0)
	require.NoError(t, err)
	require.NoError(t, c.SetStream(other))
	assert.Equal(t, other, c.Stream())
	after, err := c.BasePageIndices(0)
	require.NoError(t, err)
	assert.Equal(t, before, after, "the pages stay")
	require.NoError(t, c.Resize(12, -1))
	require.NoError(t, c.Close())
	require.NoError(t, other.Synchronize())
}

// ProbeFirstNewBlockKey names the first full block past the reusable prefix:
// the block a new cache would commit first.
func TestProbeFirstNewBlockKeyNamesTheFirstBlockToCompute(t *testing.T) {
	f := newFixture(t, smallConfig(16))
	prompt := seq(0, 13)
	keys := blockhash.Chain(blockhash.LoRA(3), tpb, prompt)
	k, ok := f.m.ProbeFirstNewBlockKey(blockhash.LoRA(3), prompt)
	require.True(t, ok)
	assert.Equal(t, keys[0], k, "nothing cached: the first block")
	f.serve(blockhash.LoRA(3), prompt[:8])
	k, ok = f.m.ProbeFirstNewBlockKey(blockhash.LoRA(3), prompt)
	require.True(t, ok)
	assert.Equal(t, keys[2], k)
	_, ok = f.m.ProbeFirstNewBlockKey(blockhash.LoRA(3), prompt[:11])
	assert.False(t, ok, "no full block past the prefix")
	assert.Equal(t, 0, f.m.NumOpenCaches())
}
