package core

import (
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core/blockhash"
	"github.com/kvcm/kvcm/core/layout"
)

// CheckInvariants checks the manager's bookkeeping at a return point (no
// call in progress) and returns every violation found:
//   - every live cache has committed ≤ history ≤ capacity, its tail the
//     tokens of its last incomplete block, and one block per capacity block,
//     holds a page exactly where its layer group needs one (in every beam),
//     and its pages are on the GPU level while it is ACTIVE; no two beams
//     share a page of a block holding a position at or past the history
//     length, and a committed block has one page for all beams;
//   - every slot of every pool group is free or owned by exactly one page,
//     and the owner's group and slot agree; free slots are distinct;
//   - every page's active and held counts are the references of the ACTIVE
//     and SUSPENDED caches, a page is in its group's victim set exactly
//     when it is evictable, and a transaction still moving it is pending;
//   - every owned page is linked in the tree or referenced by a cache (no
//     leaked slot), no lost page is reachable from the tree, and every tree
//     page links back to its node;
//   - with SSM layers every ACTIVE cache holds its own SSM state on the GPU
//     level; a SUSPENDED one may still hold the snapshot it reused (a tree
//     page), and these references count like the blocks' pages;
//   - a node's users are the caches whose chain ends at it;
//   - the given closed caches hold nothing and are unknown to the manager.
//
// It is an internal test helper (exported to the package's external tests
// only).
func (m *Manager) CheckInvariants(closed ...*KVCache) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	var errs []error
	fail := func(format string, args ...any) {
		if len(errs) < 20 {
			errs = append(errs, fmt.Errorf(format, args...))
		}
	}
	if m.closed {
		return nil
	}
	type refs struct{ active, held int }
	want := map[*page]*refs{}
	chains := map[*node]int{}
	for id, c := range m.caches {
		if c.id != id || c.status == Closed {
			fail("cache %d: in the manager's map as %d with status %v", c.id, id, c.status)
			continue
		}
		if n := c.committed; !(n <= c.history && c.history <= c.capacity) {
			fail("cache %d: committed %d, history %d, capacity %d", c.id, n, c.history, c.capacity)
		}
		if len(c.tail) != c.committed%m.cfg.TokensPerBlock {
			fail("cache %d: %d tokens in its last block, %d committed", c.id, len(c.tail), c.committed)
		}
		if got, w := len(c.blocks), m.lt.BlocksFor(c.capacity); got != w {
			fail("cache %d: %d blocks for capacity %d (want %d)", c.id, got, c.capacity, w)
		}
		if (c.status == Active) != (c.stream != nil) {
			fail("cache %d: %v with stream %v", c.id, c.status, c.stream)
		}
		chains[c.chain]++
		for b, cb := range c.blocks {
			if len(cb.pages) != len(m.lt.LifeCycles) {
				fail("cache %d block %d: %d pages for %d layer groups", c.id, b, len(cb.pages), len(m.lt.LifeCycles))
				continue
			}
			if cb.beams != nil && (len(cb.beams) != c.beamWidth()-1 || cb.node != nil) {
				fail("cache %d block %d: %d beam rows for beam width %d (committed: %v)",
					c.id, b, len(cb.beams), c.beamWidth(), cb.node != nil)
				continue
			}
			for k := range c.beamWidth() {
				row := cb.beamPages(k)
				for lc, p := range row {
					if p != nil && k > 0 && !cb.firstOf(k, lc) {
						if (b+1)*m.cfg.TokensPerBlock > c.history {
							fail("cache %d block %d layer group %d: beam %d shares a page it writes into", c.id, b, lc, k)
						}
						continue // counted once, at the first beam that sees it
					}
					needs := m.lt.Needs(layout.LayerGroupID(lc), b, c.history)
					switch {
					case p == nil && needs:
						fail("cache %d block %d layer group %d: needed but has no page", c.id, b, lc)
					case p != nil && !needs:
						fail("cache %d block %d layer group %d: keeps a page it does not need", c.id, b, lc)
					}
					if p == nil {
						continue
					}
					if p.group == nil {
						fail("cache %d block %d layer group %d: references a freed page", c.id, b, lc)
						continue
					}
					if int(p.lc) != lc {
						fail("cache %d block %d layer group %d: page of layer group %d", c.id, b, lc, p.lc)
					}
					if c.status == Active && p.level() != 0 {
						fail("cache %d block %d layer group %d: ACTIVE with a page on level %d", c.id, b, lc, p.level())
					}
					r := want[p]
					if r == nil {
						r = &refs{}
						want[p] = r
					}
					if c.status == Active {
						r.active++
					} else {
						r.held++
					}
				}
			}
		}
	}
	for _, c := range m.caches {
		if p := c.stopState; p != nil && c.status != Closed {
			// The copy of the SSM state for the partial block published at
			// close: held by the cache, private.
			if p.group == nil || p.lc != m.lt.SSM || p.node != nil {
				fail("cache %d: stopped SSM state freed, of layer group %d or in the tree", c.id, p.lc)
			} else {
				r := want[p]
				if r == nil {
					r = &refs{}
					want[p] = r
				}
				r.held++
			}
		}
		if c.status == Closed || c.ssm == nil {
			if c.status == Active && m.lt.SSM >= 0 {
				fail("cache %d: ACTIVE without its SSM state", c.id)
			}
			continue
		}
		p := c.ssm
		switch {
		case m.lt.SSM < 0 || p.lc != m.lt.SSM:
			fail("cache %d: SSM state of layer group %d (SSM layer group %d)", c.id, p.lc, m.lt.SSM)
		case p.group == nil:
			fail("cache %d: references a freed SSM state", c.id)
		case c.ssmShared != (p.node != nil):
			fail("cache %d: SSM state shared %v, in the tree %v", c.id, c.ssmShared, p.node != nil)
		case c.status == Active && (c.ssmShared || p.level() != 0):
			fail("cache %d: ACTIVE with SSM state shared %v on level %d", c.id, c.ssmShared, p.level())
		}
		r := want[p]
		if r == nil {
			r = &refs{}
			want[p] = r
		}
		if c.status == Active {
			r.active++
		} else {
			r.held++
		}
	}
	for _, c := range closed {
		if c.status != Closed {
			continue
		}
		if c.blocks != nil {
			fail("closed cache %d still holds %d blocks", c.id, len(c.blocks))
		}
		if m.caches[c.id] == c {
			fail("closed cache %d is still in the manager's map", c.id)
		}
	}

	owners := map[*page]string{}
	for _, lvl := range m.levels {
		for _, g := range lvl.groups {
			where := fmt.Sprintf("%v group %d", lvl.kind, g.desc.Index)
			if int64(len(g.owner)) != g.numSlots || int64(len(g.fences)) != g.numSlots {
				fail("%s: %d slots, %d owners, %d fences", where, g.numSlots, len(g.owner), len(g.fences))
				continue
			}
			if g.numSlots > g.capacity || (lvl.index > 0 && g.capacity != g.numSlots) {
				fail("%s: %d slots, capacity %d", where, g.numSlots, g.capacity)
			}
			isFree := make([]bool, g.numSlots)
			nfree := 0
			g.free.each(func(s int32) {
				nfree++
				switch {
				case s < 0 || int64(s) >= g.numSlots:
					fail("%s: free slot %d out of [0, %d)", where, s, g.numSlots)
				case g.owner[s] != nil:
					fail("%s: slot %d free and owned", where, s)
				default:
					isFree[s] = true
				}
			})
			if nfree != g.free.len() {
				fail("%s: %d free slots, counted %d", where, nfree, g.free.len())
			}
			for w, word := range g.free.bits {
				if (word != 0) != (g.free.summary[w/64]&(1<<(w%64)) != 0) {
					fail("%s: free-slot summary wrong for slots %d to %d", where, w*64, w*64+63)
				}
			}
			for s, p := range g.owner {
				if p == nil {
					if !isFree[s] {
						fail("%s: slot %d neither free nor owned", where, s)
					}
					continue
				}
				at := fmt.Sprintf("%s slot %d", where, s)
				if prev, ok := owners[p]; ok {
					fail("%s: page also owns %s", at, prev)
				}
				owners[p] = at
				if p.group != g || int(p.slot) != s {
					fail("%s: owner says group %p slot %d", at, p.group, p.slot)
				}
				if lvl.groupOf(p.lc) != g {
					fail("%s: page of layer group %d in the wrong group", at, p.lc)
				}
				r := want[p]
				if r == nil {
					r = &refs{}
				}
				if p.active != r.active || p.held != r.held {
					fail("%s: active %d held %d, caches reference it %d active %d held", at, p.active, p.held, r.active, r.held)
				}
				if p.moving {
					fail("%s: still moving", at)
				}
				if p.inflight != nil && !slices.Contains(m.pending, p.inflight) {
					fail("%s: moved by a transaction that is not pending", at)
				}
				inTree := p.node != nil && m.pagesOf(p.node)[p.lc] == p
				if p.node != nil && !inTree {
					fail("%s: page names a node that does not hold it", at)
				}
				if !inTree && r.active == 0 && r.held == 0 {
					fail("%s: leaked: neither in the tree nor referenced by a cache", at)
				}
				vs := &g.victims
				run := -2 - p.heapIdx
				inHeap := p.heapIdx >= 0 && p.heapIdx < len(vs.heap) && vs.heap[p.heapIdx].p == p ||
					run >= vs.head && run < len(vs.run) && vs.run[run].p == p
				if p.inVictims() && !inHeap {
					fail("%s: victim index %d does not point at the page", at, p.heapIdx)
				}
				if ev := p.evictable(lvl.index == len(m.levels)-1); ev != inHeap {
					fail("%s: evictable %v but in the victim set %v", at, ev, inHeap)
				}
			}
			vs := &g.victims
			queued, prev := 0, (*victim)(nil)
			vs.each(func(v victim, inHeap bool, i int) {
				at := i
				if !inHeap {
					at, queued = -2-i, queued+1
				}
				if p := v.p; p.group != g || p.heapIdx != at {
					fail("%s: victim %d (heap %v) is in group %p at index %d", where, i, inHeap, p.group, p.heapIdx)
				} else if v != p.victimKey() {
					fail("%s: victim %d (heap %v) is ordered by a stale priority, depth or release time", where, i, inHeap)
				}
				if inHeap && i > 0 && vs.heap[i].before(&vs.heap[(i-1)/heapArity]) {
					fail("%s: victim %d comes before its parent in the heap", where, i)
				}
				if !inHeap && prev != nil && v.before(prev) {
					fail("%s: victim %d comes before the one queued ahead of it", where, i)
				}
				if !inHeap {
					prev = &v
				}
			})
			if queued != vs.queued || prev != nil && vs.last.before(prev) {
				fail("%s: the run counts %d victims, holds %d, or its last is not its tail", where, vs.queued, queued)
			}
		}
	}
	for p := range want {
		if _, ok := owners[p]; !ok {
			fail("a page referenced by a cache owns no slot")
		}
	}
	for p := range m.lostBy {
		if _, ok := owners[p]; !ok || !p.lost {
			fail("a failure is kept for a page that is not a lost page owning a slot")
		}
	}
	if live := m.pages.next - len(m.pages.free) - len(m.pages.dead); live != len(owners) {
		fail("page store: %d pages live, %d own slots (leaked or freed twice)", live, len(owners))
	}

	seen := map[nodeID]bool{}
	var walk func(n *node)
	walk = func(n *node) {
		if seen[n.id] {
			fail("node at depth %d: reached twice", n.depth)
			return
		}
		seen[n.id] = true
		if got := chains[n]; n.users != got {
			fail("node at depth %d: %d users, %d caches chained to it", n.depth, n.users, got)
		}
		for lc, p := range m.pagesOf(n) {
			if p == nil {
				continue
			}
			if p.lost {
				fail("node at depth %d layer group %d: a lost page is reachable from the tree", n.depth, lc)
			}
			if p.node != n || int(p.lc) != lc {
				fail("node at depth %d layer group %d: its page names another node or layer group", n.depth, lc)
			}
			if _, ok := owners[p]; !ok {
				fail("node at depth %d layer group %d: its page owns no slot", n.depth, lc)
			}
		}
		full, last := 0, nodeID(0)
		for id := n.first; id != 0; id = m.nodes.at(id).next {
			c := m.nodes.at(id)
			if c.id != id || c.parent != n.id || c.prev != last || c.depth != n.depth+1 {
				fail("node at depth %d: child linked inconsistently", n.depth)
				return
			}
			last = id
			if !c.isPartial(m.cfg.TokensPerBlock) {
				full++
				if m.child(n, c.key) != c {
					fail("node at depth %d: a full child is not found by its key", n.depth)
				}
			}
			walk(c)
		}
		if last != n.last {
			fail("node at depth %d: its last child is not the end of its list", n.depth)
		}
		inline := 0
		if n.child0 != 0 {
			inline = 1
			if c := m.nodes.at(n.child0); c.parent != n.id || c.isPartial(m.cfg.TokensPerBlock) {
				fail("node at depth %d: its inline child is not a full child of it", n.depth)
			}
		}
		if full != inline+int(n.nkids) {
			fail("node at depth %d: %d full children, %d inline and %d in the map", n.depth, full, inline, n.nkids)
		}
	}
	for k, r := range m.roots {
		if r.key != k || r.parent != 0 || m.hasPages(r) {
			fail("root %x: inconsistent", k)
		}
		walk(r)
	}
	for k, id := range m.nodes.kids {
		if c := m.nodes.at(id); c.id != id || c.parent != k.parent || c.key != k.key || !seen[id] {
			fail("child map entry %x of node %d names no child in the tree", k.key, k.parent)
		}
	}
	for id, dg := range m.nodes.digests {
		if !seen[id] || len(dg) == 0 {
			fail("digest table entry of node %d names no node in the tree, or no digests", id)
		}
	}
	if live := int(m.nodes.next) - 1 - len(m.nodes.free); live != len(seen) {
		fail("node store: %d nodes live, %d in the tree (leaked or freed twice)", live, len(seen))
	}
	for n, k := range chains {
		if n.users < k {
			fail("node at depth %d: %d users, %d caches chained to it (unreachable?)", n.depth, n.users, k)
		}
	}
	return errors.Join(errs...)
}

