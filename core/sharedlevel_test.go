package core

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core/blob"
	"github.com/kvcm/kvcm/core/blockhash"
	"github.com/kvcm/kvcm/core/codec"
	"github.com/kvcm/kvcm/core/config"
	"github.com/kvcm/kvcm/core/device/emu"
	"github.com/kvcm/kvcm/core/layout"
	"github.com/kvcm/kvcm/core/sharedtier"
)

// The manager side of the shared tier: it needs a cold local level to
// onboard through; a cluster that cannot be reached costs misses and counted
// errors, never an error to the engine; lookups run without the manager's
// lock; onboarded blocks are announced with the shared level they came
// from. The end-to-end contract (two managers, two processes, a node
// stopped mid-run, verified to the byte) is in
// internal/testkit/fakeengine/shared_test.go.

func withSharedTier(cfg config.Config, addrs []string, ns string, policy config.SharedWritePolicy) config.Config {
	cfg.CacheTiers = append(cfg.CacheTiers, config.Shared(config.SharedCacheTierConfig{
		Addresses: addrs, Namespace: ns, WritePolicy: policy,
		DialTimeout: 200 * time.Millisecond, CallTimeout: 500 * time.Millisecond}))
	return cfg
}

// clusterAddrs returns make test's cluster, or skips.
func clusterAddrs(t *testing.T) []string {
	s := os.Getenv("KVCM_REDIS_CLUSTER")
	if s == "" {
		t.Skip("KVCM_REDIS_CLUSTER is not set (scripts/redis-cluster.sh start; make test sets it)")
	}
	return strings.Split(s, ",")
}

func testNamespace() string { return fmt.Sprintf("core%d-%d", os.Getpid(), time.Now().UnixNano()) }

// A shared tier without a host or disk tier is refused, naming the field.
func TestSharedTierNeedsAColdLocalLevel(t *testing.T) {
	cfg := withSharedTier(smallConfig(4), []string{"127.0.0.1:9"}, "ns", config.WriteBackOnEviction)
	_, err := NewManager(cfg, WithDevice(newFixture(t, smallConfig(4)).dev))
	var cerr *config.Error
	require.ErrorAs(t, err, &cerr)
	assert.Equal(t, "cache_tiers[1].kind", cerr.Field)
}

// With nothing listening at the seeds, every lookup and write is a miss and
// a counted error: caches are created, committed and evicted as without the
// tier, and reuse stays local.
func TestUnreachableClusterIsAMissNotAnError(t *testing.T) {
	for _, policy := range []config.SharedWritePolicy{config.WriteBackOnEviction, config.WriteThroughOnCommit} {
		t.Run(policy.String(), func(t *testing.T) {
			f := newTieredFixture(t, withSharedTier(tieredConfig(t, 4, 4, 0), []string{"127.0.0.1:9"}, "ns", policy))
			for i := range 4 { // 4 prompts of 3 blocks through 4 GPU and 4 host pages: evictions
				require.NoError(t, f.compute(blockhash.Scope{}, seq(100*i, 13), i).Close())
			}
			assert.Zero(t, f.m.ProbeReuse(blockhash.Scope{}, seq(0, 13)), "evicted, and the tier is unreachable")
			c, err := f.m.CreateKVCache(CacheOptions{InputTokens: seq(300, 13)})
			require.NoError(t, err)
			assert.Equal(t, 12, c.ReusedTokens(), "the local match is unchanged")
			require.NoError(t, c.Close())
			require.NoError(t, f.m.FlushShared(context.Background()))
			st, ok := f.m.SharedStats()
			require.True(t, ok)
			assert.Positive(t, st.Store.Errors)
			assert.Zero(t, st.OnboardedBlocks)
			assert.Zero(t, st.Store.Written)
		})
	}
}

