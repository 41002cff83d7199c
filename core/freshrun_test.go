package core

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core/blockhash"
	"github.com/kvcm/kvcm/core/config"
	"github.com/kvcm/kvcm/core/device"
)

// eachBlockBuffer is eachBuffer for the blocks in [from, to).
func (f *fixture) eachBlockBuffer(c *KVCache, from, to int, fn func(block int, loc BufferLocation, layer int32, role config.DataRole, base int32)) {
	f.eachBuffer(c, func(block int, loc BufferLocation, layer int32, role config.DataRole, base int32) {
		if block >= from && block < to {
			fn(block, loc, layer, role, base)
		}
	})
}

// verifyBlocks checks the pages of blocks [from, to) against tag's pattern
// and returns how many it checked.
func (f *fixture) verifyBlocks(c *KVCache, from, to, tag int) int {
	f.t.Helper()
	n := 0
	f.eachBlockBuffer(c, from, to, func(block int, loc BufferLocation, layer int32, role config.DataRole, base int32) {
		require.Equal(f.t, pattern(tag, block, loc, layer, role, loc.Bytes), f.readPage(loc, base), "block %d layer %d role %s", block, layer, role)
		n++
	})
	return n
}

// pushedToHost computes prompt (tag 1) on a 4-page GPU with an 8-page host
// and pushes its blocks to host with another prompt.
func pushedToHost(t *testing.T) (*fixture, []config.Token) {
	f := newTieredFixture(t, tieredConfig(t, 4, 8, 0))
	prompt := seq(0, 16)
	require.NoError(t, f.compute(blockhash.Scope{}, prompt, 1).Close())
	require.NoError(t, f.compute(blockhash.Scope{}, seq(500, 16), 2).Close())
	require.Equal(t, int64(4), levelOf(t, f.m, 1).Evictable, "the first prompt's 4 blocks went to host")
	return f, prompt
}

// assertRange checks a cache's fresh run, in tokens.
func assertRange(t *testing.T, c *KVCache, from, to int) {
	t.Helper()
	f, e := c.FreshRange()
	assert.Equal(t, [2]int{from, to}, [2]int{f, e}, "fresh range")
}

// A cache created with a fresh run of the first h blocks reuses the matched
// prefix's blocks from h on (their bytes come up from the colder level) and
// gets fresh GPU pages for the first h; its history is the whole prefix,
// nothing is committed until the run is, and the commit that completes the
// run continues the chain over the tail. The recomputed blocks replace their
// unused cold copies: the next request reuses the whole prefix from the GPU,
// the run's bytes being the ones the engine computed.
func TestAFreshHeadIsComputedWhileTheTailIsReused(t *testing.T) {
	f, prompt := pushedToHost(t)
	onboarded := f.m.MigrationStats()[HostToHot].Pages

	c, err := f.m.CreateKVCache(CacheOptions{InputTokens: prompt, FreshBlocks: 2})
	require.NoError(t, err)
	assertRange(t, c, 0, 8)
	assert.Equal(t, 16, c.ReusedTokens(), "reused: the whole matched prefix, the run included")
	assert.Equal(t, 16, c.HistoryLength())
	assert.Equal(t, 0, c.NumCommittedTokens(), "nothing committed until the run is")
	require.NoError(t, c.Resume(f.stream))
	numLC := int64(len(f.m.Layout().LifeCycles))
	assert.Equal(t, onboarded+2*numLC, f.m.MigrationStats()[HostToHot].Pages, "only the tail's 2 blocks come up")
	require.NoError(t, c.WaitFreshTail(nil))
	assert.Equal(t, 8, f.verifyBlocks(c, 2, 4, 1), "the tail holds the first request's bytes")

	// The engine computes the run into its pages and commits it.
	f.eachBlockBuffer(c, 0, 2, func(block int, loc BufferLocation, layer int32, role config.DataRole, base int32) {
		f.writePage(loc, base, pattern(3, block, loc, layer, role, loc.Bytes))
	})
	require.NoError(t, c.Commit(prompt[:4], false))
	assert.Equal(t, 4, c.NumCommittedTokens())
	require.NoError(t, c.Commit(prompt[4:8], false))
	assert.Equal(t, 16, c.NumCommittedTokens(), "the run's commit joins the tail")
	assert.Equal(t, prompt, c.CommittedTokens())
	require.NoError(t, c.Close())

	d, err := f.m.CreateKVCache(CacheOptions{InputTokens: prompt})
	require.NoError(t, err)
	assert.Equal(t, 16, d.ReusedTokens())
	mid := f.m.MigrationStats()[HostToHot].Pages
	require.NoError(t, d.Resume(f.stream))
	assert.Equal(t, mid, f.m.MigrationStats()[HostToHot].Pages, "reused from the GPU, nothing onboarded")
	assert.Equal(t, 8, f.verifyBlocks(d, 0, 2, 3), "the run the engine computed")
	assert.Equal(t, 8, f.verifyBlocks(d, 2, 4, 1), "the tail as first computed")
	require.NoError(t, d.Close())
}

