package core

import (
	"slices"

	"github.com/kvcm/kvcm/core/config"
	"github.com/kvcm/kvcm/core/layout"
)

// A fresh head (CacheOptions.FreshHeadBlocks) is a reuse plan that does not
// start at the prompt's beginning: the cache reuses blocks h..n of the
// matched prefix and computes blocks 0..h afresh, so that an engine can read
// a prefix's tail up from host or disk while it computes the head (both
// finish together when h is chosen for it). The rules:
//
//   - At creation the cache holds the tail's tree pages (Resume and Prefetch
//     bring them to the GPU, as any reused block's) and fresh private GPU
//     pages for the head; the head's tree copies are not referenced, so
//     eviction may move or drop them meanwhile.
//   - History: HistoryLength and ReusedTokens are the whole matched prefix,
//     head included (the KV past it is the engine's to compute, as after any
//     reuse); FreshHeadTokens is the head. The head's KV is owed: the engine
//     computes it into the head's pages before attending over it.
//   - Commits: NumCommittedTokens is 0 until the head is committed. The first
//     commits must be the head's tokens, in order, and may not pass its end;
//     they publish the head's blocks as any commit does, so a head block
//     whose tree copy sits unreferenced on a colder level replaces it (see
//     dropColder) and the next request finds it on the GPU. The commit that
//     completes the head joins the tail: the committed length jumps to the
//     matched prefix's end, the chain continues from its last block, and
//     commits go on from there.
//   - When the GPU has no room for the head's pages the cache reuses the
//     whole prefix instead (FreshHeadTokens 0); a head covering the whole
//     match reuses nothing. Partial reuse of one more block is off for a
//     cache with a fresh head.
//
// It is refused with SSM layers, sliding windows and multimodal digests
// (their state, window and digest positions assume a committed prefix).

// checkFreshHead validates CacheOptions.FreshHeadBlocks.
func (m *Manager) checkFreshHead(opts *CacheOptions) error {
	h := opts.FreshHeadBlocks
	switch {
	case h < 0:
		return argErr("FreshHeadBlocks", "%d is negative", h)
	case h == 0:
		return nil
	case m.lt.SSM >= 0:
		return argErr("FreshHeadBlocks", "not supported with SSM layers")
	case len(opts.InputDigests) > 0:
		return argErr("FreshHeadBlocks", "not supported with input digests")
	}
	for _, lc := range m.lt.LifeCycles {
		if lc.Window.Size > 0 {
			return argErr("FreshHeadBlocks", "not supported with sliding-window layers")
		}
	}
	return nil
}

// takeFreshHead turns the first h blocks of the cache's reused path (held,
// full blocks only) into fresh private GPU pages and returns how many blocks
// it turned: 0 when h is 0 or the GPU has no room, len(path) when the head
// covers the whole match (the cache then drops the path: it reuses nothing).
func (c *KVCache) takeFreshHead(mt *match, h int, input []config.Token) int {
	m := c.m
	if h == 0 || len(mt.path) == 0 {
		return 0
	}
	if h >= len(mt.path) {
		for b := range mt.path {
			c.blocks[b].releaseHeld(m)
		}
		c.blocks = c.blocks[:0]
		mt.path = mt.path[:0]
		return 0
	}
	lvl := m.levels[0]
	var few [4]groupNeed
	n := need(few[:0])
	for lc := range m.lt.LifeCycles {
		n = n.add(lvl.groupOf(layout.LayerGroupID(lc)), h)
	}
	// The head's tree pages are let go first: they are what the head's
	// pages replace, and making room may move them.
	for b := range h {
		c.blocks[b].releaseHeld(m)
	}
	if m.reserveAt(0, n) != nil {
		for b, nd := range mt.path[:h] {
			for lc, p := range m.pagesOf(nd) {
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
	for b := range h {
		cb := &c.blocks[b]
		cb.node = nil
		for lc := range cb.pages {
			p := m.newPage(lvl.groupOf(layout.LayerGroupID(lc)), layout.LayerGroupID(lc))
			m.ref(p, false)
			cb.pages[lc] = p
		}
	}
	tpb := m.cfg.TokensPerBlock
	c.head = h * tpb
	c.freshHead = c.head
	c.headInput = slices.Clone(input[:c.head])
	return h
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

// checkHeadCommit refuses a commit, while the head is owed, that is not the
// head's next tokens (see FreshHeadBlocks).
func (c *KVCache) checkHeadCommit(tokens []config.Token, digests int, beams bool) error {
	end := c.committed + len(tokens)
	switch {
	case beams || digests > 0:
		return argErr("tokens", "the fresh head (%d tokens) must be committed first, as plain tokens", c.head)
	case end > c.head:
		return argErr("tokens", "committing %d tokens after %d would pass the fresh head's end %d; commit the head first",
			len(tokens), c.committed, c.head)
	case !slices.Equal(tokens, c.headInput[c.committed:end]):
		return argErr("tokens", "tokens %d..%d are not the fresh head's input tokens", c.committed, end)
	}
	return nil
}

// joinTail continues the committed chain over the reused tail once the head
// is committed: the committed length becomes the matched prefix's.
func (c *KVCache) joinTail() {
	m := c.m
	tpb := m.cfg.TokensPerBlock
	from, to := c.head/tpb, c.reused/tpb
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
	c.head, c.headInput = 0, nil
}

// FreshHeadTokens returns the tokens of the fresh head the cache was created
// with (see CacheOptions.FreshHeadBlocks): 0 for none.
func (c *KVCache) FreshHeadTokens() int { return c.freshHead }
