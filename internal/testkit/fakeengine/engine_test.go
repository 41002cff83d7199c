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

func TestWriteVerifyRoundTrip(t *testing.T) {
	r := newRig(t, setup{engine: fakeengine.Options{ScratchBytes: 1000}}) // several rounds per call
	toks := randTokens(rand.New(rand.NewPCG(1, 2)), 100)
	c := r.active(toks)
	require.NoError(t, c.Resize(100, 0))
	require.NoError(t, r.e.Step(c, toks, 0, 37))
	require.NoError(t, r.e.Step(c, toks, 37, 100))
	assert.Equal(t, 100*r.e.TokenBytes(), r.e.BytesWritten())

	res, err := r.e.Verify(c, toks, 0, 100)
	require.NoError(t, err)
	assert.Zero(t, res.Mismatches)
	assert.Nil(t, res.First)
	assert.Equal(t, int64(7), res.PagesVerified, "7 blocks of the one layer group")

	// The KV of a position depends on the whole prefix: changing token 50
	// changes positions 50..99 in all 6 buffers and nothing before.
	other := slices.Clone(toks)
	other[50]++
	res, err = r.e.Verify(c, other, 0, 100)
	require.NoError(t, err)
	assert.Equal(t, int64(50*6), res.Mismatches)
	require.NotNil(t, res.First)
	assert.Equal(t, 50, res.First.Position)
	assert.Equal(t, 3, res.First.Block)
	assert.Equal(t, int64(50*6), r.e.Mismatches())
	require.NoError(t, c.Close())
	r.requireDrained()
}

func TestReusedPrefixVerifies(t *testing.T) {
	r := newRig(t, setup{engine: fakeengine.Options{ChunkTokens: 48}})
	rng := rand.New(rand.NewPCG(3, 4))
	system := randTokens(rng, 150)
	first, err := r.e.Serve(r.stream(), fakeengine.Request{Prompt: concat(system, randTokens(rng, 50)), OutputLen: 10})
	require.NoError(t, err)
	assert.Zero(t, first.Reused)
	assert.Len(t, first.Tokens, 210)

	s, err := r.e.Start(fakeengine.Request{Prompt: concat(system, randTokens(rng, 40)), OutputLen: 5})
	require.NoError(t, err)
	assert.Equal(t, 144, s.Reused(), "9 full blocks of the shared 150 tokens")
	v, err := s.Resume(r.stream())
	require.NoError(t, err)
	assert.Zero(t, v.Mismatches)
	assert.Equal(t, int64(9), v.PagesVerified)

	// A model with another seed disagrees with every reused byte.
	other, err := fakeengine.New(r.m, r.cfg, fakeengine.Options{Seed: 99})
	require.NoError(t, err)
	defer other.Close()
	ov, err := other.Verify(s.Cache(), s.Tokens(), 0, s.Reused())
	require.NoError(t, err)
	assert.Equal(t, int64(144*6), ov.Mismatches)

	for done := false; !done; {
		done, err = s.Advance()
		require.NoError(t, err)
	}
	v, err = s.Verify()
	require.NoError(t, err)
	assert.Zero(t, v.Mismatches)
	require.NoError(t, s.Close())

	// A follow-up turn reuses the first request's generated tokens too.
	turn := concat(first.Tokens, randTokens(rng, 20))
	again, err := r.e.Serve(r.stream(), fakeengine.Request{Prompt: turn, OutputLen: 3})
	require.NoError(t, err)
	assert.Equal(t, 208, again.Reused, "13 full blocks of the 210 tokens of the first turn")
	assert.Zero(t, again.Verified.Mismatches)
	assert.Equal(t, int64(13), again.Verified.PagesVerified)
	assert.Zero(t, r.e.Mismatches())
	r.requireDrained()
}

