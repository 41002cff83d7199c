package core

import (
	"errors"
	"fmt"
	"math/bits"
	"slices"

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
	heapIdx      int // where p is in its group's victim set (see inVictims)
	// moving: a migration is placing the page; it is no eviction candidate.
	moving bool
	// inflight is the transaction that last moved the page, until settled;
	// inflightIdx is the page's index in it.
	inflight    *inflight
	inflightIdx int32
	// lost: a failure destroyed the page's data; the manager's lostBy
	// holds the first one.
	lost bool
	// diskTag is the writer tag of the page's blob while it is on disk.
	diskTag uint64
	// prio is the eviction priority the cache's PriorityFunc gave the page
	// when it was allocated (prioSet), as KVCacheManagerV2 asks its
	// custom_priority_callback per page: a private page is ranked by it,
	// and the block takes it when it is committed.
	prio    int8
	prioSet bool
}

func (p *page) level() int { return p.group.level.index }

func (p *page) priority() int {
	switch {
	case p.node != nil:
		return p.group.level.nodes.prios(p.node)[p.lc]
	case p.prioSet:
		return int(p.prio)
	}
	return DefaultPriority
}

// setPriority gives a private page the priority its cache's PriorityFunc
// chose at allocation.
func (p *page) setPriority(pr int) {
	p.prio, p.prioSet = int8(pr), true
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
	// free is the free slots (see takeSlot): slots are reused in ascending
	// order, so a disk tier writes and reads its blobs forwards.
	free     freeSlots
	owner    []*page
	fences   []fence
	victims  victimSet
	peakUsed int64
	// The iteration's peaks of available, unavailable and evictable slots,
	// sampled by notePeaks at the end of every public operation (as
	// KVCacheManagerV2 samples them when statistics are committed): within
	// an operation, victims on their way out would look unavailable.
	peakAvail, peakUnavail, peakEvictable int64
}

func (g *slotGroup) used() int64 { return g.numSlots - int64(g.free.len()) }

