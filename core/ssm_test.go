package core

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core/blockhash"
	"github.com/kvcm/kvcm/core/config"
	"github.com/kvcm/kvcm/core/layout"
)

// ssmConfig: smallConfig's two full-attention layers and one SSM layer
// (a 128-byte state and a 64-byte conv state), with commit_min_snapshot.
func ssmConfig(slots int64) config.Config {
	cfg := smallConfig(slots)
	cfg.SsmLayers = []config.SsmLayerConfig{{LayerID: 2, Buffers: []config.BufferConfig{
		{Role: "ssm_state", Size: 128}, {Role: "conv_state", Size: 64},
	}}}
	cfg.CommitMinSnapshot = true
	return cfg
}

// ssmState is the location of the SSM layer's state buffer.
func (f *fixture) ssmState() BufferLocation {
	f.t.Helper()
	loc, err := f.m.Buffer(2, "ssm_state")
	require.NoError(f.t, err)
	return loc
}

// liveState returns the cache's SSM state slot.
func liveState(t *testing.T, c *KVCache) int32 {
	t.Helper()
	s, err := c.SsmBlockBaseIndex(c.m.Layout().SSM)
	require.NoError(t, err)
	require.NotEqual(t, BadPageIndex, s, "an ACTIVE cache has its SSM state")
	return s
}

// SSM layers need commit_min_snapshot, their states take no
// tokens_per_block_override, and bad SSM fields are named.
func TestSsmConfigurationErrorsNameTheField(t *testing.T) {
	cases := map[string]func(*config.Config){
		"commit_min_snapshot":           func(c *config.Config) { c.CommitMinSnapshot = false },
		"ssm_layers[0].layer_id":        func(c *config.Config) { c.SsmLayers[0].LayerID = 1 },
		"ssm_layers[0].buffers":         func(c *config.Config) { c.SsmLayers[0].Buffers = nil },
		"ssm_layers[0].buffers[1].role": func(c *config.Config) { c.SsmLayers[0].Buffers[1].Role = "ssm_state" },
		"ssm_layers[0].buffers[0].size": func(c *config.Config) { c.SsmLayers[0].Buffers[0].Size = 0 },
		"ssm_layers[0].buffers[0].tokens_per_block_override": func(c *config.Config) {
			c.SsmLayers[0].Buffers[0].TokensPerBlockOverride = 2 // divides tokens_per_block: fine for a layer
		},
		"max_ssm_slots":               func(c *config.Config) { c.MaxSsmSlots = -1 },
		"max_ssm_slots (without SSM)": func(c *config.Config) { c.SsmLayers, c.MaxSsmSlots = nil, 4 },
	}
	for name, mutate := range cases {
		t.Run(name, func(t *testing.T) {
			cfg := ssmConfig(64)
			mutate(&cfg)
			err := cfg.Validate(layout.NumLifeCycles(&cfg))
			require.ErrorIs(t, err, config.ErrInvalid)
			var ce *config.Error
			require.ErrorAs(t, err, &ce)
			field := name
			if i := len("max_ssm_slots"); len(name) > i && name[:i] == "max_ssm_slots" {
				field = "max_ssm_slots"
			}
			assert.Equal(t, field, ce.Field)
		})
	}
}

// The SSM layers form one layer group after the attention ones, with a hot
// pool group of its own even where its slot layout equals another's, and no
// page per block: an ACTIVE cache holds one SSM state whatever its length.
func TestSsmLayerGroupHoldsOneStatePerCache(t *testing.T) {
	cfg := ssmConfig(64)
	cfg.SsmLayers[0].Buffers = []config.BufferConfig{{Role: "ssm_state", Size: 128}, {Role: "conv_state", Size: 128}}
	f := newFixture(t, cfg)
	lt := f.m.Layout()
	require.Len(t, lt.LifeCycles, 2)
	assert.Equal(t, layout.LayerGroupID(1), lt.SSM)
	assert.True(t, lt.LifeCycles[1].Window.SSM)
	assert.Equal(t, []int32{2}, lt.LifeCycles[1].Layers)
	require.Len(t, lt.Levels[0].Groups, 2, "equal slot bytes, yet a pool group of its own")

	c, err := f.m.CreateKVCache(CacheOptions{InputTokens: seq(0, 10)})
	require.NoError(t, err)
	_, err = c.SsmBlockBaseIndex(lt.SSM)
	require.ErrorIs(t, err, ErrInvalidState, "a SUSPENDED cache has no GPU slot to report")
	require.NoError(t, c.Resume(f.stream))
	require.NoError(t, c.Resize(10, 10))
	liveState(t, c)
	idx, err := c.BasePageIndices(lt.SSM)
	require.NoError(t, err)
	assert.Equal(t, []int32{BadPageIndex, BadPageIndex, BadPageIndex}, idx, "no page per block")
	attn, err := c.SsmBlockBaseIndex(0)
	require.NoError(t, err)
	assert.Equal(t, BadPageIndex, attn, "an attention layer group has no SSM state")
	_, err = c.SsmBlockBaseIndex(2)
	require.ErrorIs(t, err, ErrInvalidArgument)
	assert.Equal(t, []int{3 + 1}, c.Residency(), "three KV pages and one state")
	require.NoError(t, c.Resize(40, 40))
	assert.Equal(t, []int{10 + 1}, c.Residency(), "still one state")
	require.NoError(t, c.Close())
}