// Commits go on past the joined tail as after any reuse: the blocks after
// the prefix are published behind it, and a later request reuses all of it.
func TestCommitsAfterTheJoinedTailExtendTheChain(t *testing.T) {
	f := newTieredFixture(t, tieredConfig(t, 8, 8, 0))
	prefix := seq(0, 16)
	require.NoError(t, f.compute(blockhash.Scope{}, prefix, 1).Close())
	prompt := append(seq(0, 16), seq(100, 8)...)

	c, err := f.m.CreateKVCache(CacheOptions{InputTokens: prompt, FreshBlocks: 1})
	require.NoError(t, err)
	assertRange(t, c, 0, 4)
	require.NoError(t, c.Resume(f.stream))
	require.NoError(t, c.Resize(len(prompt), len(prompt)))
	require.NoError(t, c.Commit(prompt[:4], false))
	require.NoError(t, c.Commit(prompt[16:], false))
	assert.Equal(t, prompt, c.CommittedTokens())
	require.NoError(t, c.Close())
	assert.Equal(t, len(prompt), f.serve(blockhash.Scope{}, prompt))
}

// A run that starts past the prompt's beginning: the blocks before it are
// reused and committed at creation, the run's commits follow them, and the
// tail after it joins; every block holds the bytes of whoever computed it.
func TestAFreshRunInTheMiddleKeepsTheBlocksBeforeIt(t *testing.T) {
	f, prompt := pushedToHost(t)
	c, err := f.m.CreateKVCache(CacheOptions{InputTokens: prompt, FreshFromBlock: 1, FreshBlocks: 2})
	require.NoError(t, err)
	assertRange(t, c, 4, 12)
	assert.Equal(t, 16, c.HistoryLength())
	assert.Equal(t, 4, c.NumCommittedTokens(), "the block before the run is committed")
	require.NoError(t, c.Resume(f.stream))
	f.eachBlockBuffer(c, 1, 3, func(block int, loc BufferLocation, layer int32, role config.DataRole, base int32) {
		f.writePage(loc, base, pattern(3, block, loc, layer, role, loc.Bytes))
	})
	err = c.Commit(prompt[:4], false)
	require.ErrorIs(t, err, ErrInvalidArgument, "the block before the run is committed already")
	require.NoError(t, c.Commit(prompt[4:12], false))
	assert.Equal(t, 16, c.NumCommittedTokens())
	assert.Equal(t, prompt, c.CommittedTokens())
	require.NoError(t, c.Close())

	d := f.open(blockhash.Scope{}, prompt)
	assert.Equal(t, 16, d.ReusedTokens())
	assert.Equal(t, 4, f.verifyBlocks(d, 0, 1, 1))
	assert.Equal(t, 8, f.verifyBlocks(d, 1, 3, 3))
	assert.Equal(t, 4, f.verifyBlocks(d, 3, 4, 1))
	require.NoError(t, d.Close())
	f.requireNoLeak()
}

