package core

import (
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core/blockhash"
	"github.com/kvcm/kvcm/core/codec"
	"github.com/kvcm/kvcm/core/config"
	"github.com/kvcm/kvcm/core/layout"
	"github.com/kvcm/kvcm/internal/testkit/codectest"
)

// The rules of failures: a lost page is never published and its cache learns
// of it on its next call; a codec call that fails (returns false or panics)
// is a failure the manager rolls back, never a leak; disk errors are ErrIO.

// holdMigrations blocks every migration stream of the manager until the
// returned function (also run at cleanup) is called: a decode submitted
// meanwhile cannot complete, so its failure is unknown when the submitting
// call returns.
func (f *fixture) holdMigrations() (release func()) {
	f.t.Helper()
	gate := make(chan struct{})
	f.m.mu.Lock()
	var err error
	for _, st := range f.m.migrationStreams() {
		if err == nil {
			err = st.HostFunc(func() error { <-gate; return nil })
		}
	}
	f.m.mu.Unlock()
	require.NoError(f.t, err)
	var once sync.Once
	release = func() { once.Do(func() { close(gate) }) }
	f.t.Cleanup(release)
	return release
}

// requireNoLeak checks that with every cache closed each slot of every level
// is free or evictable.
func (f *fixture) requireNoLeak() {
	f.t.Helper()
	for lvl := range f.m.levels {
		for _, g := range f.groups(layout.CacheLevel(lvl)) {
			require.Equal(f.t, g.Total, g.Available, "level %d group %d: every slot free or evictable", lvl, g.Index)
		}
	}
}

// suspendAndPushDown computes prompt in cache A, committing the first
// commit tokens, suspends it and has another request push A's pages down
// to the colder levels.
func (f *fixture) suspendAndPushDown(prompt []int, commit int) *KVCache {
	f.t.Helper()
	toks := seq(prompt[0], prompt[1])
	a, err := f.m.CreateKVCache(CacheOptions{InputTokens: toks})
	require.NoError(f.t, err)
	require.NoError(f.t, a.Resume(f.stream))
	require.NoError(f.t, a.Resize(len(toks), len(toks)))
	require.NoError(f.t, a.Commit(toks[:commit], false))
	f.writeAll(a, 1)
	require.NoError(f.t, a.Suspend())
	b := f.compute(blockhash.Scope{LoRAID: 9}, seq(5000, len(toks)), 2)
	require.NoError(f.t, b.Close())
	require.Zero(f.t, a.Residency()[0], "A's pages are all cold")
	return a
}

// A page lost to an asynchronous decode failure is never published: the
// Commit that completes its block fails with ErrDataLost, the lost pages'
// slots return when the cache closes, and the next request recomputes.
func TestLostPageIsNeverPublished(t *testing.T) {
	faulty := codectest.NewFaulty(codec.NewDefault())
	f := newTieredFixture(t, tieredConfig(t, 4, 8, 0), WithColdPageCodec(codec.Own(faulty)))
	a := f.suspendAndPushDown([]int{0, 16}, 8) // blocks 0 and 1 published, 2 and 3 private

	faulty.FailAsync(codectest.OpDecode, 0, 1, nil)
	release := f.holdMigrations()
	require.NoError(t, a.Resume(f.stream), "the decode's failure is not known yet")
	release()
	require.Error(t, f.stream.Synchronize(), "the stream waited for the failed decode")

	err := a.Commit(seq(8, 8), false)
	require.ErrorIs(t, err, ErrDataLost, "blocks 2 and 3 are lost: they must not be published")
	assert.Equal(t, 8, a.NumCommittedTokens(), "the failed commit changed nothing")
	assert.Zero(t, f.m.ProbeReuse(blockhash.Scope{}, seq(0, 17)), "no lost block is reachable")
	require.NoError(t, a.Close())
	f.requireNoLeak()

	c := f.compute(blockhash.Scope{}, seq(0, 16), 3)
	assert.Zero(t, c.ReusedTokens(), "the next request recomputes")
	assert.Equal(t, 16, f.verifyAll(c, 3), "4 blocks × 4 buffers")
	require.NoError(t, c.Close())
}