// notePeaks raises the iteration's peaks to the group's current counts.
func (g *slotGroup) notePeaks() {
	ev := int64(g.victims.len())
	avail := int64(g.free.len()) + ev
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
	// nodes is the manager's node store, where pages find their priority.
	nodes *nodeStore
	// victimScratch is reserveAt's list of the level's victims.
	victimScratch []*page
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
	g.free.reset(g.numSlots)
	for s := range int32(g.numSlots) {
		g.free.put(s)
	}
	g.owner = make([]*page, g.numSlots)
	g.fences = newFences(g.numSlots)
	// Every slot's page may become a victim: the set never grows by copying.
	g.victims.reserve(g.numSlots)
	if g.level.index == 0 {
		// The GPU level's slots are all in use under load: their
		// bookkeeping is touched now (see touch), not by the requests.
		touch(g.owner)
		touch(g.victims.heap[:g.numSlots])
		touch(g.victims.run[:g.numSlots])
		for _, f := range g.fences {
			touch(f[:1])
		}
	}
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
// (with room for as many digest tokens with digests) and the cold page.
func newDiskGroup(lvl *storageLevel, desc layout.Group, slots int64, tier config.CacheTierConfig, tokensPerBlock int, digests bool, open DiskOpener) (*slotGroup, error) {
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
	if digests {
		hdr = int64(blob.HeaderSizeDigests(tokensPerBlock, tokensPerBlock))
	}
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
	s := g.free.take()
	g.peakUsed = max(g.peakUsed, g.used())
	return s
}

// releaseSlot returns a reserved slot nobody arrived in.
func (g *slotGroup) releaseSlot(s int32) { g.free.put(s) }

// release returns p's slot; the slot keeps its fence so the next owner waits
// for every access of the previous one.
func (g *slotGroup) release(p *page) {
	g.owner[p.slot] = nil
	g.free.put(p.slot)
	p.group = nil
}

// freeSlots is a set of free slots that hands out the lowest first: a bit per
// slot, and a bit per word of them that has a free slot, so finding the
// lowest costs a scan of one summary bit per 4,096 slots.
type freeSlots struct {
	bits    []uint64
	summary []uint64 // bit w: bits[w] != 0
	n       int
}

// reset makes the set empty, for slots numSlots.
func (f *freeSlots) reset(numSlots int64) {
	words := int((numSlots + 63) / 64)
	f.bits = slices.Grow(f.bits[:0], words)[:words]
	clear(f.bits)
	f.summary = slices.Grow(f.summary[:0], (words+63)/64)[:(words+63)/64]
	clear(f.summary)
	f.n = 0
}

func (f *freeSlots) len() int { return f.n }

func (f *freeSlots) has(s int32) bool { return f.bits[s/64]&(1<<(s%64)) != 0 }

// put adds slot s, which must not be in the set.
func (f *freeSlots) put(s int32) {
	w := s / 64
	f.bits[w] |= 1 << (s % 64)
	f.summary[w/64] |= 1 << (w % 64)
	f.n++
}

// remove takes slot s, which must be in the set, out of it.
func (f *freeSlots) remove(s int32) {
	w := s / 64
	f.bits[w] &^= 1 << (s % 64)
	if f.bits[w] == 0 {
		f.summary[w/64] &^= 1 << (w % 64)
	}
	f.n--
}

// take removes and returns the lowest free slot; the set must not be empty.
func (f *freeSlots) take() int32 {
	for i, sw := range f.summary {
		if sw != 0 {
			w := i*64 + bits.TrailingZeros64(sw)
			s := int32(w*64 + bits.TrailingZeros64(f.bits[w]))
			f.remove(s)
			return s
		}
	}
	panic("core: take from an empty free-slot set")
}

// each calls fn for every free slot, in ascending order.
func (f *freeSlots) each(fn func(s int32)) {
	for w, word := range f.bits {
		for word != 0 {
			fn(int32(w*64 + bits.TrailingZeros64(word)))
			word &= word - 1
		}
	}
}

// dropFrom removes every slot at or beyond keep.
func (f *freeSlots) dropFrom(keep int64) {
	for s := keep; s < int64(len(f.bits))*64; s++ {
		if f.has(int32(s)) {
			f.remove(int32(s))
		}
	}
}

// victimSet orders a group's evictable pages: lowest priority first, then
// least recently released, then deepest (so a chain drains from its tail).
// Pages mostly arrive in that order (every release is a later tick, and a
// closing cache releases its chain deepest first), so a page that goes
// nowhere before the last one queued is appended to a sorted run in O(1);
// the others go into a heap. pop takes the earlier of the run's head and the
// heap's top. A page knows where it is (see page.inVictims).
type victimSet struct {
	heap victimHeap
	// run[head:] is sorted by victim.before; removed entries stay as
	// holes (p nil) until pop passes them or the run is compacted.
	run  []victim
	head int
	// queued counts the run's pages; last is the run's last entry as
	// appended (a hole keeps its key), which a new entry must not precede.
	queued int
	last   victim
}

// victimHeap is a 4-ary heap sifted with a hole: half the levels of a
// binary heap, and each level moves one entry (writing one page's heapIdx)
// instead of swapping two.
type victimHeap []victim

// victim is a page in the set with its order as of its last refresh, kept
// beside it so that ordering compares without reading pages or nodes.
type victim struct {
	prio, depth int
	lastUsed    uint64
	p           *page
}

// heapArity is the victim heap's children per entry.
const heapArity = 4

func (p *page) victimKey() victim {
	return victim{prio: p.priority(), depth: p.depth(), lastUsed: p.lastUsed, p: p}
}

// inVictims reports whether p is in its group's victim set. heapIdx is its
// index in the heap, or -2-i for index i of the run; -1: in neither.
func (p *page) inVictims() bool { return p.heapIdx != -1 }

// before reports whether a is evicted before b.
func (a *victim) before(b *victim) bool {
	if a.prio != b.prio {
		return a.prio < b.prio
	}
	if a.lastUsed != b.lastUsed {
		return a.lastUsed < b.lastUsed
	}
	return a.depth > b.depth
}

// reserve sizes the set for n pages without growing.
func (vs *victimSet) reserve(n int64) {
	vs.heap = make(victimHeap, 0, n)
	vs.run = make([]victim, 0, n)
}

// len returns how many pages the set holds.
func (vs *victimSet) len() int { return len(vs.heap) + vs.queued }

// push adds p, which is in no victim set.
func (vs *victimSet) push(p *page) {
	v := p.victimKey()
	if vs.queued > 0 && v.before(&vs.last) {
		vs.heap = append(vs.heap, victim{})
		vs.heap.up(len(vs.heap)-1, v)
		return
	}
	if vs.queued == 0 {
		vs.run, vs.head = vs.run[:0], 0
	} else if len(vs.run) == cap(vs.run) && 2*vs.queued <= len(vs.run) {
		// At least half the run is holes (pages that left, or popped):
		// compacting frees as many entries as it moves, so its cost
		// spreads over the pushes that refill them. With fewer holes the
		// run grows instead (a level full of cached pages whose prefixes
		// are reused and released again would otherwise compact all of
		// them every few requests).
		vs.compact()
	}
	p.heapIdx = -2 - len(vs.run)
	vs.run = append(vs.run, v)
	vs.queued++
	vs.last = v
}

// compact moves the run's pages to its front, dropping the holes.
func (vs *victimSet) compact() {
	w := 0
	for _, v := range vs.run[vs.head:] {
		if v.p != nil {
			vs.run[w] = v
			v.p.heapIdx = -2 - w
			w++
		}
	}
	clear(vs.run[w:])
	vs.run, vs.head = vs.run[:w], 0
}

// pop removes and returns the first victim; the set must not be empty.
func (vs *victimSet) pop() *page {
	if vs.queued > 0 {
		for vs.run[vs.head].p == nil {
			vs.head++
		}
		if len(vs.heap) == 0 || !vs.heap[0].before(&vs.run[vs.head]) {
			return vs.remove(vs.run[vs.head].p)
		}
	}
	return vs.heap.remove(0)
}

// remove takes p, which is in the set, out of it and returns it.
func (vs *victimSet) remove(p *page) *page {
	if p.heapIdx >= 0 {
		return vs.heap.remove(p.heapIdx)
	}
	i := -2 - p.heapIdx
	vs.run[i] = victim{}
	if i == vs.head {
		vs.head++
	}
	if vs.queued--; vs.queued == 0 {
		clear(vs.run[vs.head:])
		vs.run, vs.head = vs.run[:0], 0
	}
	p.heapIdx = -1
	return p
}

// each calls fn with every victim and whether it is in the heap at index i
// (else in the run).
func (vs *victimSet) each(fn func(v victim, inHeap bool, i int)) {
	for i, v := range vs.heap {
		fn(v, true, i)
	}
	for i, v := range vs.run[vs.head:] {
		if v.p != nil {
			fn(v, false, vs.head+i)
		}
	}
}

// put places v at i.
func (h victimHeap) put(i int, v victim) {
	h[i] = v
	v.p.heapIdx = i
}

// remove removes and returns the page at index i.
func (h *victimHeap) remove(i int) *page {
	old := *h
	n := len(old) - 1
	p := old[i].p
	last := old[n]
	old[n] = victim{}
	*h = old[:n]
	if i != n && !(*h).down(i, last) {
		(*h).up(i, last)
	}
	p.heapIdx = -1
	return p
}

// up places v at the hole i or above it.
func (h victimHeap) up(i int, v victim) {
	for i > 0 {
		parent := (i - 1) / heapArity
		if !v.before(&h[parent]) {
			break
		}
		h.put(i, h[parent])
		i = parent
	}
	h.put(i, v)
}

// down places v at the hole i0 or below it and reports whether it went
// below.
func (h victimHeap) down(i0 int, v victim) bool {
	i := i0
	for {
		first := heapArity*i + 1
		if first >= len(h) {
			break
		}
		j := first
		for k := first + 1; k < min(first+heapArity, len(h)); k++ {
			if h[k].before(&h[j]) {
				j = k
			}
		}
		if !h[j].before(&v) {
			break
		}
		h.put(i, h[j])
		i = j
	}
	h.put(i, v)
	return i > i0
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

// refresh puts p into or out of its group's victim set after a change of
// references, level or priority.
func (p *page) refresh() {
	g := p.group
	want := p.evictable(g.level.last)
	switch {
	case want && !p.inVictims():
		g.victims.push(p)
	case !want && p.inVictims():
		g.victims.remove(p)
	case want:
		g.victims.remove(p)
		g.victims.push(p)
	}
}

// newPage takes a free slot of g for lifecycle lc; reserve must have made
// room. The page starts private, unreferenced.
func (m *Manager) newPage(g *slotGroup, lc layout.LayerGroupID) *page {
	p := m.pages.alloc()
	p.lc = lc
	g.take(p)
	return p
}

// freePage returns a private page's slot. Its data no longer matters, so a
// transaction still moving it is of no concern any more.
func (m *Manager) freePage(p *page) {
	if p.inVictims() {
		p.group.victims.remove(p)
	}
	p.group.release(p)
	p.inflight = nil
	if p.lost {
		delete(m.lostBy, p)
	}
	m.pages.release(p)
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