// A model of SSM layers only (no attention layer: KVCacheManagerV2's pure
// SSM configuration) is valid: its one layer group is the SSM group, every
// block reads BadPageIndex, and a snapshot at a block boundary is reused
// byte for byte by a later prompt through it, also after the first cache
// was suspended and resumed.
func TestSsmOnlyModelReusesItsSnapshots(t *testing.T) {
	cfg := ssmConfig(64)
	cfg.Layers = nil
	f := newFixture(t, cfg)
	lt := f.m.Layout()
	require.Len(t, lt.LifeCycles, 1)
	assert.Equal(t, layout.LayerGroupID(0), lt.SSM)
	loc, prompt := f.ssmState(), seq(0, 16)
	a, err := f.m.CreateKVCache(CacheOptions{InputTokens: prompt})
	require.NoError(t, err)
	require.NoError(t, a.Resume(f.stream))
	at8 := f.computeTo(a, prompt, 8, 7)
	idx, err := a.BasePageIndices(lt.SSM)
	require.NoError(t, err)
	assert.Equal(t, []int32{BadPageIndex, BadPageIndex}, idx, "no page per block")
	require.NoError(t, a.Suspend())
	require.NoError(t, a.Resume(f.stream))
	assert.Equal(t, at8, f.readPage(loc, liveState(t, a)), "the state survives suspend and resume")

	assert.Equal(t, 8, f.m.ProbeReuse(blockhash.Scope{}, prompt[:14]))
	b, err := f.m.CreateKVCache(CacheOptions{InputTokens: prompt[:14]})
	require.NoError(t, err)
	assert.Equal(t, 8, b.ReusedTokens(), "reuse ends at the snapshot")
	require.NoError(t, b.Resume(f.stream))
	assert.NotEqual(t, liveState(t, a), liveState(t, b), "a private state")
	assert.Equal(t, at8, f.readPage(loc, liveState(t, b)), "the state at 8 tokens")
	require.NoError(t, a.Close())
	require.NoError(t, b.Close())
}

// computeTo brings c to n committed tokens of prompt as an engine would: grow,
// compute (here: write the SSM state with seed), commit.
func (f *fixture) computeTo(c *KVCache, prompt []config.Token, n int, seed byte) []byte {
	f.t.Helper()
	require.NoError(f.t, c.Resize(max(n, c.Capacity()), -1))
	state := f.fillPage(f.ssmState(), liveState(f.t, c), seed)
	require.NoError(f.t, c.Commit(prompt[c.NumCommittedTokens():n], false))
	return state
}

// A Commit that ends on a block boundary snapshots the SSM state into that
// block; a later prompt through it reuses the blocks up to there and starts
// from a private copy of the snapshot, byte for byte, while the first cache's
// state stays its own.
func TestSsmSnapshotAtBlockBoundaryIsReusedByteForByte(t *testing.T) {
	f := newFixture(t, ssmConfig(64))
	loc, prompt := f.ssmState(), seq(0, 16)
	a, err := f.m.CreateKVCache(CacheOptions{InputTokens: prompt})
	require.NoError(t, err)
	require.NoError(t, a.Resume(f.stream))
	at8 := f.computeTo(a, prompt, 8, 7)
	f.computeTo(a, prompt, 10, 99) // the first cache moves on, mid-block

	b, err := f.m.CreateKVCache(CacheOptions{InputTokens: prompt[:14]})
	require.NoError(t, err)
	assert.Equal(t, 8, b.ReusedTokens(), "reuse ends at the snapshot, block 2's end")
	require.NoError(t, b.Resume(f.stream))
	assert.NotEqual(t, liveState(t, a), liveState(t, b), "a private state")
	assert.Equal(t, at8, f.readPage(loc, liveState(t, b)), "the state at 8 tokens")
	f.fillPage(loc, liveState(t, b), 42)
	assert.NotEqual(t, at8, f.readPage(loc, liveState(t, a)), "writing one state leaves the other")
	require.NoError(t, a.Close())
	require.NoError(t, b.Close())
}

