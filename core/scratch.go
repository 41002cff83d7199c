package core

import (
	"fmt"

	"github.com/kvcm/kvcm/core/layout"
)

// SWA scratch reuse (config.Config.SwaScratchReuse, KVCacheManagerV2's
// swa_scratch_reuse). A prefill step that computes more tokens than a
// sliding window holds writes the KV of blocks that are out of the window
// again by the end of the step: attention reads them only within the step,
// layer by layer. With scratch reuse those blocks get no page; the cache
// holds a few scratch slots per layer group instead, and the step writes
// each layer's KV of consecutive scratch blocks into consecutive sub-pages of
// them (BufferLocation.ScratchPageIndex), every layer over the same slots.
// The last max_rewind_len tokens of the capacity may be rewound and kept as
// history, so their blocks always get pages.

// ScratchDesc says which blocks of a layer group use scratch slots in the
// current step and which GPU slots those are (KVCacheManagerV2's
// ScratchDesc). Blocks [Begin, End) have no page (BadPageIndex); Slots are
// slot ids of the layer group's hot pool group, in order. It is valid until
// the cache's next Resize, Commit, Suspend or Close.
type ScratchDesc struct {
	Begin, End int
	Slots      []int32
}

// Empty reports whether no block uses scratch slots.
func (d ScratchDesc) Empty() bool { return d.End <= d.Begin }

// ScratchPageIndex returns the page index of the buffer for scratch block b
// of d (Begin <= b < End), counted like PageIndex in units of the buffer's
// size from its pool's base address (KVCacheManagerV2's PER_LAYER index
// mode): block b-Begin of the layer goes to scratch slot
// (b-Begin)/ScratchBlocksPerSlot, at sub-page ((b-Begin)%ScratchBlocksPerSlot)
// * ScratchPagesPerBlock + Offset, modulo Scale. It returns -1 outside d.
func (b BufferLocation) ScratchPageIndex(d ScratchDesc, block int) int64 {
	if block < d.Begin || block >= d.End {
		return -1
	}
	bps := b.ScratchBlocksPerSlot()
	pos := int64(block - d.Begin)
	slot := int64(d.Slots[pos/bps])
	return slot*b.Scale + ((pos%bps)*b.ScratchPagesPerBlock+b.Offset)%b.Scale
}

// scratchPlan is, per layer group, the scratch blocks [lo, hi) of a step and
// the scratch slots they take. The zero plan (scratch reuse off) has none.
type scratchPlan struct {
	on     bool
	lo, hi []int
	slots  []int
	grow   bool // some layer group needs more slots than the cache holds
}

func (sc *scratchPlan) in(lc, b int) bool { return sc.on && b >= sc.lo[lc] && b < sc.hi[lc] }

// newBlocksIn counts the scratch blocks of lc among blocks [from, to).
func (sc *scratchPlan) newBlocksIn(lc, from, to int) int {
	if !sc.on {
		return 0
	}
	return max(0, min(to, sc.hi[lc])-max(from, sc.lo[lc]))
}

func (c *KVCache) maxRewind() int { return c.m.cfg.SwaScratchReuse.MaxRewindLen }

func (c *KVCache) scratchOf(lc int) []*page {
	if c.scratch == nil {
		return nil
	}
	return c.scratch[lc]
}

// planScratch plans the scratch of a step from history to capacity tokens.
func (c *KVCache) planScratch(history, capacity int) scratchPlan {
	if !c.scratchOn {
		return scratchPlan{}
	}
	lt := c.m.lt
	n := len(lt.LifeCycles)
	sc := scratchPlan{on: true, lo: make([]int, n), hi: make([]int, n), slots: make([]int, n)}
	for lc := range n {
		id := layout.LayerGroupID(lc)
		sc.lo[lc], sc.hi[lc] = lt.ScratchRange(id, history, capacity, c.maxRewind())
		sc.slots[lc] = lt.ScratchSlots(id, sc.hi[lc]-sc.lo[lc])
		sc.grow = sc.grow || sc.slots[lc] > len(c.scratchOf(lc))
	}
	return sc
}

