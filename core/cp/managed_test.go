package cp

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core"
	"github.com/kvcm/kvcm/core/blockhash"
	"github.com/kvcm/kvcm/core/config"
	"github.com/kvcm/kvcm/core/layout"
)

func TestManagerBackedScoresWhatIsCachedNow(t *testing.T) {
	r := newRig(t, tinyConfig(64), ManagerBackedOptions{})
	tr := NewTracker(r.m, r.x)
	sys := seq(1000, 16) // 4 blocks
	q := cat(sys, seq(1, 8))

	assert.Zero(t, r.x.PredictPrefixReuse("q", q), "nothing cached yet")
	r.serve(tr, "writer", cat(sys, seq(50, 3)))
	assert.InDelta(t, 16.0/24, r.x.PredictPrefixReuse("q", q), 1e-12,
		"the writer's 4 system blocks stay cached after it finished")
	assert.Equal(t, blockhash.Chain(blockhash.Scope{}, tpb, sys), r.x.GetCPCachedBlocks("q"))

	other := ManagerBackedOptions{ScopeOf: func(string) blockhash.Scope { return blockhash.Scope{LoRAID: 3} }}
	r2 := newRig(t, tinyConfig(64), other)
	r2.serve(NewTracker(r2.m, r2.x), "w", cat(sys, seq(50, 3)))
	assert.Zero(t, r2.x.PredictPrefixReuse("q", q), "scope LoRA 3 sees the blocks of scope LoRA 3 only")
}

// The index computes SHA-256 chains: a manager keying blocks with XXH3 is
// refused, naming block_key, rather than indexed under keys that never match.
func TestManagerBackedRefusesXXH3BlockKeys(t *testing.T) {
	cfg := tinyConfig(64)
	cfg.BlockKey = blockhash.XXH3
	m, x, err := NewManagerWithIndex(cfg, ManagerBackedOptions{})
	assert.Nil(t, m)
	assert.Nil(t, x)
	require.ErrorIs(t, err, config.ErrInvalid)
	var ce *config.Error
	require.ErrorAs(t, err, &ce)
	assert.Equal(t, "block_key", ce.Field)
}

func TestManagerBackedFollowsEvictionOfBlocksThatOutlivedTheirRequest(t *testing.T) {
	r := newRig(t, tinyConfig(8), ManagerBackedOptions{})
	tr := NewTracker(r.m, r.x)
	a := seq(0, 16)
	r.serve(tr, "a", a)
	probe := cat(a, seq(9000, 4))
	require.InDelta(t, 0.8, r.x.PredictPrefixReuse("p", probe), 1e-12)
	g := r.x.Generation()

	r.serve(tr, "b", seq(500, 32)) // needs all 8 pages: evicts a's blocks
	assert.Zero(t, r.x.PredictPrefixReuse("p", probe), "evicted blocks no longer count")
	assert.NotEqual(t, g, r.x.Generation(), "eviction of a watched block changes the generation")
	assert.Zero(t, r.m.ProbeReuse(blockhash.Scope{}, probe), "and the manager agrees")
}

func TestManagerBackedAgreesWithProbeReuseUnderRandomLoad(t *testing.T) {
	r := newRig(t, tinyConfig(40), ManagerBackedOptions{})
	tr := NewTracker(r.m, r.x)
	rng := rand.New(rand.NewPCG(7, 7))
	prefixes := [][]config.Token{seq(0, 12), seq(100, 20), seq(200, 8), seq(300, 16)}
	prompt := func() []config.Token {
		p := prefixes[rng.IntN(len(prefixes))]
		return cat(p[:rng.IntN(len(p)+1)], seq(10000+rng.IntN(50)*10, rng.IntN(9)))
	}
	var open []*TrackedCache
	for i := 0; i < 400; i++ {
		switch {
		case len(open) > 0 && rng.IntN(3) == 0:
			j := rng.IntN(len(open))
			require.NoError(t, open[j].Close())
			open = append(open[:j], open[j+1:]...)
		default:
			p := prompt()
			if len(p) == 0 {
				continue
			}
			c, err := tr.Create(fmt.Sprint("r", i), core.CacheOptions{InputTokens: p})
			require.NoError(t, err)
			require.NoError(t, c.Resume(r.stream))
			if err := c.Resize(len(p), len(p)); err != nil {
				require.ErrorIs(t, err, core.ErrOutOfPages)
				require.NoError(t, c.Close())
				continue
			}
			require.NoError(t, c.Commit(p[c.NumCommittedTokens():], false))
			open = append(open, c)
		}
		q := prompt()
		if len(q) == 0 {
			continue
		}
		want := float64(r.m.ProbeReuse(blockhash.Scope{}, q)) / float64(len(q))
		assert.InDelta(t, want, r.x.PredictPrefixReuse(fmt.Sprint("q", i), q), 1e-12, "step %d", i)
	}
	for _, c := range open {
		require.NoError(t, c.Close())
	}
}