// computeShared commits prompt in a manager with the shared tier under
// write-through and waits until it is written.
func computeShared(t *testing.T, addrs []string, ns string, prompt []config.Token) {
	a := newTieredFixture(t, withSharedTier(tieredConfig(t, 8, 8, 0), addrs, ns, config.WriteThroughOnCommit))
	c, err := a.m.CreateKVCache(CacheOptions{InputTokens: prompt})
	require.NoError(t, err)
	require.NoError(t, c.Resume(a.stream))
	require.NoError(t, c.Resize(len(prompt), len(prompt)))
	a.writeAll(c, 1) // computed before it is committed, as an engine does
	require.NoError(t, c.Commit(prompt, true))
	require.NoError(t, c.Close())
	require.NoError(t, a.m.FlushShared(context.Background()))
	st, _ := a.m.SharedStats()
	require.Equal(t, int64(len(prompt)/tpb), st.Store.Written, "every block")
}

// CreateKVCache reads the shared tier without holding the manager's lock:
// the store's checks of the blobs, which run while the fetch is in flight,
// find it free.
func TestSharedLookupHoldsNoLock(t *testing.T) {
	addrs, ns := clusterAddrs(t), testNamespace()
	computeShared(t, addrs, ns, seq(0, 12))
	b := newTieredFixture(t, withSharedTier(tieredConfig(t, 8, 8, 0), addrs, ns, config.WriteBackOnEviction))
	var checked, locked int
	opts := sharedtier.OptionsFrom(*withSharedTier(config.Config{}, addrs, ns, 0).CacheTiers[0].Shared)
	opts.Verify = func(k sharedtier.Key, blob []byte) error {
		checked++
		if !b.m.mu.TryLock() {
			locked++
		} else {
			b.m.mu.Unlock()
		}
		return b.m.verifyShared(k, blob)
	}
	s, err := sharedtier.Open(opts)
	require.NoError(t, err)
	b.m.shared.store.Close()
	b.m.shared.store = s
	c, err := b.m.CreateKVCache(CacheOptions{InputTokens: seq(0, 13)})
	require.NoError(t, err)
	assert.Equal(t, 12, c.ReusedTokens())
	assert.Equal(t, 3, checked, "3 blocks")
	assert.Zero(t, locked, "the lock was held during the fetch")
	require.NoError(t, c.Resume(b.stream))
	assert.Equal(t, 12, b.verifyAll(c, 1), "3 blocks × 2 layers × 2 buffers hold the first manager's bytes")
	require.NoError(t, c.Close())
}

// ProbeFirstNewBlockKey continues the prefix into the shared tier as
// ProbeReuse does: another node names the first block past the ones the tier
// holds (the block a cache created now would compute first), not a block it
// would onboard; it onboards nothing, and past blocks the tier lacks it names
// the first of them.
func TestProbeFirstNewBlockKeyContinuesIntoTheSharedTier(t *testing.T) {
	addrs, ns := clusterAddrs(t), testNamespace()
	computeShared(t, addrs, ns, seq(0, 12)) // blocks 0-2 in the tier
	b := newTieredFixture(t, withSharedTier(tieredConfig(t, 8, 8, 0), addrs, ns, config.WriteBackOnEviction))
	prompt := seq(0, 21) // 5 full blocks
	keys := blockhash.Chain(blockhash.Scope{}, tpb, prompt)

	k, ok := b.m.ProbeFirstNewBlockKey(blockhash.Scope{}, prompt)
	require.True(t, ok)
	assert.Equal(t, keys[3], k, "blocks 0-2 are in the tier: block 3 is the first to compute")
	st, _ := b.m.SharedStats()
	assert.Equal(t, int64(5), st.LookupBlocks, "the blocks past the (empty) local tree were looked up")
	assert.Equal(t, int64(3), st.FoundBlocks)
	assert.Zero(t, st.OnboardedBlocks, "a probe changes nothing")
	assert.Zero(t, b.groups(1)[0].Total-b.groups(1)[0].Free, "nothing landed on the host level")

	_, ok = b.m.ProbeFirstNewBlockKey(blockhash.Scope{}, prompt[:15])
	assert.False(t, ok, "no full block past the tier's three")

	other := append(seq(0, 4), seq(500, 12)...) // block 0 is the tier's, block 1 is not
	k, ok = b.m.ProbeFirstNewBlockKey(blockhash.Scope{}, other)
	require.True(t, ok)
	assert.Equal(t, blockhash.Chain(blockhash.Scope{}, tpb, other)[1], k)

	k, ok = b.m.ProbeFirstNewBlockKey(blockhash.LoRA(3), prompt)
	require.True(t, ok)
	assert.Equal(t, blockhash.Chain(blockhash.LoRA(3), tpb, prompt)[0], k, "another scope's chain is not in the tier")

	c, err := b.m.CreateKVCache(CacheOptions{InputTokens: prompt})
	require.NoError(t, err)
	assert.Equal(t, 12, c.ReusedTokens(), "the cache reuses the three blocks the probe passed")
	require.NoError(t, c.Close())
	k, ok = b.m.ProbeFirstNewBlockKey(blockhash.Scope{}, prompt)
	require.True(t, ok)
	assert.Equal(t, keys[3], k, "the same block once the three are local")
}

