package core

import (
	"slices"

	"github.com/kvcm/kvcm/core/blockhash"
	"github.com/kvcm/kvcm/core/config"
	"github.com/kvcm/kvcm/core/layout"
)

// EventKind says what happened to a cached block.
type EventKind int

const (
	// BlockStored: a block was published in the radix tree (on commit).
	BlockStored EventKind = iota
	// BlockRemoved: a block left the tree; it can no longer be reused.
	BlockRemoved
	// BlockUpdated: a page of the block moved to another cache level.
	BlockUpdated
	// BlockPriorityUpdated: the block's eviction priority changed (a
	// descendant committed with a higher one raised it).
	BlockPriorityUpdated
)

func (k EventKind) String() string {
	switch k {
	case BlockStored:
		return "stored"
	case BlockRemoved:
		return "removed"
	case BlockUpdated:
		return "updated"
	case BlockPriorityUpdated:
		return "priority updated"
	}
	return "unknown"
}

// CacheEvent reports a change of the set of reusable blocks. Seq increases by
// one per event of a manager, starting at 1.
type CacheEvent struct {
	Seq    uint64
	Kind   EventKind
	Key    blockhash.Key
	Parent blockhash.Key
	// Tokens of a stored block (the listener's copy).
	Tokens []config.Token
	// Digests are a stored block's multimodal digest tokens, positions in
	// Tokens (which hold 0 there); nil for a text block (the listener's
	// copy).
	Digests []blockhash.DigestAt
	// CacheID is the cache whose commit stored the block; 0 for other kinds.
	CacheID uint64
	// LayerGroup and Level of an updated page: the level it is on now, or
	// DroppedLevel when that layer group's page left the cache while the
	// block keeps pages of other layer groups; OldLevel is where it was
	// (DroppedLevel for a page that filled a gap, the shared level —
	// Manager.SharedLevel — for a page onboarded from the shared tier).
	// Level of a stored block is the GPU level, where commits publish; a
	// block onboarded from the shared tier is stored with CacheID 0 and its
	// pages then report the level they landed on.
	LayerGroup layout.LayerGroupID
	Level      layout.CacheLevel
	OldLevel   layout.CacheLevel
	// Priority is a stored or removed block's eviction priority (the highest
	// of its layer groups'), the new priority of LayerGroup's page in a
	// BlockPriorityUpdated event, whose OldPriority is the one before, and
	// LayerGroup's priority now in a BlockUpdated event (OldPriority equal
	// to it).
	Priority, OldPriority int
}

// DroppedLevel is the Level of a BlockUpdated event whose page was dropped.
const DroppedLevel layout.CacheLevel = -1

// EventListener receives every CacheEvent in order, synchronously, with the
// manager's lock held: it must not call back into the manager.
type EventListener func(CacheEvent)

// WithEventListener registers a listener for cache events.
func WithEventListener(l EventListener) Option {
	return func(o *options) { o.listeners = append(o.listeners, l) }
}

func (m *Manager) emit(e CacheEvent) {
	if len(m.listeners) == 0 {
		return
	}
	m.eventSeq++
	e.Seq = m.eventSeq
	for _, l := range m.listeners {
		l(e)
	}
}

func (m *Manager) emitStored(n *node, cache uint64) {
	if len(m.listeners) == 0 {
		return
	}
	pr := m.blockPriority(n)
	// Copied: the node's tokens are reused once it is pruned.
	m.emit(CacheEvent{Kind: BlockStored, Key: n.key, Parent: m.parentOf(n).key, Tokens: slices.Clone(m.tokensOf(n)),
		Digests: slices.Clone(m.digestsOf(n)), CacheID: cache, Priority: pr, OldPriority: pr})
}

func (m *Manager) emitRemoved(n *node) {
	if len(m.listeners) == 0 {
		return
	}
	pr := m.blockPriority(n)
	m.emit(CacheEvent{Kind: BlockRemoved, Key: n.key, Parent: m.parentOf(n).key, Priority: pr, OldPriority: pr})
}

// emitMoved reports that p moved from level from to its level now.
func (m *Manager) emitMoved(p *page, from int) {
	if p.node == nil {
		return
	}
	m.emitUpdated(p.node, p.lc, layout.CacheLevel(from), layout.CacheLevel(p.level()))
}

func (m *Manager) emitUpdated(n *node, lc layout.LayerGroupID, from, to layout.CacheLevel) {
	if len(m.listeners) == 0 {
		return
	}
	pr := m.prioOf(n)[lc]
	m.emit(CacheEvent{Kind: BlockUpdated, Key: n.key, Parent: m.parentOf(n).key, LayerGroup: lc, Level: to, OldLevel: from,
		Priority: pr, OldPriority: pr})
}

// emitPriority reports that the priority of the stored block n's page of lc
// went from old to its priority now.
func (m *Manager) emitPriority(n *node, lc layout.LayerGroupID, old int) {
	if len(m.listeners) == 0 {
		return
	}
	m.emit(CacheEvent{Kind: BlockPriorityUpdated, Key: n.key, Parent: m.parentOf(n).key, LayerGroup: lc,
		Priority: m.prioOf(n)[lc], OldPriority: old})
}

// emitDropped reports that n lost its page of lc: the block is gone when it
// has no page left, else only that layer group's page is.
func (m *Manager) emitDropped(n *node, lc layout.LayerGroupID, from layout.CacheLevel) {
	if m.hasPages(n) {
		m.emitUpdated(n, lc, from, DroppedLevel)
		return
	}
	m.emitRemoved(n)
}