func TestManagerBackedDiscountsColderLevels(t *testing.T) {
	// The GPU-only manager never moves blocks; feed the level-change events
	// a manager with cold tiers emits through the index's listener.
	r := newRig(t, tinyConfig(64), ManagerBackedOptions{LevelWeights: []float64{1, 0.5, 0.25}})
	tr := NewTracker(r.m, r.x)
	sys := seq(0, 8)
	r.serve(tr, "w", sys)
	keys := blockhash.Chain(blockhash.Scope{}, tpb, sys)
	q := cat(sys, seq(77, 8)) // 16 tokens, 2 cached blocks
	require.InDelta(t, 0.5, r.x.PredictPrefixReuse("q", q), 1e-12)

	emit := r.x.Listener()
	emit(core.CacheEvent{Kind: core.BlockUpdated, Key: keys[1], LayerGroup: 0, Level: 1})
	assert.InDelta(t, (4+2)/16.0, r.x.PredictPrefixReuse("q", q), 1e-12, "host block saves half")
	emit(core.CacheEvent{Kind: core.BlockUpdated, Key: keys[0], LayerGroup: 0, Level: 2})
	assert.InDelta(t, (1+2)/16.0, r.x.PredictPrefixReuse("q", q), 1e-12, "disk block saves a quarter")
	lv, ok := r.x.BlockLevels(keys[0])
	require.True(t, ok)
	assert.Equal(t, []int32{int32(layout.CacheLevel(2))}, lv)
	emit(core.CacheEvent{Kind: core.BlockRemoved, Key: keys[0]})
	assert.Zero(t, r.x.PredictPrefixReuse("q", q), "a prefix stops at the first missing block")
}

func TestManagerBackedMemoizesScoresUntilTheirBlocksChange(t *testing.T) {
	r := newRig(t, tinyConfig(64), ManagerBackedOptions{})
	tr := NewTracker(r.m, r.x)
	q := cat(seq(0, 8), seq(100, 4))
	r.x.PredictPrefixReuse("q", q)
	g, n := r.x.Generation(), r.x.ScoreComputations()
	for i := 0; i < 10; i++ {
		r.x.PredictPrefixReuse("q", q)
	}
	r.serve(tr, "unrelated", seq(5000, 16))
	assert.Equal(t, n, r.x.ScoreComputations(), "no event touched q's blocks: served from the memo")
	assert.Equal(t, g, r.x.Generation(), "blocks nobody watches do not change the generation")

	r.serve(tr, "w", seq(0, 8))
	assert.NotEqual(t, g, r.x.Generation(), "q's first block was stored")
	assert.InDelta(t, 8.0/12, r.x.PredictPrefixReuse("q", q), 1e-12)
	assert.Equal(t, n+1, r.x.ScoreComputations())

	r.x.ReleaseScore("q")
	g = r.x.Generation()
	r.x.Listener()(core.CacheEvent{Kind: core.BlockRemoved, Key: blockhash.Chain(blockhash.Scope{}, tpb, q)[0]})
	assert.Equal(t, g, r.x.Generation(), "released requests are not watched")
	assert.Zero(t, r.x.PredictPrefixReuse("q", q), "asking again watches it anew, with a fresh score")
}

func TestManagerBackedPriorityOrdersByScoreAndIsAPermutation(t *testing.T) {
	r := newRig(t, tinyConfig(64), ManagerBackedOptions{})
	tr := NewTracker(r.m, r.x)
	r.serve(tr, "w", seq(0, 16))
	r.x.PredictPrefixReuse("none", seq(900, 9))
	r.x.PredictPrefixReuse("half", cat(seq(0, 8), seq(900, 8)))
	r.x.PredictPrefixReuse("most", cat(seq(0, 16), seq(900, 1)))
	r.x.PredictPrefixReuse("none2", seq(800, 9))
	ids := []string{"none", "half", "unknown", "most", "none2", "half"}
	assert.Equal(t, []string{"most", "half", "half", "none", "unknown", "none2"}, r.x.GetAllocationPriority(ids),
		"highest overlap first; equal scores (and unknown ids, scored 0) keep input order")
	assert.Nil(t, r.x.GetAllocationPriority(nil))
}

