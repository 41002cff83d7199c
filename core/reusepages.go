package core

import (
	"github.com/kvcm/kvcm/core/blockhash"
	"github.com/kvcm/kvcm/core/config"
	"github.com/kvcm/kvcm/core/layout"
)

// ReusePage is one block of a reuse match in one layer group (ReusePages):
// the tokens of the block matched, and the page covering the most of them:
// where it lives and how many of the block's tokens it holds the KV of
// (Covered 0, Level and Slot -1 where no page of the layer group holds the
// matched tokens).
type ReusePage struct {
	Matched int
	Covered int
	Level   layout.CacheLevel
	Slot    int32
}

// ReusePages matches input in scope against the tree by content (the tokens
// the tree holds along input, whatever their pages) and returns the tokens
// matched and, per block of the match, the page of layer group lg that
// covers the most of the block. A block's own page covers its tokens; a block position also has
// the pages of the partial blocks committed beside it whose tokens the block
// starts with, each covering its own tokens, so a full block whose page of
// a sliding window was never kept is covered as far as a partial one's page
// reaches. These are KVCacheManagerV2's partial-coverage pages (it moves the
// partial block's pages into the full one, each recording its token count;
// kvcm keeps the partial block beside it). The match ends with the matching
// head of one more block: with partial, as far as a block beside it agrees
// with input (less than a block); else only a partial block input holds
// whole. Input is text: a block holding digest tokens matches none. It
// changes nothing.
func (m *Manager) ReusePages(scope blockhash.Scope, input []config.Token, lg layout.LayerGroupID, partial bool) (int, []ReusePage, error) {
	if int(lg) < 0 || int(lg) >= len(m.lt.LifeCycles) {
		return 0, nil, argErr("layer_group", "%d is not one of the %d layer groups", lg, len(m.lt.LifeCycles))
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return 0, nil, nil
	}
	cur := m.roots[scope.Root()]
	if cur == nil || len(input) == 0 {
		return 0, nil, nil
	}
	tpb := m.cfg.TokensPerBlock
	var pages []ReusePage
	b := 0
	for ; (b+1)*tpb <= len(input); b++ {
		blk := input[b*tpb : (b+1)*tpb]
		c := m.childHolding(cur, blk, nil)
		if c == nil {
			break
		}
		pages = append(pages, m.widestPage(cur, blk, lg))
		pages[b].Matched = tpb
		cur = c
	}
	head := input[b*tpb : min(len(input), (b+1)*tpb)]
	l := 0
	m.children(cur, func(c *node) {
		k := commonPrefix(m.tokensOf(c), m.digestsOf(c), head, nil)
		switch {
		case partial:
			l = max(l, min(k, tpb-1))
		case c.isPartial(tpb) && k == int(c.ntok):
			l = max(l, k)
		}
	})
	if l > 0 {
		pages = append(pages, m.widestPage(cur, head[:l], lg))
		pages[b].Matched = l
	}
	return b*tpb + l, pages, nil
}

// widestPage returns, among the children of parent that agree with head (a
// block's matched tokens) on all of their tokens or all of head, the page of
// lifecycle lg covering the most tokens (Covered 0 if none has one).
func (m *Manager) widestPage(parent *node, head []config.Token, lg layout.LayerGroupID) ReusePage {
	best := ReusePage{Level: -1, Slot: BadPageIndex}
	m.children(parent, func(c *node) {
		p := m.pagesOf(c)[lg]
		if p == nil || p.lost || len(m.digestsOf(c)) > 0 {
			return
		}
		n := int(c.ntok)
		if commonPrefix(m.tokensOf(c), nil, head, nil) < min(n, len(head)) {
			return
		}
		if n > best.Covered {
			best = ReusePage{Covered: n, Level: layout.CacheLevel(p.level()), Slot: p.slot}
		}
	})
	return best
}
