package core

import (
	"fmt"
	"slices"

	"github.com/kvcm/kvcm/core/device"
	"github.com/kvcm/kvcm/core/layout"
)

// Beam search. A cache has a beam width (1 at creation): each beam is one
// hypothesis with its own page per block and layer group, and the engine
// writes beam k's KV into beam k's pages. Beams share pages wherever their
// histories agree: the committed blocks and the prompt (every block before
// the beams forked) have one page that every beam reads. A block holding a
// position at or past the history length is where beams write next, so no
// two beams share a page there: when a fork or a reorder would make them
// share one, the later beam gets a copy of it (copy on write), made on the
// cache's stream.
//
// A cache references each distinct page once, whatever the number of beams
// that see it: eviction, the cold levels, Suspend and Resume treat a beam's
// private page like any other private page of the cache.

// DefaultBeamIndex is the beam the single-beam calls read: beam 0, which also
// holds the committed tokens' KV.
const DefaultBeamIndex = 0

// MaxBeamWidth is the largest beam width a cache may have.
const MaxBeamWidth = 1024

// beamPages returns beam k's pages of the block, one per layer group.
func (cb *cacheBlock) beamPages(k int) []*page {
	if k == 0 || cb.beams == nil {
		return cb.pages
	}
	return cb.beams[k-1]
}

// firstOf reports whether beam k's page of layer group lc is not the page of
// an earlier beam: the beam that owns the cache's reference to it.
func (cb *cacheBlock) firstOf(k, lc int) bool {
	p := cb.beamPages(k)[lc]
	for j := range k {
		if cb.beamPages(j)[lc] == p {
			return false
		}
	}
	return true
}

// eachPage calls fn once for every distinct page of the block, over every
// beam.
func (cb *cacheBlock) eachPage(fn func(p *page)) {
	for _, p := range cb.pages {
		if p != nil {
			fn(p)
		}
	}
	for k := range cb.beams {
		for lc, p := range cb.beams[k] {
			if p != nil && cb.firstOf(k+1, lc) {
				fn(p)
			}
		}
	}
}

// clearPage removes page p of layer group lc from every beam of the block.
func (cb *cacheBlock) clearPage(lc int, p *page) {
	if cb.pages[lc] == p {
		cb.pages[lc] = nil
	}
	for _, row := range cb.beams {
		if row[lc] == p {
			row[lc] = nil
		}
	}
}

// hasPage reports whether any beam of the block has a page of layer group lc.
func (cb *cacheBlock) hasPage(lc int) bool {
	if cb.pages[lc] != nil {
		return true
	}
	for _, row := range cb.beams {
		if row[lc] != nil {
			return true
		}
	}
	return false
}

// BeamWidth returns the cache's beam width: how many beams have page indices.
func (c *KVCache) BeamWidth() int {
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	return c.beamWidth()
}

func (c *KVCache) beamWidth() int { return max(c.width, 1) }

// SetBeamWidth sets the number of beams of an ACTIVE cache. New beams fork
// from beam 0: they share its pages, except that each gets a copy of every
// block holding a position at or past the history length (the diverging
// block, where beams write next). Beams at or beyond a smaller width are
// dropped with their private pages (their uncommitted KV is lost). It returns ErrOutOfPages
// when the GPU level has no room for the new pages; on error nothing
// changes.
func (c *KVCache) SetBeamWidth(width int) error {
	m := c.m
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case c.status != Active:
		return stateErr("set beam width", c.status)
	case width < 1 || width > MaxBeamWidth:
		return argErr("beam_width", "%d out of [1, %d]", width, MaxBeamWidth)
	}
	if err := c.checkLost(); err != nil {
		return err
	}
	if width == c.beamWidth() {
		return nil
	}
	parents := make([]int, width)
	for j := range parents {
		if j < c.beamWidth() {
			parents[j] = j
		}
	}
	ev, err := m.events.record(c.stream)
	if err != nil {
		return fmt.Errorf("record cache event: %w", err)
	}
	defer m.events.release(ev)
	if err := c.reorder(parents, c.history, ev); err != nil {
		return fmt.Errorf("set beam width of cache %d to %d: %w", c.id, width, err)
	}
	m.safePoint()
	return nil
}

