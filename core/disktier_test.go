package core

import (
	"fmt"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core/blob"
	"github.com/kvcm/kvcm/core/blockhash"
	"github.com/kvcm/kvcm/core/codec"
	"github.com/kvcm/kvcm/core/config"
	"github.com/kvcm/kvcm/core/device"
	"github.com/kvcm/kvcm/core/device/emu"
	"github.com/kvcm/kvcm/core/layout"
	"github.com/kvcm/kvcm/internal/testkit/codectest"
)

// The rules of the disk tier's blobs: every blob read is checked (layout
// fingerprint, lifecycle, writer tag, header and payload checksums); a
// damaged, stale or foreign blob is a miss — its pages are lost, the cache
// that needed them gets ErrDataLost, the lost pages are counted, the next
// request recomputes — and never wrong bytes.

// Damage of every kind found in a blob file makes its read a miss.
func TestDamagedBlobIsAMissNeverWrongBytes(t *testing.T) {
	damages := map[string]func(t *testing.T, g *slotGroup){
		"payload bit flip": func(t *testing.T, g *slotGroup) {
			flipByte(t, g.file, g.payOff+5)
		},
		"header bit flip": func(t *testing.T, g *slotGroup) {
			flipByte(t, g.file, 33) // the block key
		},
		"zeros after truncation": func(t *testing.T, g *slotGroup) {
			f := g.file.(osDiskFile)
			require.NoError(t, f.Truncate(0))
			require.NoError(t, f.Reserve(g.numSlots*g.stride))
		},
		"stale blob of another write": func(t *testing.T, g *slotGroup) {
			buf := make([]byte, g.stride)
			_, err := g.file.ReadAt(buf, g.stride) // slot 1's blob, into slot 0
			require.NoError(t, err)
			_, err = g.file.WriteAt(buf, 0)
			require.NoError(t, err)
		},
	}
	for name, damage := range damages {
		t.Run(name, func(t *testing.T) {
			f := newTieredFixture(t, tieredConfig(t, 4, 0, 4))
			a := f.suspendAndPushDown([]int{0, 16}, 16)
			f.m.mu.Lock()
			f.syncDisk()
			damage(t, f.m.levels[1].groups[0])
			f.m.mu.Unlock()
			lostBefore := f.m.Stats().LostPages

			release := f.holdMigrations()
			require.NoError(t, a.Resume(f.stream))
			release()
			err := f.stream.Synchronize()
			require.ErrorIs(t, err, ErrIO, "the stream that waited for the read learns of it")
			require.ErrorIs(t, err, blob.ErrCorrupt)
			_, err = a.BasePageIndices(0)
			require.ErrorIs(t, err, ErrDataLost, "the cache never reads the damaged bytes")
			assert.Greater(t, f.m.Stats().LostPages, lostBefore, "the lost pages are counted")
			require.NoError(t, a.Close())
			f.requireNoLeak()

			c := f.compute(blockhash.Scope{}, seq(0, 16), 3)
			assert.Zero(t, c.ReusedTokens(), "the next request recomputes")
			assert.Equal(t, 16, f.verifyAll(c, 3))
			require.NoError(t, c.Close())
		})
	}
}

// A damaged blob loses only its own page, not its transaction: the other
// pages read with it load and stay cached; only the cache holding the lost
// page sees the loss (on its stream, then ErrDataLost), exactly one page is
// counted lost, and the next request reuses the blocks before it and
// recomputes from the lost one on.
func TestDamagedBlobLosesOnlyItsOwnPage(t *testing.T) {
	f := newTieredFixture(t, tieredConfig(t, 4, 0, 4))
	a := f.suspendAndPushDown([]int{0, 16}, 16)
	keys := blockhash.Chain(blockhash.Scope{}, tpb, seq(0, 16))
	f.m.mu.Lock()
	f.syncDisk()
	g := f.m.levels[1].groups[0]
	slot := -1
	for s, p := range g.owner {
		if p != nil && p.node != nil && p.node.key == keys[2] {
			slot = s
		}
	}
	require.GreaterOrEqual(t, slot, 0, "block 2 is on disk")
	flipByte(t, g.file, int64(slot)*g.stride+g.payOff+5)
	f.m.mu.Unlock()
	lostBefore := f.m.Stats().LostPages

	// The four pages are read in one transaction. Its failure reaches the
	// cache's stream and then the cache, or Resume itself when the disk read
	// failed before Resume looked (the disk workers run on their own).
	err := a.Resume(f.stream)
	if err == nil {
		require.ErrorIs(t, f.stream.Synchronize(), blob.ErrCorrupt, "the stream of the cache holding the lost page learns of it")
		_, err = a.BasePageIndices(0)
	}
	require.ErrorIs(t, err, ErrDataLost)
	assert.Equal(t, lostBefore+1, f.m.Stats().LostPages, "only the damaged blob's page is lost")
	require.NoError(t, a.Close())
	f.requireNoLeak()

	c := f.open(blockhash.Scope{}, seq(0, 16))
	assert.Equal(t, 2*tpb, c.ReusedTokens(), "blocks 0 and 1, read with the lost one, are reused")
	verified := 0
	f.eachBuffer(c, func(block int, loc BufferLocation, layer int32, role config.DataRole, base int32) {
		if block < 2 {
			require.Equal(t, pattern(1, block, loc, layer, role, loc.Bytes), f.readPage(loc, base), "block %d", block)
			verified++
		}
	})
	assert.Equal(t, 8, verified, "2 blocks × 4 buffers, to the byte")
	require.NoError(t, c.Close())
}

