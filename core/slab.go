package core

import "github.com/kvcm/kvcm/core/config"

// slabChunk is how many nodes, pages or page rows one slab allocation holds.
const slabChunk = 64

// slabs hands out tree nodes, pages, page rows and block tokens carved from
// chunks, so the hot paths allocate once per slabChunk of them rather than
// once each. Nothing is recycled (a freed page may still be named by a
// settling transaction); a chunk is garbage once none of its items is
// referenced. The manager lock covers it.
type slabs struct {
	nodes []node
	pages []page
	rows  []*page
	prios []int
	toks  []config.Token
}

// node returns a zero node.
func (s *slabs) node() *node {
	if len(s.nodes) == 0 {
		s.nodes = make([]node, slabChunk)
	}
	n := &s.nodes[0]
	s.nodes = s.nodes[1:]
	return n
}

// page returns a zero page.
func (s *slabs) page() *page {
	if len(s.pages) == 0 {
		s.pages = make([]page, slabChunk)
	}
	p := &s.pages[0]
	s.pages = s.pages[1:]
	return p
}

// pageRow returns n nil page pointers, capped at n.
func (s *slabs) pageRow(n int) []*page {
	if len(s.rows) < n {
		s.rows = make([]*page, n*slabChunk)
	}
	row := s.rows[:n:n]
	s.rows = s.rows[n:]
	return row
}

// priorities returns n priorities, each DefaultPriority.
func (s *slabs) priorities(n int) []int {
	if len(s.prios) < n {
		s.prios = make([]int, n*slabChunk)
	}
	row := s.prios[:n:n]
	s.prios = s.prios[n:]
	for i := range row {
		row[i] = DefaultPriority
	}
	return row
}

// tokens returns a copy of t, capped at its length.
func (s *slabs) tokens(t []config.Token) []config.Token {
	if len(t) == 0 {
		return nil
	}
	if len(s.toks) < len(t) {
		s.toks = make([]config.Token, max(len(t), 2048))
	}
	out := s.toks[:len(t):len(t)]
	s.toks = s.toks[len(t):]
	copy(out, t)
	return out
}

// rows hands out the page rows of a cache's blocks from chunks that grow
// with the cache, so a cache allocates rows O(log blocks) times.
type rowChunk []*page

// row returns numLC nil page pointers; want is how many more rows the caller
// expects to need now (a chunk is at least that large).
func (r *rowChunk) row(numLC, want, have int) []*page {
	if len(*r) < numLC {
		*r = make([]*page, numLC*max(want, have, 8))
	}
	row := (*r)[:numLC:numLC]
	*r = (*r)[numLC:]
	return row
}
