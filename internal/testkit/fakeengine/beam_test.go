package fakeengine_test

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core"
	"github.com/kvcm/kvcm/core/config"
	"github.com/kvcm/kvcm/internal/testkit/fakeengine"
)

// beamRun drives one beam-search request: every beam's hypothesis, computed
// into that beam's pages.
type beamRun struct {
	t     *testing.T
	r     *rig
	c     *core.KVCache
	hyps  [][]config.Token
	rng   *rand.Rand
	hist  int
	steps int
}

// decode computes one more token in every beam: a token of its own, so the
// beams' KV differs from the diverging block on.
func (b *beamRun) decode() {
	b.t.Helper()
	require.NoError(b.t, b.c.Resize(b.hist+1, -1))
	for k := range b.hyps {
		b.hyps[k] = append(b.hyps[k], config.Token(b.rng.IntN(30000)))
		require.NoError(b.t, b.r.e.StepBeam(b.c, k, b.hyps[k], b.hist, b.hist+1))
	}
	b.hist++
	require.NoError(b.t, b.c.Resize(b.hist, b.hist))
	b.steps++
}

// reorder applies a beam search step's choice: beam j continues beam
// parents[j]'s hypothesis, and commits the converged tokens.
func (b *beamRun) reorder(parents []int, commit int) {
	b.t.Helper()
	old := b.hyps
	b.hyps = make([][]config.Token, len(parents))
	for j, p := range parents {
		b.hyps[j] = slices.Clone(old[p])
	}
	from := b.c.NumCommittedTokens()
	require.NoError(b.t, b.c.CommitBeamSearch(b.hyps[0][from:from+commit], parents, false))
}

// verify checks every beam's pages against its hypothesis, byte for byte.
func (b *beamRun) verify(what string) {
	b.t.Helper()
	for k, h := range b.hyps {
		res, err := b.r.e.VerifyBeam(b.c, k, h, 0, b.hist)
		require.NoError(b.t, err)
		assert.Zero(b.t, res.Mismatches, "%s: beam %d: %v", what, k, res.First)
		assert.Positive(b.t, res.PagesVerified, "%s: beam %d", what, k)
	}
}

// Per-beam KV survives forking (with the copy of the diverging partial
// block), reordering, committing converged tokens, and a trip of the beam
// pages through the host and disk tiers while the cache is suspended; the
// committed prefix is reusable by a later request.
func TestBeamSearchKVVerifiesThroughEveryTier(t *testing.T) {
	t.Run("full attention", func(t *testing.T) {
		beamSearchThroughTiers(t, setup{slots: 12, hostSlots: 4, diskSlots: 64, noSlidingLyr: true})
	})
	t.Run("with a sliding window", func(t *testing.T) {
		beamSearchThroughTiers(t, setup{slots: 16, hostSlots: 4, diskSlots: 64, window: 32})
	})
}

func beamSearchThroughTiers(t *testing.T, st setup) {
	r := newRig(t, st)
	rng := rand.New(rand.NewPCG(7, 8))
	prompt := randTokens(rng, 40) // tpb 16: two full blocks and 8 tokens of a third
	c := r.active(prompt)
	require.NoError(t, c.Resize(len(prompt), -1))
	require.NoError(t, r.e.Step(c, prompt, 0, len(prompt)))
	require.NoError(t, c.Commit(prompt, false))

	b := &beamRun{t: t, r: r, c: c, rng: rng, hist: len(prompt)}
	require.NoError(t, c.SetBeamWidth(3))
	for range 3 {
		b.hyps = append(b.hyps, slices.Clone(prompt))
	}
	b.verify("fork: every beam reads the prompt, the partial block copied")
	for range 4 {
		b.decode()
	}
	b.verify("after decoding")
	b.reorder([]int{2, 0, 2}, 0)
	b.verify("beams took over another's history")
	for range 3 {
		b.decode()
	}
	// The beams agree on beam 1's hypothesis up to here: it converged.
	b.reorder([]int{1, 1, 1}, b.hist-len(prompt))
	assert.Equal(t, b.hist, c.NumCommittedTokens())
	for range 5 {
		b.decode()
	}
	b.verify("converged, then diverged again")

	require.NoError(t, c.Suspend())
	stream := r.stream()
	for range 3 {
		_, err := r.e.Serve(stream, fakeengine.Request{Prompt: randTokens(rng, 160), OutputLen: 1})
		require.NoError(t, err)
	}
	moved := r.m.MigrationStats()
	require.Positive(t, moved[core.HotToHost].Pages, "the suspended beams' pages went to the host tier")
	require.Positive(t, moved[core.HostToDisk].Pages, "and on to the disk tier")
	require.NoError(t, c.Resume(stream))
	b.verify("resumed from the cold tiers")

	converged := slices.Clone(b.hyps[0][:c.NumCommittedTokens()])
	require.NoError(t, c.Close())
	res, err := r.e.Serve(stream, fakeengine.Request{Prompt: append(converged, 1), OutputLen: 1})
	require.NoError(t, err)
	assert.Equal(t, len(converged)/16*16, res.Reused, "the committed blocks were published")
	assert.Zero(t, res.Verified.Mismatches, "%v", res.Verified.First)
	assert.Zero(t, res.Final.Mismatches, "%v", res.Final.First)
	r.requireDrained()
}
