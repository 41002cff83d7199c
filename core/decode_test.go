package core

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core/config"
	"github.com/kvcm/kvcm/core/layout"
)

// stepRig is one manager, one ACTIVE cache with a committed prompt, and
// what its observers saw: block events and PriorityFunc calls.
type stepRig struct {
	f      *fixture
	c      *KVCache
	events []CacheEvent
	asks   []string
}

func newStepRig(t *testing.T, cfg config.Config, prompt int, priority bool) *stepRig {
	t.Helper()
	r := &stepRig{}
	r.f = newFixture(t, cfg, WithEventListener(func(e CacheEvent) { r.events = append(r.events, e) }))
	opts := CacheOptions{InputTokens: seq(0, prompt)}
	if priority {
		opts.Priority = func(b int, lc layout.LayerGroupID) int {
			r.asks = append(r.asks, fmt.Sprintf("%d/%d", b, lc))
			return 40 + b%20
		}
	}
	c, err := r.f.m.CreateKVCache(opts)
	require.NoError(t, err)
	require.NoError(t, c.Resume(r.f.stream))
	require.NoError(t, c.Resize(prompt, prompt))
	require.NoError(t, c.Commit(seq(0, prompt), false))
	r.c = c
	return r
}

// stepState is everything the equivalence compares.
type stepState struct {
	Committed                []config.Token
	History, Capacity        int
	Pages                    [][]int32
	CacheStats, ManagerStats BlockStats
	Pending                  []LayerGroupStats
	AvgCapacity, AvgHistory  mean
	Events                   []CacheEvent
	Asks                     []string
	Free                     []int
}

func (r *stepRig) state(t *testing.T) stepState {
	t.Helper()
	s := stepState{
		Committed: r.c.CommittedTokens(), History: r.c.HistoryLength(), Capacity: r.c.Capacity(),
		CacheStats: r.c.Stats(), ManagerStats: r.f.m.Stats(), Pending: append([]LayerGroupStats(nil), r.c.pending...),
		AvgCapacity: r.c.avgCapacity, AvgHistory: r.c.avgHistory, Events: r.events, Asks: r.asks,
	}
	for lc := range r.f.m.NumLayerGroups() {
		idx, err := r.c.BasePageIndices(layout.LayerGroupID(lc))
		require.NoError(t, err)
		s.Pages = append(s.Pages, idx)
		s.Free = append(s.Free, r.f.m.levels[0].groupOf(layout.LayerGroupID(lc)).free.len())
	}
	return s
}

// perStep is the reference: the per-step calls DecodeSteps is equivalent to,
// through Resize's and Commit's general paths (not the decode-step short
// paths, resizeInBlock and commitInBlock, which DecodeSteps shares).
func perStep(c *KVCache, tokens []config.Token) error {
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	for _, t := range tokens {
		h := c.history + 1
		if err := c.resize(max(c.capacity, h), h); err != nil {
			return err
		}
		if err := c.commit([]config.Token{t}, nil, nil, false); err != nil {
			return err
		}
	}
	return nil
}

// DecodeSteps leaves the cache and the manager exactly as the per-step
// Resize/Commit calls do: committed tokens, history, capacity, page indices,
// statistics, Adjust's demand samples (one per step), block events and the
// PriorityFunc's calls, within a block, across block boundaries, with
// capacity reserved ahead and with sliding windows.
func TestDecodeStepsEqualThePerStepCalls(t *testing.T) {
	cases := []struct {
		name          string
		cfg           config.Config
		prompt, steps int
		ahead         int // capacity reserved past the history first
		runs          []int
		priority      bool
	}{
		{name: "in block", cfg: smallConfig(64), prompt: 5, runs: []int{2}},
		{name: "fills the block", cfg: smallConfig(64), prompt: 5, runs: []int{3}},
		{name: "across blocks", cfg: smallConfig(64), prompt: 6, runs: []int{11, 1, 1, 7}},
		{name: "one step a call", cfg: smallConfig(64), prompt: 3, runs: []int{1, 1, 1, 1, 1, 1, 1, 1, 1}},
		{name: "capacity ahead", cfg: smallConfig(64), prompt: 6, ahead: 7, runs: []int{9, 4}},
		{name: "sliding windows", cfg: windowConfig(), prompt: 9, runs: []int{30, 3, 17}},
		{name: "priorities", cfg: smallConfig(64), prompt: 6, runs: []int{13, 2}, priority: true},
		{name: "windows and priorities", cfg: windowConfig(), prompt: 7, runs: []int{21}, priority: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			want, got := newStepRig(t, tc.cfg, tc.prompt, tc.priority), newStepRig(t, tc.cfg, tc.prompt, tc.priority)
			if tc.ahead > 0 {
				require.NoError(t, want.c.Resize(tc.prompt+tc.ahead, -1))
				require.NoError(t, got.c.Resize(tc.prompt+tc.ahead, -1))
			}
			next := 1000
			for _, n := range tc.runs {
				toks := seq(next, n)
				next += n
				require.NoError(t, perStep(want.c, toks))
				require.NoError(t, got.c.DecodeSteps(toks))
				require.Equal(t, want.state(t), got.state(t), "after %d steps", n)
			}
			require.NoError(t, want.c.Close())
			require.NoError(t, got.c.Close())
			wr, gr := want.f.m.rebalance, got.f.m.rebalance
			wr.lastAdjust, gr.lastAdjust = time.Time{}, time.Time{} // creation times
			assert.Equal(t, wr, gr, "the closes' samples for Adjust")
			assert.Equal(t, want.events, got.events)
		})
	}
}

