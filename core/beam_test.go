package core

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core/blockhash"
	"github.com/kvcm/kvcm/core/config"
)

// beamIndices returns every beam's base page indices of layer group 0.
func beamIndices(t *testing.T, c *KVCache) [][]int32 {
	t.Helper()
	out := make([][]int32, c.BeamWidth())
	for k := range out {
		idx, err := c.BasePageIndicesOfBeam(0, k)
		require.NoError(t, err)
		out[k] = idx
	}
	return out
}

// openBeamCache opens an ACTIVE cache over a 10-token prompt (tpb 4: two
// full blocks and a partial one), its KV committed, and writes a pattern
// into the key page of block 2, the one beams diverge in.
func openBeamCache(t *testing.T, f *fixture) (*KVCache, BufferLocation, []byte) {
	t.Helper()
	c := f.open(blockhash.Scope{}, seq(0, 10))
	loc, err := f.m.Buffer(0, config.RoleKey)
	require.NoError(t, err)
	idx, err := c.BasePageIndices(0)
	require.NoError(t, err)
	return c, loc, f.fillPage(loc, idx[2], 3)
}

// A cache starts with one beam; the beam width changes only on an ACTIVE
// cache, within [1, MaxBeamWidth], and a refused change changes nothing.
func TestBeamWidthRules(t *testing.T) {
	f := newFixture(t, smallConfig(32))
	c, err := f.m.CreateKVCache(CacheOptions{InputTokens: seq(0, 8)})
	require.NoError(t, err)
	assert.Equal(t, 1, c.BeamWidth())
	assert.ErrorIs(t, c.SetBeamWidth(2), ErrInvalidState, "SUSPENDED")
	require.NoError(t, c.Resume(f.stream))
	for _, w := range []int{0, -1, MaxBeamWidth + 1} {
		err := c.SetBeamWidth(w)
		assert.ErrorIs(t, err, ErrInvalidArgument)
		assert.ErrorContains(t, err, "beam_width")
	}
	assert.Equal(t, 1, c.BeamWidth())
	require.NoError(t, c.SetBeamWidth(4))
	assert.Equal(t, 4, c.BeamWidth())
	require.NoError(t, c.Suspend())
	assert.Equal(t, 4, c.BeamWidth(), "kept while SUSPENDED")
	require.NoError(t, c.Close())
	assert.ErrorIs(t, c.SetBeamWidth(1), ErrInvalidState, "CLOSED")
	require.NoError(t, f.m.CheckInvariants(c))
}

// Forked beams share every block of the history that no beam writes into
// again (the prefix), get a copy of the diverging partially filled block,
// and a page of their own in every block added later.
func TestForkedBeamsShareThePrefixAndCopyTheDivergingBlock(t *testing.T) {
	f := newFixture(t, smallConfig(32))
	c, loc, pattern := openBeamCache(t, f)
	before := f.hotStats().Free
	require.NoError(t, c.SetBeamWidth(3))
	idx := beamIndices(t, c)
	for k := 1; k < 3; k++ {
		assert.Equal(t, idx[0][:2], idx[k][:2], "beam %d shares the full blocks", k)
		assert.NotEqual(t, idx[0][2], idx[k][2], "beam %d has its own diverging block", k)
		assert.Equal(t, pattern, f.readPage(loc, idx[k][2]), "beam %d's diverging block is a copy", k)
	}
	assert.NotEqual(t, idx[1][2], idx[2][2])
	assert.Equal(t, before-2, f.hotStats().Free, "one copy per new beam (one layer group)")

	allocated := c.Stats().AllocNewBlocks
	require.NoError(t, c.Resize(14, -1))
	assert.Equal(t, allocated+3, c.Stats().AllocNewBlocks, "a new block counts once per beam")
	idx = beamIndices(t, c)
	assert.Len(t, idx[0], 4)
	assert.NotEqual(t, idx[0][3], idx[1][3])
	assert.NotEqual(t, idx[1][3], idx[2][3])
	assert.Equal(t, before-2-3, f.hotStats().Free, "a new block costs a page per beam")
	require.NoError(t, f.m.CheckInvariants())
	require.NoError(t, c.Close())
	require.NoError(t, f.m.CheckInvariants(c))
}

// The single-beam page indices are beam 0's; a beam outside the width is
// refused naming beam_id.
func TestBeamPageIndicesNameTheBeam(t *testing.T) {
	f := newFixture(t, smallConfig(32))
	c, _, _ := openBeamCache(t, f)
	require.NoError(t, c.SetBeamWidth(2))
	zero, err := c.BasePageIndices(0)
	require.NoError(t, err)
	assert.Equal(t, beamIndices(t, c)[DefaultBeamIndex], zero)
	for _, beam := range []int{-1, 2} {
		_, err := c.BasePageIndicesOfBeam(0, beam)
		assert.ErrorIs(t, err, ErrInvalidArgument)
		assert.ErrorContains(t, err, "beam_id")
	}
	require.NoError(t, c.Close())
}

