package fakeengine_test

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core/config"
	"github.com/kvcm/kvcm/internal/testkit/fakeengine"
)

// scratchSetup: layers 2-4 share a 32-token window (one layer group whose
// pool holds six buffers: a scratch slot takes three blocks of a layer),
// with SWA scratch reuse; prefill in one chunk of 512 tokens.
func scratchSetup() setup {
	return setup{window: 32, engine: fakeengine.Options{ChunkTokens: 512}, tweak: func(c *config.Config) {
		w := c.Layers[2]
		for id := int32(3); id <= 4; id++ {
			w.LayerID = id
			c.Layers = append(c.Layers, w)
		}
		c.SwaScratchReuse = &config.SwaScratchReuseConfig{}
	}}
}

// The KV a prefill writes through SWA scratch slots lands in them only: the
// blocks the window keeps, full attention and another active request's
// pages verify byte for byte, and a later request reuses the prompt.
func TestScratchPrefillKeepsEveryKeptByteCorrect(t *testing.T) {
	r := newRig(t, scratchSetup())
	rng := rand.New(rand.NewPCG(3, 4))
	other, err := r.e.Start(fakeengine.Request{Prompt: randTokens(rng, 200)})
	require.NoError(t, err)
	_, err = other.Resume(r.stream())
	require.NoError(t, err)
	for done := false; !done; {
		done, err = other.Advance()
		require.NoError(t, err)
	}

	prompt := randTokens(rng, 320) // 20 blocks; the window keeps the last 2
	s, err := r.e.Start(fakeengine.Request{Prompt: prompt, OutputLen: 8})
	require.NoError(t, err)
	_, err = s.Resume(r.stream())
	require.NoError(t, err)
	c := s.Cache()
	require.NoError(t, c.Resize(320, 0))
	d, err := c.ScratchDesc(r.lgOf(2))
	require.NoError(t, err)
	require.Equal(t, [2]int{0, 18}, [2]int{d.Begin, d.End})
	require.Len(t, d.Slots, 6, "18 blocks, three a slot")
	for done := false; !done; {
		done, err = s.Advance()
		require.NoError(t, err)
	}
	assert.False(t, c.HasScratchSlots())
	v, err := s.Verify()
	require.NoError(t, err)
	assert.Zero(t, v.Mismatches)
	assert.Positive(t, v.PagesVerified)
	v, err = other.Verify()
	require.NoError(t, err)
	assert.Zero(t, v.Mismatches, "scratch writes never touch another cache's pages")
	require.NoError(t, s.Close())
	require.NoError(t, other.Close())

	again, err := r.e.Start(fakeengine.Request{Prompt: concat(prompt, []config.Token{1}), OutputLen: 1})
	require.NoError(t, err)
	assert.Equal(t, 320, again.Reused())
	v, err = again.Resume(r.stream())
	require.NoError(t, err)
	assert.Zero(t, v.Mismatches)
	assert.Positive(t, v.PagesVerified)
	require.NoError(t, again.Close())
	r.requireDrained()
}
