package cp

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core"
	"github.com/kvcm/kvcm/core/blockhash"
	"github.com/kvcm/kvcm/core/config"
)

func newReuse(t *testing.T, limit int) *ReuseEvict {
	t.Helper()
	r, err := NewReuseEvict(DefaultReuseOptions(limit))
	require.NoError(t, err)
	return r
}

// apply sets us on m.
func apply(t *testing.T, m *core.Manager, us ...PriorityUpdate) {
	t.Helper()
	for _, u := range us {
		_, err := m.SetBlockPriorities(blockhash.Scope{}, u.Chain, u.Priorities)
		require.NoError(t, err)
	}
}

// A block a finished request leaves cached that nobody reused gets the
// one-off priority; a block it reused keeps the priority its reuse gave it.
func TestReuseEvictReleasesBlocksNobodyReusedAsOneOff(t *testing.T) {
	r := newReuse(t, 100)
	chain := keys(1, 2, 3, 4)
	us := r.Admitted(chain[:2])
	require.Len(t, us, 1)
	assert.Equal(t, []int{core.DefaultPriority, core.DefaultPriority}, us[0].Priorities, "reused once: the default")
	u := r.Released(chain)
	assert.Equal(t, chain, u.Chain)
	assert.Equal(t, []int{35, 35, 15, 15}, u.Priorities)
	p, ok := r.Priority(3)
	assert.True(t, ok)
	assert.Equal(t, 15, p)
}

// The more often a block is reused, the higher it ranks: Base + Step ×
// log2(count), at most Max.
func TestReuseEvictRanksByReuseCount(t *testing.T) {
	r := newReuse(t, 100)
	hot, cold := keys(1, 2), keys(9)
	r.Admitted(cold)
	var last []int
	for range 4 {
		last = r.Admitted(hot)[0].Priorities
	}
	assert.Equal(t, []int{43, 43}, last, "4 reuses (barely decayed): 35 + 4×2")
	pc, _ := r.Priority(9)
	assert.Equal(t, 35, pc)
	for range 10000 {
		last = r.Admitted(hot)[0].Priorities
	}
	assert.Equal(t, []int{65, 65}, last, "capped at Max")
}

// Counts decay: a block reused often long ago ranks, once its count has
// decayed below a recently reused one's, below it, and the limit sends it
// back to Base first.
func TestReuseEvictLowersTheStalestBlocksFirstAtTheLimit(t *testing.T) {
	o := DefaultReuseOptions(2)
	o.HalfLife = 4
	r, err := NewReuseEvict(o)
	require.NoError(t, err)
	for range 8 {
		r.Admitted(keys(1)) // old and popular
	}
	for range 16 {
		r.Admitted(nil) // other admissions: 4 half-lives
	}
	r.Admitted(keys(2))
	us := r.Admitted(keys(2)) // recent: 2 reuses beat 8 decayed 16×
	assert.Equal(t, 2, r.Raised())
	r.Admitted(keys(3))
	us = r.Admitted(keys(3))
	require.Len(t, us, 2, "the chain's own update, then the lowered block's")
	assert.Equal(t, PriorityUpdate{Chain: keys(1), Priorities: []int{core.DefaultPriority}}, us[1])
	assert.Equal(t, 2, r.Raised())
}

// However many chains are reused, at most Limit blocks rank above Base,
// every update keeps an ancestor at least as high as its descendants, and
// a block the limit lowered is set back to Base along its chain.
func TestReuseEvictIsBoundedAndKeepsChainsMonotone(t *testing.T) {
	const limit = 50
	r := newReuse(t, limit)
	rng := rand.New(rand.NewPCG(1, 2))
	for range 3000 {
		g := uint64(rng.IntN(40))
		n := 1 + rng.IntN(8)
		chain := make([]blockhash.Key, n)
		for i := range chain {
			chain[i] = blockhash.Key(g*100 + uint64(i))
		}
		for _, u := range r.Admitted(chain) {
			require.Len(t, u.Priorities, len(u.Chain))
			for i := 1; i < len(u.Priorities); i++ {
				require.GreaterOrEqual(t, u.Priorities[i-1], u.Priorities[i], "an ancestor never ranks below its descendant")
			}
			for i, k := range u.Chain {
				p, ok := r.Priority(k)
				require.True(t, ok)
				require.Equal(t, p, u.Priorities[i], "updates carry the policy's priority")
			}
		}
		require.LessOrEqual(t, r.Raised(), limit)
	}
	assert.Equal(t, limit, r.Raised(), "the limit binds")
}

// A removed block is forgotten and leaves the raised set.
func TestReuseEvictForgetsRemovedBlocks(t *testing.T) {
	r := newReuse(t, 10)
	r.Admitted(keys(1))
	r.Admitted(keys(1))
	assert.Equal(t, 1, r.Raised())
	r.Removed(1)
	_, ok := r.Priority(1)
	assert.False(t, ok)
	assert.Zero(t, r.Raised())
	r.Removed(1)
}

// Bad options fail naming the field.
func TestReuseOptionsValidateNamesTheField(t *testing.T) {
	for field, mut := range map[string]func(*ReuseOptions){
		"one-off":   func(o *ReuseOptions) { o.OneOff = 40 },
		"max":       func(o *ReuseOptions) { o.Max = 101 },
		"step":      func(o *ReuseOptions) { o.Step = 0 },
		"half-life": func(o *ReuseOptions) { o.HalfLife = 0 },
		"limit":     func(o *ReuseOptions) { o.Limit = -1 },
	} {
		o := DefaultReuseOptions(1)
		mut(&o)
		_, err := NewReuseEvict(o)
		require.Error(t, err, field)
		assert.Contains(t, err.Error(), field)
	}
}

// Through the manager: one-off blocks are evicted before reused ones,
// although they were released last, and a prefix reused more outlives one
// reused less, although that one was reused last.
func TestReuseEvictOrdersTheManagersEviction(t *testing.T) {
	rg := newRig(t, tinyConfig(8), ManagerBackedOptions{})
	tr := NewTracker(rg.m, rg.x)
	r := newReuse(t, 100)
	// 9 tokens: two full blocks and a partial one.
	pop, less, once := seq(0, 9), seq(100, 9), seq(200, 9)
	serve := func(id string, prompt []config.Token) {
		chain := blockhash.Chain(blockhash.Scope{}, tpb, prompt)
		reused := rg.m.ProbeReuse(blockhash.Scope{}, prompt) / tpb
		rg.serve(tr, id, prompt)
		apply(t, rg.m, r.Admitted(chain[:reused])...)
		apply(t, rg.m, r.Released(chain))
	}
	serve("p0", pop)
	serve("p1", pop)
	serve("p2", pop)
	serve("l0", less)
	serve("l1", less)
	serve("o", once)
	// Six cached blocks, two free pages; five more pages evict three.
	serve("x", seq(300, 17))
	assert.Zero(t, rg.m.ProbeReuse(blockhash.Scope{}, once), "the one-off prefix went first")
	assert.Equal(t, 4, rg.m.ProbeReuse(blockhash.Scope{}, less), "then the prefix reused less")
	assert.Equal(t, 8, rg.m.ProbeReuse(blockhash.Scope{}, pop), "the prefix reused most stays")
}
