package core

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core/blockhash"
	"github.com/kvcm/kvcm/core/codec"
	"github.com/kvcm/kvcm/core/codec/staged"
	"github.com/kvcm/kvcm/core/config"
	"github.com/kvcm/kvcm/core/device"
	"github.com/kvcm/kvcm/core/device/emu"
	"github.com/kvcm/kvcm/core/layout"
	"github.com/kvcm/kvcm/internal/testkit/devicetest"
)

// The rules of migration streams: GPU→host evictions and host→GPU
// onboardings run on streams of their own, so one never queues behind the
// other, and only the slots' fences order them: no page is read before the
// transfer that writes it completes, and no slot is written while a transfer
// on another stream still reads it.

// parkEvictions blocks the eviction stream until the returned function
// (also run at cleanup) is called (see parkPath).
func (f *fixture) parkEvictions() (release func()) {
	f.t.Helper()
	f.m.mu.Lock()
	down := f.m.streamOf(unit{src: f.m.levels[0].groups[0], dst: f.m.levels[1].groups[0]})
	up := f.m.streamOf(unit{src: f.m.levels[1].groups[0], dst: f.m.levels[0].groups[0]})
	f.m.mu.Unlock()
	require.NotSame(f.t, down, up, "evictions and onboardings have their own streams")
	return f.parkPath(0, 1)
}

// parkPath blocks the stream of the migrations from level src to level dst
// until the returned function (also run at cleanup) is called. It parks a
// stream while the test frees pinned host memory, which CUDA synchronizes,
// so it runs on emu only.
func (f *fixture) parkPath(src, dst int) (release func()) {
	f.t.Helper()
	devicetest.SkipUnlessEmu(f.t, f.dev, "parks a stream while freeing pinned host memory, which CUDA synchronizes")
	gate := make(chan struct{})
	f.m.mu.Lock()
	st := f.m.streamOf(unit{src: f.m.levels[src].groups[0], dst: f.m.levels[dst].groups[0]})
	err := st.HostFunc(func() error { <-gate; return nil })
	f.m.mu.Unlock()
	require.NoError(f.t, err)
	closed := false
	release = func() {
		if !closed {
			closed = true
			close(gate)
		}
	}
	f.t.Cleanup(release)
	return release
}

// passThrough runs a request over prompt that commits nothing, writing its
// pages if write is set, and closes it: its slots are free again.
func (f *fixture) passThrough(prompt []config.Token, write bool) {
	f.t.Helper()
	c, err := f.m.CreateKVCache(CacheOptions{Scope: blockhash.Scope{LoRAID: 9, HasLoRA: true}, InputTokens: prompt})
	require.NoError(f.t, err)
	require.NoError(f.t, c.Resume(f.stream))
	require.NoError(f.t, c.Resize(len(prompt), len(prompt)))
	if write {
		f.writeAll(c, 9)
	}
	require.NoError(f.t, c.Close())
}

// syncAsync synchronizes the engine stream in the background.
func (f *fixture) syncAsync() chan error {
	done := make(chan error, 1)
	go func() { done <- f.stream.Synchronize() }()
	return done
}

// notWithin reports whether done stays silent for a while: a transfer that
// must wait for parked work but does not would finish in this window. What
// done delivered stays in it.
func notWithin(done chan error) bool {
	select {
	case err := <-done:
		done <- err
		return false
	case <-time.After(100 * time.Millisecond):
		return true
	}
}

// An onboarding does not wait for evictions it does not depend on: with the
// eviction stream parked, a cache's pages come back from the host tier into
// free slots and the engine's stream completes. (On one stream this hangs.)
func TestOnboardingDoesNotQueueBehindEvictions(t *testing.T) {
	f := newTieredFixture(t, tieredConfig(t, 4, 8, 0))
	a := f.compute(blockhash.Scope{}, seq(0, 16), 1)
	require.NoError(t, a.Suspend())
	f.passThrough(seq(500, 16), true) // A goes to the host tier
	require.Equal(t, 4, a.Residency()[1])

	release := f.parkEvictions()
	require.NoError(t, a.Resume(f.stream))
	select {
	case err := <-f.syncAsync():
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		release()
		t.Fatal("the onboarding waited for the parked eviction stream")
	}
	assert.Equal(t, 16, f.verifyAll(a, 1))
	release()
	require.NoError(t, a.Close())
}