// Onboarded blocks are stored (by no cache) and each page reports that it
// came from the shared level to the first cold level; the counters say how
// many blocks, pages and bytes.
func TestOnboardedBlocksAreAnnouncedFromTheSharedLevel(t *testing.T) {
	addrs, ns := clusterAddrs(t), testNamespace()
	computeShared(t, addrs, ns, seq(0, 8))
	var events []CacheEvent
	b := newTieredFixture(t, withSharedTier(tieredConfig(t, 8, 8, 0), addrs, ns, config.WriteBackOnEviction),
		WithEventListener(func(e CacheEvent) { events = append(events, e) }))
	shared, ok := b.m.SharedLevel()
	require.True(t, ok)
	assert.Equal(t, layout.CacheLevel(2), shared, "after the GPU and host levels")
	assert.Equal(t, 8, b.m.ProbeReuse(blockhash.Scope{}, seq(0, 9)))
	c, err := b.m.CreateKVCache(CacheOptions{InputTokens: seq(0, 9)})
	require.NoError(t, err)
	defer c.Close()
	assert.Equal(t, 8, c.ReusedTokens())
	var kinds []EventKind
	for _, e := range events {
		kinds = append(kinds, e.Kind)
		if e.Kind == BlockUpdated {
			assert.Equal(t, shared, e.OldLevel)
			assert.Equal(t, layout.CacheLevel(1), e.Level)
		}
	}
	require.Equal(t, []EventKind{BlockStored, BlockUpdated, BlockStored, BlockUpdated}, kinds)
	assert.Equal(t, events[0].Key, events[2].Parent, "in block order")
	assert.Zero(t, events[0].CacheID)
	st, _ := b.m.SharedStats()
	assert.Equal(t, int64(2), st.OnboardedBlocks)
	assert.Equal(t, int64(2), st.OnboardedPages)
	assert.Equal(t, int64(2*256), st.OnboardedBytes, "2 cold pages of 256 bytes")
	assert.Zero(t, st.DiscardedPages)
}

// Without a host tier the blobs land on the disk tier (with headers of its
// own) and are read, checked and decoded from there; under write-back, pages
// evicted from the disk tier, the last local level, are read from their
// slots and written. Either way the second manager holds the first's bytes.
func TestDiskTierOnboardsAndWritesBack(t *testing.T) {
	addrs, ns := clusterAddrs(t), testNamespace()
	a := newTieredFixture(t, withSharedTier(tieredConfig(t, 4, 0, 4), addrs, ns, config.WriteBackOnEviction))
	for i := range 4 { // 4 prompts of 3 blocks through 4 GPU and 4 disk pages
		require.NoError(t, a.compute(blockhash.Scope{}, seq(100*i, 12), i+1).Close())
	}
	require.NoError(t, a.m.FlushShared(context.Background()))
	st, _ := a.m.SharedStats()
	require.Positive(t, st.WriteBacks)
	require.Equal(t, st.WriteBacks, st.Store.Written+st.Store.Present, "every evicted block is written")
	require.Zero(t, st.LostWrites)

	b := newTieredFixture(t, withSharedTier(tieredConfig(t, 4, 0, 4), addrs, ns, config.WriteBackOnEviction))
	c, err := b.m.CreateKVCache(CacheOptions{InputTokens: seq(0, 13)})
	require.NoError(t, err)
	assert.Equal(t, 12, c.ReusedTokens(), "the first prompt, evicted first, is in the cluster")
	assert.Equal(t, int64(3), b.groups(1)[0].Total-b.groups(1)[0].Free, "landed on the disk level")
	require.NoError(t, c.Resume(b.stream))
	assert.Equal(t, 12, b.verifyAll(c, 1))
	require.NoError(t, c.Close())
}

