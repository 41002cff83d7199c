package cp

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core"
	"github.com/kvcm/kvcm/core/blockhash"
	"github.com/kvcm/kvcm/core/config"
)

// A cache that resizes past the sliding window before committing publishes
// block 1 without its windowed page (a plain BlockStored: the mirror sets
// every page to level 0). A later cache publishing an equal block fills the
// missing page and core DOES emit BlockUpdated(level 0) for it — but the
// mirror already believes the page is on level 0, so drain() hits the
// "b.levels[lg] == lv → continue" shortcut, never marks the watchers dirty
// and never bumps the generation. The memoized score stays stale although
// ProbeReuse (and a freshly registered request) now sees the longer reuse.
func TestRegressionMemoStaleWhenEqualBlockFillsWindowedPage(t *testing.T) {
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

// Delegating "never lets the external index break scheduling", and it
// already clones the ids it hands to GetAllocationPriority, but it hands the
// caller's token slice to the external PredictPrefixReuse as is: an external
// index that scribbles on it corrupts the prompt the scheduler keeps (and the
// simulator later creates the KV cache from).
func TestRegressionDelegatingShieldsCallerTokensFromExternalIndex(t *testing.T) {
	d := NewDelegating(External{
		PredictPrefixReuse: func(_ string, tokens []config.Token) (float64, error) {
			for i := range tokens {
				tokens[i] = -1
			}
			return 0.5, nil
		},
	}, DelegatingOptions{})
	prompt := seq(1, 8)
	d.PredictPrefixReuse("r", prompt)
	assert.Equal(t, seq(1, 8), prompt, "the caller's prompt must not be modified through the adapter")
}

// Delegating.Generation mixes the external generation g and its own
// notification counter as g*C ^ own. The mix is not injective: when both
// change, the result can stay equal, and a caller (sched.Scheduler) keeps
// stale scores although the external index said its scores changed.
func TestRegressionDelegatingGenerationChangesWhenExternalGenerationChanges(t *testing.T) {
	const c = uint64(0x9E3779B97F4A7C15)
	inv := c // Newton iteration for the inverse of an odd number mod 2^64
	for i := 0; i < 6; i++ {
		inv *= 2 - c*inv
	}
	require.Equal(t, uint64(1), c*inv)
	ext := uint64(0)
	d := NewDelegating(External{Generation: func() (uint64, error) { return ext, nil }}, DelegatingOptions{})
	g0 := d.Generation()
	d.NotifyBlocksAllocated("r", []blockhash.Key{1}) // own counter 0 -> 1
	ext = inv                                        // the external index's scores changed too
	assert.NotEqual(t, g0, d.Generation(), "both the external generation and the notification count changed")
}