// wouldUseScratch reports whether the cache's current step would have
// scratch blocks with scratch reuse on.
func (c *KVCache) wouldUseScratch() bool {
	for lc := range c.m.lt.LifeCycles {
		if lo, hi := c.m.lt.ScratchRange(layout.LayerGroupID(lc), c.history, c.capacity, c.maxRewind()); hi > lo {
			return true
		}
	}
	return false
}

// checkScratchStep refuses a Resize that scratch reuse cannot follow: a
// capacity change needs the previous step computed (the history in
// [capacity - max_rewind_len, capacity] of it), so that its scratch blocks
// are out of the window for good; the capacity must not shrink while the
// cache holds scratch slots.
func (c *KVCache) checkScratchStep(capacity, history int) error {
	if !c.scratchOn {
		return nil
	}
	if capacity != c.capacity {
		if lo := max(0, c.capacity-c.maxRewind()); history < lo || history > c.capacity {
			return argErr("history_length", "with SWA scratch reuse, a resize that changes the capacity needs the previous step computed: history in [%d, %d] (capacity %d less max_rewind_len %d), got %d",
				lo, c.capacity, c.capacity, c.maxRewind(), history)
		}
		if capacity < c.capacity && c.hasScratch() {
			return argErr("capacity", "must not shrink (%d < %d) while the cache holds scratch slots", capacity, c.capacity)
		}
	}
	return c.checkScratchHistory(history)
}

// checkScratchHistory refuses a history advance to history that would bring
// a block computed in scratch slots (of the current step) back into a
// window: its KV is gone.
func (c *KVCache) checkScratchHistory(history int) error {
	if !c.scratchOn || history == c.history {
		return nil
	}
	lt := c.m.lt
	for lc := range lt.LifeCycles {
		id := layout.LayerGroupID(lc)
		lo, hi := lt.ScratchRange(id, c.history, c.capacity, c.maxRewind())
		nlo, nhi := lt.ScratchRange(id, history, c.capacity, c.maxRewind())
		for b := lo; b < hi; b++ {
			if (b < nlo || b >= nhi) && lt.Needs(id, b, history) {
				return argErr("history_length", "%d would bring block %d of layer group %d, computed in scratch slots, back into the window; with SWA scratch reuse the history advances past a step's scratch blocks at once (to at least %d)",
					history, b, lc, max(0, c.capacity-c.maxRewind()))
			}
		}
	}
	return nil
}

func (c *KVCache) hasScratch() bool {
	for _, s := range c.scratch {
		if len(s) > 0 {
			return true
		}
	}
	return false
}

// addScratch takes the scratch slots sc needs beyond those the cache holds
// (reserveAt made room), appending them to added in layer-group order.
func (c *KVCache) addScratch(sc scratchPlan, added []*page, waits *waitSet) []*page {
	if !sc.grow {
		return added
	}
	m := c.m
	for lc := range sc.slots {
		id := layout.LayerGroupID(lc)
		for range sc.slots[lc] - len(c.scratchOf(lc)) {
			p := m.newPage(m.levels[0].groupOf(id), id)
			m.ref(p, true)
			added = append(added, p)
			waits.addFence(p.group.fences[p.slot])
		}
	}
	return added
}

// scratchReleases appends to released the pages of blocks below oldBlocks
// that sc makes scratch blocks: blocks past the history (no computed KV) of
// the previous step's rewindable tail.
func (c *KVCache) scratchReleases(sc scratchPlan, released []releasedPage, oldBlocks int) []releasedPage {
	if !sc.on {
		return released
	}
	for lc := range sc.lo {
		for b := sc.lo[lc]; b < min(sc.hi[lc], oldBlocks); b++ {
			if p := c.blocks[b].pages[lc]; p != nil {
				released = append(released, releasedPage{b, lc, p})
			}
		}
	}
	return released
}

// excessScratch lists the scratch slots the cache holds beyond sc's.
func (c *KVCache) excessScratch(sc scratchPlan) []*page {
	var out []*page
	for lc, s := range c.scratch {
		want := 0
		if sc.on {
			want = sc.slots[lc]
		}
		if len(s) > want {
			out = append(out, s[want:]...)
		}
	}
	return out
}