func TestManagerBackedNotificationsDoNotDecideWhatIsCached(t *testing.T) {
	r := newRig(t, tinyConfig(64), ManagerBackedOptions{})
	tr := NewTracker(r.m, r.x)
	c := r.open(tr, "w", seq(0, 9))
	keys := c.Keys()
	require.Len(t, keys, 2)
	assert.Equal(t, keys, r.x.GetCPCachedBlocks("w"), "blocks notified allocated and cached")
	require.NoError(t, c.Close()) // terminal free
	assert.Nil(t, r.x.GetCPCachedBlocks("w"), "the request is forgotten")
	assert.InDelta(t, 8.0/12, r.x.PredictPrefixReuse("next", cat(seq(0, 8), seq(50, 4))), 1e-12,
		"but its blocks stay cached: freed is not evicted")

	r.x.NotifyBlocksAllocated("ghost", []blockhash.Key{12345})
	assert.Empty(t, r.x.GetCPCachedBlocks("ghost"), "a notified block the manager never stored is not cached")
}

func TestManagerBackedIsSafeUnderConcurrentUse(t *testing.T) {
	r := newRig(t, tinyConfig(256), ManagerBackedOptions{})
	tr := NewTracker(r.m, r.x)
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; i < 50; i++ {
				id := fmt.Sprint(w, "-", i)
				r.x.PredictPrefixReuse(id, seq(i%5*100, 20))
				r.x.GetAllocationPriority([]string{id, "x"})
				if w%2 == 0 {
					r.serve(tr, id, seq(i%5*100, 12))
				}
				r.x.Generation()
			}
		}(w)
	}
	wg.Wait()
}

func TestManagerBackedWithSeveralLayerGroupsUsesProbeReuse(t *testing.T) {
	cfg := tinyConfig(64)
	cfg.Layers = append(cfg.Layers, config.AttentionLayerConfig{
		LayerID: 1, SlidingWindowSize: 8, Buffers: []config.BufferConfig{{Role: config.RoleKey, Size: 8}},
	})
	cfg.CacheTiers[0].Quota = 64 * 16
	r := newRig(t, cfg, ManagerBackedOptions{})
	require.Equal(t, 2, r.m.NumLayerGroups())
	tr := NewTracker(r.m, r.x)
	p := seq(0, 24)
	r.serve(tr, "w", p)
	for _, q := range [][]config.Token{cat(p, seq(99, 3)), cat(p[:13], seq(99, 5)), seq(0, 9)} {
		want := float64(r.m.ProbeReuse(blockhash.Scope{}, q)) / float64(len(q))
		assert.InDelta(t, want, r.x.PredictPrefixReuse(fmt.Sprint(len(q)), q), 1e-12)
	}
}

// The index scores the prefix the manager would reuse: a prompt cached whole
// counts whole, and the manager's reuse match backoff trims it (to whole
// blocks, the index's unit).
func TestManagerBackedScoresTheWholePromptLessTheBackoff(t *testing.T) {
	for _, tc := range []struct {
		backoff int
		want    float64
	}{{0, 1}, {1, 0.5}, {4, 0.5}, {5, 0}} {
		cfg := tinyConfig(64)
		cfg.ReuseMatchBackoff = tc.backoff
		r := newRig(t, cfg, ManagerBackedOptions{})
		p := seq(0, 8)
		r.serve(NewTracker(r.m, r.x), "w", p)
		assert.InDelta(t, tc.want, r.x.PredictPrefixReuse(fmt.Sprint("q", tc.backoff), p), 1e-12, "backoff %d", tc.backoff)
		want := float64(r.m.ProbeReuse(blockhash.Scope{}, p)/tpb*tpb) / float64(len(p))
		assert.InDelta(t, want, r.x.PredictPrefixReuse(fmt.Sprint("q", tc.backoff), p), 1e-12, "as the manager would reuse")
	}
}

func TestManagerBackedUsesKnownChainsAsIfItHashedThem(t *testing.T) {
	q := cat(seq(0, 16), seq(500, 5))
	chain := blockhash.Chain(blockhash.Scope{}, tpb, q)
	for _, known := range [][]blockhash.Key{nil, chain[:1], chain[:3], chain} {
		r := newRig(t, tinyConfig(64), ManagerBackedOptions{KnownChain: func(string) []blockhash.Key { return known }})
		r.serve(NewTracker(r.m, r.x), "w", seq(0, 12))
		assert.InDelta(t, 12.0/21, r.x.PredictPrefixReuse("q", q), 1e-12, "%d known keys", len(known))
		assert.Equal(t, chain[:3], r.x.GetCPCachedBlocks("q"))
	}
}