// Reuse stops at the deepest block holding a snapshot: a Commit of several
// blocks snapshots only the last one, a Commit ending mid-block none, and a
// prompt that matches blocks without a snapshot reuses none of them.
func TestSsmReuseEndsAtTheLastSnapshot(t *testing.T) {
	f := newFixture(t, ssmConfig(64))
	prompt := seq(0, 24)
	a, err := f.m.CreateKVCache(CacheOptions{InputTokens: prompt})
	require.NoError(t, err)
	require.NoError(t, a.Resume(f.stream))
	f.computeTo(a, prompt, 12, 1) // blocks 0-2 in one Commit: a snapshot at 12
	f.computeTo(a, prompt, 18, 2) // blocks 3 and half of 4: no snapshot
	require.NoError(t, a.Close())
	for _, c := range []struct{ prompt, reused int }{{24, 12}, {16, 12}, {12, 12}, {11, 0}, {8, 0}} {
		assert.Equal(t, c.reused, f.m.ProbeReuse(blockhash.Scope{}, prompt[:c.prompt]), "prompt of %d tokens", c.prompt)
	}
	c, err := f.m.CreateKVCache(CacheOptions{InputTokens: prompt[:20]})
	require.NoError(t, err)
	assert.Equal(t, ReuseDiagnostics{ContentTokens: 16, AttentionTokens: 16}, c.ReuseDiagnostics(),
		"16 tokens match and are usable; the SSM snapshot cuts reuse to 12")
	assert.Equal(t, 12, c.ReusedTokens())
	require.NoError(t, c.Close())
	// The backoff applies to the content match (16 tokens describe 15
	// positions): the last snapshot within them is at 12; a content match
	// of 12 tokens describes 11, with no snapshot.
	f.m.cfg.ReuseMatchBackoff = 1
	assert.Equal(t, 12, f.m.ProbeReuse(blockhash.Scope{}, prompt))
	assert.Equal(t, 0, f.m.ProbeReuse(blockhash.Scope{}, prompt[:12]), "backing off one token leaves no snapshot")
}

// Every cache created with input tokens counts one SSM snapshot lookup: a
// hit (aligned: on a block boundary) when it reused a snapshot, with its
// reused and unreused tokens. As in KVCacheManagerV2 the lookup is pending in
// the cache: CommitPendingStats counts it, DiscardPendingStats and Close drop
// it; the getter resets the counters.
func TestSsmSnapshotStatsCountLookups(t *testing.T) {
	f := newFixture(t, ssmConfig(64))
	prompt := seq(0, 16)
	a, err := f.m.CreateKVCache(CacheOptions{InputTokens: prompt})
	require.NoError(t, err)
	assert.Empty(t, f.m.SsmSnapshotIterationStats(), "pending in the cache")
	a.CommitPendingStats()
	require.NoError(t, a.Resume(f.stream))
	f.computeTo(a, prompt, 8, 1)
	require.NoError(t, a.Close())
	b, err := f.m.CreateKVCache(CacheOptions{InputTokens: prompt[:10]})
	require.NoError(t, err)
	b.CommitPendingStats()
	require.NoError(t, b.Close())
	c, err := f.m.CreateKVCache(CacheOptions{})
	require.NoError(t, err)
	c.CommitPendingStats()
	require.NoError(t, c.Close())
	d, err := f.m.CreateKVCache(CacheOptions{InputTokens: prompt})
	require.NoError(t, err)
	d.DiscardPendingStats()
	d.CommitPendingStats()
	require.NoError(t, d.Close())
	e, err := f.m.CreateKVCache(CacheOptions{InputTokens: prompt})
	require.NoError(t, err)
	require.NoError(t, e.Close())

	got := f.m.GetAndResetSsmSnapshotIterationStats()
	want := SsmSnapshotStats{Lookups: 2, Hits: 1, Misses: 1, ReusedTokens: 8, UnreusedTokens: 16 + 2, AlignedHits: 1}
	assert.Equal(t, map[layout.LayerGroupID]SsmSnapshotStats{1: want}, got, "discarded and closed lookups do not count")
	assert.InDelta(t, 0.5, got[1].HitRate(), 1e-9)
	assert.Empty(t, f.m.GetAndResetSsmSnapshotIterationStats(), "reset")
	assert.Empty(t, newFixture(t, smallConfig(16)).m.GetAndResetSsmSnapshotIterationStats(), "no SSM layers")
}

