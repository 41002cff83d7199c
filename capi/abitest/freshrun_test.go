package abitest

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Through the C ABI as in Go: a cache created with a fresh run of a prefix
// pushed to host onboards only the blocks after the run, reports the whole
// prefix as its history with nothing committed, commits the run's tokens
// and then stands at the prefix's end; the next request reuses the whole
// prefix from the GPU. kvcm_kv_cache_wait_fresh_tail orders the stream after
// the tail (again: nothing), is a no-op without a run and refused on a
// SUSPENDED cache. A negative run, and a start without a run, are refused
// naming the field.
func TestAFreshRunThroughTheCABI(t *testing.T) {
	noLeaks(t)
	m, err := CreateManager(smallConfig(4, 8), nil)
	require.NoError(t, err)
	defer DestroyManager(m)
	s, err := CreateStream(m)
	require.NoError(t, err)
	prompt := seq(1, 4*tpb)
	serveV2(t, m, s, Scope{}, prompt)
	serveV2(t, m, s, Scope{}, seq(500, 4*tpb))
	before, err := MigrationPages(m)
	require.NoError(t, err)

	c, err := CreateCacheFresh(m, prompt, 0, 2)
	require.NoError(t, err)
	requireCode(t, WaitFreshTail(c, s), InvalidState, "SUSPENDED")
	from, to, err := FreshRange(c)
	require.NoError(t, err)
	assert.Equal(t, [2]int64{0, 2 * tpb}, [2]int64{from, to})
	info, err := GetCacheInfo(c)
	require.NoError(t, err)
	assert.Equal(t, int64(4*tpb), info.ReusedToken)
	assert.Equal(t, int64(4*tpb), info.History)
	assert.Zero(t, info.Committed)
	require.NoError(t, Resume(c, s))
	after, err := MigrationPages(m)
	require.NoError(t, err)
	assert.Equal(t, int64(2), after[PathHostToGPU]-before[PathHostToGPU], "the 2 blocks after the run come up, one page each")
	requireCode(t, Commit(c, prompt[:3*tpb], false), InvalidArgument, "tokens")
	require.NoError(t, Commit(c, prompt[:2*tpb], false))
	info, err = GetCacheInfo(c)
	require.NoError(t, err)
	assert.Equal(t, int64(4*tpb), info.Committed, "the run's commit joins the tail")
	require.NoError(t, WaitFreshTail(c, s))
	require.NoError(t, WaitFreshTail(c, s), "idempotent")
	require.NoError(t, Synchronize(s))
	require.NoError(t, CloseCache(c))

	d, err := CreateCacheV2(m, Scope{}, prompt, false, 0)
	require.NoError(t, err)
	info, err = GetCacheInfo(d)
	require.NoError(t, err)
	assert.Equal(t, int64(4*tpb), info.ReusedToken)
	mid, err := MigrationPages(m)
	require.NoError(t, err)
	require.NoError(t, Resume(d, s))
	end, err := MigrationPages(m)
	require.NoError(t, err)
	assert.Equal(t, mid[PathHostToGPU], end[PathHostToGPU], "the whole prefix is on the GPU")
	require.NoError(t, WaitFreshTail(d, s), "no run: nothing to wait for")
	require.NoError(t, CloseCache(d))

	_, err = CreateCacheFresh(m, prompt, 0, -1)
	requireCode(t, err, InvalidArgument, "fresh_blocks")
	_, err = CreateCacheFresh(m, prompt, 1, 0)
	requireCode(t, err, InvalidArgument, "fresh_from_block")
}