// slidingConfig: a full-attention layer and a 4-token sliding-window layer,
// `slots` pages shared by both layer groups.
func slidingConfig(slots int64) config.Config {
	cfg := tinyConfig(slots)
	cfg.Layers = append(cfg.Layers, config.AttentionLayerConfig{
		LayerID: 1, SlidingWindowSize: 4, Buffers: []config.BufferConfig{{Role: config.RoleKey, Size: 8}},
	})
	return cfg
}

func TestManagerBackedFollowsDroppedPagesAndStaysExactUnderSlidingWindows(t *testing.T) {
	r := newRig(t, slidingConfig(24), ManagerBackedOptions{})
	require.Equal(t, 2, r.m.NumLayerGroups())
	tr := NewTracker(r.m, r.x)
	rng := rand.New(rand.NewPCG(11, 3))
	prefixes := [][]config.Token{seq(0, 16), seq(100, 12), seq(200, 20)}
	prompt := func() []config.Token {
		p := prefixes[rng.IntN(len(prefixes))]
		return cat(p[:rng.IntN(len(p)+1)], seq(10000+rng.IntN(40)*10, rng.IntN(6)))
	}
	var open []*TrackedCache
	sawDropped := 0
	for i := 0; i < 500; i++ {
		if len(open) > 0 && (len(open) > 2 || rng.IntN(2) == 0) {
			j := rng.IntN(len(open))
			require.NoError(t, open[j].Close())
			open = append(open[:j], open[j+1:]...)
		} else if p := prompt(); len(p) > 0 {
			c, err := tr.Create(fmt.Sprint("r", i), core.CacheOptions{InputTokens: p})
			require.NoError(t, err)
			require.NoError(t, c.Resume(r.stream))
			if err := c.Resize(len(p), len(p)); err != nil {
				require.ErrorIs(t, err, core.ErrOutOfPages)
				require.NoError(t, c.Close())
			} else {
				require.NoError(t, c.Commit(p[c.NumCommittedTokens():], false))
				open = append(open, c)
			}
		}
		q := prompt()
		if len(q) == 0 {
			continue
		}
		// GPU only: every page the reuse keeps weighs 1, so the score is the
		// manager's reusable full blocks over the prompt.
		want := float64(r.m.ProbeReuse(blockhash.Scope{}, q)/tpb*tpb) / float64(len(q))
		assert.InDelta(t, want, r.x.PredictPrefixReuse(fmt.Sprint("q", i), q), 1e-12, "step %d", i)
		for _, p := range prefixes {
			for _, k := range blockhash.Chain(blockhash.Scope{}, tpb, p) {
				if lv, ok := r.x.BlockLevels(k); ok && slices.Contains(lv, int32(core.DroppedLevel)) {
					sawDropped++
				}
			}
		}
	}
	for _, c := range open {
		require.NoError(t, c.Close())
	}
	assert.Positive(t, sawDropped, "the workload drops single layer groups' pages, and the index sees it")
}

func TestManagerBackedWeighsOnlyThePagesABlockStillHas(t *testing.T) {
	r := newRig(t, slidingConfig(64), ManagerBackedOptions{LevelWeights: []float64{1, 0.5}})
	tr := NewTracker(r.m, r.x)
	sys := seq(0, 8)
	r.serve(tr, "w", sys)
	keys := blockhash.Chain(blockhash.Scope{}, tpb, sys)
	q := cat(sys, seq(77, 8)) // 16 tokens, 2 cached blocks
	require.InDelta(t, 0.5, r.x.PredictPrefixReuse("q", q), 1e-12)

	// Block 0: its full-attention page moves to the host, its windowed page
	// is dropped (reusing 8 tokens never needs it).
	emit := r.x.Listener()
	emit(core.CacheEvent{Kind: core.BlockUpdated, Key: keys[0], LayerGroup: 0, Level: 1})
	assert.InDelta(t, (4*0.75+4)/16.0, r.x.PredictPrefixReuse("q", q), 1e-12, "mean of host and GPU pages")
	emit(core.CacheEvent{Kind: core.BlockUpdated, Key: keys[0], LayerGroup: 1, Level: core.DroppedLevel})
	assert.InDelta(t, (4*0.5+4)/16.0, r.x.PredictPrefixReuse("q", q), 1e-12,
		"the dropped page no longer counts: only the host page is left")
	lv, ok := r.x.BlockLevels(keys[0])
	require.True(t, ok)
	assert.Equal(t, []int32{1, int32(core.DroppedLevel)}, lv)
	emit(core.CacheEvent{Kind: core.BlockStored, Key: keys[0], Parent: 0})
	assert.InDelta(t, 0.5, r.x.PredictPrefixReuse("q", q), 1e-12, "stored again: all pages back on the GPU")
}