// A long prefix is fetched and landed in chunks (each landing overlapping
// the next fetch): every block arrives once, in order, with its bytes.
func TestLongPrefixOnboardsInChunks(t *testing.T) {
	addrs, ns := clusterAddrs(t), testNamespace()
	computeShared(t, addrs, ns, seq(0, 28))
	old := sharedChunkBytes
	sharedChunkBytes = 2 * 256 // 2 blocks a chunk: 7 blocks in 4 chunks
	t.Cleanup(func() { sharedChunkBytes = old })
	var stored []CacheEvent
	b := newTieredFixture(t, withSharedTier(tieredConfig(t, 8, 8, 0), addrs, ns, config.WriteBackOnEviction),
		WithEventListener(func(e CacheEvent) {
			if e.Kind == BlockStored {
				stored = append(stored, e)
			}
		}))
	c, err := b.m.CreateKVCache(CacheOptions{InputTokens: seq(0, 29)})
	require.NoError(t, err)
	assert.Equal(t, 28, c.ReusedTokens())
	require.Len(t, stored, 7)
	for i := 1; i < len(stored); i++ {
		assert.Equal(t, stored[i-1].Key, stored[i].Parent, "block %d follows block %d", i, i-1)
	}
	require.NoError(t, c.Resume(b.stream))
	assert.Equal(t, 28, b.verifyAll(c, 1), "7 blocks × 2 layers × 2 buffers")
	require.NoError(t, c.Close())
	st, _ := b.m.SharedStats()
	assert.Equal(t, int64(7), st.OnboardedBlocks)
	assert.Zero(t, st.DiscardedPages)
}

// The shared tier's disk I/O (a write-back's read of a disk slot) holds no
// host function: with such a job stuck, where the host functions of all
// streams share one thread (CUDA's driver thread; the emulation's
// SharedHostThread), a cache's pages still go to the host tier and come
// back, to the byte. (With the read in a host function, this hangs.)
func TestSharedDiskJobsHoldNoHostFunction(t *testing.T) {
	cfg := withSharedTier(tieredConfig(t, 4, 8, 8), []string{"127.0.0.1:9"}, "ns", config.WriteBackOnEviction)
	f := newTieredFixtureOn(t, emu.Options{Seed: 7, MaxDelay: 50e3, SharedHostThread: true}, cfg,
		WithColdPageCodec(codec.Own(hostChecked{codec.NewDefault()})))
	gate := make(chan struct{})
	f.m.mu.Lock()
	disk := f.m.levels[2].groups[0]
	require.NoError(t, f.m.sharedDiskJob([]*slotGroup{disk}, []int32{int32(disk.numSlots) - 1}, func() { <-gate }))
	f.m.mu.Unlock()
	defer close(gate)

	a := f.suspendAndPushDown([]int{0, 16}, 16)
	assert.Equal(t, 4, a.Residency()[1], "A's pages are on the host tier")
	require.NoError(t, a.Resume(f.stream))
	require.NoError(t, f.stream.Synchronize())
	assert.Equal(t, 16, f.verifyAll(a, 1))
	require.NoError(t, a.Close())
}