// No slot is reused while a transfer on another stream still reads it: the
// onboarding of A into the hot slots B's eviction frees waits for that
// eviction's reads, so B comes back to the byte too.
func TestOnboardingWaitsForTheEvictionThatFreesItsSlots(t *testing.T) {
	f := newTieredFixture(t, tieredConfig(t, 4, 8, 0))
	a := f.compute(blockhash.Scope{}, seq(0, 16), 1)
	require.NoError(t, a.Suspend())
	b := f.compute(blockhash.Scope{LoRAID: 9}, seq(500, 16), 2)
	require.NoError(t, b.Suspend())

	release := f.parkEvictions()
	require.NoError(t, a.Resume(f.stream), "B's pages go down, A's come up into their slots")
	done := f.syncAsync()
	assert.True(t, notWithin(done), "A's onboarding completed while B's eviction was parked")
	release()
	require.NoError(t, <-done)
	assert.Equal(t, 16, f.verifyAll(a, 1))
	require.NoError(t, a.Suspend())
	require.NoError(t, b.Resume(f.stream))
	assert.Equal(t, 16, f.verifyAll(b, 2), "B's bytes were read before A's overwrote them")
	require.NoError(t, b.Close())
	require.NoError(t, a.Close())
}

// No page is read before its write completes: A's pages, still being
// written to the host tier by a parked eviction, are pushed on to disk by
// the disk stream, which waits for that eviction, so they come back to the
// byte.
func TestDiskWriteWaitsForTheEvictionThatWritesItsPages(t *testing.T) {
	f := newTieredFixture(t, tieredConfig(t, 4, 4, 8))
	a := f.compute(blockhash.Scope{}, seq(0, 16), 1)
	require.NoError(t, a.Suspend())

	release := f.parkEvictions()
	// Requests take the GPU without writing it (the engine stream would
	// wait for the parked evictions): A goes to the host tier, its blobs not
	// yet written, then E's pages follow and push A's on to disk.
	f.passThrough(seq(500, 16), false)
	require.Equal(t, 4, a.Residency()[1])
	e := f.open(blockhash.Scope{LoRAID: 7, HasLoRA: true}, seq(700, 16))
	require.NoError(t, e.Suspend())
	f.passThrough(seq(900, 16), false)
	require.Equal(t, 4, a.Residency()[2], "A's pages are on disk")
	release()

	require.NoError(t, a.Resume(f.stream))
	assert.Equal(t, 16, f.verifyAll(a, 1), "the disk blobs hold what the eviction wrote")
	require.NoError(t, a.Close())
	require.NoError(t, e.Close())
}

// Under random delays on every stream, caches that take the GPU in turn
// (each resume evicts one and onboards another at once) keep their bytes.
func TestDuplexMigrationsKeepBytesUnderDelays(t *testing.T) {
	f := newTieredFixture(t, tieredConfig(t, 4, 12, 0))
	caches := make([]*KVCache, 3)
	for i := range caches {
		caches[i] = f.compute(blockhash.Scope{LoRAID: int64(i)}, seq(1000*i, 16), i+1)
		require.NoError(t, caches[i].Suspend())
	}
	for round := range 12 {
		i := round % len(caches)
		require.NoError(t, caches[i].Resume(f.stream))
		require.Equal(t, 16, f.verifyAll(caches[i], i+1), "round %d", round)
		require.NoError(t, caches[i].Suspend())
	}
	ms := f.m.MigrationStats()
	assert.Positive(t, ms[HotToHost].Pages)
	assert.Positive(t, ms[HostToHot].Pages)
	for _, c := range caches {
		require.NoError(t, c.Close())
	}
}

// The staged codec (device staging, DMA of contiguous chunks) moves pages
// between the GPU and the host tier on both streams, to the byte.
func TestStagedCodecMigratesOnBothStreams(t *testing.T) {
	dev := devicetest.Open(t, emu.Options{Seed: 13, MaxDelay: 20e3})
	inner := codec.ColdPageCodec(codec.NewDefault())
	st, err := staged.New(dev, inner, staged.Options{ChunkBytes: 2 << 10, RingChunks: 2})
	require.NoError(t, err)
	m, err := NewManager(tieredConfig(t, 4, 12, 0), WithDevice(dev), WithColdPageCodec(codec.Own(st)))
	require.NoError(t, err)
	s, err := dev.NewStream()
	require.NoError(t, err)
	f := &fixture{t: t, m: m, dev: dev, stream: s}
	defer func() {
		s.Close()
		require.NoError(t, m.Close())
		dev.Close()
	}()
	caches := make([]*KVCache, 3)
	for i := range caches {
		caches[i] = f.compute(blockhash.Scope{LoRAID: int64(i)}, seq(1000*i, 16), i+1)
		require.NoError(t, caches[i].Suspend())
	}
	for round := range 6 {
		i := round % len(caches)
		require.NoError(t, caches[i].Resume(f.stream))
		require.Equal(t, 16, f.verifyAll(caches[i], i+1), "round %d", round)
		require.NoError(t, caches[i].Suspend())
	}
	assert.Positive(t, m.MigrationStats()[HostToHot].Pages)
	for _, c := range caches {
		require.NoError(t, c.Close())
	}
}

