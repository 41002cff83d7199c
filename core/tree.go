package core

import (
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
	key      blockhash.Key
	parent   *node
	depth    int
	tokens   []config.Token
	children map[blockhash.Key]*node
	partials []*node
	pages    []*page
	// users counts caches whose committed chain runs through the node; such a
	// node is never pruned, so chains stay linked while caches commit.
	users int
	// priority is the eviction priority of each lifecycle's page.
	priority []int
}

func newNode(parent *node, key blockhash.Key, tokens []config.Token, numLC int) *node {
	n := &node{key: key, parent: parent, tokens: tokens, pages: make([]*page, numLC), priority: make([]int, numLC)}
	for lc := range n.priority {
		n.priority[lc] = DefaultPriority
	}
	if parent != nil {
		n.depth = parent.depth + 1
	}
	return n
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
	return n.parent != nil && n.users == 0 && len(n.children) == 0 && len(n.partials) == 0 && !n.hasPages()
}

func (n *node) child(key blockhash.Key) *node { return n.children[key] }

func (n *node) addChild(c *node, tokensPerBlock int) {
	if c.isPartial(tokensPerBlock) {
		n.partials = append(n.partials, c)
		return
	}
	if n.children == nil {
		n.children = map[blockhash.Key]*node{}
	}
	n.children[c.key] = c
}

func (n *node) removeChild(c *node) {
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
