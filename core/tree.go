package core

import (
	"slices"

	"github.com/kvcm/kvcm/core/blockhash"
	"github.com/kvcm/kvcm/core/config"
	"github.com/kvcm/kvcm/core/layout"
)

// Priorities order eviction: lower goes first. A cache's PriorityFunc may
// return any value in [MinPriority, MaxPriority].
const (
	MinPriority     = 0
	DefaultPriority = 35
	MaxPriority     = 100
)

// node is one committed block in the radix tree: its chained key, its tokens
// (a full block, or fewer for a partial leaf), and its page per lifecycle at
// whatever level each lives. A scope's root node holds no tokens and no pages.
type node struct {
	key    blockhash.Key
	parent *node
	depth  int
	tokens []config.Token
	// child0 is a full-block child and children holds the others: most
	// nodes have one child, and those need no map.
	child0   *node
	children map[blockhash.Key]*node
	partials []*node
	pages    []*page
	// users counts caches whose committed chain runs through the node; such a
	// node is never pruned, so chains stay linked while caches commit.
	users int
	// priority is the eviction priority of each lifecycle's page.
	priority []int
}

// newNode returns a node from the manager's slabs; tokens are copied.
func (m *Manager) newNode(parent *node, key blockhash.Key, tokens []config.Token) *node {
	// Slab nodes are zero and never reused: only the set fields are written
	// (a struct assignment would copy every field under the GC's write
	// barrier).
	n := m.slabs.node()
	n.key, n.parent = key, parent
	n.priority = m.slabs.priorities(len(m.lt.LifeCycles))
	n.tokens = m.slabs.tokens(tokens)
	n.pages = m.slabs.pageRow(len(m.lt.LifeCycles))
	if parent != nil {
		n.depth = parent.depth + 1
	}
	return n
}

// blockPriority is the block's priority as one value: the highest of its
// layer groups', the last to be evicted.
func (n *node) blockPriority() int {
	return slices.Max(n.priority)
}

func (n *node) isPartial(tokensPerBlock int) bool { return len(n.tokens) < tokensPerBlock }

func (n *node) hasPages() bool {
	for _, p := range n.pages {
		if p != nil {
			return true
		}
	}
	return false
}

// prunable: nothing left to reuse and nobody building on it.
func (n *node) prunable() bool {
	return n.parent != nil && n.users == 0 && !n.hasChildren() && !n.hasPages()
}

// hasChildren reports whether any block, full or partial, follows n.
func (n *node) hasChildren() bool {
	return n.child0 != nil || len(n.children) > 0 || len(n.partials) > 0
}

func (n *node) child(key blockhash.Key) *node {
	if c := n.child0; c != nil && c.key == key {
		return c
	}
	return n.children[key]
}

func (n *node) addChild(c *node, tokensPerBlock int) {
	switch {
	case c.isPartial(tokensPerBlock):
		n.partials = append(n.partials, c)
	case n.child0 == nil:
		n.child0 = c
	default:
		if n.children == nil {
			n.children = map[blockhash.Key]*node{}
		}
		n.children[c.key] = c
	}
}

func (n *node) removeChild(c *node) {
	if n.child0 == c {
		n.child0 = nil
		return
	}
	if n.children[c.key] == c {
		delete(n.children, c.key)
		return
	}
	for i, p := range n.partials {
		if p == c {
			n.partials = append(n.partials[:i], n.partials[i+1:]...)
			return
		}
	}
}