// A page whose blob failed in a disk read that has not settled yet, and
// that a later transaction moves on (prefetched to the host tier, then
// evicted back to disk by another request before the read was seen
// complete), is still lost: the later copy carries the failure, so the
// damaged bytes are never written back as a sound blob and reused.
func TestBlobFailureFollowsThePageIntoLaterMoves(t *testing.T) {
	f := newTieredFixture(t, tieredConfig(t, 4, 4, 8))
	a := f.suspendAndPushDown([]int{0, 16}, 16) // A's pages on the host tier, B's on the GPU
	c := f.compute(blockhash.Scope{LoRAID: 3}, seq(9000, 16), 3)
	require.NoError(t, c.Close()) // B's pages to the host tier, A's to disk
	require.Equal(t, 4, a.Residency()[2], "A's pages are on disk")
	key := blockhash.Chain(blockhash.Scope{}, tpb, seq(0, 16))[1]
	f.m.mu.Lock()
	f.syncDisk()
	g := f.m.levels[2].groups[0]
	for s, p := range g.owner {
		if p != nil && p.node != nil && p.node.key == key {
			flipByte(t, g.file, int64(s)*g.stride+g.payOff+5)
		}
	}
	f.m.mu.Unlock()
	lostBefore := f.m.Stats().LostPages

	release := f.holdMigrations()
	require.NoError(t, a.Prefetch(1), "disk→host, not complete yet")
	require.Equal(t, 4, a.Residency()[1])
	d := f.open(blockhash.Scope{LoRAID: 4}, seq(7000, 16)) // C's pages to the host tier, A's back to disk
	require.Equal(t, 4, a.Residency()[2], "A's pages moved on before the read settled")
	release()
	require.NoError(t, d.Close())
	require.ErrorIs(t, a.Resume(f.stream), ErrDataLost)
	assert.Equal(t, lostBefore+1, f.m.Stats().LostPages, "the damaged blob's page, and only it")
	require.NoError(t, a.Close())
	assert.Equal(t, tpb, f.m.ProbeReuse(blockhash.Scope{}, seq(0, 17)), "block 0 is reused, block 1 is not")
}

// A blob written by a transaction whose earlier work failed asynchronously
// (its encode) is not left behind looking sound: once the loss is settled
// its header is wiped, so a later manager on the persistent directory does
// not restore the block.
func TestBlobOfAFailedEncodeIsNotRestored(t *testing.T) {
	cfg := tieredConfig(t, 4, 0, 8)
	cfg.CacheTiers[1].Persistent = true
	faulty := codectest.NewFaulty(codec.NewDefault())
	f := newTieredFixture(t, cfg, WithColdPageCodec(codec.Own(identified{faulty})))
	a := f.compute(blockhash.Scope{}, seq(0, 16), 1)
	require.NoError(t, a.Close()) // committed, cached on the GPU
	faulty.FailAsync(codectest.OpEncode, 0, 1, nil)
	b := f.compute(blockhash.Scope{LoRAID: 1}, seq(100, 16), 2) // A's blocks go to disk; their encode fails
	require.NoError(t, b.Close())
	f.m.mu.Lock()
	f.syncDisk()
	f.m.settle()
	f.m.mu.Unlock()
	require.Equal(t, int64(4), f.m.Stats().LostPages, "A's four pages")
	require.NoError(t, f.m.Close())

	m, err := NewManager(cfg, WithDevice(f.dev), WithColdPageCodec(codec.Own(identified{codec.NewDefault()})))
	require.NoError(t, err)
	defer m.Close()
	assert.Zero(t, m.ProbeReuse(blockhash.Scope{}, seq(0, 17)), "no block of the failed encode is restored")
}