// LostPages counts the pages of c whose data an asynchronous failure
// destroyed, after settling completed transactions as every call does (an
// internal test helper, like CheckInvariants).
func (c *KVCache) LostPages() int {
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	c.m.settle()
	n := 0
	c.eachPage(func(p *page) {
		if p.lost {
			n++
		}
	})
	return n
}

// CheckInvariants reports a slot neither free nor owned, a page in two
// slots, a wrong reference count and a lost page in the tree.
func TestCheckInvariantsReportsBrokenBookkeeping(t *testing.T) {
	f := newFixture(t, smallConfig(8))
	c := f.open(blockhash.Scope{}, seq(0, 8))
	require.NoError(t, f.m.CheckInvariants())
	g := f.m.levels[0].groups[0]
	p := c.blocks[0].pages[0]

	s := g.free.take()
	assert.ErrorContains(t, f.m.CheckInvariants(), "neither free nor owned")
	g.free.put(s)

	g.owner[s] = p
	assert.ErrorContains(t, f.m.CheckInvariants(), "page also owns")
	g.owner[s] = nil

	p.active++
	assert.ErrorContains(t, f.m.CheckInvariants(), "caches reference it 1 active")
	p.active--

	p.lost = true
	assert.ErrorContains(t, f.m.CheckInvariants(), "lost page is reachable from the tree")
	p.lost = false

	leak := f.m.newNode(nil, 1, nil, nil)
	assert.ErrorContains(t, f.m.CheckInvariants(), "leaked or freed twice")
	f.m.freeNode(leak)
	lost := f.m.pages.alloc()
	assert.ErrorContains(t, f.m.CheckInvariants(), "pages live")
	f.m.pages.release(lost)
	f.m.pages.recycle()

	require.NoError(t, c.Close())
	assert.NoError(t, f.m.CheckInvariants(c))
	c.blocks = []cacheBlock{{}}
	assert.ErrorContains(t, f.m.CheckInvariants(c), "closed cache")
	c.blocks = nil
}
