package core

import (
	"container/heap"
	"errors"
	"fmt"

	"github.com/kvcm/kvcm/core/blob"
	"github.com/kvcm/kvcm/core/config"
	"github.com/kvcm/kvcm/core/device"
	"github.com/kvcm/kvcm/core/layout"
)

// page is one lifecycle's data for one block, occupying one slot of its
// lifecycle's pool group at its current level.
type page struct {
	lc    layout.LayerGroupID
	group *slotGroup
	slot  int32
	// node is the radix-tree block the page belongs to; nil for a page
	// private to one cache.
	node *node
	// active counts references from active caches: the page is pinned in
	// place. held counts references from suspended caches: the page may move
	// to another level but must not be dropped.
	active, held int
	lastUsed     uint64
	heapIdx      int
	// heapPrio and heapDepth are priority() and depth() as of the last
	// refresh, so the victim heap compares pages without reading nodes.
	heapPrio, heapDepth int
	// moving: a migration is placing the page; it is no eviction candidate.
	moving bool
	// inflight is the transaction that last moved the page, until settled;
	// inflightIdx is the page's index in it.
	inflight    *inflight
	inflightIdx int32
	// lost: a failure destroyed the page's data; lostBy is the first one.
	lost   bool
	lostBy error
	// diskTag is the writer tag of the page's blob while it is on disk.
	diskTag uint64
}

func (p *page) level() int { return p.group.level.index }

func (p *page) priority() int {
	if p.node != nil {
		return p.node.priority[p.lc]
	}
	return DefaultPriority
}

func (p *page) depth() int {
	if p.node != nil {
		return p.node.depth
	}
	return 0
}

// slotGroup is one pool group of one level: its memory, its free slots, the
// fence of every slot and the eviction candidates.
type slotGroup struct {
	level *storageLevel
	desc  layout.Group
	mem   []device.Memory // one allocation per pool; none on disk
	file  DiskFile        // the group's blob file on a disk level
	dir   string          // the disk tier's directory, for errors
	// hdrBytes, payOff and stride: a disk slot is a blob header, padded to
	// payOff, then the payload, padded to stride. align is what the file's
	// I/O must be aligned to (direct I/O); payOff and stride are multiples
	// of it, so payloads move in place.
	hdrBytes, payOff, stride, align int64
	dio                             *diskIO // blob I/O of the group, used on the disk stream
	numSlots                        int64
	// capacity is the most slots the group can grow to in place: hot pools
	// reserve it; cold groups grow by reallocation, so it equals numSlots.
	capacity int64
	// free is a min-heap of free slots (see takeSlot): slots are reused in
	// ascending order, so a disk tier writes and reads its blobs forwards.
	free     []int32
	owner    []*page
	fences   []fence
	victims  victimHeap
	peakUsed int64
	// The iteration's peaks of available, unavailable and evictable slots,
	// sampled by notePeaks at the end of every public operation (as
	// KVCacheManagerV2 samples them when statistics are committed): within
	// an operation, victims on their way out would look unavailable.
	peakAvail, peakUnavail, peakEvictable int64
}

func (g *slotGroup) used() int64 { return g.numSlots - int64(len(g.free)) }

// notePeaks raises the iteration's peaks to the group's current counts.
func (g *slotGroup) notePeaks() {
	ev := int64(len(g.victims))
	avail := int64(len(g.free)) + ev
	g.peakAvail = max(g.peakAvail, avail)
	g.peakUnavail = max(g.peakUnavail, g.numSlots-avail)
	g.peakEvictable = max(g.peakEvictable, ev)
}

// resetPeaks starts a new iteration's peaks from the current counts.
func (g *slotGroup) resetPeaks() {
	g.peakUsed = g.used()
	g.peakAvail, g.peakUnavail, g.peakEvictable = 0, 0, 0
	g.notePeaks()
}

func (g *slotGroup) poolBase(pool int) device.Ptr { return g.mem[pool].Ptr() }