// checkBeamIndices validates the beam_search_indices of a commit: one old
// beam per beam, the one whose history the beam takes over.
func (c *KVCache) checkBeamIndices(parents []int) error {
	if len(parents) != c.beamWidth() {
		return argErr("beam_search_indices", "has %d entries for beam width %d", len(parents), c.beamWidth())
	}
	for j, p := range parents {
		if p < 0 || p >= c.beamWidth() {
			return argErr("beam_search_indices", "entry %d is beam %d, out of [0, %d)", j, p, c.beamWidth())
		}
	}
	return nil
}

// cowPage is a page a reorder must fill: beam j's page of layer group lc in
// block b, a copy of src.
type cowPage struct {
	b, j, lc int
	src      *page
}

// reorder makes beam j take over the pages of old beam parents[j], for every
// j; len(parents) is the new beam width. Blocks from the first holding a
// position at or past history are written next, so a page two new beams
// would share there is copied for the later one, on the cache's stream,
// into a page the reorder releases where there is one (the stream orders
// the copy after its last use) and into a new GPU page otherwise. Pages no
// beam references any more are released, fenced by ev (recorded on the
// cache's stream before the call). On error nothing changes.
func (c *KVCache) reorder(parents []int, history int, ev *sharedEvent) error {
	m, tpb := c.m, c.m.cfg.TokensPerBlock
	width, numLC := len(parents), len(m.lt.LifeCycles)
	if width == 1 && parents[0] == 0 && c.beamWidth() == 1 {
		return nil
	}
	writable := history / tpb // the first block beams may still write into
	// The new rows of every block that has or gets beams of its own (nil:
	// one row every beam reads, before and after), and the copies they need.
	rows := make([][][]*page, len(c.blocks))
	var cows []cowPage
	var dropped []*page
	for b := range c.blocks {
		cb := &c.blocks[b]
		if b < writable && cb.beams == nil {
			continue
		}
		row := make([][]*page, width)
		for j, p := range parents {
			row[j] = slices.Clone(cb.beamPages(p))
		}
		rows[b] = row
		cb.eachPage(func(p *page) {
			for _, r := range row {
				if r[p.lc] == p {
					return
				}
			}
			dropped = append(dropped, p)
		})
		if b < writable {
			continue
		}
		for j := 1; j < width; j++ {
			for lc := range numLC {
				if src := row[j][lc]; src != nil && slices.ContainsFunc(row[:j], func(r []*page) bool { return r[lc] == src }) {
					cows = append(cows, cowPage{b, j, lc, src})
				}
			}
		}
	}
	// Copies go into released private pages first, new pages for the rest.
	lvl := m.levels[0]
	dsts := make([]*page, len(cows))
	n := need{}
	for i, cw := range cows {
		if k := slices.IndexFunc(dropped, func(p *page) bool { return int(p.lc) == cw.lc && p.node == nil }); k >= 0 {
			dsts[i] = dropped[k]
			dropped = slices.Delete(dropped, k, k+1)
		} else {
			n = n.add(lvl.groupOf(layout.LayerGroupID(cw.lc)), 1)
		}
	}
	if len(n) > 0 {
		if err := m.reserveAt(0, n); err != nil {
			return err
		}
	}
	waits := waitSet{skip: c.stream}
	var made []*page
	var descs []device.CopyDesc
	for i, cw := range cows {
		dp := dsts[i]
		if dp == nil {
			dp = m.newPage(lvl.groupOf(layout.LayerGroupID(cw.lc)), layout.LayerGroupID(cw.lc))
			m.ref(dp, true)
			made = append(made, dp)
			waits.addFence(dp.group.fences[dp.slot])
			dsts[i] = dp
		}
		for pool := range cw.src.group.desc.PoolBytes {
			descs = append(descs, device.CopyDesc{
				Dst: dp.group.slotAddr(pool, dp.slot), Src: cw.src.group.slotAddr(pool, cw.src.slot),
				Size: cw.src.group.desc.PoolBytes[pool],
			})
		}
	}
	if len(cows) > 0 {
		err := waits.apply(c.stream)
		if err == nil {
			err = c.stream.BatchCopy(descs)
		}
		if err != nil {
			for _, p := range made {
				m.unref(p, true)
			}
			return fmt.Errorf("copy the diverging blocks: %w", err)
		}
	}
	for i, cw := range cows {
		rows[cw.b][cw.j][cw.lc] = dsts[i]
	}
	for b, row := range rows {
		if row == nil {
			continue
		}
		cb := &c.blocks[b]
		copy(cb.pages, row[0])
		cb.beams = nil
		for j := 1; j < width; j++ {
			if !slices.Equal(row[j], cb.pages) {
				cb.beams = row[1:]
				break
			}
		}
	}
	for _, p := range dropped {
		p.group.fences[p.slot].add(&m.events, ev)
		m.unref(p, true)
	}
	c.width = width
	return nil
}

