package core

import (
	"fmt"
	"slices"

	"github.com/kvcm/kvcm/core/config"
	"github.com/kvcm/kvcm/core/device"
	"github.com/kvcm/kvcm/core/layout"
)

// A fresh run (CacheOptions.FreshBlocks, FreshFromBlock) is a reuse plan
// that is not one prefix: of the matched prefix's n blocks the cache reuses
// blocks 0..f and f+k..n and computes the k blocks f..f+k afresh, so that an
// engine can read the prefix's tail up from host or disk while it computes
// the run (both finish together when k is chosen for it), and reuses the
// blocks before f where they already are (typically on the GPU). The rules:
//
//   - At creation the cache holds the tree pages of blocks 0..f and
//     f+k..n (Resume and Prefetch bring them to the GPU, as any reused
//     block's) and fresh private GPU pages for the run; the run's tree
//     copies are not referenced, so eviction may move or drop them meanwhile.
//   - History: HistoryLength and ReusedTokens are the whole matched prefix,
//     the run included (the KV past it is the engine's to compute, as after
//     any reuse); FreshRange is the run, in tokens. The run's KV is owed: the
//     engine computes it into the run's pages before attending over it.
//   - Commits: NumCommittedTokens is f's end until the run is committed. The
//     next commits must be the run's tokens, in order, and may not pass its
//     end; they publish the run's blocks as any commit does, so a block
//     whose tree copy sits unreferenced on a colder level is replaced by the
//     computed one (see dropColder) and the next request finds it on the
//     GPU. The commit that completes the run joins the tail: the committed
//     length jumps to the matched prefix's end, the chain continues from its
//     last block, and commits go on from there.
//   - Readiness: while the run is owed, Resume makes the cache's stream
//     wait only for the pages the run's compute reads and writes (the
//     blocks before the run and the run's own pages, and any past the
//     prefix); the tail's onboarding goes on meanwhile, so the run's
//     prefill enqueued after Resume overlaps it. WaitFreshTail enqueues the
//     wait for the tail; the engine calls it before any work that reads
//     past the run (the order: Resume, compute the run, commit it,
//     WaitFreshTail, attend past the run). Reading the tail before it is
//     the engine's bug; the library's own operations stay correct without
//     it: the tail's fences keep the onboarding's events until they
//     complete, so a migration of a tail page (after Suspend or Close),
//     another cache's Resume or partial copy of a tail block, and the
//     shared tier all wait for them as for any page, and nothing the
//     library enqueues on the cache's stream reads the tail (beam copies
//     copy only blocks past the committed length: the tail is committed
//     from the join on, and beam commits are refused before). A failed
//     onboarding of the tail reaches the stream at WaitFreshTail, and the
//     cache's next call once it is known (ErrDataLost), as Resume's.
//     A Resume after the run's commit waits for every page again.
//   - When the GPU has no room for the run's pages the cache reuses the
//     whole prefix instead (FreshRange empty); a run reaching the match's
//     end is a plain cut: the cache reuses blocks 0..f only. Partial reuse
//     of one more block is off for a cache with a fresh run.
//
// It is refused with SSM layers, sliding windows and multimodal digests
// (their state, window and digest positions assume a committed prefix).
// Errors name the options as the C ABI and the bindings spell them
// (fresh_blocks, fresh_from_block), as the core's other argument errors do.

// checkFreshRun validates CacheOptions.FreshBlocks and FreshFromBlock
// (fresh_blocks and fresh_from_block in errors).
func (m *Manager) checkFreshRun(opts *CacheOptions) error {
	k, f := opts.FreshBlocks, opts.FreshFromBlock
	switch {
	case k < 0:
		return argErr("fresh_blocks", "%d is negative", k)
	case f < 0:
		return argErr("fresh_from_block", "%d is negative", f)
	case k == 0 && f > 0:
		return argErr("fresh_from_block", "set without fresh_blocks")
	case k == 0:
		return nil
	case m.lt.SSM >= 0:
		return argErr("fresh_blocks", "not supported with SSM layers")
	case len(opts.InputDigests) > 0:
		return argErr("fresh_blocks", "not supported with input digests")
	}
	for _, lc := range m.lt.LifeCycles {
		if lc.Window.Size > 0 {
			return argErr("fresh_blocks", "not supported with sliding-window layers")
		}
	}
	return nil
}