// Landing blobs on a disk tier (no host tier) holds no host function either:
// with a landing's write stuck in the disk workers, where all streams share
// one host-function thread, a cache's pages still go to the host tier and
// come back, to the byte. (With the write in a host function, this hangs.)
func TestSharedLandingHoldsNoHostFunction(t *testing.T) {
	d := &landingDisk{gate: make(chan struct{})}
	d.block.Store(-1)
	cfg := withSharedTier(tieredConfig(t, 4, 8, 8), []string{"127.0.0.1:9"}, "ns", config.WriteBackOnEviction)
	f := newTieredFixtureOn(t, emu.Options{Seed: 7, MaxDelay: 50e3, SharedHostThread: true}, cfg,
		WithColdPageCodec(codec.Own(hostChecked{codec.NewDefault()})), WithDiskFiles(d.open))
	f.m.mu.Lock()
	disk := f.m.levels[2].groups[0]
	p := f.m.newPage(disk, 0)
	d.block.Store(int64(p.slot) * disk.stride)
	a := arrival{p: p, payload: make([]byte, disk.blobBytes()), hdr: blob.Header{Fingerprint: f.m.blobFP[0]}}
	require.NoError(t, f.m.landShared(disk, []arrival{a}))
	f.m.mu.Unlock()
	defer close(d.gate)

	c := f.suspendAndPushDown([]int{0, 16}, 16)
	assert.Equal(t, 4, c.Residency()[1], "the cache's pages are on the host tier")
	require.NoError(t, c.Resume(f.stream))
	require.NoError(t, f.stream.Synchronize())
	assert.Equal(t, 16, f.verifyAll(c, 1))
	require.NoError(t, c.Close())
}

// A landed blob the disk refuses to write loses only its page: the page is
// dropped from the tree and counted lost (and a failed landing) when its
// transaction settles; the
// other page of the same transaction stays, its blob on disk to the byte.
func TestFailedLandingWriteLosesOnlyItsPage(t *testing.T) {
	d := &landingDisk{}
	d.block.Store(-1)
	cfg := withSharedTier(tieredConfig(t, 4, 0, 8), []string{"127.0.0.1:9"}, "ns", config.WriteBackOnEviction)
	f := newTieredFixture(t, cfg, WithDiskFiles(d.open))
	m := f.m
	m.mu.Lock()
	g := m.shared.dst.groupOf(0)
	require.True(t, g.onDisk())
	cur, key := m.root(blockhash.Scope{}), blockhash.Scope{}.Root()
	var arrivals []arrival
	for b := range 2 {
		blk := seq(b*tpb, tpb)
		key = m.hasher.Next(key, blk)
		n := m.newNode(cur, key, blk, nil)
		m.addChild(cur, n)
		payload := make([]byte, g.blobBytes())
		for i := range payload {
			payload[i] = byte(b*7 + i)
		}
		h := blob.Header{Fingerprint: m.blobFP[0], Key: uint64(key), Tokens: append([]int32(nil), blk...)}
		arrivals = append(arrivals, arrival{p: m.newPage(g, 0), n: n, payload: payload, hdr: h, fresh: true})
		cur = n
	}
	d.block.Store(int64(arrivals[1].p.slot) * g.stride)
	require.Equal(t, 2, m.landArrivals(arrivals), "both are linked: the write fails later")
	m.mu.Unlock()
	require.NoError(t, m.shared.stream.Synchronize())
	m.mu.Lock()
	m.settle()
	good, bad := arrivals[0], arrivals[1]
	assert.True(t, bad.p.lost, "the page whose blob was not written")
	assert.Nil(t, m.pagesOf(bad.n)[0], "is out of the tree")
	assert.False(t, good.p.lost)
	assert.Same(t, good.p, m.pagesOf(good.n)[0])
	got := make([]byte, g.blobBytes())
	require.NoError(t, g.dio.do([]blobOp{{slot: good.p.slot, buf: got, want: m.wantOf(good.p)}}, false))
	assert.Equal(t, good.payload, got)
	m.mu.Unlock()
	assert.Equal(t, int64(1), m.Stats().LostPages)
	st, _ := m.SharedStats()
	assert.Equal(t, int64(1), st.FailedLandings, "the failed landing is counted in the shared tier's stats")
	assert.Equal(t, tpb, m.ProbeReuse(blockhash.Scope{}, seq(0, 2*tpb+1)), "the first block only")
}