// MaxSsmSlots caps the SSM pool group's GPU slots; the bytes it leaves go to
// the attention layer groups. A snapshot that finds no GPU slot, and no
// colder level, is not taken.
func TestMaxSsmSlotsCapsTheSsmPoolGroup(t *testing.T) {
	cfg := ssmConfig(64)
	uncapped := newFixture(t, cfg)
	st, err := uncapped.m.StorageStats(layout.GPULevel)
	require.NoError(t, err)
	require.Len(t, st, 2)
	require.Greater(t, st[1].Total, int64(2))

	cfg.MaxSsmSlots, cfg.MaxUtilForResume = 2, 1
	f := newFixture(t, cfg)
	capped, err := f.m.StorageStats(layout.GPULevel)
	require.NoError(t, err)
	assert.Equal(t, int64(2), capped[1].Total)
	assert.Greater(t, capped[0].Total, st[0].Total, "the attention group gets the rest")

	prompt := seq(0, 16)
	a, err := f.m.CreateKVCache(CacheOptions{InputTokens: prompt})
	require.NoError(t, err)
	require.NoError(t, a.Resume(f.stream))
	f.computeTo(a, prompt, 4, 1) // snapshot: slot 2 of 2
	f.computeTo(a, prompt, 8, 2) // the first snapshot is evicted for it (no colder level: dropped)
	b, err := f.m.CreateKVCache(CacheOptions{InputTokens: seq(50, 16)})
	require.NoError(t, err)
	require.NoError(t, b.Resume(f.stream), "the second state takes the last snapshot's place")
	c, err := f.m.CreateKVCache(CacheOptions{InputTokens: prompt})
	require.NoError(t, err)
	require.ErrorIs(t, c.Resume(f.stream), ErrOutOfPages, "two live states fill the capped group")
	require.NoError(t, c.Close())
	f.computeTo(a, prompt, 12, 3)
	assert.Equal(t, 0, f.m.ProbeReuse(blockhash.Scope{}, prompt[:12]), "no slot for a snapshot at 12")
	for _, x := range []*KVCache{a, b} {
		require.NoError(t, x.Close())
	}

	// Zero-capacity requests hold only their states (KVCacheManagerV2's
	// hybrid floors).
	cfg.Constraints = []config.BatchDesc{{Requests: []config.RequestDesc{{}, {}, {}}}}
	_, err = NewManager(cfg, WithDevice(f.dev))
	var ce *config.Error
	require.ErrorAs(t, err, &ce, "a cap below the states the constraints need")
	assert.Equal(t, "max_ssm_slots", ce.Field)
	cfg.MaxSsmSlots = 3
	m, err := NewManager(cfg, WithDevice(f.dev))
	require.NoError(t, err)
	require.NoError(t, m.Close())
}

// An SSM state is a page of one more layer group: a suspended cache's state
// and the tree's snapshots are evicted to the host and disk levels through
// the codec and come back byte for byte.
func TestSsmStatesTravelThroughHostAndDisk(t *testing.T) {
	cfg := tieredConfig(t, 8, 2, 64)
	cfg.SsmLayers = ssmConfig(0).SsmLayers
	cfg.CommitMinSnapshot = true
	cfg.MaxSsmSlots = 2
	f := newTieredFixture(t, cfg)
	loc := f.ssmState()
	prompt := seq(0, 8)
	a, err := f.m.CreateKVCache(CacheOptions{InputTokens: prompt})
	require.NoError(t, err)
	require.NoError(t, a.Resume(f.stream))
	snap := f.computeTo(a, prompt, 8, 5)
	live := f.fillPage(loc, liveState(t, a), 6)
	require.NoError(t, a.Suspend())

	// Other requests take the GPU's SSM slots: a's state and the snapshot
	// leave the GPU level.
	var others []*KVCache
	for i := range 2 {
		o, err := f.m.CreateKVCache(CacheOptions{InputTokens: seq(100*(i+1), 4)})
		require.NoError(t, err)
		require.NoError(t, o.Resume(f.stream))
		f.fillPage(loc, liveState(t, o), byte(100+i)) // no GPU SSM slot keeps a's bytes
		others = append(others, o)
	}
	res := a.Residency()
	assert.Equal(t, 2, res[0], "a's KV pages stayed on the GPU")
	assert.Equal(t, 1, res[1]+res[2], "a's state left it")
	t.Logf("a's residency by level: %v", res)
	for _, o := range others {
		require.NoError(t, o.Close())
	}

	require.NoError(t, a.Resume(f.stream))
	assert.Equal(t, live, f.readPage(loc, liveState(t, a)), "a's live state came back")
	b, err := f.m.CreateKVCache(CacheOptions{InputTokens: prompt})
	require.NoError(t, err)
	assert.Equal(t, 8, b.ReusedTokens())
	require.NoError(t, a.Close())
	require.NoError(t, b.Resume(f.stream))
	assert.Equal(t, snap, f.readPage(loc, liveState(t, b)), "the snapshot came back")
	require.NoError(t, b.Close())
}

