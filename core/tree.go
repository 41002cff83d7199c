package core

import (
	"slices"

	"github.com/kvcm/kvcm/core/blockhash"
	"github.com/kvcm/kvcm/core/config"
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