// unifyBlock makes every beam of block b see beam 0's pages, releasing the
// others (fenced by ev): the block is committed, its KV converged in beam 0.
func (c *KVCache) unifyBlock(b int, ev *sharedEvent) {
	m, cb := c.m, &c.blocks[b]
	if cb.beams == nil {
		return
	}
	for k := range cb.beams {
		for lc, p := range cb.beams[k] {
			if p != nil && p != cb.pages[lc] && cb.firstOf(k+1, lc) {
				p.group.fences[p.slot].add(&m.events, ev)
				m.unref(p, true)
			}
		}
	}
	cb.beams = nil
}

// newBeamRows gives a new block its pages of beams 1..width-1 (beam 0's come
// from the caller): a private page of each layer group where beam 0 has one.
func (c *KVCache) newBeamRows(cb *cacheBlock, added []*page, waits *waitSet) []*page {
	m, lvl := c.m, c.m.levels[0]
	width := c.beamWidth()
	if width == 1 {
		return added
	}
	cb.beams = make([][]*page, width-1)
	for k := range cb.beams {
		cb.beams[k] = make([]*page, len(cb.pages))
		for lc, p0 := range cb.pages {
			if p0 == nil {
				continue
			}
			p := m.newPage(lvl.groupOf(layout.LayerGroupID(lc)), layout.LayerGroupID(lc))
			p.prio, p.prioSet = p0.prio, p0.prioSet // the block's priority, asked once
			m.ref(p, true)
			cb.beams[k][lc] = p
			added = append(added, p)
			waits.addFence(p.group.fences[p.slot])
		}
	}
	return added
}

// BasePageIndicesOfBeam is BasePageIndices for beam (in [0, BeamWidth())).
func (c *KVCache) BasePageIndicesOfBeam(lg layout.LayerGroupID, beam int) ([]int32, error) {
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	return c.beamPageIndices(lg, beam, nil)
}

// AppendBasePageIndicesOfBeam is BasePageIndicesOfBeam appending to dst.
func (c *KVCache) AppendBasePageIndicesOfBeam(dst []int32, lg layout.LayerGroupID, beam int) ([]int32, error) {
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	return c.beamPageIndices(lg, beam, dst)
}

// beamPageIndices appends beam's GPU slot of each block in layer group lg
// to dst (BadPageIndex where the block has no page); the cache must be
// ACTIVE.
func (c *KVCache) beamPageIndices(lg layout.LayerGroupID, beam int, dst []int32) ([]int32, error) {
	if c.status != Active {
		return nil, stateErr("page indices", c.status)
	}
	if lg < 0 || int(lg) >= len(c.m.lt.LifeCycles) {
		return nil, argErr("layer_group_id", "%d out of [0, %d)", lg, len(c.m.lt.LifeCycles))
	}
	if beam < 0 || beam >= c.beamWidth() {
		return nil, argErr("beam_id", "%d out of [0, %d)", beam, c.beamWidth())
	}
	if err := c.checkLost(); err != nil {
		return nil, err
	}
	for i := range c.blocks {
		if p := c.blocks[i].beamPages(beam)[lg]; p != nil {
			dst = append(dst, p.slot)
		} else {
			dst = append(dst, BadPageIndex)
		}
	}
	return dst, nil
}