// identified gives a codec the default codec's identity, as a persistent
// tier needs.
type identified struct{ codec.ColdPageCodec }

func (identified) Identity() string { return codec.ConcatIdentity }

// syncDisk waits for every disk transaction submitted so far (the manager's
// lock held).
func (f *fixture) syncDisk() {
	f.t.Helper()
	for _, st := range f.m.diskStreams {
		require.NoError(f.t, st.Synchronize(), "the blobs are written")
	}
}

func flipByte(t *testing.T, f DiskFile, off int64) {
	t.Helper()
	align := f.Alignment() // the block holding off, for a direct-I/O file
	b := alignedBuf(align, align)
	base := off / align * align
	_, err := f.ReadAt(b, base)
	require.NoError(t, err)
	b[off-base] ^= 0x10
	_, err = f.WriteAt(b, base)
	require.NoError(t, err)
}

// Blobs on disk carry the header the format package decodes: the layout
// fingerprint, the lifecycle, the block key with its parent and tokens.
func TestDiskBlobsCarryTheirBlockHeader(t *testing.T) {
	f := newTieredFixture(t, tieredConfig(t, 4, 0, 4))
	a := f.suspendAndPushDown([]int{0, 16}, 16)
	defer a.Close()
	f.m.mu.Lock()
	defer f.m.mu.Unlock()
	f.syncDisk()
	g := f.m.levels[1].groups[0]
	keys := blockhash.Chain(blockhash.Scope{}, tpb, seq(0, 16))
	found := map[uint64]blob.Header{}
	for s := range g.numSlots {
		buf := make([]byte, g.stride)
		_, err := g.file.ReadAt(buf, s*g.stride)
		require.NoError(t, err)
		h, err := blob.Decode(buf[:g.hdrBytes], tpb)
		require.NoError(t, err, "slot %d", s)
		require.NoError(t, h.Verify(buf[g.hdrBytes:]))
		assert.Equal(t, f.m.blobFP[h.LifeCycle], h.Fingerprint)
		found[h.Key] = h
	}
	parent := uint64(blockhash.Scope{}.Root())
	for i, k := range keys {
		h, ok := found[uint64(k)]
		require.True(t, ok, "block %d is on disk", i)
		assert.Equal(t, parent, h.Parent)
		assert.Equal(t, seq(i*tpb, tpb), h.Tokens)
		parent = uint64(k)
	}
}

// GPU↔host migrations never wait for disk I/O they do not depend on, even
// where the host functions of all streams share one thread (CUDA's driver
// thread; the emulation's SharedHostThread) and the codec checks its work in
// host functions (as gpucodec does): with a disk transaction stuck in its
// file I/O, a cache's pages go to the host tier and come back, to the byte.
// (With disk I/O in a host function, or on the migration stream, this
// hangs.)
func TestHostMigrationsDoNotWaitForDiskIO(t *testing.T) {
	f := newTieredFixtureOn(t, emu.Options{Seed: 7, MaxDelay: 50e3, SharedHostThread: true}, tieredConfig(t, 4, 8, 8),
		WithColdPageCodec(codec.Own(hostChecked{codec.NewDefault()})))
	gate := make(chan struct{})
	f.m.mu.Lock()
	disk := f.m.streamOf(unit{src: f.m.levels[2].groups[0], dst: f.m.levels[0].groups[0]})
	b := newDiskBatch(1)
	stuck := []func(){func() { defer b.finish(); <-gate }} // a file I/O that does not return
	b.left = 1
	require.NoError(t, f.m.diskIO(disk, b, stuck))
	f.m.mu.Unlock()
	defer close(gate)

	a := f.suspendAndPushDown([]int{0, 16}, 16)
	assert.Equal(t, 4, a.Residency()[1], "A's pages are on the host tier")
	require.NoError(t, a.Resume(f.stream))
	require.NoError(t, f.stream.Synchronize())
	assert.Equal(t, 16, f.verifyAll(a, 1))
	require.NoError(t, a.Close())
}