// While the run is owed, a commit must be its next tokens and may not pass
// its end; a refused commit changes nothing.
func TestAFreshRunRefusesOtherCommits(t *testing.T) {
	f, prompt := pushedToHost(t)
	c, err := f.m.CreateKVCache(CacheOptions{InputTokens: prompt, FreshBlocks: 2})
	require.NoError(t, err)
	require.NoError(t, c.Resume(f.stream))

	err = c.Commit(prompt[:12], false)
	require.ErrorIs(t, err, ErrInvalidArgument)
	assert.Contains(t, err.Error(), "tokens")
	err = c.Commit(seq(900, 4), false)
	require.ErrorIs(t, err, ErrInvalidArgument)
	assert.Contains(t, err.Error(), "fresh run")
	err = c.CommitBeamSearch(prompt[:4], []int{0}, false)
	require.ErrorIs(t, err, ErrInvalidArgument)
	assert.Equal(t, 0, c.NumCommittedTokens())

	// A commit inside a block is checked as any other, also once nothing
	// is left to settle (a decode step's short path).
	require.NoError(t, c.WaitFreshTail(nil))
	require.NoError(t, f.stream.Synchronize())
	require.NoError(t, c.Commit(prompt[:2], false))
	assert.Equal(t, 2, c.NumCommittedTokens())
	err = c.Commit(seq(900, 1), false)
	require.ErrorIs(t, err, ErrInvalidArgument)
	assert.Contains(t, err.Error(), "fresh run")
	assert.Equal(t, 2, c.NumCommittedTokens())
	require.NoError(t, c.Commit(prompt[2:8], false))
	assert.Equal(t, 16, c.NumCommittedTokens())
	require.NoError(t, c.Close())
}

// A run that reaches the match's end is a plain cut (from the beginning: no
// reuse); a run the GPU has no room for leaves the cache reusing the whole
// prefix.
func TestAFreshRunFallsBackToPlainReuse(t *testing.T) {
	f, prompt := pushedToHost(t)
	c, err := f.m.CreateKVCache(CacheOptions{InputTokens: prompt, FreshBlocks: 4})
	require.NoError(t, err)
	assertRange(t, c, 0, 0)
	assert.Equal(t, 0, c.ReusedTokens())
	require.NoError(t, c.Close())
	c, err = f.m.CreateKVCache(CacheOptions{InputTokens: prompt, FreshFromBlock: 1, FreshBlocks: 5})
	require.NoError(t, err)
	assertRange(t, c, 0, 0)
	assert.Equal(t, 4, c.ReusedTokens())
	assert.Equal(t, 4, c.NumCommittedTokens())
	require.NoError(t, c.Close())

	// Every GPU page pinned by an active cache: no room for the run.
	pin := f.open(blockhash.Scope{}, seq(700, 16))
	c, err = f.m.CreateKVCache(CacheOptions{InputTokens: prompt, FreshBlocks: 2})
	require.NoError(t, err)
	assertRange(t, c, 0, 0)
	assert.Equal(t, 16, c.ReusedTokens())
	assert.Equal(t, 16, c.NumCommittedTokens())
	require.NoError(t, c.Close())
	require.NoError(t, pin.Close())
	f.requireNoLeak()
}

// Bad plans are refused, naming the option as the C ABI and the bindings
// spell it: negative counts, a start without a run, and layouts whose
// state assumes a committed prefix.
func TestAFreshRunIsRefusedWhereItCannotHold(t *testing.T) {
	f := newFixture(t, smallConfig(8))
	_, err := f.m.CreateKVCache(CacheOptions{InputTokens: seq(0, 8), FreshBlocks: -1})
	require.ErrorIs(t, err, ErrInvalidArgument)
	assert.Contains(t, err.Error(), "fresh_blocks")
	_, err = f.m.CreateKVCache(CacheOptions{InputTokens: seq(0, 8), FreshBlocks: 1, FreshFromBlock: -1})
	require.ErrorIs(t, err, ErrInvalidArgument)
	assert.Contains(t, err.Error(), "fresh_from_block")
	_, err = f.m.CreateKVCache(CacheOptions{InputTokens: seq(0, 8), FreshFromBlock: 1})
	require.ErrorIs(t, err, ErrInvalidArgument)
	assert.Contains(t, err.Error(), "fresh_from_block")

	s := newFixture(t, ssmConfig(8))
	_, err = s.m.CreateKVCache(CacheOptions{InputTokens: seq(0, 8), FreshBlocks: 1})
	require.ErrorIs(t, err, ErrInvalidArgument)
	assert.Contains(t, err.Error(), "fresh_blocks")

	w := newFixture(t, windowConfig())
	_, err = w.m.CreateKVCache(CacheOptions{InputTokens: seq(0, 8), FreshBlocks: 1})
	require.ErrorIs(t, err, ErrInvalidArgument)
	assert.Contains(t, err.Error(), "fresh_blocks")
}

