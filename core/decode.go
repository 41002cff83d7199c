package core

import (
	"fmt"

	"github.com/kvcm/kvcm/core/config"
	"github.com/kvcm/kvcm/core/layout"
)

// askedPriority is a PriorityFunc answer DecodeSteps asked before its steps
// applied: block b's page of lifecycle lc.
type askedPriority struct {
	b, pr int
	lc    layout.LayerGroupID
}

// DecodeSteps applies len(tokens) one-token decode steps to an ACTIVE cache
// in one call, under one lock. It is equivalent to calling, for each token
// t in order,
//
//	Resize(max(Capacity(), HistoryLength()+1), HistoryLength()+1)
//	Commit([]config.Token{t}, false)
//
// with every side effect those calls have, step by step: a demand sample
// per resize (for Adjust), the block statistics, a block published (and its
// events) when a token fills it, pages a sliding window no longer needs
// released, the PriorityFunc asked about each new page and each published
// block. Before any step applies it checks what can fail: the cache's state
// (ACTIVE, commits not stopped, the history at the committed tokens, one
// beam, no SWA scratch reuse, no fresh run owed, nothing lost), the
// capacity the run reaches, the PriorityFunc's answers (asked then, in the
// order the steps would ask, so a panic in it changes nothing) and the
// pages of every block the run adds (reserved at once, evicting if needed:
// pages the run's windows release on the way are not counted), and it
// records on the cache's stream the one event the run's published blocks
// and released pages are fenced by (the stream's work so far, which is what
// each step would record). On such an error nothing changes. A device
// failure after that (a page's fence the stream cannot be made to wait
// for) fails the call after the steps before it applied; the error says how
// many, and NumCommittedTokens tells them.
func (c *KVCache) DecodeSteps(tokens []config.Token) error {
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	if len(tokens) == 0 {
		return nil
	}
	if err := c.prepareSteps(len(tokens)); err != nil {
		return err
	}
	defer func() { c.asked = c.asked[:0] }()
	m, tpb := c.m, c.m.cfg.TokensPerBlock
	if ev := c.runEvent; ev != nil {
		defer func() { c.runEvent = nil; m.events.release(ev) }()
	}
	for i := range tokens {
		h := c.history + 1
		capacity := max(c.capacity, h)
		if k := len(c.blocks); capacity <= k*tpb && capacity > (k-1)*tpb && len(c.tail)+1 < tpb && !c.windowMoves(h) {
			// A step inside the last block that fills nothing: what
			// resizeInBlock and commitInBlock do, whose other checks
			// prepareSteps made for the whole run.
			c.sampleResize(capacity, h, true)
			c.capacity, c.history = capacity, h
			c.tail = append(c.tail, tokens[i])
			c.committed++
			continue
		}
		if !c.resizeInBlock(capacity, h) {
			if err := c.resize(capacity, h); err != nil {
				return fmt.Errorf("decode step %d of %d (the %d before applied): %w", i+1, len(tokens), i, err)
			}
		}
		tok := tokens[i : i+1]
		if !c.commitInBlock(tok) {
			if err := c.commit(tok, nil, nil, false); err != nil {
				return fmt.Errorf("decode step %d of %d (the %d before and its resize applied): %w", i+1, len(tokens), i, err)
			}
		}
	}
	if len(m.prune) > 0 {
		m.safePoint()
	}
	return nil
}

// prepareSteps checks the state n decode steps need, asks the PriorityFunc
// what they will ask (into c.asked), records the run's event (into
// c.runEvent, when a step will take one) and reserves the pages of the
// blocks they add, with the manager's lock held; on error nothing changed.
func (c *KVCache) prepareSteps(n int) error {
	m, lt := c.m, c.m.lt
	switch {
	case c.status != Active:
		return stateErr("decode steps", c.status)
	case c.stopped:
		return fmt.Errorf("%w: decode steps after stop_committing or is_end", ErrInvalidState)
	case c.committed != c.history:
		return fmt.Errorf("%w: decode steps need the history at the committed tokens (history %d, committed %d)",
			ErrInvalidState, c.history, c.committed)
	case c.beamWidth() > 1:
		return fmt.Errorf("%w: decode steps on a cache of %d beams (one beam only)", ErrInvalidState, c.beamWidth())
	case c.scratchOn:
		return fmt.Errorf("%w: decode steps on a cache with SWA scratch reuse", ErrInvalidState)
	case c.owed:
		return fmt.Errorf("%w: decode steps before the fresh run's commit", ErrInvalidState)
	case c.history+n > MaxCapacity:
		return argErr("tokens", "%d decode steps after %d tokens exceed the largest sequence, %d tokens", n, c.history, MaxCapacity)
	}
	if err := c.checkLost(); err != nil {
		return err
	}
	tpb := m.cfg.TokensPerBlock
	var few [4]groupNeed
	need := need(few[:0])
	c.asked = c.asked[:0]
	blocks, capacity := len(c.blocks), c.capacity
	for i := range n {
		h := c.history + i + 1
		capacity = max(capacity, h)
		if nb := lt.BlocksFor(capacity); nb > blocks {
			for b := blocks; b < nb; b++ {
				for lc := range lt.LifeCycles {
					id := layout.LayerGroupID(lc)
					if !lt.Needs(id, b, h) {
						continue
					}
					need = need.add(m.levels[0].groupOf(id), 1)
					if err := c.askAhead(b, id); err != nil {
						return err
					}
				}
			}
			blocks = nb
		}
		if h%tpb == 0 && c.priority != nil {
			// The commit filling block b asks where no page has a
			// priority: pages the run allocates have one.
			b := h/tpb - 1
			for lc := range lt.LifeCycles {
				id := layout.LayerGroupID(lc)
				if b < len(c.blocks) {
					if p := c.blocks[b].pages[lc]; p != nil && p.prioSet {
						continue
					}
				} else if c.askedAhead(b, id) {
					continue // its page, allocated by the run, has the answer
				}
				if err := c.askAhead(b, id); err != nil {
					return err
				}
			}
		}
	}
	if last := c.history + n; last/tpb > c.history/tpb || c.windowMoves(last) {
		// The run publishes a block or releases pages: the one event its
		// steps take (see streamEvent), recorded before anything changes
		// (the reservation below may evict).
		ev, err := m.events.record(c.stream)
		if err != nil {
			c.asked = c.asked[:0]
			return fmt.Errorf("%d decode steps of cache %d: record cache event: %w", n, c.id, err)
		}
		c.runEvent = ev
	}
	if len(need) > 0 {
		if err := m.reserveAt(0, need); err != nil {
			c.asked = c.asked[:0]
			if ev := c.runEvent; ev != nil {
				c.runEvent = nil
				m.events.release(ev)
			}
			return fmt.Errorf("%d decode steps of cache %d: %w", n, c.id, err)
		}
	}
	return nil
}

// askAhead asks the PriorityFunc about block b of lifecycle lc for the
// steps to come (see askPriority).
func (c *KVCache) askAhead(b int, lc layout.LayerGroupID) error {
	if c.priority == nil {
		return nil
	}
	pr, err := c.askPriority(b, lc)
	if err != nil {
		c.asked = c.asked[:0]
		return err
	}
	c.asked = append(c.asked, askedPriority{b: b, pr: pr, lc: lc})
	return nil
}

func (c *KVCache) askedAhead(b int, lc layout.LayerGroupID) bool {
	for _, a := range c.asked {
		if a.b == b && a.lc == lc {
			return true
		}
	}
	return false
}
