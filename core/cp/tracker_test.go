package cp

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core"
	"github.com/kvcm/kvcm/core/blockhash"
)

func TestTrackerNotifiesCommittedBlocksWithTheManagersKeys(t *testing.T) {
	r := newRig(t, tinyConfig(64), ManagerBackedOptions{})
	rec := newRecorder()
	tr := NewTracker(r.m, rec)
	p := seq(0, 14) // 3 full blocks and 2 tokens
	c, err := tr.Create("a", core.CacheOptions{InputTokens: p})
	require.NoError(t, err)
	require.NoError(t, c.Resume(r.stream))
	require.NoError(t, c.Resize(14, 14))
	require.NoError(t, c.Commit(p[:6], false)) // one block and a half
	assert.Len(t, rec.allocated["a"], 1)
	require.NoError(t, c.Commit(p[6:], true))
	assert.Equal(t, blockhash.Chain(blockhash.Scope{}, tpb, p), rec.allocated["a"])
	assert.Equal(t, r.events.stored(), rec.allocated["a"], "the keys of the manager's stored events")
	require.NoError(t, c.Close())
}

func TestTrackerNotifiesReusedBlocksAtCreation(t *testing.T) {
	r := newRig(t, tinyConfig(64), ManagerBackedOptions{})
	rec := newRecorder()
	tr := NewTracker(r.m, rec)
	r.serve(tr, "first", seq(0, 12))
	c, err := tr.Create("second", core.CacheOptions{InputTokens: cat(seq(0, 8), seq(40, 4))})
	require.NoError(t, err)
	assert.Equal(t, rec.allocated["first"][:2], rec.allocated["second"], "registration of the reused blocks")
	require.NoError(t, c.Close())
	assert.Equal(t, [][]blockhash.Key{rec.allocated["first"][:2]}, rec.freed["second"])
}

// A cache with a fresh run notifies the whole matched prefix at creation,
// the run included, and nothing more when the run is committed: the keys are
// the committed chain's, each once.
func TestTrackerNotifiesAFreshRunOnce(t *testing.T) {
	r := newRig(t, tinyConfig(64), ManagerBackedOptions{})
	rec := newRecorder()
	tr := NewTracker(r.m, rec)
	r.serve(tr, "first", seq(0, 16))
	p := cat(seq(0, 16), seq(40, 4))
	c, err := tr.Create("second", core.CacheOptions{InputTokens: p, FreshFromBlock: 1, FreshBlocks: 2})
	require.NoError(t, err)
	from, to := c.FreshRange()
	require.Equal(t, [2]int{4, 12}, [2]int{from, to}, "blocks 1 and 2 are computed afresh")
	assert.Equal(t, rec.allocated["first"], rec.allocated["second"], "the whole matched prefix at creation")
	require.NoError(t, c.Resume(r.stream))
	require.NoError(t, c.Commit(p[4:8], false))
	require.NoError(t, c.Commit(p[8:12], false)) // completes the run: the tail joins
	assert.Equal(t, rec.allocated["first"], rec.allocated["second"], "the run's commits add no key")
	require.NoError(t, c.WaitFreshTail(r.stream))
	require.NoError(t, c.Resize(20, 20))
	require.NoError(t, c.Commit(p[16:], false))
	chain := blockhash.Chain(blockhash.Scope{}, tpb, p)
	assert.Equal(t, chain, rec.allocated["second"])
	require.NoError(t, c.Close())
	assert.Equal(t, [][]blockhash.Key{chain}, rec.freed["second"])
}

func TestTrackerFreesOnlyOnTerminalClose(t *testing.T) {
	r := newRig(t, tinyConfig(64), ManagerBackedOptions{})
	rec := newRecorder()
	tr := NewTracker(r.m, rec)
	c := r.open(tr, "a", seq(0, 8))
	for i := 0; i < 3; i++ {
		require.NoError(t, c.Suspend())
		require.NoError(t, c.Resume(r.stream))
	}
	require.NoError(t, c.Resize(12, -1))
	assert.Empty(t, rec.freed, "suspend, resume and resize never free")
	require.NoError(t, c.Close())
	require.NoError(t, c.Close())
	assert.Equal(t, [][]blockhash.Key{rec.allocated["a"]}, rec.freed["a"], "one terminal free, with every block")
}

func TestTrackerWithoutIndexUsesNull(t *testing.T) {
	r := newRig(t, tinyConfig(64), ManagerBackedOptions{})
	tr := NewTracker(r.m, nil)
	assert.Equal(t, Null{}, tr.CP())
	r.serve(tr, "a", seq(0, 8))
}

func TestTrackerWithKnownKeysNotifiesWhatItWouldHash(t *testing.T) {
	p := seq(0, 22)
	chain := blockhash.Chain(blockhash.Scope{}, tpb, p)
	for _, known := range [][]blockhash.Key{nil, chain[:2], chain} {
		r := newRig(t, tinyConfig(64), ManagerBackedOptions{})
		rec := newRecorder()
		tr := NewTracker(r.m, rec)
		c, err := tr.CreateWithKeys("a", core.CacheOptions{InputTokens: p}, known)
		require.NoError(t, err)
		require.NoError(t, c.Resume(r.stream))
		require.NoError(t, c.Resize(22, 22))
		require.NoError(t, c.Commit(p[:7], false))
		require.NoError(t, c.Commit(p[7:], false))
		assert.Equal(t, chain, rec.allocated["a"], "%d known keys", len(known))
		require.NoError(t, c.Close())
	}
}