// A run whose new blocks the GPU cannot hold fails with ErrOutOfPages
// before any step applies, even when its first steps would fit.
func TestDecodeStepsOutOfPagesChangesNothing(t *testing.T) {
	r := newStepRig(t, smallConfig(2), 6, false) // 2 blocks: full
	before := r.state(t)
	err := r.c.DecodeSteps(seq(100, 3)) // steps 7 and 8 fit, 9 needs a block
	require.ErrorIs(t, err, ErrOutOfPages)
	assert.Contains(t, err.Error(), "decode steps")
	assert.Equal(t, before, r.state(t))
	require.NoError(t, r.c.DecodeSteps(seq(100, 2)), "the steps that fit still apply")
}

// A run that publishes a block on a stream that cannot record its event
// fails before any step applies (the in-block steps before the block
// included); a run that needs no event does not touch the stream.
func TestDecodeStepsRecordFailureChangesNothing(t *testing.T) {
	r := newStepRig(t, smallConfig(64), 5, false)
	require.NoError(t, r.f.stream.Close())
	before := r.state(t)
	err := r.c.DecodeSteps(seq(100, 4)) // tokens 6, 7 in block 1, 8 fills it, 9 opens block 2
	require.Error(t, err)
	assert.Contains(t, err.Error(), "record cache event")
	assert.Equal(t, before, r.state(t))
	require.NoError(t, r.c.DecodeSteps(seq(100, 2)), "steps inside the block need no event")
	assert.Equal(t, 7, r.c.NumCommittedTokens())
}

// A PriorityFunc that panics on a page a later step allocates fails the
// call before any step applies.
func TestDecodeStepsPriorityPanicChangesNothing(t *testing.T) {
	r := newStepRig(t, smallConfig(64), 6, false)
	r.c.priority = func(b int, lc layout.LayerGroupID) int {
		if b == 3 {
			panic("no")
		}
		return 50
	}
	before := r.state(t)
	err := r.c.DecodeSteps(seq(100, 8))
	require.ErrorIs(t, err, ErrInvalidArgument)
	assert.Contains(t, err.Error(), "priority callback")
	assert.Equal(t, before, r.state(t))
	assert.Empty(t, r.c.asked, "no answer kept for later calls")
}

// DecodeSteps refuses, changing nothing, a cache not in a decode step's
// state, naming what is wrong; no tokens is no step.
func TestDecodeStepsChecksTheState(t *testing.T) {
	r := newStepRig(t, smallConfig(64), 6, false)
	require.NoError(t, r.c.DecodeSteps(nil))

	require.NoError(t, r.c.Resize(8, 7))
	before := r.state(t)
	err := r.c.DecodeSteps(seq(100, 1))
	require.ErrorIs(t, err, ErrInvalidState)
	assert.Contains(t, err.Error(), "history at the committed tokens")
	assert.Equal(t, before, r.state(t))
	require.NoError(t, r.c.Commit(seq(50, 1), false))

	r.c.StopCommitting()
	require.ErrorIs(t, r.c.DecodeSteps(seq(100, 1)), ErrInvalidState)

	s := newStepRig(t, smallConfig(64), 6, false)
	require.NoError(t, s.c.Suspend())
	err = s.c.DecodeSteps(seq(100, 1))
	require.ErrorIs(t, err, ErrInvalidState)
	assert.Contains(t, err.Error(), "SUSPENDED")
	require.NoError(t, s.c.Close())
	require.ErrorIs(t, s.c.DecodeSteps(seq(100, 1)), ErrInvalidState)
}