// parkOnboardings blocks the host→GPU stream until the returned function
// (also run at cleanup) is called (see parkPath).
func (f *fixture) parkOnboardings() (release func()) {
	f.t.Helper()
	return f.parkPath(1, 0)
}

// syncWithin synchronizes s, failing the test (after release) when it
// does not return: the work on it waited for the parked stream.
func syncWithin(t *testing.T, s device.Stream, release func(), why string) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- s.Synchronize() }()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		release()
		t.Fatal(why)
	}
}

// The overlap: while the run is owed, Resume orders the cache's stream after
// the pages the run's compute uses only, so the run is computed and
// committed while the tail's onboarding is still parked; WaitFreshTail
// orders the stream after the tail, whose bytes are then the original ones.
// It is idempotent, and a no-op without a run.
func TestTheRunIsComputedWhileTheTailIsStillOnboarding(t *testing.T) {
	f, prompt := pushedToHost(t)
	c, err := f.m.CreateKVCache(CacheOptions{InputTokens: prompt, FreshBlocks: 2})
	require.NoError(t, err)
	release := f.parkOnboardings()
	require.NoError(t, c.Resume(f.stream))
	syncWithin(t, f.stream, release, "Resume made the stream wait for the tail's onboarding")
	f.eachBlockBuffer(c, 0, 2, func(block int, loc BufferLocation, layer int32, role config.DataRole, base int32) {
		f.writePage(loc, base, pattern(3, block, loc, layer, role, loc.Bytes))
	})
	require.NoError(t, c.Commit(prompt[:8], false))
	assert.Equal(t, 16, c.NumCommittedTokens(), "the run's commit joins the tail")

	require.NoError(t, c.WaitFreshTail(nil))
	done := f.syncAsync()
	assert.True(t, notWithin(done), "the stream passed WaitFreshTail before the tail landed")
	release()
	require.NoError(t, <-done)
	assert.Equal(t, 8, f.verifyBlocks(c, 0, 2, 3), "the run the engine computed")
	assert.Equal(t, 8, f.verifyBlocks(c, 2, 4, 1), "the tail's original bytes")
	require.NoError(t, c.WaitFreshTail(nil), "idempotent")
	require.NoError(t, c.Close())

	d, err := f.m.CreateKVCache(CacheOptions{InputTokens: prompt})
	require.NoError(t, err)
	require.ErrorIs(t, d.WaitFreshTail(nil), ErrInvalidState, "a SUSPENDED cache")
	require.NoError(t, d.Resume(f.stream))
	require.NoError(t, d.WaitFreshTail(nil), "no run: nothing to wait for")
	assert.Equal(t, 8, f.verifyBlocks(d, 0, 2, 3))
	assert.Equal(t, 8, f.verifyBlocks(d, 2, 4, 1))
	require.NoError(t, d.Close())
}

// Another cache reusing the tail gets it only with a wait: its Resume
// settles the tail's onboarding, which the first cache's stream did not
// wait for, before it returns.
func TestAnotherCacheReusingTheTailWaitsForItsOnboarding(t *testing.T) {
	f, prompt := pushedToHost(t)
	c, err := f.m.CreateKVCache(CacheOptions{InputTokens: prompt, FreshBlocks: 2})
	require.NoError(t, err)
	release := f.parkOnboardings()
	require.NoError(t, c.Resume(f.stream))
	f.eachBlockBuffer(c, 0, 2, func(block int, loc BufferLocation, layer int32, role config.DataRole, base int32) {
		f.writePage(loc, base, pattern(3, block, loc, layer, role, loc.Bytes))
	})
	require.NoError(t, c.Commit(prompt[:8], false))

	d, err := f.m.CreateKVCache(CacheOptions{InputTokens: prompt})
	require.NoError(t, err)
	other, err := f.dev.NewStream()
	require.NoError(t, err)
	defer other.Close()
	mid := f.m.MigrationStats()[HostToHot].Pages
	done := make(chan error, 1)
	go func() { done <- d.Resume(other) }()
	assert.True(t, notWithin(done), "the other cache resumed before the tail landed")
	release()
	require.NoError(t, <-done)
	assert.Equal(t, mid, f.m.MigrationStats()[HostToHot].Pages, "every block shared with the first cache on the GPU")
	require.NoError(t, other.Synchronize())
	assert.Equal(t, 8, f.verifyBlocks(d, 0, 2, 3))
	assert.Equal(t, 8, f.verifyBlocks(d, 2, 4, 1), "the tail's original bytes")
	require.NoError(t, d.Close())
	require.NoError(t, c.Close())
}