// hostChecked is a codec that checks each call's work in a host function on
// its stream, as gpucodec does with HostCheck.
type hostChecked struct{ codec.ColdPageCodec }

func (h hostChecked) Encode(lg layout.LayerGroupID, dst device.Ptr, idx codec.PageIndices, st device.Stream) bool {
	return h.ColdPageCodec.Encode(lg, dst, idx, st) && st.HostFunc(func() error { return nil }) == nil
}

func (h hostChecked) Decode(lg layout.LayerGroupID, src device.Ptr, idx codec.PageIndices, st device.Stream) bool {
	return h.ColdPageCodec.Decode(lg, src, idx, st) && st.HostFunc(func() error { return nil }) == nil
}

// Blobs of 64 KiB and more go through direct I/O where the filesystem
// allows it (aligned slots, aligned scratch), and round-trip to the byte:
// blobs moved several slots to a vectored call, and blobs of more than half
// a run (1 MiB), each written payload first and header after, whose damage
// is still a miss.
func TestDirectIOBlobsRoundTrip(t *testing.T) {
	for _, page := range []int64{64 << 10, 1 << 20} {
		t.Run(fmt.Sprintf("%dKiB", page>>10), func(t *testing.T) {
			cfg := smallConfig(4)
			cfg.Layers = cfg.Layers[:1]
			cfg.Layers[0].Buffers = []config.BufferConfig{{Role: config.RoleKey, Size: page / 2}, {Role: config.RoleValue, Size: page / 2}}
			cfg.CacheTiers = []config.CacheTierConfig{config.GPU(4 * page), config.Disk(4*page, t.TempDir())}
			f := newTieredFixture(t, cfg)
			g := f.m.levels[1].groups[0]
			if g.align == 1 {
				t.Logf("no O_DIRECT on %s: the buffered fallback is tested", g.dir)
			} else {
				assert.Zero(t, g.stride%g.align, "slots are aligned")
			}
			a := f.suspendAndPushDown([]int{0, 16}, 16)
			require.Equal(t, 4, a.Residency()[1])
			require.NoError(t, a.Resume(f.stream))
			require.NoError(t, f.stream.Synchronize())
			assert.Equal(t, 8, f.verifyAll(a, 1), "4 blocks × 2 buffers")
			require.NoError(t, a.Close())

			b := f.suspendAndPushDown([]int{1000, 16}, 16)
			require.Equal(t, 4, b.Residency()[1])
			f.m.mu.Lock()
			f.syncDisk()
			for s := range g.numSlots {
				flipByte(t, g.file, s*g.stride+g.payOff+page-1)
			}
			f.m.mu.Unlock()
			require.NoError(t, b.Resume(f.stream))
			require.ErrorIs(t, f.stream.Synchronize(), blob.ErrCorrupt)
			_, err := b.BasePageIndices(0)
			require.ErrorIs(t, err, ErrDataLost, "a damaged payload is a miss")
			require.NoError(t, b.Close())
		})
	}
}

// BenchmarkPersistentStart is the start of a manager on a full persistent
// tier: every slot's header read (on the I/O workers) and checked, every
// block linked into the tree. The tier is one chain of blocks written
// directly through the group's blob I/O; the page cache is warm.
func BenchmarkPersistentStart(b *testing.B) {
	for _, bc := range []struct {
		page  int64
		slots int64
	}{{256, 1 << 16}, {64 << 10, 1 << 10}} {
		b.Run(fmt.Sprintf("%dB×%d", bc.page, bc.slots), func(b *testing.B) {
			cfg := smallConfig(4)
			cfg.Layers = cfg.Layers[:1]
			cfg.Layers[0].Buffers = []config.BufferConfig{{Role: config.RoleKey, Size: bc.page / 2}, {Role: config.RoleValue, Size: bc.page / 2}}
			disk := config.Disk(bc.slots*bc.page, b.TempDir())
			disk.Persistent = true
			cfg.CacheTiers = []config.CacheTierConfig{config.GPU(4 * bc.page), disk}
			m, err := NewManager(cfg)
			require.NoError(b, err)
			g := m.levels[1].groups[0]
			payload := make([]byte, bc.page)
			h := blockhash.NewHasher()
			parent := blockhash.Scope{}.Root()
			for s := range int32(g.numSlots) {
				toks := seq(int(s)*tpb, tpb)
				key := h.Next(parent, toks)
				hd := blob.Header{Fingerprint: m.blobFP[0], Key: uint64(key), Parent: uint64(parent), Tag: uint64(s) + 1, Tokens: toks}
				require.NoError(b, g.dio.do([]blobOp{{slot: s, buf: payload, hdr: &hd}}, true))
				parent = key
			}
			require.NoError(b, m.Close())
			b.ResetTimer()
			for range b.N {
				m, err := NewManager(cfg)
				require.NoError(b, err)
				b.StopTimer()
				st, err := m.StorageStats(1)
				require.NoError(b, err)
				require.Equal(b, g.numSlots, st[0].Total-st[0].Free, "every slot restored")
				require.NoError(b, m.Close())
				b.StartTimer()
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(g.numSlots), "ns/slot")
		})
	}
}

