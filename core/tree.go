package core

import (
	"bytes"
	"fmt"
	"slices"
	"unsafe"

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
// Nodes live in the manager's node store (slab.go) and name each other by
// nodeID: a node holds no pointer, so the garbage collector scans none of the
// tree's links or tokens (only the nodes' page rows). Its tokens, priorities
// and pages are the store's (tokensOf, prioOf, pagesOf), and so are the
// multimodal digest tokens of the rare block that has them (digestsOf).
type node struct {
	key    blockhash.Key
	id     nodeID
	parent nodeID
	depth  int
	ntok   int32
	// child0 is a full-block child; the others are in the store's map
	// (nkids of them): most nodes have one child, and those need no map.
	child0 nodeID
	nkids  int32
	// Every child, full or partial, is in the list from first to last,
	// linked by prev and next, in the order they were added.
	first, last, prev, next nodeID
	// users counts caches whose committed chain runs through the node; such a
	// node is never pruned, so chains stay linked while caches commit.
	users int
}

// newNode returns a node from the manager's node store; tokens and digests
// (the block's digest tokens, positions in tokens) are copied.
func (m *Manager) newNode(parent *node, key blockhash.Key, tokens []config.Token, digests []blockhash.DigestAt) *node {
	n := m.nodes.alloc()
	n.key = key
	n.ntok = int32(copy(m.nodes.toks(n), tokens))
	m.nodes.setDigests(n, digests)
	if parent != nil {
		n.parent, n.depth = parent.id, parent.depth+1
	}
	return n
}

// freeNode returns an unlinked node without pages to the store.
func (m *Manager) freeNode(n *node) { m.nodes.release(n) }

// parentOf returns n's parent, nil for a root.
func (m *Manager) parentOf(n *node) *node { return m.nodes.get(n.parent) }

// tokensOf returns n's tokens (the store's: do not modify or keep).
func (m *Manager) tokensOf(n *node) []config.Token { return m.nodes.toks(n)[:n.ntok] }

// digestsOf returns n's multimodal digest tokens, positions relative to its
// block (the store's: do not modify or keep); nil for a text block.
func (m *Manager) digestsOf(n *node) []blockhash.DigestAt { return m.nodes.digests[n.id] }

// holds reports whether n holds exactly the block tokens with digests.
func (m *Manager) holds(n *node, tokens []config.Token, digests []blockhash.DigestAt) bool {
	return sameTokens(m.tokensOf(n), tokens) && slices.Equal(m.digestsOf(n), digests)
}

// sameTokens reports whether a and b hold the same tokens: their bytes
// compared at once (prefix lookup compares a block's tokens per node on its
// path; an element loop costs 3-4 times as much).
func sameTokens(a, b []config.Token) bool {
	return len(a) == len(b) && bytes.Equal(tokenBytes(a), tokenBytes(b))
}

func tokenBytes(t []config.Token) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(t))), len(t)*int(unsafe.Sizeof(config.Token(0))))
}

// pagesOf returns n's page per lifecycle (the store's row, to read and set).
func (m *Manager) pagesOf(n *node) []*page { return m.nodes.pages(n) }

// prioOf returns n's eviction priority per lifecycle (the store's row).
func (m *Manager) prioOf(n *node) []int { return m.nodes.prios(n) }

// blockPriority is the block's priority as one value: the highest of its
// layer groups', the last to be evicted.
func (m *Manager) blockPriority(n *node) int {
	return slices.Max(m.prioOf(n))
}

func (n *node) isPartial(tokensPerBlock int) bool { return int(n.ntok) < tokensPerBlock }

func (m *Manager) hasPages(n *node) bool {
	for _, p := range m.pagesOf(n) {
		if p != nil {
			return true
		}
	}
	return false
}

// prunable: nothing left to reuse and nobody building on it.
func (m *Manager) prunable(n *node) bool {
	return n.parent != 0 && n.users == 0 && !n.hasChildren() && !m.hasPages(n)
}

// hasChildren reports whether any block, full or partial, follows n.
func (n *node) hasChildren() bool { return n.first != 0 }

// child returns n's full-block child of key, nil if none.
func (m *Manager) child(n *node, key blockhash.Key) *node {
	if n.child0 != 0 {
		if c := m.nodes.at(n.child0); c.key == key {
			return c
		}
	}
	if n.nkids == 0 {
		return nil
	}
	return m.nodes.get(m.nodes.kids[childKey{n.id, key}])
}

