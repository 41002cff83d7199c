package abitest

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Through the C ABI, kvcm_kv_cache_decode_steps leaves a cache as the
// per-step resize and commit calls do (committed tokens, history, capacity,
// page indices, block events) across block boundaries; NULL tokens with a
// count, a cache not at its committed history and a run the GPU cannot hold
// fail naming what is wrong, changing nothing.
func TestDecodeStepsThroughTheCABI(t *testing.T) {
	noLeaks(t)
	type run struct {
		info   CacheInfo
		pages  []int32
		toks   []int32
		events []BlockEvent
	}
	prompt := seq(1, 2*tpb+1)
	steps := seq(100, 2*tpb+2)
	do := func(batched bool) run {
		m, c := prefilled(t, 16, prompt)
		defer DestroyManager(m)
		if batched {
			require.NoError(t, DecodeSteps(c, steps[:3]))
			require.NoError(t, DecodeSteps(c, steps[3:]))
		} else {
			for i, tok := range steps {
				n := int64(len(prompt) + i + 1)
				require.NoError(t, Resize(c, n, n))
				require.NoError(t, Commit(c, []int32{tok}, false))
			}
		}
		var r run
		var err error
		r.info, err = GetCacheInfo(c)
		require.NoError(t, err)
		r.pages, _, err = BasePageIndices(c, 0, 64)
		require.NoError(t, err)
		r.toks, _, err = CommittedTokens(c, 64)
		require.NoError(t, err)
		r.events, err = DrainBlockEvents(m)
		require.NoError(t, err)
		require.NoError(t, CloseCache(c))
		return r
	}
	want, got := do(false), do(true)
	assert.Equal(t, want, got)
	assert.Equal(t, int64(len(prompt)+len(steps)), got.info.Committed)

	m, c := prefilled(t, 3, prompt)
	defer DestroyManager(m)
	before, err := GetCacheInfo(c)
	require.NoError(t, err)
	requireCode(t, DecodeStepsNull(c, 2), InvalidArgument, "tokens")
	requireCode(t, DecodeSteps(c, seq(100, tpb)), OutOfPages, "decode steps")
	require.NoError(t, Resize(c, before.Capacity+1, -1))
	require.NoError(t, Resize(c, before.Capacity+1, before.History+1))
	requireCode(t, DecodeSteps(c, seq(100, 1)), InvalidState, "history at the committed tokens")
	after, err := GetCacheInfo(c)
	require.NoError(t, err)
	assert.Equal(t, before.Committed, after.Committed)
	require.NoError(t, DecodeStepsNull(c, 0), "no steps")
	require.NoError(t, CloseCache(c))
}

// prefilled returns a manager of gpuPages GPU pages and an ACTIVE cache of
// it with prompt committed; the caller destroys the manager.
func prefilled(t *testing.T, gpuPages int64, prompt []int32) (m, c uint64) {
	t.Helper()
	m, err := CreateManager(smallConfig(gpuPages, 0), nil)
	require.NoError(t, err)
	s, err := CreateStream(m)
	require.NoError(t, err)
	c, err = CreateCache(m, -1, "", prompt)
	require.NoError(t, err)
	require.NoError(t, Resume(c, s))
	require.NoError(t, Resize(c, int64(len(prompt)), int64(len(prompt))))
	require.NoError(t, Commit(c, prompt, false))
	return m, c
}
