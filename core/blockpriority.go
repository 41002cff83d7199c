package core

import (
	"github.com/kvcm/kvcm/core/blockhash"
	"github.com/kvcm/kvcm/core/layout"
)

// SetBlockPriorities sets the eviction priority of the cached blocks along
// chain, the chained keys (blockhash.Chain) of leading full blocks in scope:
// chain[i] gets priorities[i], as far as the tree holds the chain. It
// returns how many blocks that is. It is for a scheduler that knows which
// cached blocks waiting requests will reuse, where a PriorityFunc decides
// only at commit. The two slices must be as long; otherwise it fails,
// changing nothing.
//
// Priorities are clamped into [MinPriority, MaxPriority]. The tree's rule that
// an ancestor never ranks below a descendant holds afterwards: raising a
// block raises its ancestors to it, and lowering one stops at the highest
// priority among its children. A stored block whose priority changes is
// reported as BlockPriorityUpdated. Every layer group's page gets the
// priority.
func (m *Manager) SetBlockPriorities(scope blockhash.Scope, chain []blockhash.Key, priorities []int) (int, error) {
	if len(priorities) != len(chain) {
		return 0, argErr("priorities", "has %d entries for a chain of %d blocks", len(priorities), len(chain))
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.checkOpen(); err != nil {
		return 0, err
	}
	var path []*node
	for n := m.root(scope); len(path) < len(chain); {
		c := m.child(n, chain[len(path)])
		if c == nil {
			break
		}
		path = append(path, c)
		n = c
	}
	// Deepest first, so each block sees its children's final priorities.
	for i := len(path) - 1; i >= 0; i-- {
		n := path[i]
		for lc := range m.prioOf(n) {
			want := min(max(priorities[i], MinPriority), MaxPriority)
			m.children(n, func(c *node) { want = max(want, m.prioOf(c)[lc]) })
			m.setNodePriority(n, layout.LayerGroupID(lc), want)
		}
	}
	return len(path), nil
}

// setNodePriority sets n's priority in lc, re-ranks its page and reports
// the change.
func (m *Manager) setNodePriority(n *node, lc layout.LayerGroupID, pr int) {
	old := m.prioOf(n)[lc]
	if old == pr {
		return
	}
	m.prioOf(n)[lc] = pr
	if p := m.pagesOf(n)[lc]; p != nil {
		p.refresh()
	}
	if m.hasPages(n) {
		m.emitPriority(n, lc, old)
	}
}
