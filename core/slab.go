package core

import (
	"slices"
	"unsafe"

	"github.com/kvcm/kvcm/core/blockhash"
	"github.com/kvcm/kvcm/core/config"
)

// nodeID names a tree node in the manager's node store; 0 names none.
type nodeID int32

// nodeChunkLen is how many nodes one chunk of the node store holds.
const nodeChunkLen = 256

// nodeChunk is nodeChunkLen nodes with their tokens, priorities and pages,
// allocated together. Nodes and priorities hold no pointers, so the garbage
// collector never scans them; only the page row of each node is scanned.
type nodeChunk struct {
	nodes *[nodeChunkLen]node
	toks  []config.Token // tokensPerBlock per node
	prios []int          // one per layer group per node
	pages []*page        // one per layer group per node
}

// nodeStore holds every tree node of a manager in chunks that never move or
// go away, so a *node stays valid while the manager lives; freed nodes are
// reused, newest first. Nodes link to each other by nodeID, and keyed
// children beyond a node's first live in one map keyed by value. The manager
// lock covers it.
type nodeStore struct {
	tpb, numLC int
	chunks     []nodeChunk
	free       []nodeID
	next       nodeID // the next never used ID
	// kids holds the full-block children of nodes that have more than one:
	// a node's first keyed child is its child0.
	kids map[childKey]nodeID
	// digests holds the multimodal digest tokens of the nodes whose blocks
	// have some: they are rare, and a side table keeps nodes pointer-free.
	digests map[nodeID][]blockhash.DigestAt
}

// childKey names a keyed child: its parent and its block key.
type childKey struct {
	parent nodeID
	key    blockhash.Key
}

func newNodeStore(tpb, numLC int) nodeStore {
	return nodeStore{tpb: tpb, numLC: numLC, next: 1, kids: map[childKey]nodeID{},
		digests: map[nodeID][]blockhash.DigestAt{}}
}

// reserve makes room for n nodes in all, so the first n cost no allocation
// (nor a page fault: see touch).
func (s *nodeStore) reserve(n int) {
	for len(s.chunks)*nodeChunkLen < n+1 {
		s.grow()
		c := &s.chunks[len(s.chunks)-1]
		touch(c.nodes[:])
		touch(c.toks)
		touch(c.prios)
		touch(c.pages)
	}
}

func (s *nodeStore) grow() {
	s.chunks = append(s.chunks, nodeChunk{
		nodes: new([nodeChunkLen]node),
		toks:  make([]config.Token, nodeChunkLen*s.tpb),
		prios: make([]int, nodeChunkLen*s.numLC),
		pages: make([]*page, nodeChunkLen*s.numLC),
	})
}

// at returns the node named id; id must name one.
func (s *nodeStore) at(id nodeID) *node {
	return &s.chunks[id/nodeChunkLen].nodes[id%nodeChunkLen]
}

// get returns the node named id, nil for 0.
func (s *nodeStore) get(id nodeID) *node {
	if id == 0 {
		return nil
	}
	return s.at(id)
}

// alloc returns a zero node with its ID set, its priorities DefaultPriority
// and no pages.
func (s *nodeStore) alloc() *node {
	var id nodeID
	if k := len(s.free); k > 0 {
		id, s.free = s.free[k-1], s.free[:k-1]
	} else {
		id = s.next
		s.next++
		if int(id)/nodeChunkLen >= len(s.chunks) {
			s.grow()
		}
	}
	n := s.at(id)
	n.id = id
	for i := range s.prios(n) {
		s.prios(n)[i] = DefaultPriority
	}
	return n
}

// release returns n to the store; it must be unlinked and hold no page.
// Its digests go with it: a reused ID starts without any.
func (s *nodeStore) release(n *node) {
	id := n.id
	clear(s.pages(n))
	delete(s.digests, id)
	*n = node{}
	s.free = append(s.free, id)
}

// setDigests gives n a copy of digests (none: a text block).
func (s *nodeStore) setDigests(n *node, digests []blockhash.DigestAt) {
	if len(digests) == 0 {
		delete(s.digests, n.id)
		return
	}
	s.digests[n.id] = slices.Clone(digests)
}

// toks returns the node's token storage, tpb long.
func (s *nodeStore) toks(n *node) []config.Token {
	c, i := &s.chunks[n.id/nodeChunkLen], int(n.id%nodeChunkLen)
	return c.toks[i*s.tpb : (i+1)*s.tpb : (i+1)*s.tpb]
}

func (s *nodeStore) prios(n *node) []int {
	c, i := &s.chunks[n.id/nodeChunkLen], int(n.id%nodeChunkLen)
	return c.prios[i*s.numLC : (i+1)*s.numLC : (i+1)*s.numLC]
}

func (s *nodeStore) pages(n *node) []*page {
	c, i := &s.chunks[n.id/nodeChunkLen], int(n.id%nodeChunkLen)
	return c.pages[i*s.numLC : (i+1)*s.numLC : (i+1)*s.numLC]
}