// childHolding returns n's full-block child holding exactly the block tokens
// with digests, nil if none (or if the one whose key they hash to holds other
// tokens: a key collision). When n has at most one full-block child its tokens
// are compared and no key is computed: a node's key is always its parent's
// key chained with its tokens (publish, the shared tier and a persisted disk
// tier check or compute it so), so a child holding the tokens is the one the
// key names.
func (m *Manager) childHolding(n *node, tokens []config.Token, digests []blockhash.DigestAt) *node {
	if n.nkids == 0 {
		if n.child0 != 0 {
			if c := m.nodes.at(n.child0); m.holds(c, tokens, digests) {
				return c
			}
		}
		return nil
	}
	c := m.child(n, m.hasher.NextDigests(n.key, tokens, digests))
	if c == nil || !m.holds(c, tokens, digests) {
		return nil
	}
	return c
}

// isChild reports whether c is linked as a child of n.
func (m *Manager) isChild(n, c *node) bool {
	return c.parent == n.id && (n.first == c.id || c.prev != 0)
}

// children calls fn for each of n's children in the order they were added.
func (m *Manager) children(n *node, fn func(c *node)) {
	for id := n.first; id != 0; {
		c := m.nodes.at(id)
		id = c.next
		fn(c)
	}
}

func (m *Manager) addChild(n, c *node) {
	switch {
	case c.isPartial(m.cfg.TokensPerBlock):
	case n.child0 == 0:
		n.child0 = c.id
	default:
		m.nodes.kids[childKey{n.id, c.key}] = c.id
		n.nkids++
	}
	c.prev, c.next = n.last, 0
	if n.last != 0 {
		m.nodes.at(n.last).next = c.id
	} else {
		n.first = c.id
	}
	n.last = c.id
}

func (m *Manager) removeChild(n, c *node) {
	if !m.isChild(n, c) {
		return
	}
	switch k := (childKey{n.id, c.key}); {
	case c.isPartial(m.cfg.TokensPerBlock):
	case n.child0 == c.id:
		n.child0 = 0
	case n.nkids > 0 && m.nodes.kids[k] == c.id:
		delete(m.nodes.kids, k)
		n.nkids--
	}
	if c.prev != 0 {
		m.nodes.at(c.prev).next = c.next
	} else {
		n.first = c.next
	}
	if c.next != 0 {
		m.nodes.at(c.next).prev = c.prev
	} else {
		n.last = c.prev
	}
	c.prev, c.next = 0, 0
}

// commonPrefix returns how many leading tokens a and b share, a digest
// token matching only the same digest.
func commonPrefix(a []config.Token, ad []blockhash.DigestAt, b []config.Token, bd []blockhash.DigestAt) int {
	n := min(len(a), len(b))
	i, j := 0, 0 // next digest of a and of b
	for p := 0; p < n; p++ {
		da, db := i < len(ad) && ad[i].Pos == p, j < len(bd) && bd[j].Pos == p
		switch {
		case da != db, da && ad[i].Digest != bd[j].Digest, a[p] != b[p]:
			return p
		}
		if da {
			i, j = i+1, j+1
		}
	}
	return n
}

// match is the reusable prefix of some input.
type match struct {
	path    []*node // nodes of the reused full blocks
	partial *node   // source of a partially reused block
	partLen int
	// contentBlocks are the input's full blocks the tree holds by content;
	// usableBlocks those of them the attention layer groups can reuse (the
	// path before the last SSM snapshot shortens it). With partial reuse
	// contentPart and attentionPart are the matching heads of one more
	// block: by content, and of a block whose attention pages are on the
	// GPU level (so it could be copied from).
	contentBlocks, usableBlocks int
	contentPart, attentionPart  int
}

func (mt *match) tokens(tpb int) int { return len(mt.path)*tpb + mt.partLen }

// key returns the key the match's full blocks end at: the last one's, or
// the scope's root.
func (mt *match) key(scope blockhash.Scope) blockhash.Key {
	if len(mt.path) > 0 {
		return mt.path[len(mt.path)-1].key
	}
	return scope.Root()
}