// gatedCodec is the default codec whose armed Encode first blocks its
// stream until gate closes; multi is what it declares as codec.MultiStream.
type gatedCodec struct {
	codec.ColdPageCodec
	gate  chan struct{}
	armed bool
	multi bool
}

func (g *gatedCodec) MultiStream() bool { return g.multi }

func (g *gatedCodec) Encode(lg layout.LayerGroupID, dst device.Ptr, idx codec.PageIndices, s device.Stream) bool {
	if g.armed {
		gate := g.gate
		if s.HostFunc(func() error { <-gate; return nil }) != nil {
			return false
		}
	}
	return g.ColdPageCodec.Encode(lg, dst, idx, s)
}

// A codec that declares MultiStream has its calls overlap across streams;
// any other codec's calls are ordered across streams as if on one: an
// onboarding's decode, into slots no eviction reads, waits for the blocked
// encode of an eviction only then.
func TestCodecCallsOverlapAcrossStreamsOnlyWhenTheCodecSaysSo(t *testing.T) {
	for _, multi := range []bool{true, false} {
		t.Run(fmt.Sprintf("multi-stream=%v", multi), func(t *testing.T) {
			gc := &gatedCodec{ColdPageCodec: codec.NewDefault(), gate: make(chan struct{}), multi: multi}
			f := newTieredFixture(t, tieredConfig(t, 8, 12, 0), WithColdPageCodec(codec.Own(gc)))
			devicetest.SkipUnlessEmu(t, f.dev, "blocks a stream while freeing pinned host memory, which CUDA synchronizes")
			released := false
			release := func() {
				if !released {
					released = true
					close(gc.gate)
				}
			}
			defer release()
			a := f.compute(blockhash.Scope{}, seq(0, 16), 1)
			require.NoError(t, a.Suspend())
			f.passThrough(seq(500, 32), true) // A goes to the host tier; the GPU is free
			require.Equal(t, 4, a.Residency()[1])
			c := f.compute(blockhash.Scope{LoRAID: 3, HasLoRA: true}, seq(700, 16), 3) // slots 0-3
			require.NoError(t, c.Suspend())
			// E1 holds slots 4-7 without committing, so they come free again.
			e1, err := f.m.CreateKVCache(CacheOptions{Scope: blockhash.Scope{LoRAID: 4, HasLoRA: true}, InputTokens: seq(900, 16)})
			require.NoError(t, err)
			require.NoError(t, e1.Resume(f.stream))
			require.NoError(t, e1.Resize(16, 16))
			gc.armed = true
			// E2 pushes C down (the blocked encode) and keeps C's slots, on a
			// stream of its own, which waits for that encode.
			s2, err := f.dev.NewStream()
			require.NoError(t, err)
			defer s2.Close()
			e2, err := f.m.CreateKVCache(CacheOptions{Scope: blockhash.Scope{LoRAID: 5, HasLoRA: true}, InputTokens: seq(1100, 16)})
			require.NoError(t, err)
			require.NoError(t, e2.Resume(s2))
			require.NoError(t, e2.Resize(16, 16))
			require.Equal(t, 4, c.Residency()[1], "C's pages are going down")
			gc.armed = false
			require.NoError(t, e1.Close()) // frees slots 4-7

			require.NoError(t, a.Resume(f.stream), "A comes up into slots 4-7")

			done := f.syncAsync()
			if multi {
				select {
				case err := <-done:
					require.NoError(t, err)
				case <-time.After(30 * time.Second):
					t.Fatal("the onboarding waited for an unrelated encode of a multi-stream codec")
				}
			} else {
				assert.True(t, notWithin(done), "the decode ran beside the encode of a single-stream codec")
				release()
				require.NoError(t, <-done)
			}
			assert.Equal(t, 16, f.verifyAll(a, 1))
			release()
			require.NoError(t, e2.Close())
			require.NoError(t, a.Close())
			require.NoError(t, c.Resume(f.stream))
			assert.Equal(t, 16, f.verifyAll(c, 3))
			require.NoError(t, c.Close())
		})
	}
}
