package core

import (
	"fmt"

	"github.com/kvcm/kvcm/core/layout"
)

// PlannedDrop is a plan to drop the committed sliding-window pages that only
// the next turn of a conversation would reuse (KVCacheManagerV2's
// PlannedDropHandle): made by KVCache.PlanCommittedBlockDrop, carried out
// once by Drop. Its pages stay cached and reusable until then.
type PlannedDrop struct {
	m     *Manager
	pages []plannedPage
	done  bool
}

// plannedPage is the page of layer group lc of a tree block.
type plannedPage struct {
	n  *node
	lc layout.LayerGroupID
}

// PlanCommittedBlockDrop plans dropping, for every sliding-window layer
// group, the committed pages of the cache's full committed blocks that are in
// the window of the committed tokens (past its sink blocks), and with SSM
// layers the SSM snapshot of the last committed full block: a later turn
// that extends the conversation reuses the rest, and full-attention and sink
// blocks (and earlier snapshots) stay. A block the cache committed as an equal cached block follows
// that block: its pages are planned. It needs StopCommitting (or Commit with
// isEnd) first
// (ErrInvalidState). It returns nil, planning nothing, when the cache
// committed no full block, its blocks are not all in the tree (a key
// collision detached it) or one of the pages is no longer cached.
func (c *KVCache) PlanCommittedBlockDrop() (*PlannedDrop, error) {
	m := c.m
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.checkOpen(); err != nil {
		return nil, err
	}
	if c.status == Closed {
		return nil, stateErr("plan committed block drop", c.status)
	}
	if !c.stopped {
		return nil, fmt.Errorf("%w: plan_committed_block_drop requires stop_committing first", ErrInvalidState)
	}
	lt := m.lt
	end := min(c.committed/m.cfg.TokensPerBlock, len(c.blocks))
	if end == 0 {
		return nil, nil
	}
	// A block the cache committed where an equal one was cached already
	// follows that block in the tree, keeping its own pages private
	// (allow_seq_rebasing False): the plan names the tree's block, the one
	// a later turn reuses, as KVCacheManagerV2 plans the block it rebased
	// onto.
	along := make([]*node, end)
	for n := c.chain; n != nil && n.parent != 0; n = m.parentOf(n) {
		if b := n.depth - 1; b < end {
			along[b] = n
		}
	}
	var pages []plannedPage
	for lc := range lt.LifeCycles {
		id := layout.LayerGroupID(lc)
		if lt.LifeCycles[lc].Window.Size == 0 {
			continue // later turns read every block
		}
		for b := max(lt.SinkBlocks(id), min(lt.FirstKeptBlock(id, c.committed), end)); b < end; b++ {
			n := c.blocks[b].node
			if n == nil {
				n = along[b]
			}
			if n == nil || m.pagesOf(n)[lc] == nil {
				return nil, nil
			}
			pages = append(pages, plannedPage{n, id})
		}
	}
	// The SSM state of the conversation's endpoint: the snapshot of the last
	// committed full block, which only a later turn extending it reuses
	// (earlier snapshots serve shorter prompts and stay).
	if ssm := lt.SSM; ssm >= 0 {
		n := c.blocks[end-1].node
		if n == nil {
			n = along[end-1]
		}
		if n != nil && m.pagesOf(n)[ssm] != nil {
			pages = append(pages, plannedPage{n, ssm})
		}
	}
	if len(pages) == 0 {
		return nil, nil
	}
	if m.planned == nil {
		m.planned = map[plannedPage]int{}
	}
	for _, pp := range pages {
		m.planned[pp]++
		pp.n.users++ // the node stays in the tree while planned
	}
	return &PlannedDrop{m: m, pages: pages}, nil
}

// Drop carries out the plan: every planned page no other plan still names is
// dropped from every level, unless a cache uses it now (it stays cached
// then, as in KVCacheManagerV2). A second Drop fails with ErrInvalidState.
func (d *PlannedDrop) Drop() error {
	m := d.m
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.checkOpen(); err != nil {
		return err
	}
	if d.done {
		return fmt.Errorf("%w: the planned drop has already been dropped", ErrInvalidState)
	}
	d.done = true
	for _, pp := range d.pages {
		pp.n.users--
		m.prune = append(m.prune, pp.n)
		if m.planned[pp]--; m.planned[pp] > 0 {
			continue
		}
		delete(m.planned, pp)
		if p := m.pagesOf(pp.n)[pp.lc]; p != nil && p.active == 0 && p.held == 0 && !p.moving {
			m.drop(p)
		}
	}
	m.safePoint()
	return nil
}

// Dropped reports whether Drop was called.
func (d *PlannedDrop) Dropped() bool {
	d.m.mu.Lock()
	defer d.m.mu.Unlock()
	return d.done
}