// snapshot returns the SSM snapshot a cache reusing the match starts from:
// the partial block's, else the last reused block's (matchPrefix ends the
// path at a block with one); nil without SSM layers or reuse.
func (mt *match) snapshot(m *Manager) *page {
	switch {
	case m.lt.SSM < 0:
		return nil
	case mt.partial != nil:
		return m.pagesOf(mt.partial)[m.lt.SSM]
	case len(mt.path) == 0:
		return nil
	}
	return m.pagesOf(mt.path[len(mt.path)-1])[m.lt.SSM]
}

// findMatch returns the reusable prefix of input: every full block the tree
// holds along it (as far as every lifecycle has the pages it needs), and with
// partial reuse the matching head of one more block. With SSM layers the
// match ends where an SSM snapshot is: at a partial block (published at
// close with the state at its end) the input holds whole, after the full
// blocks, and without partial reuse only where the input ends with it; else
// at the last full block holding a snapshot. A partial block's match is
// checked at its endpoint, where a sliding window may need fewer of the
// full blocks' pages. The whole input may match; the engine drops the last
// prompt token itself when it must compute it. ReuseMatchBackoff tokens are
// then trimmed off the tail of the content match (the tokens the tree holds
// along input, pages or not), and the match is the longest usable one
// within what is left, as KVCacheManagerV2 applies the backoff inside the
// match: a match of m tokens describes the first m - backoff positions, and
// the pages needed are those of the final endpoint. It changes nothing.
func (m *Manager) findMatch(scope blockhash.Scope, input []config.Token, digests []blockhash.DigestAt) match {
	mt := m.matchPrefix(scope, input, digests)
	tpb := m.cfg.TokensPerBlock
	if content := max(mt.contentBlocks*tpb, mt.tokens(tpb)); m.cfg.ReuseMatchBackoff > 0 && content > 0 {
		// The trimmed match is the match of the trimmed input: a shorter
		// prefix may need other pages (a window further back).
		n := max(content-m.cfg.ReuseMatchBackoff, 0)
		mt = m.matchPrefix(scope, input[:n], blockhash.DigestsIn(digests, 0, n))
	}
	return mt
}

// matchPrefix walks the tree along all of input (digests: its digest
// tokens, sorted).
func (m *Manager) matchPrefix(scope blockhash.Scope, input []config.Token, digests []blockhash.DigestAt) match {
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
		dg := blockhash.DigestsIn(digests, b*tpb, (b+1)*tpb)
		c := m.childHolding(cur, blk, dg)
		if c == nil {
			break
		}
		path = append(path, c)
		cur = c
	}
	m.matched = path
	mt.path = path[:m.usablePrefix(path)]
	mt.contentBlocks, mt.usableBlocks = len(path), len(mt.path)
	ssm := m.lt.SSM
	if ssm < 0 && !m.cfg.EnablePartialReuse {
		return mt
	}
	parentAt := func(blocks int) *node {
		if blocks > 0 {
			return path[blocks-1]
		}
		return root
	}
	// head returns the input's tokens (at most a block) after blocks full
	// blocks, and their digests.
	head := func(blocks int) ([]config.Token, []blockhash.DigestAt) {
		from := blocks * tpb
		rest := input[from:limit]
		rest = rest[:min(len(rest), tpb)]
		return rest, blockhash.DigestsIn(digests, from, from+len(rest))
	}
	if m.cfg.EnablePartialReuse {
		// The diagnostics count the matching head of the block after the
		// content match, whatever its pages.
		rest, rd := head(mt.contentBlocks)
		m.children(parentAt(mt.contentBlocks), func(c *node) {
			mt.contentPart = max(mt.contentPart, min(commonPrefix(m.tokensOf(c), m.digestsOf(c), rest, rd), tpb-1))
		})
	}
	rest, restDigests := head(mt.usableBlocks)
	var best *node
	bestLen := 0
	for _, c := range m.sortedChildren(parentAt(mt.usableBlocks)) {
		l := min(commonPrefix(m.tokensOf(c), m.digestsOf(c), rest, restDigests), tpb-1)
		if m.cfg.EnablePartialReuse && m.hotAttention(c) {
			mt.attentionPart = max(mt.attentionPart, l)
		}
		switch {
		case !m.hotComplete(c):
			continue
		case ssm >= 0 && (!c.isPartial(tpb) || l != int(c.ntok)):
			// The SSM snapshot of a partial block is at its end: only a
			// block the input holds whole can be resumed from.
			continue
		case ssm >= 0 && !m.cfg.EnablePartialReuse && l != len(rest):
			// Without partial reuse, only where the input ends with it.
			continue
		}
		if l > bestLen {
			best, bestLen = c, l
		}
	}
	mt.attentionPart = max(mt.attentionPart, bestLen)
	if mt.contentBlocks == mt.usableBlocks {
		mt.contentPart = max(mt.contentPart, mt.attentionPart)
	}
	mt.partial, mt.partLen = best, bestLen
	if ssm < 0 && m.cfg.EnablePartialReuse && mt.contentBlocks > mt.usableBlocks {
		// A sliding window that moves on over a partial block's tokens may
		// need fewer of the path's pages than at the block boundary (pages
		// of blocks it had no use for were never kept): the deepest content
		// match, with the matching head of one more block, is usable where
		// every lifecycle has the pages it needs at that endpoint.
		rest, rd := head(mt.contentBlocks)
		var cand *node
		l := 0
		for _, c := range m.sortedChildren(parentAt(mt.contentBlocks)) {
			if k := min(commonPrefix(m.tokensOf(c), m.digestsOf(c), rest, rd), tpb-1); k > l && m.hotComplete(c) {
				cand, l = c, k
			}
		}
		if end := mt.contentBlocks*tpb + l; cand != nil && end > mt.tokens(tpb) && m.usableAt(path, mt.contentBlocks, end) {
			mt.path, mt.partial, mt.partLen = path[:mt.contentBlocks], cand, l
			mt.usableBlocks, mt.attentionPart = mt.contentBlocks, l
			mt.contentPart = max(mt.contentPart, l)
		}
	}
	if ssm >= 0 && best == nil {
		for len(mt.path) > 0 && m.pagesOf(mt.path[len(mt.path)-1])[ssm] == nil {
			mt.path = mt.path[:len(mt.path)-1]
		}
	}
	return mt
}