// Suspending or closing the cache right after Resume, the tail never waited
// for, keeps its bytes: the eviction that then takes its slots waits for
// the onboarding, and the tail comes back to the byte (after a Suspend, the
// next Resume leaves it to WaitFreshTail again while the run is owed).
func TestSuspendOrCloseRightAfterResumeKeepsTheTail(t *testing.T) {
	for _, closeIt := range []bool{false, true} {
		name := map[bool]string{false: "suspend", true: "close"}[closeIt]
		t.Run(name, func(t *testing.T) {
			f, prompt := pushedToHost(t)
			c, err := f.m.CreateKVCache(CacheOptions{InputTokens: prompt, FreshBlocks: 2})
			require.NoError(t, err)
			release := f.parkOnboardings()
			require.NoError(t, c.Resume(f.stream))
			if closeIt {
				require.NoError(t, c.Close())
			} else {
				require.NoError(t, c.Suspend())
			}
			f.passThrough(seq(700, 16), false) // the tail's slots go to another request
			release()
			require.NoError(t, f.stream.Synchronize())

			if closeIt {
				d, err := f.m.CreateKVCache(CacheOptions{InputTokens: prompt})
				require.NoError(t, err)
				require.NoError(t, d.Resume(f.stream))
				assert.Equal(t, 16, f.verifyAll(d, 1), "the prefix as first computed")
				require.NoError(t, d.Close())
				return
			}
			assert.Equal(t, 4, c.Residency()[1], "the tail's slots went to the other request")
			require.NoError(t, c.Resume(f.stream))
			require.NoError(t, c.WaitFreshTail(nil))
			assert.Equal(t, 8, f.verifyBlocks(c, 2, 4, 1), "the tail as first computed")
			require.NoError(t, c.Close())
		})
	}
}

// Once the run is committed, a Resume waits for every page again: with only
// the tail cold, the stream does not pass the Resume until it lands, and
// WaitFreshTail has nothing left to do.
func TestAResumeAfterTheRunsCommitWaitsForTheTail(t *testing.T) {
	f, prompt := pushedToHost(t)
	c, err := f.m.CreateKVCache(CacheOptions{InputTokens: prompt, FreshBlocks: 2})
	require.NoError(t, err)
	require.NoError(t, c.Resume(f.stream))
	f.eachBlockBuffer(c, 0, 2, func(block int, loc BufferLocation, layer int32, role config.DataRole, base int32) {
		f.writePage(loc, base, pattern(3, block, loc, layer, role, loc.Bytes))
	})
	require.NoError(t, c.Commit(prompt[:8], false))
	require.NoError(t, c.WaitFreshTail(nil))
	require.NoError(t, c.Suspend())
	f.passThrough(seq(700, 8), false) // the tail's 2 blocks go to host
	require.Equal(t, 2, c.Residency()[1], "only the tail is cold")

	release := f.parkOnboardings()
	require.NoError(t, c.Resume(f.stream))
	done := f.syncAsync()
	assert.True(t, notWithin(done), "the stream passed the Resume before the tail landed")
	release()
	require.NoError(t, <-done)
	require.NoError(t, c.WaitFreshTail(nil), "nothing left to wait for")
	assert.Equal(t, 8, f.verifyBlocks(c, 0, 2, 3))
	assert.Equal(t, 8, f.verifyBlocks(c, 2, 4, 1), "the tail as first computed")
	require.NoError(t, c.Close())
}