// beam_search_indices makes beam j take over the history of the old beam
// it names: its pages where the block is read only, a copy of them where
// beams still write; pages no beam names any more are released.
func TestCommitBeamSearchMakesBeamsTakeOverAnothersHistory(t *testing.T) {
	f := newFixture(t, smallConfig(32))
	c, loc, _ := openBeamCache(t, f)
	require.NoError(t, c.SetBeamWidth(2))
	require.NoError(t, c.Resize(16, 14)) // one more block, computed up to 14 in each beam
	old := beamIndices(t, c)
	one2 := f.fillPage(loc, old[1][2], 11)
	one3 := f.fillPage(loc, old[1][3], 12)
	free := f.hotStats().Free

	require.NoError(t, c.CommitBeamSearch(nil, []int{1, 1}, false))
	idx := beamIndices(t, c)
	assert.Equal(t, old[1][2], idx[0][2], "block 2 is read only now: beam 0 takes beam 1's page")
	assert.Equal(t, old[1][2], idx[1][2], "and beam 1 keeps it, shared")
	assert.Equal(t, old[1][3], idx[0][3], "beam 0 takes beam 1's diverging block")
	assert.NotEqual(t, old[1][3], idx[1][3], "beam 1 gets a copy of it")
	assert.Equal(t, one2, f.readPage(loc, idx[0][2]))
	assert.Equal(t, one3, f.readPage(loc, idx[1][3]))
	// Beam 0's two old pages go, one copy comes.
	assert.Equal(t, free+2-1, f.hotStats().Free)
	require.NoError(t, f.m.CheckInvariants())

	// Forking: both beams descend from beam 0.
	require.NoError(t, c.CommitBeamSearch(nil, []int{0, 0}, false))
	again := beamIndices(t, c)
	assert.Equal(t, idx[0][3], again[0][3])
	assert.NotEqual(t, idx[0][3], again[1][3])
	assert.Equal(t, one3, f.readPage(loc, again[1][3]))
	require.NoError(t, f.m.CheckInvariants())
	require.NoError(t, c.Close())
}

// Committing converged tokens publishes each block they complete once, from
// beam 0, and every beam sees that one page from then on.
func TestCommittedBeamBlocksArePublishedOnceAndShared(t *testing.T) {
	var stored []int
	f := newFixture(t, smallConfig(32), WithEventListener(func(e CacheEvent) {
		if e.Kind == BlockStored {
			stored = append(stored, len(e.Tokens))
		}
	}))
	c, _, _ := openBeamCache(t, f)
	stored = nil
	require.NoError(t, c.SetBeamWidth(3))
	require.NoError(t, c.Resize(13, -1))
	free := f.hotStats().Free
	require.NoError(t, c.CommitBeamSearch(seq(10, 2), []int{0, 1, 2}, false))
	assert.Equal(t, []int{tpb}, stored, "block 2 is published once")
	idx := beamIndices(t, c)
	assert.Equal(t, idx[0][2], idx[1][2])
	assert.Equal(t, idx[0][2], idx[2][2])
	assert.NotEqual(t, idx[0][3], idx[1][3], "the next block stays per beam")
	assert.Equal(t, free+2, f.hotStats().Free, "beams 1 and 2 release their pages of block 2")
	assert.Equal(t, 12, c.NumCommittedTokens())
	assert.Equal(t, 12, f.m.ProbeReuse(blockhash.Scope{}, seq(0, 13)))
	require.NoError(t, f.m.CheckInvariants())
	require.NoError(t, c.Close())
	require.NoError(t, f.m.CheckInvariants(c))
}

// A smaller beam width drops the beams beyond it with their private pages.
func TestNarrowingTheBeamDropsBeamsAndTheirPages(t *testing.T) {
	f := newFixture(t, smallConfig(32))
	c, _, _ := openBeamCache(t, f)
	free := f.hotStats().Free
	require.NoError(t, c.SetBeamWidth(4))
	require.NoError(t, c.SetBeamWidth(2))
	assert.Equal(t, free-1, f.hotStats().Free, "beam 1's diverging copy stays")
	require.NoError(t, c.SetBeamWidth(1))
	assert.Equal(t, free, f.hotStats().Free)
	require.NoError(t, f.m.CheckInvariants())
	require.NoError(t, c.Close())
}