// commonPrefix returns how many leading tokens a and b share.
func commonPrefix(a, b []config.Token) int {
	n := min(len(a), len(b))
	for i := 0; i < n; i++ {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}

// match is the reusable prefix of some input.
type match struct {
	path    []*node // nodes of the reused full blocks
	partial *node   // source of a partially reused block
	partLen int
}

func (mt *match) tokens(tpb int) int { return len(mt.path)*tpb + mt.partLen }

// findMatch returns the reusable prefix of input: every full block the tree
// holds along it (as far as every lifecycle has the pages it needs), and with
// partial reuse the matching head of one more block. The whole input may
// match; the engine drops the last prompt token itself when it must compute
// it. ReuseMatchBackoff tokens are then trimmed off the match's tail. It
// changes nothing.
func (m *Manager) findMatch(scope blockhash.Scope, input []config.Token) match {
	mt := m.matchPrefix(scope, input)
	if back := m.cfg.ReuseMatchBackoff; back > 0 && mt.tokens(m.cfg.TokensPerBlock) > 0 {
		// The trimmed match is the match of the trimmed input: a shorter
		// prefix may need other pages (a window further back).
		mt = m.matchPrefix(scope, input[:max(mt.tokens(m.cfg.TokensPerBlock)-back, 0)])
	}
	return mt
}

// matchPrefix walks the tree along all of input.
func (m *Manager) matchPrefix(scope blockhash.Scope, input []config.Token) match {
	var mt match
	limit := len(input)
	if limit == 0 {
		return mt
	}
	root := m.roots[scope.Root()]
	if root == nil {
		return mt
	}
	tpb := m.cfg.TokensPerBlock
	cur := root
	path := m.matched[:0]
	for b := 0; (b+1)*tpb <= limit; b++ {
		blk := input[b*tpb : (b+1)*tpb]
		c := cur.child(m.hasher.Next(cur.key, blk))
		if c == nil || !slices.Equal(c.tokens, blk) {
			break
		}
		path = append(path, c)
		cur = c
	}
	m.matched = path
	mt.path = path[:m.usablePrefix(path)]
	if !m.cfg.EnablePartialReuse {
		return mt
	}
	parent := root
	if len(mt.path) > 0 {
		parent = mt.path[len(mt.path)-1]
	}
	rest := input[len(mt.path)*tpb : limit]
	rest = rest[:min(len(rest), tpb)]
	var best *node
	bestLen := 0
	for _, c := range sortedChildren(parent) {
		if !m.hotComplete(c) {
			continue
		}
		if l := min(commonPrefix(c.tokens, rest), tpb-1); l > bestLen {
			best, bestLen = c, l
		}
	}
	mt.partial, mt.partLen = best, bestLen
	return mt
}

// sortedChildren lists a node's children in a deterministic order.
func sortedChildren(n *node) []*node {
	out := make([]*node, 0, 1+len(n.children)+len(n.partials))
	if n.child0 != nil {
		out = append(out, n.child0)
	}
	for _, c := range n.children {
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b *node) int {
		switch {
		case a.key < b.key:
			return -1
		case a.key > b.key:
			return 1
		}
		return 0
	})
	return append(out, n.partials...)
}

// hotComplete: the node has a page for every lifecycle, all on the GPU level,
// so it can be copied from.
func (m *Manager) hotComplete(n *node) bool {
	for _, p := range n.pages {
		if p == nil || p.level() != 0 {
			return false
		}
	}
	return true
}

// usablePrefix returns the largest j such that every lifecycle has the pages
// it needs to continue after the first j blocks of path: all of them under
// full attention, the sink blocks and those within the window otherwise.
func (m *Manager) usablePrefix(path []*node) int {
	tpb := m.cfg.TokensPerBlock
	// missing[lc*width+b] counts the blocks before b without a page of lc.
	numLC, width := len(m.lt.LifeCycles), len(path)+1
	if cap(m.missing) < numLC*width {
		m.missing = make([]int, numLC*width)
	}
	missing := m.missing[:numLC*width]
	for lc := range numLC {
		row := missing[lc*width : (lc+1)*width]
		row[0] = 0
		for b, n := range path {
			row[b+1] = row[b]
			if n.pages[lc] == nil {
				row[b+1]++
			}
		}
	}
	for j := len(path); j > 0; j-- {
		ok := true
		for lc := range numLC {
			row := missing[lc*width : (lc+1)*width]
			id := layout.LayerGroupID(lc)
			sinks := min(m.lt.SinkBlocks(id), j)
			first := max(m.lt.FirstKeptBlock(id, j*tpb), sinks)
			if row[sinks] > 0 || row[j]-row[first] > 0 {
				ok = false
				break
			}
		}
		if ok {
			return j
		}
	}
	return 0
}

// ProbeReuse returns how many tokens of input a new cache in scope would
// reuse now. With a shared tier it continues past the local tree into it
// (one round trip per batch of block keys, without the manager's lock): the
// blocks the tier holds now count, less ReuseMatchBackoff. It changes
// nothing.
func (m *Manager) ProbeReuse(scope blockhash.Scope, input []config.Token) int {
	if m.shared != nil {
		return m.probeShared(scope, input)
	}
	return m.probeLocal(scope, input)
}

func (m *Manager) probeLocal(scope blockhash.Scope, input []config.Token) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return 0
	}
	mt := m.findMatch(scope, input)
	return mt.tokens(m.cfg.TokensPerBlock)
}

// ProbeFirstNewBlockKey returns the key of the first full block of input
// past its reusable prefix (see ProbeReuse): the block a new cache in scope
// would compute and commit first. It reports false when no full block of
// input lies past that prefix. It changes nothing.
func (m *Manager) ProbeFirstNewBlockKey(scope blockhash.Scope, input []config.Token) (blockhash.Key, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return 0, false
	}
	tpb := m.cfg.TokensPerBlock
	mt := m.findMatch(scope, input)
	b := mt.tokens(tpb) / tpb
	if (b+1)*tpb > len(input) {
		return 0, false
	}
	keys := blockhash.Chain(scope, tpb, input[:(b+1)*tpb])
	return keys[b], true
}