// Freed slots are reused lowest first, not last freed first, so a disk
// tier's consecutive writes, and the reads that follow them, run forwards
// through the file.
func TestFreeSlotsAreReusedInAscendingOrder(t *testing.T) {
	f := newTieredFixture(t, tieredConfig(t, 4, 0, 8))
	f.m.mu.Lock()
	defer f.m.mu.Unlock()
	g := f.m.levels[1].groups[0]
	for want := range int32(g.numSlots) {
		require.Equal(t, want, g.takeSlot(), "a fresh group hands out its slots in order")
	}
	for _, s := range []int32{5, 2, 7, 0} {
		g.releaseSlot(s)
	}
	var got []int32
	for range 4 {
		got = append(got, g.takeSlot())
	}
	assert.Equal(t, []int32{0, 2, 5, 7}, got)
	for _, s := range got {
		g.releaseSlot(s)
	}
	for s := range int32(g.numSlots) {
		if !slices.Contains(got, s) {
			g.releaseSlot(s)
		}
	}
}

// A persistent disk tier keeps the blocks' multimodal digest tokens in their
// headers: a manager restarted on the directory reuses digest-keyed blocks
// with the same items (not the text blocks of equal token values), byte for
// byte, and a text-only manager has no room for them.
func TestPersistentTierRestoresDigestKeyedBlocks(t *testing.T) {
	cfg := tieredConfig(t, 4, 0, 8)
	cfg.CacheTiers[1].Persistent = true
	f := newTieredFixture(t, cfg, WithColdPageCodec(codec.Own(identified{codec.NewDefault()})))
	img := blockhash.Digest{1, 2, 3}
	prompt, digests := imagePrompt(img)
	a := f.openDigests(prompt, digests, false)
	f.writeAll(a, 1)
	require.NoError(t, a.Close())
	b := f.compute(blockhash.Scope{LoRAID: 1}, seq(100, 16), 2) // the image prompt's blocks go to disk
	require.NoError(t, b.Close())
	f.m.mu.Lock()
	f.syncDisk()
	f.m.mu.Unlock()
	require.NoError(t, f.m.Close())

	m, err := NewManager(cfg, WithDevice(f.dev), WithColdPageCodec(codec.Own(identified{codec.NewDefault()})))
	require.NoError(t, err)
	defer m.Close()
	g := &fixture{t: t, m: m, dev: f.dev, stream: f.stream}
	require.NoError(t, m.CheckInvariants())
	n, err := m.ProbeReuseDigests(blockhash.Scope{}, prompt, digests)
	require.NoError(t, err)
	assert.Equal(t, 12, n, "the digest-keyed blocks are restored")
	assert.Equal(t, 4, m.ProbeReuse(blockhash.Scope{}, prompt), "token 0 is not the item")
	c, err := m.CreateKVCache(CacheOptions{InputTokens: prompt, InputDigests: digests})
	require.NoError(t, err)
	assert.Equal(t, digests, c.CommittedDigests())
	require.NoError(t, c.Resume(g.stream))
	assert.Equal(t, 3*4, g.verifyAll(c, 1), "every buffer page of the three blocks, byte for byte")
	require.NoError(t, c.Close())

	assert.Equal(t, int64(blob.HeaderSizeDigests(tpb, tpb)), m.levels[1].groups[0].hdrBytes)
	cfg.TextOnly = true
	require.NoError(t, m.Close())
	text, err := NewManager(cfg, WithDevice(f.dev), WithColdPageCodec(codec.Own(identified{codec.NewDefault()})))
	require.NoError(t, err)
	assert.Equal(t, int64(blob.HeaderSize(tpb)), text.levels[1].groups[0].hdrBytes, "text-only: text headers")
	require.NoError(t, text.Close())
}