// An asynchronous decode failure that Resume could not know is reported to
// the cache on its next call (every call but Close fails with ErrDataLost)
// and counted in LostPages.
func TestAsyncDecodeFailureIsReportedToTheCache(t *testing.T) {
	faulty := codectest.NewFaulty(codec.NewDefault())
	f := newTieredFixture(t, tieredConfig(t, 4, 8, 0), WithColdPageCodec(codec.Own(faulty)))
	a := f.suspendAndPushDown([]int{0, 16}, 16)
	lostBefore := f.m.Stats().LostPages

	faulty.FailAsync(codectest.OpDecode, 0, 1, fmt.Errorf("decode went wrong"))
	release := f.holdMigrations()
	require.NoError(t, a.Resume(f.stream))
	assert.Equal(t, Active, a.Status())
	release()
	require.Error(t, f.stream.Synchronize())

	_, err := a.BasePageIndices(0)
	require.ErrorIs(t, err, ErrDataLost, "the next call reports the loss")
	assert.Contains(t, err.Error(), "decode went wrong", "and says what destroyed the pages")
	assert.Equal(t, lostBefore+4, f.m.Stats().LostPages, "A's four pages are counted")
	require.ErrorIs(t, a.Resize(20, -1), ErrDataLost)
	require.ErrorIs(t, a.Commit(nil, true), ErrDataLost)
	require.ErrorIs(t, a.Suspend(), ErrDataLost)
	require.NoError(t, a.Close(), "close always works")
	assert.Zero(t, f.m.ProbeReuse(blockhash.Scope{}, seq(0, 17)))
	f.requireNoLeak()

	c := f.compute(blockhash.Scope{}, seq(0, 16), 3)
	assert.Zero(t, c.ReusedTokens())
	assert.Equal(t, 16, f.verifyAll(c, 3), "4 blocks × 4 buffers")
	require.NoError(t, c.Close())
}

// A failed codec Decode (false or a panic) drops the pages it was bringing
// back: Resume fails with ErrCodecFailed, the prefix is no longer offered,
// no slot leaks, and the next request recomputes, even while the codec keeps
// failing.
func TestFailedDecodeDropsThePagesAndTheNextRequestRecomputes(t *testing.T) {
	for name, tc := range map[string]struct {
		arm func(*codectest.Faulty)
		why string
	}{
		"returns false": {func(f *codectest.Faulty) { f.FailSync(codectest.OpDecode, 0, -1) }, "returned false"},
		"panics":        {func(f *codectest.Faulty) { f.FailPanic(codectest.OpDecode, 0, -1) }, "panicked"},
	} {
		for tiers, disk := range map[string]bool{"host": false, "disk": true} {
			t.Run(name+"/"+tiers, func(t *testing.T) {
				faulty := codectest.NewFaulty(codec.NewDefault())
				cfg := tieredConfig(t, 4, 8, 0)
				if disk {
					cfg = tieredConfig(t, 4, 0, 8)
				}
				f := newTieredFixture(t, cfg, WithColdPageCodec(codec.Own(faulty)))
				prompt := seq(0, 17)
				a := f.compute(blockhash.Scope{}, prompt[:16], 1)
				require.NoError(t, a.Close())
				b := f.compute(blockhash.Scope{LoRAID: 1}, seq(500, 16), 2) // A's blocks go cold
				require.NoError(t, b.Close())
				require.Equal(t, 16, f.m.ProbeReuse(blockhash.Scope{}, prompt))

				tc.arm(faulty)
				c, err := f.m.CreateKVCache(CacheOptions{InputTokens: prompt})
				require.NoError(t, err)
				require.Equal(t, 16, c.ReusedTokens())
				err = c.Resume(f.stream)
				require.ErrorIs(t, err, ErrCodecFailed)
				assert.False(t, errors.Is(err, ErrCodecRejected), "a failed call is no rejected configuration")
				assert.Contains(t, err.Error(), tc.why)
				assert.Equal(t, Suspended, c.Status())
				assert.Zero(t, f.m.ProbeReuse(blockhash.Scope{}, prompt), "the dropped prefix is not offered")
				require.ErrorIs(t, c.Resume(f.stream), ErrDataLost, "the cache can only be closed")
				require.NoError(t, c.Close())
				f.requireNoLeak()

				d := f.compute(blockhash.Scope{}, prompt[:16], 3)
				assert.Zero(t, d.ReusedTokens(), "the next request recomputes")
				assert.Equal(t, 16, f.verifyAll(d, 3), "4 blocks × 4 buffers")
				require.NoError(t, d.Close())
			})
		}
	}
}