// commitScratch makes the cache hold sc's scratch slots: the excess ones
// (fenced already) are released, fresh ones (addScratch's, in layer-group
// order) appended.
func (c *KVCache) commitScratch(sc scratchPlan, fresh []*page) {
	m := c.m
	for lc, s := range c.scratch {
		want := 0
		if sc.on {
			want = sc.slots[lc]
		}
		for i := len(s) - 1; i >= want; i-- {
			m.unref(s[i], true)
			s[i] = nil
		}
		c.scratch[lc] = s[:min(len(s), want)]
	}
	if len(fresh) == 0 {
		return
	}
	if c.scratch == nil {
		c.scratch = make([][]*page, len(m.lt.LifeCycles))
	}
	for lc := range sc.slots {
		k := sc.slots[lc] - len(c.scratch[lc])
		c.scratch[lc] = append(c.scratch[lc], fresh[:k]...)
		fresh = fresh[k:]
	}
}

// freeScratch releases every scratch slot; the caller fenced them.
func (c *KVCache) freeScratch() { c.commitScratch(scratchPlan{}, nil) }

// takeScratch reserves and takes the scratch slots of the cache's current
// step (for Resume): it returns the plan and the fresh slots, which the
// caller commits or, on failure, unrefs.
func (c *KVCache) takeScratch(waits *waitSet) (scratchPlan, []*page, error) {
	sc := c.planScratch(c.history, c.capacity)
	if !sc.grow {
		return sc, nil, nil
	}
	m := c.m
	n := need{}
	for lc := range sc.slots {
		if k := sc.slots[lc] - len(c.scratchOf(lc)); k > 0 {
			n = n.add(m.levels[0].groupOf(layout.LayerGroupID(lc)), k)
		}
	}
	if err := m.reserveAt(0, n); err != nil {
		return sc, nil, err
	}
	return sc, c.addScratch(sc, nil, waits), nil
}

// ScratchDesc returns the scratch blocks and slots of layer group lg in the
// ACTIVE cache's current step (KVCacheManagerV2's get_scratch_desc); an
// Empty one when the layer group has none.
func (c *KVCache) ScratchDesc(lg layout.LayerGroupID) (ScratchDesc, error) {
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	if c.status != Active {
		return ScratchDesc{}, stateErr("scratch desc", c.status)
	}
	if lg < 0 || int(lg) >= len(c.m.lt.LifeCycles) {
		return ScratchDesc{}, argErr("layer_group_id", "%d out of [0, %d)", lg, len(c.m.lt.LifeCycles))
	}
	if !c.scratchOn {
		return ScratchDesc{}, nil
	}
	lo, hi := c.m.lt.ScratchRange(lg, c.history, c.capacity, c.maxRewind())
	if hi <= lo {
		return ScratchDesc{}, nil
	}
	d := ScratchDesc{Begin: lo, End: hi}
	for _, p := range c.scratchOf(int(lg)) {
		d.Slots = append(d.Slots, p.slot)
	}
	return d, nil
}

// HasScratchSlots reports whether the cache holds scratch slots now
// (KVCacheManagerV2's has_scratch_slots); only an ACTIVE cache does.
func (c *KVCache) HasScratchSlots() bool {
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	return c.hasScratch()
}

// SwaScratchReuse reports whether the cache uses scratch slots
// (KVCacheManagerV2's enable_swa_scratch_reuse); it starts as the manager's
// configuration says.
func (c *KVCache) SwaScratchReuse() bool {
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	return c.scratchOn
}

// SetSwaScratchReuse turns scratch reuse on or off for the cache. Turning it
// on needs it configured (config.Config.SwaScratchReuse); either way the
// cache's current step must have no scratch blocks with it on
// (ErrInvalidState otherwise), so the switch changes no page.
func (c *KVCache) SetSwaScratchReuse(on bool) error {
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	switch {
	case on == c.scratchOn:
		return nil
	case c.status == Closed:
		return stateErr("set swa scratch reuse", c.status)
	case on && !c.m.cfg.EnableSwaScratchReuse():
		return argErr("enable_swa_scratch_reuse", "the manager's configuration has no swa_scratch_reuse")
	case c.wouldUseScratch():
		return fmt.Errorf("%w: cache %d: scratch blocks are needed by its current step (history %d, capacity %d); switch scratch reuse before resizing",
			ErrInvalidState, c.id, c.history, c.capacity)
	}
	c.scratchOn = on
	return nil
}