// sortedChildren lists a node's children in a deterministic order: the full
// blocks by key, then the partial ones in the order they were added.
func (m *Manager) sortedChildren(n *node) []*node {
	var out, partials []*node
	m.children(n, func(c *node) {
		if c.isPartial(m.cfg.TokensPerBlock) {
			partials = append(partials, c)
		} else {
			out = append(out, c)
		}
	})
	slices.SortFunc(out, func(a, b *node) int {
		switch {
		case a.key < b.key:
			return -1
		case a.key > b.key:
			return 1
		}
		return 0
	})
	return append(out, partials...)
}

// hotAttention: the node has a page for every attention lifecycle, all on
// the GPU level.
func (m *Manager) hotAttention(n *node) bool {
	for lc, p := range m.pagesOf(n) {
		if layout.LayerGroupID(lc) != m.lt.SSM && (p == nil || p.level() != 0) {
			return false
		}
	}
	return true
}

// hotComplete: the node has a page for every lifecycle, all on the GPU level,
// so it can be copied from.
func (m *Manager) hotComplete(n *node) bool {
	for _, p := range m.pagesOf(n) {
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
			if m.pagesOf(n)[lc] == nil {
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

// usableAt reports whether every lifecycle has the pages it needs of the
// first j blocks of path to continue after end tokens (the tokens past the j
// blocks are a partial block's).
func (m *Manager) usableAt(path []*node, j, end int) bool {
	for lc := range m.lt.LifeCycles {
		id := layout.LayerGroupID(lc)
		for b := range j {
			if m.lt.Needs(id, b, end) && m.pagesOf(path[b])[lc] == nil {
				return false
			}
		}
	}
	return true
}

// ProbeReuse returns how many tokens of input a new cache in scope would
// reuse now. With a shared tier it continues past the local tree into it
// (one round trip per batch of block keys, without the manager's lock): the
// blocks the tier holds now count, less ReuseMatchBackoff. It changes
// nothing.
func (m *Manager) ProbeReuse(scope blockhash.Scope, input []config.Token) int {
	n, _ := m.ProbeReuseDigests(scope, input, nil)
	return n
}

// ProbeReuseDigests is ProbeReuse for input with digest tokens (see
// CacheOptions.InputDigests); bad digests are ErrInvalidArgument. The digests
// enter the block keys, so the shared tier's blocks of the same input (text
// and digests) count as for text.
func (m *Manager) ProbeReuseDigests(scope blockhash.Scope, input []config.Token, digests []blockhash.DigestAt) (int, error) {
	input, err := m.textOrDigests("digest_positions", input, digests, false)
	if err != nil {
		return 0, err
	}
	if m.shared != nil {
		n, _ := m.probeShared(scope, input, digests)
		return n, nil
	}
	return m.probeLocal(scope, input, digests), nil
}

// probeLocal is ProbeReuseDigests in the local levels.
func (m *Manager) probeLocal(scope blockhash.Scope, input []config.Token, digests []blockhash.DigestAt) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return 0
	}
	mt := m.findMatch(scope, input, digests)
	return mt.tokens(m.cfg.TokensPerBlock)
}

// textOrDigests checks the digest tokens of tokens (named name: the C ABI's
// name of the positions array, which every binding's errors share) and
// returns tokens with 0 at every digest position (a copy where needed). A
// text-only manager or cache refuses digests.
func (m *Manager) textOrDigests(name string, tokens []config.Token, digests []blockhash.DigestAt, textOnly bool) ([]config.Token, error) {
	if len(digests) == 0 {
		return tokens, nil
	}
	if textOnly || m.cfg.TextOnly {
		return nil, argErr(name, "digest tokens in a text-only cache")
	}
	if err := blockhash.CheckDigests(name, digests, len(tokens)); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidArgument, err)
	}
	out := slices.Clone(tokens)
	for _, d := range digests {
		out[d.Pos] = 0
	}
	return out, nil
}