// The manager's events alone cannot tell which pages a block has: a cache
// that resizes past a sliding window before committing publishes blocks
// without their windowed pages, announced by a plain BlockStored. This is why
// ManagerBacked still caps the prefix with ProbeReuse for several layer
// groups. If this test fails, core now reports those pages and the probe can
// go.
func TestManagerEventsAloneMissPagesReleasedBeforeCommit(t *testing.T) {
	r := newRig(t, slidingConfig(64), ManagerBackedOptions{})
	p := seq(0, 24)
	c, err := r.m.CreateKVCache(core.CacheOptions{InputTokens: p})
	require.NoError(t, err)
	require.NoError(t, c.Resume(r.stream))
	require.NoError(t, c.Resize(len(p), len(p))) // releases the windowed pages of blocks 0..4
	require.NoError(t, c.Commit(p, false))
	require.NoError(t, c.Close())

	r.events.mu.Lock()
	for _, e := range r.events.evs {
		assert.Equal(t, core.BlockStored, e.Kind, "only stores: nothing says block 1 lacks its windowed page")
		assert.Equal(t, c.ID(), e.CacheID, "each names the committing cache")
	}
	r.events.mu.Unlock()
	q := cat(p[:8], seq(900, 4))
	assert.Less(t, r.m.ProbeReuse(blockhash.Scope{}, q), 8,
		"reusing 8 tokens needs block 1's windowed page, which the cache released before committing")
	assert.InDelta(t, float64(r.m.ProbeReuse(blockhash.Scope{}, q)/tpb*tpb)/12, r.x.PredictPrefixReuse("q", q), 1e-12,
		"the index, probing, agrees with the manager")
}

// A memoized score follows the manager when a later cache fills a windowed
// page an earlier one published without: the generation changes and the score
// equals that of a freshly registered request.
func TestManagerBackedScoreChangesWhenAnEqualBlockFillsAWindowedPage(t *testing.T) {
	r := newRig(t, slidingConfig(64), ManagerBackedOptions{})
	p := seq(0, 24)
	c, err := r.m.CreateKVCache(core.CacheOptions{InputTokens: p})
	require.NoError(t, err)
	require.NoError(t, c.Resume(r.stream))
	require.NoError(t, c.Resize(len(p), len(p))) // releases windowed pages of blocks 0..4
	require.NoError(t, c.Commit(p, false))
	require.NoError(t, c.Close())

	q := cat(p[:8], seq(900, 4))
	before := r.x.PredictPrefixReuse("q", q)
	require.Less(t, r.m.ProbeReuse(blockhash.Scope{}, q), 8)
	g := r.x.Generation()

	// A second cache computes the same 8 tokens chunk by chunk, so it still
	// holds block 1's windowed page when it publishes it.
	c2, err := r.m.CreateKVCache(core.CacheOptions{InputTokens: cat(p[:8], seq(700, 3))})
	require.NoError(t, err)
	require.NoError(t, c2.Resume(r.stream))
	for pos := c2.NumCommittedTokens(); pos < 8; pos += tpb {
		require.NoError(t, c2.Resize(pos+tpb, pos+tpb))
		require.NoError(t, c2.Commit(p[pos:pos+tpb], false))
	}
	require.NoError(t, c2.Close())
	require.Equal(t, 8, r.m.ProbeReuse(blockhash.Scope{}, q), "the manager now reuses 8 tokens")

	fresh := r.x.PredictPrefixReuse("q-fresh", q)
	assert.InDelta(t, 8.0/12, fresh, 1e-12, "a freshly registered request sees the filled page")
	assert.NotEqual(t, g, r.x.Generation(), "an event touched a watched block's pages: generation must change")
	assert.InDelta(t, fresh, r.x.PredictPrefixReuse("q", q), 1e-12,
		"memoized score of q is stale (was %v)", before)
}