// slotAddr is the address of slot s in pool i.
func (g *slotGroup) slotAddr(pool int, s int32) device.Ptr {
	return g.mem[pool].Ptr().Add(int64(s) * g.desc.PoolBytes[pool])
}

// storageLevel is one cache tier.
type storageLevel struct {
	index int
	// last: the coldest level, where eviction drops pages instead of
	// moving them down.
	last   bool
	kind   config.TierKind
	quota  int64
	groups []*slotGroup
	lcMap  []layout.PoolGroupIndex
}

func (l *storageLevel) groupOf(lc layout.LayerGroupID) *slotGroup { return l.groups[l.lcMap[lc]] }

// slotsBytes is the size of n slots of b bytes, checked: layout sizing keeps
// every level within its int64 quota, so an overflow here is a bug, reported
// rather than wrapped into a negative size.
func slotsBytes(n, b int64) (int64, error) {
	size, ok := layout.CheckedMul(n, b)
	if !ok {
		return 0, fmt.Errorf("%d slots of %d bytes overflow int64", n, b)
	}
	return size, nil
}

// newHotGroup reserves capacity slots in every pool and commits slots.
func newHotGroup(dev device.Device, lvl *storageLevel, desc layout.Group, slots, capacity int64) (*slotGroup, error) {
	g := &slotGroup{level: lvl, desc: desc, numSlots: slots, capacity: capacity}
	for i, b := range desc.PoolBytes {
		size, err := slotsBytes(slots, b)
		if err != nil {
			g.freeMemory()
			return nil, fmt.Errorf("gpu pool %d of group %d: %w", i, desc.Index, err)
		}
		limit, err := slotsBytes(capacity, b)
		if err != nil {
			g.freeMemory()
			return nil, fmt.Errorf("gpu pool %d of group %d: %w", i, desc.Index, err)
		}
		mem, err := dev.Reserve(size, limit)
		if err != nil {
			g.freeMemory()
			return nil, fmt.Errorf("reserve gpu pool %d of group %d (%d of %d slots of %d bytes): %w",
				i, desc.Index, slots, capacity, b, err)
		}
		g.mem = append(g.mem, mem)
	}
	g.initSlots()
	return g, nil
}

// newSlotGroup allocates a host-level cold group.
func newSlotGroup(dev device.Device, lvl *storageLevel, desc layout.Group, slots int64, kind device.MemoryKind) (*slotGroup, error) {
	g := &slotGroup{level: lvl, desc: desc, numSlots: slots, capacity: slots}
	for i, b := range desc.PoolBytes {
		size, err := slotsBytes(slots, b)
		if err != nil {
			g.freeMemory()
			return nil, fmt.Errorf("%v pool %d of group %d: %w", lvl.kind, i, desc.Index, err)
		}
		mem, err := dev.Alloc(kind, size)
		if err != nil {
			g.freeMemory()
			return nil, fmt.Errorf("allocate %v pool %d of group %d (%d slots of %d bytes): %w",
				lvl.kind, i, desc.Index, slots, b, err)
		}
		g.mem = append(g.mem, mem)
	}
	g.initSlots()
	return g, nil
}

func (g *slotGroup) initSlots() {
	g.free = make([]int32, g.numSlots)
	for i := range g.free {
		g.free[i] = int32(i) // ascending: already a min-heap
	}
	g.owner = make([]*page, g.numSlots)
	g.fences = newFences(g.numSlots)
	// Every slot's page may become a victim: the heap never grows by copying.
	g.victims = make(victimHeap, 0, g.numSlots)
}

// fenceRoom is the events each slot's fence holds before it grows: a fence
// prunes when it reaches fencePruneAt, so it rarely needs more.
const fenceRoom = fencePruneAt + 1

// newFences returns n empty fences sharing one backing array.
func newFences(n int64) []fence {
	fences := make([]fence, n)
	room := make([]*sharedEvent, n*fenceRoom)
	for i := range fences {
		fences[i] = room[i*fenceRoom : i*fenceRoom : (i+1)*fenceRoom]
	}
	return fences
}