// touch writes to every memory page of s once. Memory fresh from the
// operating system is mapped on its first write, at the cost of a page fault
// (microseconds on a loaded virtual machine): preallocated bookkeeping is
// touched when the manager is built rather than by the requests that first
// use it.
func touch[T any](s []T) {
	var zero T
	step := max(1, 4096/int(unsafe.Sizeof(zero)))
	for i := 0; i < len(s); i += step {
		s[i] = zero
	}
}

// pageChunkLen is how many pages one chunk of the page store holds.
const pageChunkLen = 256

// pageStore hands out pages from chunks and reuses freed ones, so taking a
// page allocates nothing in steady state. A page freed during an operation
// is reused only after the operation's safe point (recycle): until then
// scratch lists of the operation may still name it. A settling transaction
// may name a reused page, but tells it apart by its inflight, which a freed
// page has cleared. The manager lock covers it.
type pageStore struct {
	chunks []*[pageChunkLen]page
	next   int // pages handed out of the last chunk
	free   []*page
	dead   []*page // freed since the last recycle
}

// reserve makes room for n pages in all, so the first n cost no allocation
// (nor a page fault: see touch).
func (s *pageStore) reserve(n int) {
	for len(s.chunks)*pageChunkLen < n {
		c := new([pageChunkLen]page)
		touch(c[:])
		s.chunks = append(s.chunks, c)
	}
}

// alloc returns a zero page.
func (s *pageStore) alloc() *page {
	if k := len(s.free); k > 0 {
		p := s.free[k-1]
		s.free[k-1] = nil
		s.free = s.free[:k-1]
		return p
	}
	if s.next == pageChunkLen*len(s.chunks) {
		s.chunks = append(s.chunks, new([pageChunkLen]page))
	}
	p := &s.chunks[s.next/pageChunkLen][s.next%pageChunkLen]
	s.next++
	return p
}

// release takes back a page nothing references any more.
func (s *pageStore) release(p *page) { s.dead = append(s.dead, p) }

// recycle makes the pages released so far reusable.
func (s *pageStore) recycle() {
	for i, p := range s.dead {
		*p = page{}
		s.free = append(s.free, p)
		s.dead[i] = nil
	}
	s.dead = s.dead[:0]
}

// blockRows is a cache's blocks and their page rows: one flat row array
// with room for every block the block slice has room for, so adding a block
// allocates nothing until the slice grows (by doubling). A closed cache's
// blockRows go to the manager for the next cache (spareRows).
type blockRows struct {
	blocks []cacheBlock
	rows   []*page // numLC a block, for cap(blocks) blocks
}

// reserve makes room for n blocks of numLC page rows, moving the rows of
// the blocks there are.
func (r *blockRows) reserve(n, numLC int) {
	if cap(r.blocks) >= n {
		return
	}
	blocks := make([]cacheBlock, len(r.blocks), max(n, 2*cap(r.blocks)))
	rows := make([]*page, cap(blocks)*numLC)
	for b, cb := range r.blocks {
		row := rows[b*numLC : (b+1)*numLC : (b+1)*numLC]
		copy(row, cb.pages)
		blocks[b] = cacheBlock{pages: row, node: cb.node}
	}
	r.blocks, r.rows = blocks, rows
}

// add appends a block without pages, after node (nil: none yet).
func (r *blockRows) add(node *node, numLC int) *cacheBlock {
	b := len(r.blocks)
	r.reserve(b+1, numLC)
	row := r.rows[b*numLC : (b+1)*numLC : (b+1)*numLC]
	clear(row) // a block truncated away may have left pages here
	r.blocks = append(r.blocks, cacheBlock{pages: row, node: node})
	return &r.blocks[b]
}

// grow appends n blocks without pages or nodes in one step (add, n times,
// without rewriting the slices' headers for each).
func (r *blockRows) grow(n, numLC int) {
	from := len(r.blocks)
	r.reserve(from+n, numLC)
	clear(r.rows[from*numLC : (from+n)*numLC]) // blocks truncated away may have left pages here
	r.blocks = r.blocks[:from+n]
	for b := from; b < from+n; b++ {
		r.blocks[b] = cacheBlock{pages: r.rows[b*numLC : (b+1)*numLC : (b+1)*numLC]}
	}
}

// spareRows returns blockRows with room for n blocks: the last closed
// cache's when they are large enough.
func (m *Manager) spareRows(n int) blockRows {
	r := m.spare
	if cap(r.blocks) < n {
		return blockRows{}
	}
	m.spare = blockRows{}
	return r
}

// putSpareRows keeps a closed cache's blockRows for the next cache, if they
// are larger than those kept.
func (m *Manager) putSpareRows(r blockRows) {
	if cap(r.blocks) <= cap(m.spare.blocks) {
		return
	}
	clear(r.blocks[:cap(r.blocks)])
	clear(r.rows)
	r.blocks = r.blocks[:0]
	m.spare = r
}