// A failed codec Encode (false or a panic) during eviction leaves its pages
// where they were, usable and retryable: the call that needed the slots fails
// with ErrOutOfPages saying why, the destination slots return, and once the
// codec works again everything proceeds to the byte.
func TestFailedEncodeKeepsThePagesAndSaysWhy(t *testing.T) {
	for name, tc := range map[string]struct {
		arm func(*codectest.Faulty)
		why string
	}{
		"returns false": {func(f *codectest.Faulty) { f.FailSync(codectest.OpEncode, 0, -1) }, "returned false"},
		"panics":        {func(f *codectest.Faulty) { f.FailPanic(codectest.OpEncode, 0, -1) }, "panicked"},
	} {
		for tiers, disk := range map[string]bool{"host": false, "disk": true} {
			t.Run(name+"/"+tiers, func(t *testing.T) {
				faulty := codectest.NewFaulty(codec.NewDefault())
				cfg := tieredConfig(t, 4, 8, 0)
				if disk {
					cfg = tieredConfig(t, 4, 0, 8)
				}
				f := newTieredFixture(t, cfg, WithColdPageCodec(codec.Own(faulty)))
				a := f.compute(blockhash.Scope{}, seq(0, 16), 1)
				require.NoError(t, a.Suspend()) // held: its pages must move down, not be dropped

				tc.arm(faulty)
				b, err := f.m.CreateKVCache(CacheOptions{InputTokens: seq(100, 16)})
				require.NoError(t, err)
				require.NoError(t, b.Resume(f.stream))
				err = b.Resize(16, 16)
				require.ErrorIs(t, err, ErrOutOfPages)
				require.ErrorIs(t, err, ErrCodecFailed, "the out-of-pages error carries its cause")
				assert.Contains(t, err.Error(), "Encode")
				assert.Contains(t, err.Error(), tc.why)
				assert.Zero(t, b.Capacity(), "the failed resize changed nothing")
				cold := levelOf(t, f.m, 1)
				assert.Equal(t, cold.Total, cold.Free, "the failed transactions' cold slots returned")
				assert.Zero(t, f.m.Stats().LostPages, "nothing was lost")

				faulty.Heal()
				require.NoError(t, b.Resize(16, 16), "retry succeeds")
				require.NoError(t, b.Close())
				require.NoError(t, a.Resume(f.stream))
				assert.Equal(t, 16, f.verifyAll(a, 1), "A's pages are intact")
				require.NoError(t, a.Close())
				f.requireNoLeak()
			})
		}
	}
}

// A held victim whose encode fails does not block the eviction of the next
// victim: a cached page nobody holds is dropped instead and the call
// succeeds.
func TestVictimThatCannotLeaveDoesNotBlockTheOthers(t *testing.T) {
	faulty := codectest.NewFaulty(codec.NewDefault())
	f := newTieredFixture(t, tieredConfig(t, 4, 8, 0), WithColdPageCodec(codec.Own(faulty)))
	a := f.compute(blockhash.Scope{}, seq(0, 8), 1)
	require.NoError(t, a.Suspend()) // the two oldest victims, held
	x := f.compute(blockhash.Scope{}, seq(100, 8), 2)
	require.NoError(t, x.Close()) // two newer victims, only cached

	faulty.FailSync(codectest.OpEncode, 0, -1)
	b, err := f.m.CreateKVCache(CacheOptions{InputTokens: seq(200, 8)})
	require.NoError(t, err)
	require.NoError(t, b.Resume(f.stream))
	require.NoError(t, b.Resize(8, 8), "X's cached pages make room though A's cannot move")
	require.NoError(t, b.Close())
	faulty.Heal()
	require.NoError(t, a.Resume(f.stream))
	assert.Equal(t, 8, f.verifyAll(a, 1), "2 blocks × 4 buffers")
	require.NoError(t, a.Close())
}

// panicAt is a codec one of whose set-up methods panics.
type panicAt struct {
	codec.ColdPageCodec
	method string
	closes int
}

func (p *panicAt) Configure(d []layout.PoolGroupDesc) bool {
	if p.method == "Configure" {
		panic("configure bug")
	}
	return p.ColdPageCodec.Configure(d)
}

func (p *panicAt) QueryColdPageBytes(lg layout.LayerGroupID) int64 {
	if p.method == "QueryColdPageBytes" {
		panic("size bug")
	}
	return p.ColdPageCodec.QueryColdPageBytes(lg)
}

func (p *panicAt) Close() error {
	p.closes++
	return nil
}

