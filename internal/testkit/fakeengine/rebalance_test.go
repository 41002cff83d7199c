package fakeengine_test

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core/config"
	"github.com/kvcm/kvcm/core/layout"
	"github.com/kvcm/kvcm/internal/testkit/fakeengine"
)

// A rebalance keeps every byte: a suspended request's pages and the cached
// prefixes verify after Adjust moved the pool groups to the sampled demand.
func TestRebalanceKeepsEveryByte(t *testing.T) {
	r := newRig(t, setup{window: 32, slots: 256, tweak: func(c *config.Config) {
		c.CacheTiers[0].MaxQuota = 4 * c.CacheTiers[0].Quota
		c.RebalanceCooldownSecs = 0
		c.RebalanceTargetRatioUpdateInterval = 1
	}})
	rng := rand.New(rand.NewPCG(5, 6))
	held, err := r.e.Start(fakeengine.Request{Prompt: randTokens(rng, 320), OutputLen: 4})
	require.NoError(t, err)
	_, err = held.Resume(r.stream())
	require.NoError(t, err)
	for range 3 {
		_, err = held.Advance()
		require.NoError(t, err)
	}
	require.NoError(t, held.Suspend())

	var cached [][]config.Token
	for range 8 {
		p := randTokens(rng, 640)
		res, err := r.e.Serve(r.stream(), fakeengine.Request{Prompt: p, OutputLen: 2})
		require.NoError(t, err)
		require.Zero(t, res.Final.Mismatches)
		cached = append(cached, p)
	}
	before, err := r.m.StorageStats(layout.GPULevel)
	require.NoError(t, err)
	require.True(t, r.m.NeedAdjustment())
	require.NoError(t, r.m.Adjust())
	after, err := r.m.StorageStats(layout.GPULevel)
	require.NoError(t, err)
	require.NotEqual(t, before[0].Total, after[0].Total, "the pool groups were resized")

	v, err := held.Resume(r.stream())
	require.NoError(t, err)
	assert.Zero(t, v.Mismatches)
	assert.Positive(t, v.PagesVerified)
	for done := false; !done; {
		done, err = held.Advance()
		require.NoError(t, err)
	}
	require.NoError(t, held.Close())
	for _, p := range cached {
		res, err := r.e.Serve(r.stream(), fakeengine.Request{Prompt: p, OutputLen: 1})
		require.NoError(t, err)
		assert.Zero(t, res.Verified.Mismatches, "a cached prefix that survived the rebalance is intact")
		assert.Zero(t, res.Final.Mismatches)
	}
	r.requireDrained()
}
