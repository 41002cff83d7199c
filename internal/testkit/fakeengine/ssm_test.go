package fakeengine_test

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core"
	"github.com/kvcm/kvcm/core/config"
	"github.com/kvcm/kvcm/internal/testkit/fakeengine"
)

// withSsm adds an SSM layer (a 96-byte state and a 32-byte conv state) with
// commit_min_snapshot, its GPU slots capped at maxSlots.
func withSsm(maxSlots int64) func(*config.Config) {
	return func(c *config.Config) {
		c.SsmLayers = []config.SsmLayerConfig{{LayerID: 3, Buffers: []config.BufferConfig{
			{Role: "ssm_state", Size: 96}, {Role: "conv_state", Size: 32},
		}}}
		c.CommitMinSnapshot = true
		c.MaxSsmSlots = maxSlots
	}
}

// The engine writes each request's SSM state through the device; a later
// prompt through a cached prefix starts from the snapshot taken at the last
// block boundary a commit ended on, and it verifies byte for byte after the
// snapshot was pushed through the host and disk levels and decoded back.
func TestSsmStateVerifiesThroughHostAndDisk(t *testing.T) {
	r := newRig(t, setup{slots: 12, hostSlots: 4, diskSlots: 64, noSlidingLyr: true, tweak: withSsm(3),
		engine: fakeengine.Options{ChunkTokens: 32}})
	ssm := r.lgOf(3)
	rng := rand.New(rand.NewPCG(51, 52))
	a := randTokens(rng, 150)
	stream := r.stream()
	res, err := r.e.Serve(stream, fakeengine.Request{Prompt: a, OutputLen: 2})
	require.NoError(t, err)
	require.Zero(t, res.Final.Mismatches, "first: %v", res.Final.First)
	// Other requests push a's snapshots (3 GPU slots of SSM states) and
	// blocks to the host, and from there to the disk.
	for range 4 {
		_, err := r.e.Serve(stream, fakeengine.Request{Prompt: randTokens(rng, 100), OutputLen: 1})
		require.NoError(t, err)
	}
	mig := r.m.MigrationStats()
	require.Positive(t, mig[core.HostToDisk].Pages+mig[core.HotToDisk].Pages, "pages reached the disk tier")
	r.m.GetAndResetLayerGroupIterationStats()

	res, err = r.e.Serve(stream, fakeengine.Request{Prompt: concat(a[:140], []config.Token{7}), OutputLen: 2})
	require.NoError(t, err)
	require.Equal(t, 128, res.Reused, "the last snapshot within the prompt: the chunk ending at 128")
	assert.Zero(t, res.Verified.Mismatches, "first: %v", res.Verified.First)
	assert.Equal(t, int64(8+1), res.Verified.PagesVerified, "8 blocks and the SSM state")
	assert.Zero(t, res.Final.Mismatches, "first: %v", res.Final.First)
	lg := r.m.GetAndResetLayerGroupIterationStats()
	assert.Positive(t, lg[ssm].OnboardBlocks, "the snapshot came back from a cold level")
	ss := r.m.GetAndResetSsmSnapshotIterationStats()[ssm]
	assert.Equal(t, int64(1), ss.Hits)
	r.requireDrained()
}

// A state that is not the prefix's does not verify: the engine's check
// would catch a snapshot of another length or another request.
func TestSsmStateOfAnotherLengthIsAMismatch(t *testing.T) {
	r := newRig(t, setup{noSlidingLyr: true, tweak: withSsm(0)})
	rng := rand.New(rand.NewPCG(53, 54))
	prompt := randTokens(rng, 40)
	c := r.active(prompt)
	require.NoError(t, c.Resize(40, 0))
	require.NoError(t, r.e.Step(c, prompt, 0, 40))
	require.NoError(t, c.Resize(40, 32)) // the history says 32: the state is 40's
	v, err := r.e.Verify(c, prompt, 0, 32)
	require.NoError(t, err)
	assert.Positive(t, v.Mismatches)
	require.NotNil(t, v.First)
	assert.Equal(t, int32(3), v.First.Layer, "the SSM layer's state")
	require.NoError(t, c.Resize(40, 40))
	v, err = r.e.Verify(c, prompt, 0, 40)
	require.NoError(t, err)
	assert.Zero(t, v.Mismatches, "first: %v", v.First)
	require.NoError(t, c.Close())
}

// Interleaved requests with preemption, suspension and reuse on a hybrid
// model: every resume verifies the KV and the SSM state the cache holds.
func TestSsmInterleavedScenario(t *testing.T) {
	base := workload{groups: 6, perGroup: 5, system: 120, question: 40, output: 12, scopes: 2}
	runInterleaved(t, scenario{name: "ssm-host-disk", setup: setup{seed: 9, slots: 40, hostSlots: 32, diskSlots: 96,
		window: 48, maxDelay: 20 * time.Microsecond, tweak: withSsm(6), engine: fakeengine.Options{ChunkTokens: 32}},
		workload: base, inFlight: 4})
}

// While live states hold every GPU SSM slot, a request's snapshots are taken
// on the host level (KVCacheManagerV2 tries every level): a later request
// through the prefix resumes from one, and its state and KV verify byte for
// byte.
func TestSsmSnapshotsTakenOnTheHostVerify(t *testing.T) {
	r := newRig(t, setup{slots: 24, hostSlots: 16, noSlidingLyr: true, tweak: withSsm(2),
		engine: fakeengine.Options{ChunkTokens: 32}})
	ssm := r.lgOf(3)
	rng := rand.New(rand.NewPCG(55, 56))
	a := randTokens(rng, 96)
	holder, err := r.e.Start(fakeengine.Request{Prompt: randTokens(rng, 8), OutputLen: 1})
	require.NoError(t, err)
	_, err = holder.Resume(r.stream()) // its state takes one of the two GPU SSM slots
	require.NoError(t, err)
	res, err := r.e.Serve(r.stream(), fakeengine.Request{Prompt: a, OutputLen: 2}) // the other: a's state
	require.NoError(t, err)
	require.Zero(t, res.Final.Mismatches, "first: %v", res.Final.First)
	require.NoError(t, holder.Close())
	st, err := r.m.StorageStats(1)
	require.NoError(t, err)
	require.Positive(t, st[ssm].Total-st[ssm].Free, "a's snapshots are on the host level")
	r.m.GetAndResetSsmSnapshotIterationStats()

	res, err = r.e.Serve(r.stream(), fakeengine.Request{Prompt: concat(a[:80], []config.Token{7}), OutputLen: 2})
	require.NoError(t, err)
	require.Equal(t, 64, res.Reused, "the last snapshot within the prompt: the chunk ending at 64")
	assert.Zero(t, res.Verified.Mismatches, "first: %v", res.Verified.First)
	assert.Equal(t, int64(4+1), res.Verified.PagesVerified, "4 blocks and the SSM state")
	assert.Zero(t, res.Final.Mismatches, "first: %v", res.Final.First)
	assert.Equal(t, int64(1), r.m.GetAndResetSsmSnapshotIterationStats()[ssm].Hits)
	r.requireDrained()
}
