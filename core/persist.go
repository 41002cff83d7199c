package core

import (
	"fmt"
	"slices"

	"github.com/kvcm/kvcm/core/blob"
	"github.com/kvcm/kvcm/core/blockhash"
	"github.com/kvcm/kvcm/core/config"
	"github.com/kvcm/kvcm/core/layout"
)

// restoreDisk rebuilds, at start, the committed blocks a persistent disk
// tier's files hold (config.CacheTierConfig.Persistent). It reads every
// slot's header, not the payloads: a slot whose header is intact, of this
// manager's fingerprint and of its lifecycle's group, with a full block
// whose key is the hash of its parent key and tokens (with the digest tokens
// the header holds: see diskDigests), becomes a page of that block on the
// disk level. The blocks are linked into the tree by their
// parent keys; a block whose parent is not on disk hangs from a root of its
// parent's key, so the chains that start at a scope's root are reachable
// again and the others only wait for eviction. Every other slot is free
// (reclaimed): blobs of another layout, damaged or half-written headers,
// duplicates. A blob whose payload was half written at a kill keeps an intact
// header; its payload checksum fails when it is read, which makes it a miss
// and frees its slot then. Restored blocks are announced as BlockStored with
// CacheID 0; they are the first eviction victims until used.
func (m *Manager) restoreDisk() error {
	if t, ok := m.cfg.Tier(config.DiskTier); !ok || !t.Persistent {
		return nil
	}
	lvl := m.levels[len(m.levels)-1]
	tpb := m.cfg.TokensPerBlock
	type found struct {
		g    *slotGroup
		slot int32
		h    blob.Header
	}
	byKey := map[uint64][]found{}
	for _, g := range lvl.groups {
		size, err := g.file.Size()
		if err != nil {
			return fmt.Errorf("%w: disk tier %s: %w", ErrIO, g.dir, err)
		}
		// Headers are read on the group's I/O workers (queue depth), then
		// checked here in slot order.
		n := min(g.numSlots, size/g.stride)
		heads := make([]blob.Header, n)
		ok := make([]bool, n)
		hdrRead := roundUp(g.hdrBytes, g.align)
		g.dio.each(int(n), func(i int, scratch []byte) error {
			if _, err := g.file.ReadAt(scratch[:hdrRead], int64(i)*g.stride); err != nil {
				return nil // unreadable: reclaimed
			}
			h, err := blob.Decode(scratch[:g.hdrBytes], tpb)
			heads[i], ok[i] = h, err == nil
			return nil
		})
		for s := range n {
			h := heads[s]
			if !ok[s] || h.Key == 0 || len(h.Tokens) != tpb || h.PayloadLen != g.blobBytes() {
				continue
			}
			lc := layout.LayerGroupID(h.LifeCycle)
			if int(lc) >= len(m.blobFP) || m.blobFP[lc] != h.Fingerprint || lvl.groupOf(lc) != g ||
				(len(h.Digests) > 0 && m.cfg.TextOnly) ||
				m.hasher.NextDigests(blockhash.Key(h.Parent), h.Tokens, headerDigests(h)) != blockhash.Key(h.Key) {
				continue
			}
			byKey[h.Key] = append(byKey[h.Key], found{g: g, slot: int32(s), h: h})
			m.diskSeq = max(m.diskSeq, h.Tag)
		}
	}
	nodes := map[uint64]*node{}
	var link func(key uint64, depth int) *node
	link = func(key uint64, depth int) *node {
		if n, ok := nodes[key]; ok {
			return n
		}
		fs := byKey[key]
		if len(fs) == 0 || depth > len(byKey) { // not on disk, or a cycle of colliding keys
			return nil
		}
		first := fs[0].h
		parent := link(first.Parent, depth+1)
		if parent == nil {
			parent = m.roots[blockhash.Key(first.Parent)]
			if parent == nil {
				parent = m.newNode(nil, blockhash.Key(first.Parent), nil, nil)
				m.roots[parent.key] = parent
			}
		}
		n := m.newNode(parent, blockhash.Key(key), first.Tokens, headerDigests(first))
		m.addChild(parent, n)
		nodes[key] = n
		for _, f := range fs {
			lc := layout.LayerGroupID(f.h.LifeCycle)
			if m.pagesOf(n)[lc] != nil || f.h.Parent != first.Parent || !sameTokens(f.h.Tokens, first.Tokens) ||
				!slices.Equal(f.h.Digests, first.Digests) {
				continue // a duplicate: its slot stays free
			}
			p := m.pages.alloc()
			p.lc, p.node, p.diskTag = lc, n, f.h.Tag
			p.group, p.slot, p.heapIdx = f.g, f.slot, -1
			f.g.owner[f.slot] = p
			m.pagesOf(n)[lc] = p
			p.refresh()
		}
		m.emitStored(n, 0)
		return n
	}
	keys := make([]uint64, 0, len(byKey))
	for k := range byKey {
		keys = append(keys, k)
	}
	slices.Sort(keys) // a deterministic tree for one directory
	for _, k := range keys {
		link(k, 0)
	}
	for _, g := range lvl.groups {
		g.rebuildFree()
		g.peakUsed = g.used()
	}
	return nil
}

// headerDigests returns the digest tokens a blob header holds as the tree's
// (nil for a text block).
func headerDigests(h blob.Header) []blockhash.DigestAt {
	if len(h.Digests) == 0 {
		return nil
	}
	out := make([]blockhash.DigestAt, len(h.Digests))
	for i, d := range h.Digests {
		out[i] = blockhash.DigestAt{Pos: int(d.Pos), Digest: d.Value}
	}
	return out
}