// newDiskGroup opens the group's blob file under dir with open, with its
// space reserved up front so a full disk fails here rather than during a
// write. Each slot holds a blob header for blocks of tokensPerBlock tokens
// and the cold page.
func newDiskGroup(lvl *storageLevel, desc layout.Group, slots int64, tier config.CacheTierConfig, tokensPerBlock int, open DiskOpener) (*slotGroup, error) {
	dir := tier.Path
	blobBytes := desc.PoolBytes[0]
	f, err := open(DiskFileSpec{Dir: dir, Group: desc.Index, Persistent: tier.Persistent, Direct: blobBytes >= directMinBlob})
	if err != nil {
		if errors.Is(err, ErrDiskInUse) {
			return nil, fmt.Errorf("disk tier %s: %w", dir, err)
		}
		return nil, fmt.Errorf("%w: disk tier %s: %w", ErrIO, dir, err)
	}
	hdr := int64(blob.HeaderSize(tokensPerBlock))
	align := max(f.Alignment(), 1)
	pay := roundUp(hdr, align)
	g := &slotGroup{level: lvl, desc: desc, numSlots: slots, capacity: slots, file: f, dir: dir,
		hdrBytes: hdr, payOff: pay, stride: roundUp(pay+blobBytes, align), align: align}
	g.dio = g.io(tokensPerBlock)
	if err := g.reserveFile(slots); err != nil {
		g.freeMemory()
		return nil, err
	}
	g.initSlots()
	return g, nil
}

// directMinBlob is the smallest cold page the disk tier uses direct I/O
// for: a slot is then a 4 KiB header block and the page rounded up to 4 KiB,
// which costs at most 1/8 more disk than the blobs themselves.
const directMinBlob = 64 << 10

func roundUp(n, align int64) int64 { return (n + align - 1) / align * align }

func (g *slotGroup) reserveFile(slots int64) error {
	size, err := slotsBytes(slots, g.stride)
	if err != nil {
		return fmt.Errorf("disk tier %s: %w", g.dir, err)
	}
	if err := g.file.Reserve(size); err != nil {
		return fmt.Errorf("%w: disk tier %s: reserve %d bytes: %w", ErrIO, g.dir, size, err)
	}
	return nil
}

func (g *slotGroup) freeMemory() {
	for _, m := range g.mem {
		m.Free()
	}
	g.mem = nil
	if g.file != nil {
		g.file.Close()
		g.file = nil
	}
}

// blobBytes is the cold page size of a one-pool cold group.
func (g *slotGroup) blobBytes() int64 { return g.desc.PoolBytes[0] }

// onDisk reports whether the group's slots live in a file.
func (g *slotGroup) onDisk() bool { return g.file != nil }

// hostSlot is the host view of slot s of a host-level cold group.
func (g *slotGroup) hostSlot(s int32) []byte {
	n := g.blobBytes()
	return g.mem[0].Host()[int64(s)*n : int64(s+1)*n]
}

// take hands out a free slot to p.
func (g *slotGroup) take(p *page) {
	s := g.takeSlot()
	g.owner[s] = p
	p.group, p.slot, p.heapIdx = g, s, -1
}

// takeSlot reserves the lowest free slot for a page about to arrive. Lowest
// first (rather than last freed first) keeps a disk tier's consecutive
// writes, and the reads that follow them, in ascending file order.
func (g *slotGroup) takeSlot() int32 {
	h := g.free
	s := h[0]
	n := len(h) - 1
	h[0] = h[n]
	g.free = h[:n]
	siftDown(g.free, 0)
	g.peakUsed = max(g.peakUsed, g.used())
	return s
}

// releaseSlot returns a reserved slot nobody arrived in.
func (g *slotGroup) releaseSlot(s int32) { g.pushFree(s) }