// Suspend keeps the SSM state: resuming without pressure finds it in the
// same GPU slot with the same bytes (KVCacheManagerV2's suspend/resume test).
func TestSsmStateSurvivesSuspendAndResume(t *testing.T) {
	f := newFixture(t, ssmConfig(64))
	c, err := f.m.CreateKVCache(CacheOptions{})
	require.NoError(t, err)
	require.NoError(t, c.Resume(f.stream))
	require.NoError(t, c.Resize(100, 0))
	slot := liveState(t, c)
	state := f.fillPage(f.ssmState(), slot, 3)
	c.StopCommitting()
	require.NoError(t, c.Suspend())
	require.NoError(t, c.Resume(f.stream))
	assert.Equal(t, slot, liveState(t, c), "the same slot")
	assert.Equal(t, state, f.readPage(f.ssmState(), slot))
	require.NoError(t, c.Close())
	st, err := f.m.StorageStats(layout.GPULevel)
	require.NoError(t, err)
	assert.Equal(t, st[1].Total, st[1].Free, "a closed cache's state is freed")
}

// With SSM layers a Commit starts or ends at the history length (the one
// state is the history's): a commit ending short of a history that passed it
// fails, naming tokens, and changes nothing; one ending at it snapshots the
// history's state.
func TestSsmCommitStartsOrEndsAtTheHistory(t *testing.T) {
	f := newFixture(t, ssmConfig(64))
	prompt := seq(0, 16)
	c, err := f.m.CreateKVCache(CacheOptions{InputTokens: prompt})
	require.NoError(t, err)
	require.NoError(t, c.Resume(f.stream))
	require.NoError(t, c.Resize(12, 10))
	f.fillPage(f.ssmState(), liveState(t, c), 10)

	err = c.Commit(prompt[:8], false)
	require.ErrorIs(t, err, ErrInvalidArgument, "the state is 10 tokens', not 8's")
	assert.ErrorContains(t, err, "tokens: ")
	assert.Zero(t, c.NumCommittedTokens(), "a failed commit changes nothing")
	assert.Zero(t, f.m.ProbeReuse(blockhash.Scope{}, prompt), "and snapshots nothing")

	require.NoError(t, c.Commit(prompt[:10], false), "ending at the history")
	assert.Zero(t, f.m.ProbeReuse(blockhash.Scope{}, prompt), "mid-block: no snapshot")
	require.NoError(t, c.Resize(12, 12))
	at12 := f.fillPage(f.ssmState(), liveState(t, c), 12)
	require.ErrorIs(t, c.Commit(prompt[10:11], false), ErrInvalidArgument, "from 10 to 11 of a history of 12")
	require.NoError(t, c.Commit(prompt[10:12], false), "from 10 to the history")
	b, err := f.m.CreateKVCache(CacheOptions{InputTokens: prompt[:14]})
	require.NoError(t, err)
	assert.Equal(t, 12, b.ReusedTokens())
	require.NoError(t, b.Resume(f.stream))
	assert.Equal(t, at12, f.readPage(f.ssmState(), liveState(t, b)), "the history's state at 12")
	require.NoError(t, b.Close())
	require.NoError(t, c.Resize(16, -1))
	require.NoError(t, c.Commit(prompt[12:16], false), "from the history on")
	require.NoError(t, c.Close())
}