// A codec that panics while the manager is built rejects the configuration:
// NewManager returns ErrCodecRejected naming the panic and destroys the
// codec.
func TestPanickingCodecSetUpIsARejection(t *testing.T) {
	for _, method := range []string{"Configure", "QueryColdPageBytes"} {
		t.Run(method, func(t *testing.T) {
			c := &panicAt{ColdPageCodec: codec.NewDefault(), method: method}
			var err error
			require.NotPanics(t, func() {
				_, err = NewManager(tieredConfig(t, 4, 8, 0), WithColdPageCodec(codec.Own(c)))
			})
			require.ErrorIs(t, err, ErrCodecRejected)
			assert.Contains(t, err.Error(), method)
			assert.Contains(t, err.Error(), "panicked")
			assert.Equal(t, 1, c.closes, "the consumed codec is destroyed")
		})
	}
}

// An asynchronous disk read failure (here a truncated blob file: EOF) loses
// the pages it read: the stream that waited sees ErrIO, the cache gets
// ErrDataLost naming the read, and the next request recomputes.
func TestDiskReadFailureIsIOAndLosesThePages(t *testing.T) {
	// The disk has room for A's pages only, so nothing else is written to
	// the truncated file while A's pages are read back.
	f := newTieredFixture(t, tieredConfig(t, 4, 0, 4))
	a := f.suspendAndPushDown([]int{0, 16}, 16)
	f.m.mu.Lock()
	f.syncDisk()
	require.NoError(t, f.m.levels[1].groups[0].file.(osDiskFile).Truncate(0))
	f.m.mu.Unlock()

	release := f.holdMigrations()
	require.NoError(t, a.Resume(f.stream))
	release()
	err := f.stream.Synchronize()
	require.ErrorIs(t, err, ErrIO, "the stream that waited for the read reports an i/o error")
	_, err = a.BasePageIndices(0)
	require.ErrorIs(t, err, ErrDataLost)
	assert.Contains(t, err.Error(), "disk read")
	require.NoError(t, a.Close())
	f.requireNoLeak()

	c := f.compute(blockhash.Scope{}, seq(0, 16), 3)
	assert.Zero(t, c.ReusedTokens())
	assert.Equal(t, 16, f.verifyAll(c, 3), "4 blocks × 4 buffers")
	require.NoError(t, c.Close())
}

// A disk tier's file that cannot be sized (EFBIG, ENOSPC) fails NewManager
// and ResizeLevel with ErrIO; the failed resize changes nothing.
func TestDiskSizingFailureIsIO(t *testing.T) {
	// 1 MiB pages, so 2^30 slots make a 1 PiB blob file: more than a file
	// may hold (EFBIG, at once, allocating nothing), yet within the slots a
	// pool group indexes.
	const page, petabyte = 1 << 20, 1 << 50
	cfg := smallConfig(4)
	cfg.Layers = cfg.Layers[:1]
	cfg.Layers[0].Buffers = []config.BufferConfig{{Role: config.RoleKey, Size: page / 2}, {Role: config.RoleValue, Size: page / 2}}
	cfg.CacheTiers = []config.CacheTierConfig{config.GPU(4 * page), config.Disk(8*page, t.TempDir())}

	huge := cfg
	huge.CacheTiers = []config.CacheTierConfig{cfg.CacheTiers[0], config.Disk(petabyte, t.TempDir())}
	_, err := NewManager(huge)
	require.ErrorIs(t, err, ErrIO, "a 1 PiB blob file cannot be made")

	f := newTieredFixture(t, cfg)
	before := f.groups(1)
	err = f.m.ResizeLevel(1, petabyte)
	require.ErrorIs(t, err, ErrIO)
	assert.Equal(t, before, f.groups(1), "the failed resize changed nothing")
}

// A synchronous codec failure on the GPU→disk path releases the staging
// lease of its unit: the call that needed the slots fails with
// ErrOutOfPages and no page-ring lease stays live.
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

// A synchronous codec failure on the disk→GPU path releases the staging
// lease of its unit too: Resume fails with ErrCodecFailed and the pages it
// was bringing back are dropped.
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

// An asynchronous failure loses only the pages of its own transaction: later
// users of the slots it touched (here B's pages, which reuse A's GPU slots)
// do not inherit it when they are evicted in turn.
func TestAsyncFailureLosesOnlyItsTransactionsPages(t *testing.T) {
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

// A pending partial block (Commit with isEnd and partial reuse) whose page
// was lost while its cache was suspended is not published when the cache
// closes: once every cache is closed, no slot leaks.
func TestLostPendingPartialIsNeverPublished(t *testing.T) {
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