// takeFreshRun turns blocks [from, from+k) of the cache's reused path (held,
// full blocks only) into fresh private GPU pages and returns how many blocks
// it turned: 0 when k is 0, the run starts past the match, the run reaches
// the match's end (the cache then reuses blocks 0..from only) or the GPU has
// no room.
func (c *KVCache) takeFreshRun(mt *match, from, k int, input []config.Token) int {
	m := c.m
	if k == 0 || from >= len(mt.path) {
		return 0
	}
	if from+k >= len(mt.path) {
		for b := from; b < len(mt.path); b++ {
			c.blocks[b].releaseHeld(m)
		}
		c.blocks = c.blocks[:from]
		mt.path = mt.path[:from]
		return 0
	}
	lvl := m.levels[0]
	var few [4]groupNeed
	n := need(few[:0])
	for lc := range m.lt.LifeCycles {
		n = n.add(lvl.groupOf(layout.LayerGroupID(lc)), k)
	}
	// The run's tree pages are let go first: they are what the run's pages
	// replace, and making room may move them.
	for b := from; b < from+k; b++ {
		c.blocks[b].releaseHeld(m)
	}
	if m.reserveAt(0, n) != nil {
		for b := from; b < from+k; b++ {
			for lc, p := range m.pagesOf(mt.path[b]) {
				c.blocks[b].pages[lc] = p
				if p != nil {
					m.ref(p, false)
				}
			}
		}
		// Eviction may have moved or dropped some of them: the path
		// keeps the blocks that are all there, from its start.
		c.cutToFullBlocks(mt)
		return 0
	}
	for b := from; b < from+k; b++ {
		cb := &c.blocks[b]
		cb.node = nil
		for lc := range cb.pages {
			p := m.newPage(lvl.groupOf(layout.LayerGroupID(lc)), layout.LayerGroupID(lc))
			m.ref(p, false)
			cb.pages[lc] = p
		}
	}
	tpb := m.cfg.TokensPerBlock
	c.freshFrom, c.freshTo = from*tpb, (from+k)*tpb
	c.owed = true
	c.freshInput = slices.Clone(input[c.freshFrom:c.freshTo])
	return k
}

// releaseHeld lets go of the tree pages a new cache holds for a block.
func (cb *cacheBlock) releaseHeld(m *Manager) {
	for lc, p := range cb.pages {
		if p != nil {
			cb.pages[lc] = nil
			m.unref(p, false)
		}
	}
}

// checkRunCommit refuses a commit, while the run is owed, that is not the
// run's next tokens (see CacheOptions.FreshBlocks).
func (c *KVCache) checkRunCommit(tokens []config.Token, digests int, beams bool) error {
	end := c.committed + len(tokens)
	switch {
	case beams || digests > 0:
		return argErr("tokens", "the fresh run (tokens %d..%d) must be committed first, as plain tokens", c.freshFrom, c.freshTo)
	case end > c.freshTo:
		return argErr("tokens", "committing %d tokens after %d would pass the fresh run's end %d; commit the run first",
			len(tokens), c.committed, c.freshTo)
	case !sameTokens(tokens, c.freshInput[c.committed-c.freshFrom:end-c.freshFrom]):
		return argErr("tokens", "tokens %d..%d are not the fresh run's input tokens", c.committed, end)
	}
	return nil
}

// joinTail continues the committed chain over the reused tail once the run
// is committed: the committed length becomes the matched prefix's.
func (c *KVCache) joinTail() {
	m := c.m
	tpb := m.cfg.TokensPerBlock
	from, to := c.freshTo/tpb, c.reused/tpb
	if c.detached {
		for b := from; b < to; b++ {
			c.orphanBlock(m.tokensOf(c.blocks[b].node), nil)
		}
	} else {
		last := c.blocks[to-1].node
		c.chain.users--
		last.users++
		c.chain = last
	}
	c.committed = c.reused
	c.owed, c.freshInput = false, nil
}

// FreshRange returns the tokens [from, to) of the fresh run the cache was
// created with (see CacheOptions.FreshBlocks): from == to for none.
func (c *KVCache) FreshRange() (from, to int) { return c.freshFrom, c.freshTo }

// eachTailPage calls fn once for every page of the fresh run's tail: the
// reused blocks after the run.
func (c *KVCache) eachTailPage(fn func(p *page)) {
	tpb := c.m.cfg.TokensPerBlock
	for b := c.freshTo / tpb; b < c.reused/tpb; b++ {
		c.blocks[b].eachPage(fn)
	}
}

// eachPageButTail is eachPage without the fresh run's tail.
func (c *KVCache) eachPageButTail(fn func(p *page)) {
	tpb := c.m.cfg.TokensPerBlock
	from, to := c.freshTo/tpb, c.reused/tpb
	for b := range c.blocks {
		if b < from || b >= to {
			c.blocks[b].eachPage(fn)
		}
	}
	if c.ssm != nil {
		fn(c.ssm)
	}
}

// WaitFreshTail makes stream (nil: the cache's) wait until the fresh run's
// tail is ready: the onboarding of its pages that Resume left out of the
// stream's waits (see CacheOptions.FreshBlocks) has landed. The engine
// enqueues it before any work that reads past the run. It is idempotent:
// once it has run on the cache's stream, later calls do nothing until the
// next Resume, and so does a call on an ACTIVE cache without a run, or
// whose Resume waited for the tail already (after the run's commit). A
// call on another stream orders that stream and leaves the cache's own
// wait pending. The cache must be ACTIVE.
func (c *KVCache) WaitFreshTail(stream device.Stream) error {
	m := c.m
	m.mu.Lock()
	defer m.mu.Unlock()
	if c.status != Active {
		return stateErr("wait for the fresh tail", c.status)
	}
	if err := c.checkLost(); err != nil {
		return err
	}
	if !c.tailPending {
		return nil
	}
	if stream == nil {
		stream = c.stream
	}
	waits := waitSet{skip: stream}
	c.eachTailPage(func(p *page) { waits.addFence(p.group.fences[p.slot]) })
	err := waits.apply(stream)
	if err == nil {
		err = m.checkBlobs(stream, c.eachTailPage)
	}
	if err != nil {
		return fmt.Errorf("wait for cache %d's fresh tail: %w", c.id, err)
	}
	if stream == c.stream {
		c.tailPending = false
	}
	return nil
}