// ProbeFirstNewBlockKey returns the key of the first full block of input
// past its reusable prefix (see ProbeReuse): the block a new cache in scope
// would compute and commit first. With a shared tier the prefix continues
// into it as ProbeReuse's does (one round trip per batch of block keys,
// without the manager's lock), so a block the tier holds is not named. It
// reports false when no full block of input lies past that prefix. It
// changes nothing.
func (m *Manager) ProbeFirstNewBlockKey(scope blockhash.Scope, input []config.Token) (blockhash.Key, bool) {
	k, ok, _ := m.ProbeFirstNewBlockKeyDigests(scope, input, nil)
	return k, ok
}

// ProbeFirstNewBlockKeyDigests is ProbeFirstNewBlockKey for input with
// digest tokens; bad digests are ErrInvalidArgument.
func (m *Manager) ProbeFirstNewBlockKeyDigests(scope blockhash.Scope, input []config.Token, digests []blockhash.DigestAt) (blockhash.Key, bool, error) {
	input, err := m.textOrDigests("digest_positions", input, digests, false)
	if err != nil {
		return 0, false, err
	}
	tpb := m.cfg.TokensPerBlock
	if m.shared != nil {
		t, keys := m.probeShared(scope, input, digests)
		b := t / tpb
		if (b+1)*tpb > len(input) {
			return 0, false, nil
		}
		if b < len(keys) {
			return keys[b], true, nil
		}
		m.mu.Lock()
		defer m.mu.Unlock()
		if m.closed {
			return 0, false, nil
		}
		k := scope.Root()
		if len(keys) > 0 {
			k = keys[len(keys)-1]
		}
		return m.chainKey(k, len(keys), b, input, digests), true, nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return 0, false, nil
	}
	mt := m.findMatch(scope, input, digests)
	b := mt.tokens(tpb) / tpb
	if (b+1)*tpb > len(input) {
		return 0, false, nil
	}
	return m.chainKey(mt.key(scope), len(mt.path), b, input, digests), true, nil
}

// chainKey returns the key of block b of input, continuing the chain from
// key, block from-1's (the scope's root for block 0). Under the lock: the
// hasher is the manager's.
func (m *Manager) chainKey(key blockhash.Key, from, b int, input []config.Token, digests []blockhash.DigestAt) blockhash.Key {
	tpb := m.cfg.TokensPerBlock
	for i := from; i <= b; i++ {
		key = m.hasher.NextDigests(key, input[i*tpb:(i+1)*tpb], blockhash.DigestsIn(digests, i*tpb, (i+1)*tpb))
	}
	return key
}