// ssmPartialConfig is ssmConfig with partial reuse.
func ssmPartialConfig(slots int64) config.Config {
	cfg := ssmConfig(slots)
	cfg.EnablePartialReuse = true
	return cfg
}

// A cache that closes with its committed tokens ending mid-block publishes
// that partial block with the SSM state at its end (its own state, which it
// gives up): a later prompt holding the whole block reuses up to its end
// (an unaligned hit) and resumes from that state byte for byte; a prompt
// ending inside it falls back to the last full block with a snapshot.
func TestSsmPartialBlockIsPublishedWithItsStateAtClose(t *testing.T) {
	f := newFixture(t, ssmPartialConfig(64))
	loc, prompt := f.ssmState(), seq(0, 16)
	a, err := f.m.CreateKVCache(CacheOptions{InputTokens: prompt})
	require.NoError(t, err)
	require.NoError(t, a.Resume(f.stream))
	f.computeTo(a, prompt, 8, 1)
	at10 := f.computeTo(a, prompt, 10, 2)
	require.NoError(t, a.Close())
	f.m.GetAndResetSsmSnapshotIterationStats()

	b, err := f.m.CreateKVCache(CacheOptions{InputTokens: prompt[:14]})
	require.NoError(t, err)
	assert.Equal(t, 10, b.ReusedTokens(), "up to the partial block's end")
	assert.Equal(t, ReuseDiagnostics{ContentTokens: 10, AttentionTokens: 10}, b.ReuseDiagnostics())
	require.NoError(t, b.Resume(f.stream))
	assert.Equal(t, at10, f.readPage(loc, liveState(t, b)), "the state at 10 tokens")
	b.CommitPendingStats()
	require.NoError(t, b.Close())
	st := f.m.GetAndResetSsmSnapshotIterationStats()[f.m.Layout().SSM]
	assert.Equal(t, SsmSnapshotStats{Lookups: 1, Hits: 1, ReusedTokens: 10, UnreusedTokens: 4, UnalignedHits: 1}, st)

	assert.Equal(t, 10, f.m.ProbeReuse(blockhash.Scope{}, prompt[:10]), "the whole input")
	assert.Equal(t, 8, f.m.ProbeReuse(blockhash.Scope{}, append(seq(0, 9), 99)), "the state is at 10, not 9")
	c, err := f.m.CreateKVCache(CacheOptions{InputTokens: append(seq(0, 9), 99)})
	require.NoError(t, err)
	assert.Equal(t, ReuseDiagnostics{ContentTokens: 9, AttentionTokens: 9}, c.ReuseDiagnostics(),
		"the attention pages match 9 tokens; the SSM state cuts reuse to 8")
	require.NoError(t, c.Close())
	require.NoError(t, f.m.CheckInvariants())
}

// Without partial reuse the partial block is published all the same, and a
// prompt reuses it only when it ends with it (KVCacheManagerV2: partial
// snapshots are created, partial prompt reuse stays optional).
func TestSsmPartialBlockWithoutPartialReuseMatchesOnlyAtTheInputsEnd(t *testing.T) {
	f := newFixture(t, ssmConfig(64))
	loc, prompt := f.ssmState(), seq(0, 16)
	a, err := f.m.CreateKVCache(CacheOptions{InputTokens: prompt})
	require.NoError(t, err)
	require.NoError(t, a.Resume(f.stream))
	f.computeTo(a, prompt, 8, 1)
	at10 := f.computeTo(a, prompt, 10, 2)
	require.NoError(t, a.Close())
	assert.Equal(t, 8, f.m.ProbeReuse(blockhash.Scope{}, prompt[:14]), "the input goes on: the snapshot at 8")
	b, err := f.m.CreateKVCache(CacheOptions{InputTokens: prompt[:10]})
	require.NoError(t, err)
	assert.Equal(t, 10, b.ReusedTokens(), "the input ends with the partial block")
	require.NoError(t, b.Resume(f.stream))
	assert.Equal(t, at10, f.readPage(loc, liveState(t, b)))
	require.NoError(t, b.Close())
}