// landingDisk opens the disk tier's files with OSDiskFiles; a write that
// covers offset block waits for gate or, without one, fails.
type landingDisk struct {
	block atomic.Int64 // -1: none
	gate  chan struct{}
}

func (d *landingDisk) open(spec DiskFileSpec) (DiskFile, error) {
	f, err := OSDiskFiles(spec)
	if err != nil {
		return nil, err
	}
	return landingFile{f.(VectorDiskFile), d}, nil
}

type landingFile struct {
	VectorDiskFile
	d *landingDisk
}

func (f landingFile) hit(off int64, n int) error {
	if b := f.d.block.Load(); b < off || b >= off+int64(n) {
		return nil
	}
	if f.d.gate != nil {
		<-f.d.gate
		return nil
	}
	return errors.New("injected write failure")
}

func (f landingFile) WriteAt(p []byte, off int64) (int, error) {
	if err := f.hit(off, len(p)); err != nil {
		return 0, err
	}
	return f.VectorDiskFile.WriteAt(p, off)
}

func (f landingFile) WritevAt(bufs [][]byte, off int64) (int, error) {
	n := 0
	for _, b := range bufs {
		n += len(b)
	}
	if err := f.hit(off, n); err != nil {
		return 0, err
	}
	return f.VectorDiskFile.WritevAt(bufs, off)
}

// Blocks keyed by multimodal digests are shared like text blocks: the
// digests enter the block key, so a second manager given the same prompt and
// digests reuses every block from the cluster, to the byte, and one given
// another item's digest there reuses only the text block before it.
func TestDigestBlocksAreShared(t *testing.T) {
	addrs, ns := clusterAddrs(t), testNamespace()
	prompt, digests := imagePrompt(blockhash.Digest{7})
	a := newTieredFixture(t, withSharedTier(tieredConfig(t, 8, 8, 0), addrs, ns, config.WriteThroughOnCommit))
	c, err := a.m.CreateKVCache(CacheOptions{InputTokens: prompt, InputDigests: digests})
	require.NoError(t, err)
	require.NoError(t, c.Resume(a.stream))
	require.NoError(t, c.Resize(len(prompt), len(prompt)))
	a.writeAll(c, 1)
	require.NoError(t, c.CommitDigests(prompt, digests, true))
	require.NoError(t, c.Close())
	require.NoError(t, a.m.FlushShared(context.Background()))
	st, _ := a.m.SharedStats()
	require.Equal(t, int64(3), st.Store.Written, "every block, the image's included")

	input := append(slices.Clone(prompt), 13)
	b := newTieredFixture(t, withSharedTier(tieredConfig(t, 8, 8, 0), addrs, ns, config.WriteBackOnEviction))
	n, err := b.m.ProbeReuseDigests(blockhash.Scope{}, input, digests)
	require.NoError(t, err)
	assert.Equal(t, 12, n)
	other := []blockhash.DigestAt{{Pos: 4, Digest: blockhash.Digest{8}}}
	n, err = b.m.ProbeReuseDigests(blockhash.Scope{}, input, other)
	require.NoError(t, err)
	assert.Equal(t, 4, n, "another image: the text block before it")

	input[4] = 77 // the value at a digest position does not matter
	d, err := b.m.CreateKVCache(CacheOptions{InputTokens: input, InputDigests: digests})
	require.NoError(t, err)
	assert.Equal(t, 12, d.ReusedTokens())
	assert.Equal(t, digests, d.CommittedDigests(), "the onboarded blocks keep their digests")
	require.NoError(t, d.Resume(b.stream))
	require.NoError(t, b.stream.Synchronize())
	b.verifyAll(d, 1)
	require.NoError(t, d.Close())
	st, _ = b.m.SharedStats()
	assert.Equal(t, int64(3), st.OnboardedBlocks)
}