func TestCorruptedPageIsDetected(t *testing.T) {
	r := newRig(t, setup{})
	toks := randTokens(rand.New(rand.NewPCG(5, 6)), 64)
	c := r.active(toks)
	require.NoError(t, c.Resize(64, 0))
	require.NoError(t, r.e.Step(c, toks, 0, 64))
	require.NoError(t, r.e.Corrupt(c, 37, 1, config.RoleValue, 3))

	res, err := r.e.Verify(c, toks, 0, 64)
	require.NoError(t, err)
	assert.Equal(t, int64(1), res.Mismatches)
	require.NotNil(t, res.First)
	assert.Equal(t, fakeengine.Mismatch{CacheID: c.ID(), Block: 2, Layer: 1, Role: config.RoleValue, Position: 37,
		Offset: 3, Got: res.First.Want ^ 0xff, Want: res.First.Want}, *res.First)
	st := r.e.Stats()
	require.NotNil(t, st.FirstMismatch)
	assert.Equal(t, *res.First, *st.FirstMismatch)

	// The corruption survives reuse: a later cache sharing the block sees it.
	require.NoError(t, c.Commit(toks, true), "committing advances the history")
	assert.Equal(t, 64, c.HistoryLength())
	require.NoError(t, c.Close())
	s, err := r.e.Start(fakeengine.Request{Prompt: concat(toks, []config.Token{1}), OutputLen: 1})
	require.NoError(t, err)
	v, err := s.Resume(r.stream())
	require.NoError(t, err)
	assert.Equal(t, int64(1), v.Mismatches)
	assert.Equal(t, 37, v.First.Position)
	require.NoError(t, s.Close())
}

func TestSlidingWindowSkipsReleasedBlocks(t *testing.T) {
	r := newRig(t, setup{window: 40, engine: fakeengine.Options{ChunkTokens: 16}})
	toks := randTokens(rand.New(rand.NewPCG(7, 8)), 160)
	s, err := r.e.Start(fakeengine.Request{Prompt: toks, OutputLen: 0})
	require.NoError(t, err)
	_, err = s.Resume(r.stream())
	require.NoError(t, err)
	for done := false; !done; {
		done, err = s.Advance()
		require.NoError(t, err)
	}
	swLG := r.lgOf(2)
	idx, err := s.Cache().BasePageIndices(swLG)
	require.NoError(t, err)
	// history 160, window 40: blocks from (160-40)/16 = 7 are kept.
	assert.Equal(t, []int32{core.BadPageIndex, core.BadPageIndex, core.BadPageIndex, core.BadPageIndex,
		core.BadPageIndex, core.BadPageIndex, core.BadPageIndex}, idx[:7])
	assert.NotContains(t, idx[7:], core.BadPageIndex)

	v, err := s.Verify()
	require.NoError(t, err)
	assert.Zero(t, v.Mismatches)
	assert.Equal(t, int64(7), v.PagesSkipped)
	assert.Equal(t, int64(10+3), v.PagesVerified, "10 full-attention blocks, 3 windowed ones")

	// Writing into a released block is refused rather than skipped.
	err = r.e.Step(s.Cache(), toks, 0, 16)
	require.ErrorContains(t, err, "no page for block 0 of layer group")
	require.NoError(t, s.Close())

	// A second request reuses the prefix; the windowed layer group holds
	// only the blocks it still needs, and the rest verify.
	s2, err := r.e.Start(fakeengine.Request{Prompt: concat(toks[:150], []config.Token{5, 6, 7}), OutputLen: 4})
	require.NoError(t, err)
	require.Equal(t, 144, s2.Reused())
	v, err = s2.Resume(r.stream())
	require.NoError(t, err)
	assert.Zero(t, v.Mismatches)
	// history 144: the windowed group keeps blocks from (144-40)/16 = 6.
	assert.Equal(t, int64(6), v.PagesSkipped)
	assert.Equal(t, int64(9+3), v.PagesVerified)
	require.NoError(t, s2.Close())
	r.requireDrained()
}