// A partial block keeps the state of the cache's last commit only (one
// cache's earlier endpoints in the same block are gone: their state moved
// on), and only when the history is still the committed tokens when the
// cache closes.
func TestSsmPartialBlockKeepsOnlyTheLastCommitsState(t *testing.T) {
	f := newFixture(t, ssmPartialConfig(64))
	prompt := seq(0, 16)
	a, err := f.m.CreateKVCache(CacheOptions{InputTokens: prompt})
	require.NoError(t, err)
	require.NoError(t, a.Resume(f.stream))
	f.computeTo(a, prompt, 8, 1)
	f.computeTo(a, prompt, 9, 2)
	f.computeTo(a, prompt, 10, 3)
	require.NoError(t, a.Close())
	assert.Equal(t, 8, f.m.ProbeReuse(blockhash.Scope{}, append(seq(0, 9), 99)), "no state at 9")
	assert.Equal(t, 10, f.m.ProbeReuse(blockhash.Scope{}, prompt))

	other := seq(100, 16)
	c, err := f.m.CreateKVCache(CacheOptions{InputTokens: other})
	require.NoError(t, err)
	require.NoError(t, c.Resume(f.stream))
	f.computeTo(c, other, 10, 4)
	require.NoError(t, c.Resize(12, 12)) // computed on past the committed tokens
	require.NoError(t, c.Close())
	assert.Zero(t, f.m.ProbeReuse(blockhash.Scope{}, other), "no state at 10 is left")
	require.NoError(t, f.m.CheckInvariants())
}

// A cache whose commits stop (is_end, StopCommitting) on a partial block
// while it may compute on keeps a copy of the state at the committed length,
// and the partial block published at close gets that copy, not the state
// the cache moved on to.
func TestSsmStoppedCommitsKeepTheStateOfTheCommittedTokens(t *testing.T) {
	for _, stop := range []string{"is_end", "StopCommitting"} {
		t.Run(stop, func(t *testing.T) {
			f := newFixture(t, ssmPartialConfig(64))
			loc, prompt := f.ssmState(), seq(0, 16)
			a, err := f.m.CreateKVCache(CacheOptions{InputTokens: prompt})
			require.NoError(t, err)
			require.NoError(t, a.Resume(f.stream))
			require.NoError(t, a.Resize(10, -1))
			at10 := f.fillPage(loc, liveState(t, a), 5)
			if stop == "is_end" {
				require.NoError(t, a.Commit(prompt[:10], true))
			} else {
				require.NoError(t, a.Commit(prompt[:10], false))
				a.StopCommitting()
			}
			require.NoError(t, f.m.CheckInvariants())
			require.NoError(t, a.Resize(13, 13))
			f.fillPage(loc, liveState(t, a), 6) // generation moves the state on
			require.NoError(t, a.Suspend())
			require.NoError(t, a.Close())

			b, err := f.m.CreateKVCache(CacheOptions{InputTokens: prompt})
			require.NoError(t, err)
			assert.Equal(t, 10, b.ReusedTokens())
			require.NoError(t, b.Resume(f.stream))
			assert.Equal(t, at10, f.readPage(loc, liveState(t, b)), "the state at the committed 10 tokens")
			require.NoError(t, b.Close())
			require.NoError(t, f.m.CheckInvariants())
		})
	}
}

// A final commit (is_end) that fills the cache's capacity leaves it nothing to
// compute on without a Resize, so the partial block it publishes takes the
// cache's own SSM state at close, no copy: the block's snapshot is the slot
// the cache held, as KVCacheManagerV2 moves live pages into the tree at a
// final partial commit.
func TestSsmFinalCommitAtCapacityGivesTheCachesOwnState(t *testing.T) {
	f := newFixture(t, ssmPartialConfig(64))
	loc, prompt := f.ssmState(), seq(0, 16)
	a, err := f.m.CreateKVCache(CacheOptions{})
	require.NoError(t, err)
	require.NoError(t, a.Resume(f.stream))
	require.NoError(t, a.Resize(10, 10))
	slot := liveState(t, a)
	at10 := f.fillPage(loc, slot, 7)
	require.NoError(t, a.Commit(prompt[:10], true))
	require.NoError(t, f.m.CheckInvariants())
	require.NoError(t, a.Close())

	n, pages, err := f.m.ReusePages(blockhash.Scope{}, prompt[:10], f.m.Layout().SSM, true)
	require.NoError(t, err)
	require.Equal(t, 10, n)
	require.Len(t, pages, 3, "two full blocks of 4 tokens and the partial one")
	assert.Equal(t, ReusePage{Matched: 2, Covered: 2, Level: 0, Slot: slot}, pages[2],
		"the partial block's snapshot is the cache's own state slot")
	b, err := f.m.CreateKVCache(CacheOptions{InputTokens: prompt[:10]})
	require.NoError(t, err)
	assert.Equal(t, 10, b.ReusedTokens())
	require.NoError(t, b.Resume(f.stream))
	assert.Equal(t, at10, f.readPage(loc, liveState(t, b)), "the state at the committed 10 tokens")
	require.NoError(t, b.Close())
	require.NoError(t, f.m.CheckInvariants())
}