// release returns p's slot; the slot keeps its fence so the next owner waits
// for every access of the previous one.
func (g *slotGroup) release(p *page) {
	g.owner[p.slot] = nil
	g.pushFree(p.slot)
	p.group = nil
}

func (g *slotGroup) pushFree(s int32) {
	g.free = append(g.free, s)
	h := g.free
	for i := len(h) - 1; i > 0; {
		parent := (i - 1) / 2
		if h[parent] <= h[i] {
			break
		}
		h[parent], h[i] = h[i], h[parent]
		i = parent
	}
}

// heapifyFree restores the free heap after the list was edited as a slice.
func (g *slotGroup) heapifyFree() {
	for i := len(g.free)/2 - 1; i >= 0; i-- {
		siftDown(g.free, i)
	}
}

func siftDown(h []int32, i int) {
	for {
		l := 2*i + 1
		if l >= len(h) {
			return
		}
		c := l
		if r := l + 1; r < len(h) && h[r] < h[l] {
			c = r
		}
		if h[i] <= h[c] {
			return
		}
		h[i], h[c] = h[c], h[i]
		i = c
	}
}

// victimHeap orders evictable pages: lowest priority first, then least
// recently released, then deepest (so a chain drains from its tail).
type victimHeap []*page

func (h victimHeap) Len() int { return len(h) }
func (h victimHeap) Less(i, j int) bool {
	a, b := h[i], h[j]
	if pa, pb := a.heapPrio, b.heapPrio; pa != pb {
		return pa < pb
	}
	if a.lastUsed != b.lastUsed {
		return a.lastUsed < b.lastUsed
	}
	return a.heapDepth > b.heapDepth
}
func (h victimHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].heapIdx, h[j].heapIdx = i, j
}
func (h *victimHeap) Push(x any) {
	p := x.(*page)
	p.heapIdx = len(*h)
	*h = append(*h, p)
}
func (h *victimHeap) Pop() any {
	old := *h
	p := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	p.heapIdx = -1
	return p
}

// evictable reports whether p may leave its slot: nobody uses it in place and
// either a colder level can take it or nobody holds it at all.
func (p *page) evictable(lastLevel bool) bool {
	if p.active > 0 || p.moving || p.lost {
		return false
	}
	if p.held > 0 {
		return !lastLevel
	}
	return p.node != nil
}

// refresh puts p into or out of its group's victim heap after a change of
// references, level or priority.
func (p *page) refresh() {
	g := p.group
	want := p.evictable(g.level.last)
	if want {
		p.heapPrio, p.heapDepth = p.priority(), p.depth()
	}
	switch {
	case want && p.heapIdx < 0:
		heap.Push(&g.victims, p)
	case !want && p.heapIdx >= 0:
		heap.Remove(&g.victims, p.heapIdx)
	case want:
		heap.Fix(&g.victims, p.heapIdx)
	}
}

// newPage takes a free slot of g for lifecycle lc; reserve must have made
// room. The page starts private, unreferenced.
func (m *Manager) newPage(g *slotGroup, lc layout.LayerGroupID) *page {
	p := m.slabs.page()
	p.lc = lc
	g.take(p)
	return p
}

// freePage returns a private page's slot. Its data no longer matters, so a
// transaction still moving it is of no concern any more.
func (m *Manager) freePage(p *page) {
	if p.heapIdx >= 0 {
		heap.Remove(&p.group.victims, p.heapIdx)
	}
	p.group.release(p)
	p.inflight = nil
}

// unref drops one reference of a cache and refreshes eviction state; private
// pages that nobody references any more are freed.
func (m *Manager) unref(p *page, active bool) {
	if active {
		p.active--
	} else {
		p.held--
	}
	m.tick++
	p.lastUsed = m.tick
	if p.active == 0 && p.held == 0 && p.node == nil {
		m.freePage(p)
		return
	}
	p.refresh()
}

// ref adds a reference of a cache.
func (m *Manager) ref(p *page, active bool) {
	if active {
		p.active++
	} else {
		p.held++
	}
	p.refresh()
}