func TestServeIsDeterministic(t *testing.T) {
	prompt := randTokens(rand.New(rand.NewPCG(9, 10)), 70)
	var outs [][]config.Token
	for range 2 {
		r := newRig(t, setup{engine: fakeengine.Options{Seed: 4, Vocab: 1000}})
		res, err := r.e.Serve(r.stream(), fakeengine.Request{Prompt: prompt, OutputLen: 12})
		require.NoError(t, err)
		require.Equal(t, prompt, res.Tokens[:70])
		for _, tok := range res.Tokens[70:] {
			require.Less(t, tok, config.Token(1000))
		}
		assert.Equal(t, r.e.NextToken(res.Tokens[:75]), res.Tokens[75])
		outs = append(outs, res.Tokens)
	}
	assert.Equal(t, outs[0], outs[1])
}

func TestZeroLowBytes(t *testing.T) {
	r := newRig(t, setup{engine: fakeengine.Options{ZeroLowBytes: true}})
	toks := randTokens(rand.New(rand.NewPCG(11, 12)), 40)
	for pos := range 40 {
		kv, err := r.e.ExpectedKV(toks, pos, 1, config.RoleValue)
		require.NoError(t, err)
		require.Len(t, kv, 8)
		var high byte
		for i, b := range kv {
			if i%2 == 0 {
				require.Zero(t, b, "position %d byte %d", pos, i)
			} else {
				high |= b
			}
		}
		require.NotZero(t, high)
	}
	res, err := r.e.Serve(r.stream(), fakeengine.Request{Prompt: toks, OutputLen: 2})
	require.NoError(t, err)
	assert.Len(t, res.Tokens, 42)

	cfg := setup{tpb: 16}.config()
	cfg.Layers[0].Buffers[0].Size = 16 * 3
	m, err := core.NewManager(cfg)
	require.NoError(t, err)
	defer m.Close()
	_, err = fakeengine.New(m, cfg, fakeengine.Options{ZeroLowBytes: true})
	require.ErrorContains(t, err, "ZeroLowBytes needs even bytes per token")
	cfg.Layers[0].Buffers[0].Size = 16*3 + 1
	m2, err := core.NewManager(cfg)
	require.NoError(t, err)
	defer m2.Close()
	_, err = fakeengine.New(m2, cfg, fakeengine.Options{})
	require.ErrorContains(t, err, "not a multiple of 16 tokens per block")
}

func TestStepPreconditions(t *testing.T) {
	r := newRig(t, setup{})
	toks := randTokens(rand.New(rand.NewPCG(13, 14)), 40)
	c, err := r.m.CreateKVCache(core.CacheOptions{InputTokens: toks})
	require.NoError(t, err)
	require.ErrorIs(t, r.e.Step(c, toks, 0, 10), core.ErrInvalidState)
	_, err = r.e.Verify(c, toks, 0, 10)
	require.ErrorIs(t, err, core.ErrInvalidState)
	require.NoError(t, c.Resume(r.stream()))
	require.NoError(t, c.Resize(20, 0))
	require.ErrorContains(t, r.e.Step(c, toks, 10, 40), "no page for block 2")
	require.ErrorIs(t, r.e.Step(c, toks, 10, 41), core.ErrInvalidArgument)
	require.ErrorIs(t, r.e.Step(c, toks, 11, 10), core.ErrInvalidArgument)
	// Verify skips what the cache has no page for.
	require.NoError(t, r.e.Step(c, toks, 0, 20))
	v, err := r.e.Verify(c, toks, 0, 40)
	require.NoError(t, err)
	assert.Equal(t, int64(2), v.PagesVerified)
	assert.Zero(t, v.PagesSkipped, "positions past the capacity are not skipped pages")
	assert.Zero(t, v.Mismatches)
	require.NoError(t, c.Close())

	noData, err := fakeengine.New(r.m, r.cfg, fakeengine.Options{NoData: true})
	require.NoError(t, err)
	defer noData.Close()
	res, err := noData.Serve(r.stream(), fakeengine.Request{Prompt: toks, OutputLen: 3})
	require.NoError(t, err)
	assert.Len(t, res.Tokens, 43)
	assert.Zero(t, noData.BytesWritten())
	assert.Zero(t, noData.PagesVerified())
}