// A snapshot that finds no GPU slot is taken on the first colder level with
// room (KVCacheManagerV2 tries every level): the state is encoded there
// through the codec, after the work that wrote it, and a later prompt
// through the block resumes from it byte for byte.
func TestSsmSnapshotWithoutAGpuSlotIsTakenOnAColderLevel(t *testing.T) {
	for _, cold := range []string{"host", "disk"} {
		t.Run(cold, func(t *testing.T) {
			cfg := tieredConfig(t, 8, 0, 64)
			level := layout.CacheLevel(1)
			if cold == "host" {
				cfg = tieredConfig(t, 8, 64, 0)
			}
			cfg.SsmLayers = ssmConfig(0).SsmLayers
			cfg.CommitMinSnapshot = true
			cfg.MaxSsmSlots = 2
			f := newTieredFixture(t, cfg)
			loc, prompt := f.ssmState(), seq(0, 16)
			ssm := f.m.Layout().SSM
			a, err := f.m.CreateKVCache(CacheOptions{InputTokens: prompt})
			require.NoError(t, err)
			require.NoError(t, a.Resume(f.stream))
			b, err := f.m.CreateKVCache(CacheOptions{InputTokens: seq(100, 4)})
			require.NoError(t, err)
			require.NoError(t, b.Resume(f.stream)) // the two live states fill the GPU's SSM slots
			at8 := f.computeTo(a, prompt, 8, 5)
			f.fillPage(loc, liveState(t, a), 6) // a moves on: the copy was taken before
			st, err := f.m.StorageStats(level)
			require.NoError(t, err)
			assert.Equal(t, int64(1), st[ssm].Total-st[ssm].Free, "the snapshot is on the %s level", cold)
			assert.Equal(t, 8, f.m.ProbeReuse(blockhash.Scope{}, prompt[:12]))
			require.NoError(t, f.m.CheckInvariants())
			require.NoError(t, b.Close())
			require.NoError(t, a.Close()) // room for the snapshot and a new state

			c, err := f.m.CreateKVCache(CacheOptions{InputTokens: prompt[:12]})
			require.NoError(t, err)
			assert.Equal(t, 8, c.ReusedTokens())
			require.NoError(t, c.Resume(f.stream))
			assert.Equal(t, at8, f.readPage(loc, liveState(t, c)), "the state at 8 tokens, back from the %s level", cold)
			require.NoError(t, c.Close())
			require.NoError(t, f.m.CheckInvariants())
		})
	}
}

// The first Resume's copy of a reused snapshot into the cache's own state
// counts at once as one intra-device copy of the SSM layer group in the
// iteration statistics (KVCacheManagerV2's deferred copy); a fresh state
// copies nothing.
func TestSsmSnapshotCopyAtResumeCountsAsAnIntraDeviceCopy(t *testing.T) {
	f := newFixture(t, ssmConfig(64))
	prompt := seq(0, 12)
	a, err := f.m.CreateKVCache(CacheOptions{InputTokens: prompt})
	require.NoError(t, err)
	require.NoError(t, a.Resume(f.stream))
	f.computeTo(a, prompt, 8, 1)
	require.NoError(t, a.Close())
	ssm := f.m.Layout().SSM
	b, err := f.m.CreateKVCache(CacheOptions{InputTokens: prompt})
	require.NoError(t, err)
	require.Equal(t, 8, b.ReusedTokens())
	f.m.GetAndResetLayerGroupIterationStats()
	require.NoError(t, b.Resume(f.stream))
	st := f.m.GetAndResetLayerGroupIterationStats()[ssm]
	assert.Equal(t, int64(1), st.IntraDeviceCopyBlocks)
	assert.Equal(t, int64(128+64), st.IntraDeviceCopyBytes, "the state's bytes")
	require.NoError(t, b.Close())
	c, err := f.m.CreateKVCache(CacheOptions{})
	require.NoError(t, err)
	require.NoError(t, c.Resume(f.stream))
	assert.Zero(t, f.m.GetAndResetLayerGroupIterationStats()[ssm].IntraDeviceCopyBlocks, "a fresh state")
	require.NoError(t, c.Close())
}