// Failed beam calls change nothing: out of pages for the copies, bad
// beam_search_indices, a commit past the capacity.
func TestFailedBeamCallsChangeNothing(t *testing.T) {
	f := newFixture(t, smallConfig(4))
	c, _, _ := openBeamCache(t, f) // 3 of 4 pages, then 4 with two beams
	require.NoError(t, c.SetBeamWidth(2))
	free, idx := f.hotStats().Free, beamIndices(t, c)

	assert.ErrorIs(t, c.SetBeamWidth(3), ErrOutOfPages)
	assert.ErrorIs(t, c.Resize(13, -1), ErrOutOfPages)
	for _, bad := range [][]int{{0}, {0, 0, 0}, {0, 2}, {-1, 0}} {
		err := c.CommitBeamSearch(nil, bad, false)
		assert.ErrorIs(t, err, ErrInvalidArgument)
		assert.ErrorContains(t, err, "beam_search_indices")
	}
	assert.ErrorIs(t, c.CommitBeamSearch(seq(10, 1), []int{1, 0}, false), ErrInvalidArgument, "past the capacity")
	assert.Equal(t, 2, c.BeamWidth())
	assert.Equal(t, 10, c.NumCommittedTokens())
	assert.Equal(t, free, f.hotStats().Free)
	assert.Equal(t, idx, beamIndices(t, c))
	require.NoError(t, f.m.CheckInvariants())
	require.NoError(t, c.Close())
}

// A sliding window releases the pages of every beam once a block leaves it,
// and a shrink releases every beam's pages beyond the capacity.
func TestSlidingWindowAndShrinkReleaseEveryBeam(t *testing.T) {
	cfg := smallConfig(32)
	cfg.Layers[1].SlidingWindowSize = 4
	f := newFixture(t, cfg)
	c := f.open(blockhash.Scope{}, seq(0, 6))
	require.NoError(t, c.SetBeamWidth(2))
	require.NoError(t, c.Resize(16, -1))
	before := f.hotStats().Free
	require.NoError(t, c.Resize(16, 12))
	for k := range 2 {
		idx, err := c.BasePageIndicesOfBeam(1, k)
		require.NoError(t, err)
		assert.Equal(t, BadPageIndex, idx[1], "beam %d: block 1 left the window", k)
	}
	// Block 0's page of the windowed group stays cached in the tree.
	assert.Equal(t, before+2, f.hotStats().Free, "both beams' private pages of block 1 are freed")
	require.NoError(t, f.m.CheckInvariants())
	require.NoError(t, c.Resize(12, -1))
	assert.Len(t, beamIndices(t, c)[1], 3)
	require.NoError(t, f.m.CheckInvariants())
	require.NoError(t, c.Close())
	require.NoError(t, f.m.CheckInvariants(c))
}

// A suspended cache's beam pages are private pages like any other: they
// stay, move to colder levels and come back on Resume with their bytes.
func TestBeamPagesSurviveSuspendAndResume(t *testing.T) {
	f := newFixture(t, smallConfig(32))
	c, loc, pattern := openBeamCache(t, f)
	require.NoError(t, c.SetBeamWidth(2))
	idx := beamIndices(t, c)
	mine := f.fillPage(loc, idx[1][2], 42)
	require.NoError(t, c.Suspend())
	require.NoError(t, c.Resume(f.stream))
	idx = beamIndices(t, c)
	assert.Equal(t, pattern, f.readPage(loc, idx[0][2]))
	assert.Equal(t, mine, f.readPage(loc, idx[1][2]))
	require.NoError(t, f.m.CheckInvariants())
	require.NoError(t, c.Close())
}

// A reorder that keeps the beam width needs no new pages: the copies of the
// diverging block go into the pages it releases, so it succeeds on a full
// GPU level.
func TestReorderOnAFullLevelReusesTheReleasedPages(t *testing.T) {
	f := newFixture(t, smallConfig(5))
	c, loc, _ := openBeamCache(t, f)
	require.NoError(t, c.SetBeamWidth(3)) // 5 of 5 pages
	require.Zero(t, f.hotStats().Free)
	old := beamIndices(t, c)
	two := f.fillPage(loc, old[2][2], 9)
	require.NoError(t, c.CommitBeamSearch(nil, []int{2, 2, 0}, false))
	idx := beamIndices(t, c)
	assert.Equal(t, old[2][2], idx[0][2])
	assert.Equal(t, two, f.readPage(loc, idx[1][2]), "beam 1 holds a copy of old beam 2")
	assert.Equal(t, old[0][2], idx[2][2], "beam 2 takes old beam 0's page")
	assert.Zero(t, f.hotStats().Free)
	require.NoError(t, f.m.CheckInvariants())
	require.NoError(t, c.Close())
}
