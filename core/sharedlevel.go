package core

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"

	"github.com/kvcm/kvcm/core/blob"
	"github.com/kvcm/kvcm/core/blockhash"
	"github.com/kvcm/kvcm/core/codec"
	"github.com/kvcm/kvcm/core/config"
	"github.com/kvcm/kvcm/core/device"
	"github.com/kvcm/kvcm/core/layout"
	"github.com/kvcm/kvcm/core/sharedtier"
	"github.com/kvcm/kvcm/core/staging"
)

// The shared tier (config.SharedTier) is a level of content-addressed blobs
// on a Redis Cluster (core/sharedtier), after every local level. A blob is
// the disk tier's: a core/blob header naming the layout fingerprint, the
// lifecycle, the block key, the parent key and the tokens, then the codec's
// payload. Managers (in other processes, on other nodes) whose layouts have
// the same fingerprint share blobs, of text blocks and of blocks with
// multimodal digest tokens alike: the digests (and their flag) enter the
// block key (blockhash.Hasher.NextDigests), so managers given the same input
// and digests agree on it, and an input's other digest misses.
//
// Reads. CreateKVCache, ProbeReuse and ProbeFirstNewBlockKey (which names
// the first block past ProbeReuse's prefix) continue the prefix match past
// the local tree: the blocks from the first one a lifecycle lacks a page of are
// looked up with one pipelined round trip per batch of keys
// (Store.MatchPrefix), and CreateKVCache fetches what was found (Store.Get,
// each blob checked: header, key, fingerprint, tokens, payload checksum).
// The blobs land raw, without decoding, in slots of the first cold local
// level (host, or disk without a host tier) as tree blocks, in one
// transaction per pool group on the shared stream (wait the slots' fences,
// copy or write, record the finish event, attach it), and the cache onboards
// them to the GPU at Resume like any cold page, decoded by the codec. The
// lookup and the fetch run without the manager's lock, the fetch in chunks
// of about sharedChunkBytes, each landed as it arrives so that its copy
// overlaps the next fetch; the tree is walked again under the lock and a
// block that changed meanwhile ends the onboarding there. A fault (a
// node down, a timeout, a damaged or foreign blob) is a miss and a counted
// error, never wrong bytes: each call is bounded by the tier's call timeout.
//
// Writes (config.SharedWritePolicy). With WriteBackOnEviction a page that
// eviction drops from the last local level is read from its slot on the
// shared stream, after its fence, and queued for the cluster; with
// WriteThroughOnCommit every committed page is encoded into pinned staging
// on the shared stream and queued. The queue (Store.Put) is bounded and never
// blocks: a full queue drops and counts, and a block the cluster already
// holds is not written again (its EXISTS rides in the round trip that
// writes the batch before it).

// SharedStats counts the shared tier's traffic as the manager sees it, with
// the store's own counters in Store.
type SharedStats struct {
	// LookupBlocks are blocks past the local tree looked up in the shared
	// tier by CreateKVCache and ProbeReuse; FoundBlocks those the tier held
	// (every missing page of the block).
	LookupBlocks, FoundBlocks int64
	// OnboardedBlocks and OnboardedPages were brought from the shared tier
	// to the first cold local level; OnboardedBytes are their payload bytes.
	OnboardedBlocks, OnboardedPages, OnboardedBytes int64
	// DiscardedPages were fetched but not onboarded: the tree had changed
	// meanwhile, the level had no room, or the copy could not be submitted.
	DiscardedPages int64
	// WriteBacks are pages evicted from the last local level and
	// WriteThroughs committed pages handed to the write queue.
	WriteBacks, WriteThroughs int64
	// LostWrites are pages that could not be handed to the queue: their
	// slot could not be read, or the transaction not submitted.
	LostWrites int64
	// FailedLandings are onboarded pages whose landing write to a disk
	// tier failed after it was submitted (an I/O error): each is lost when
	// its transaction settles, and also counted in BlockStats.LostPages.
	FailedLandings int64
	Store          sharedtier.Stats
}

type sharedLevel struct {
	store  *sharedtier.Store
	policy config.SharedWritePolicy
	// level is the shared tier's level number: after every local level.
	level layout.CacheLevel
	// dst is the first cold local level, where onboarded blobs land.
	dst *storageLevel
	// stream orders the shared tier's copies by the slots' fences, so they
	// never wait behind the GPU↔host migrations.
	stream device.Stream
	// stats is guarded by the manager's lock; lostWrites counts failures
	// in host functions.
	stats      SharedStats
	lostWrites atomic.Int64
}

// openShared opens the shared tier's store (NewManager, after every local
// level). The store connects on its own: an unreachable cluster makes misses.
func (m *Manager) openShared(c config.SharedCacheTierConfig) error {
	if len(m.levels) < 2 {
		return &config.Error{Field: fmt.Sprintf("cache_tiers[%d].kind", len(m.cfg.CacheTiers)),
			Msg: "a shared tier needs a host or disk tier to onboard its blocks through"}
	}
	sh := &sharedLevel{policy: c.WritePolicy, level: layout.CacheLevel(len(m.levels)), dst: m.levels[1]}
	var err error
	if sh.stream, err = m.dev.NewStream(); err != nil {
		return fmt.Errorf("create shared tier stream: %w", err)
	}
	m.shared = sh
	if c.WritePolicy == config.WriteThroughOnCommit && m.pageRing == nil {
		var maxCold int64
		for _, lc := range m.lcCodec {
			maxCold = max(maxCold, lc.coldBytes)
		}
		if m.pageRing, err = staging.NewPageRing(m.dev, maxCold); err != nil {
			return fmt.Errorf("page staging ring: %w", err)
		}
	}
	opts := sharedtier.OptionsFrom(c)
	opts.Verify = m.verifyShared
	if sh.store, err = sharedtier.Open(opts); err != nil {
		return &config.Error{Field: fmt.Sprintf("cache_tiers[%d]", len(m.cfg.CacheTiers)), Msg: err.Error()}
	}
	return nil
}

func (sh *sharedLevel) close() { sh.store.Close() }

// SharedLevel returns the shared tier's level number (the number of local
// levels), as events name it; false without a shared tier.
func (m *Manager) SharedLevel() (layout.CacheLevel, bool) {
	if m.shared == nil {
		return 0, false
	}
	return m.shared.level, true
}

// SharedStats returns the shared tier's counters; false without a shared
// tier.
func (m *Manager) SharedStats() (SharedStats, bool) {
	if m.shared == nil {
		return SharedStats{}, false
	}
	m.mu.Lock()
	s := m.shared.stats
	m.mu.Unlock()
	s.LostWrites += m.shared.lostWrites.Load()
	s.Store = m.shared.store.Stats()
	return s, true
}

// FlushShared waits until the shared tier's writes handed over so far are
// written or failed: first the shared stream's work (the reads of evicted
// and committed pages, which queue their blobs), then the store's queue. It
// returns ctx's error once ctx is done, whatever is still running (which
// goes on), and nil at once without a shared tier. It does not wait for
// writes still ordered behind a migration on the shared stream: those are
// queued when their host function runs.
func (m *Manager) FlushShared(ctx context.Context) error {
	if m.shared == nil {
		return nil
	}
	synced := make(chan error, 1)
	go func() { synced <- m.shared.stream.Synchronize() }()
	select {
	case err := <-synced:
		if err != nil {
			return fmt.Errorf("shared tier stream: %w", err)
		}
	case <-ctx.Done():
		return ctx.Err()
	}
	return m.shared.store.Flush(ctx)
}

func (m *Manager) sharedKey(lc layout.LayerGroupID, k blockhash.Key) sharedtier.Key {
	return sharedtier.Key{Fingerprint: sharedtier.Fingerprint(m.blobFP[lc]), Lifecycle: uint32(lc), Block: uint64(k)}
}

// verifyShared accepts a blob read back only when it is an intact blob of
// key: its layout, lifecycle, block key, a full block, the lifecycle's
// payload size and checksum. It runs on the store's callers, without the
// lock: it reads only what construction set.
func (m *Manager) verifyShared(key sharedtier.Key, b []byte) error {
	lc := int(key.Lifecycle)
	if lc >= len(m.blobFP) {
		return fmt.Errorf("%w: lifecycle %d of %d", blob.ErrCorrupt, lc, len(m.blobFP))
	}
	h, err := blob.Decode(b, m.cfg.TokensPerBlock)
	switch {
	case err != nil:
		return err
	case h.Fingerprint != m.blobFP[lc] || h.LifeCycle != key.Lifecycle || h.Key != key.Block:
		return fmt.Errorf("%w: blob of layout %v lifecycle %d block %x, want %v lifecycle %d block %x",
			blob.ErrCorrupt, h.Fingerprint, h.LifeCycle, h.Key, m.blobFP[lc], key.Lifecycle, key.Block)
	case len(h.Tokens) != m.cfg.TokensPerBlock:
		return fmt.Errorf("%w: %d tokens, not a full block", blob.ErrCorrupt, len(h.Tokens))
	case h.PayloadLen != m.lcCodec[lc].coldBytes:
		return fmt.Errorf("%w: payload of %d bytes, the layout's is %d", blob.ErrCorrupt, h.PayloadLen, m.lcCodec[lc].coldBytes)
	}
	return h.Verify(b[h.Size():])
}

// sharedPlan is what a lookup asks the shared tier for: the pages missing
// locally of the input's full blocks from start on, in block order.
type sharedPlan struct {
	scope blockhash.Scope
	input []config.Token // 0 at every digest position
	// digests are the input's multimodal digest tokens (sorted), which enter
	// the block keys (blockhash.Hasher.NextDigests), so managers agree on the
	// key of a block with digests as on a text block's.
	digests []blockhash.DigestAt
	keys    []blockhash.Key // chain key of every full block looked at
	start   int             // first block a lifecycle lacks a page of
	want    []sharedtier.Key
	wantLC  []layout.LayerGroupID
	// wantFrom[b-start] is the index in want of block b's first page, and
	// wantFrom[len] = len(want).
	wantFrom []int
}

// blocks is the number of blocks the plan looks up.
func (p *sharedPlan) blocks() int { return len(p.wantFrom) - 1 }

// coveredBlocks is how many blocks from start the first n keys cover.
func (p *sharedPlan) coveredBlocks(n int) int {
	k := 0
	for k < p.blocks() && p.wantFrom[k+1] <= n {
		k++
	}
	return k
}

// blockDigests are the digest tokens of plan block b (counted from the
// input's first), positions relative to the block.
func (p *sharedPlan) blockDigests(b, tpb int) []blockhash.DigestAt {
	return blockhash.DigestsIn(p.digests, b*tpb, (b+1)*tpb)
}

// planShared walks the tree along input's full blocks (input with 0 at the
// positions of its digest tokens, see textOrDigests) and lists the pages to
// ask the shared tier for; false when every block is local (or none is
// full). It takes the lock.
func (m *Manager) planShared(scope blockhash.Scope, input []config.Token, digests []blockhash.DigestAt) (*sharedPlan, bool) {
	tpb := m.cfg.TokensPerBlock
	nb := len(input) / tpb
	if nb == 0 {
		return nil, false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, false
	}
	p := &sharedPlan{scope: scope, input: input, digests: digests, start: -1}
	cur := m.roots[scope.Root()]
	key := scope.Root()
	numLC := len(m.lt.LifeCycles)
	for b := range nb {
		blk, dg := input[b*tpb:(b+1)*tpb], p.blockDigests(b, tpb)
		key = m.hasher.NextDigests(key, blk, dg)
		var c *node
		if cur != nil {
			if c = m.child(cur, key); c != nil && !m.holds(c, blk, dg) {
				break // a key collision: nothing past it is this input's
			}
		}
		cur = c
		if p.start < 0 && c != nil && !slices.Contains(m.pagesOf(c), nil) {
			p.keys = append(p.keys, key)
			continue
		}
		if p.start < 0 {
			p.start = b
		}
		p.keys = append(p.keys, key)
		p.wantFrom = append(p.wantFrom, len(p.want))
		for lc := range numLC {
			if c == nil || m.pagesOf(c)[lc] == nil {
				p.want = append(p.want, m.sharedKey(layout.LayerGroupID(lc), key))
				p.wantLC = append(p.wantLC, layout.LayerGroupID(lc))
			}
		}
	}
	if p.start < 0 {
		return nil, false
	}
	p.wantFrom = append(p.wantFrom, len(p.want))
	return p, true
}

// sharedFetch is what a lookup fetched: the plan's blocks [from, to)
// (counted from its start); blobs[i] is want[wantFrom[from]+i]'s.
type sharedFetch struct {
	plan     *sharedPlan
	from, to int
	blobs    [][]byte
}

// sharedChunkBytes is about how many blob bytes one fetch brings before they
// are landed: the landing of one chunk (on the shared stream) overlaps the
// fetch of the next. A variable for the tests.
var sharedChunkBytes int64 = 8 << 20

// matchShared asks the shared tier how many blocks of the plan it holds,
// without the lock, and counts the lookup.
func (m *Manager) matchShared(p *sharedPlan) int {
	n, _ := m.shared.store.MatchPrefix(context.Background(), p.want) // errors are counted by the store
	k := p.coveredBlocks(n)
	m.mu.Lock()
	m.shared.stats.LookupBlocks += int64(p.blocks())
	m.shared.stats.FoundBlocks += int64(k)
	m.mu.Unlock()
	return k
}

// fetchShared looks input's blocks past the local tree up in the shared
// tier (input and digests as for planShared) and fetches the blobs found,
// without the lock, in chunks of about sharedChunkBytes, the next chunk's
// fetch in flight while one is checked and onboarded: each chunk but the
// last is onboarded as soon as it arrives (taking the lock for that only),
// so its landing overlaps the next fetch; the last is returned, for
// CreateKVCache to onboard under the lock it creates the cache with (nil
// when there is none). A blob missing (evicted since the match), failing its
// check or of other tokens (a key collision) ends the blocks there (the
// chunk already in flight is dropped).
func (m *Manager) fetchShared(scope blockhash.Scope, input []config.Token, digests []blockhash.DigestAt) *sharedFetch {
	p, ok := m.planShared(scope, input, digests)
	if !ok {
		return nil
	}
	k := m.matchShared(p)
	if k == 0 {
		return nil
	}
	var perBlock int64
	for _, lc := range m.lcCodec {
		perBlock += lc.coldBytes
	}
	chunk := int(max(sharedChunkBytes/perBlock, 1))
	tpb := m.cfg.TokensPerBlock
	get := func(from int) <-chan [][]byte {
		got := make(chan [][]byte, 1)
		go func() {
			blobs, _ := m.shared.store.Get(context.Background(), p.want[p.wantFrom[from]:p.wantFrom[min(from+chunk, k)]])
			got <- blobs
		}()
		return got
	}
	next := get(0)
	for from := 0; from < k; {
		to := min(from+chunk, k)
		lo := p.wantFrom[from]
		blobs := <-next
		if to < k {
			next = get(to)
		}
		for i, b := range blobs {
			j := p.blockOf(lo + i)
			if b != nil {
				h, err := blob.Decode(b, tpb) // verified by the store
				if err == nil && sameTokens(h.Tokens, p.input[(p.start+j)*tpb:][:tpb]) {
					continue
				}
			}
			to = j
			blobs = blobs[:p.wantFrom[j]-lo]
			break
		}
		if to == from {
			return nil
		}
		f := &sharedFetch{plan: p, from: from, to: to, blobs: blobs}
		if to == k || to < min(from+chunk, k) {
			return f
		}
		m.mu.Lock()
		if !m.closed {
			m.onboardShared(f)
			m.safePoint()
		}
		m.mu.Unlock()
		from = to
	}
	return nil
}

// blockOf is the plan block (counted from start) of want[i].
func (p *sharedPlan) blockOf(i int) int {
	b, _ := slices.BinarySearch(p.wantFrom, i+1)
	return b - 1
}

// arrival is one fetched page taking a slot of the first cold level.
type arrival struct {
	p       *page
	n       *node
	payload []byte
	hdr     blob.Header
	fresh   bool // n was created for it
}

// onboardShared puts the fetched blobs into the tree as blocks with pages on
// the first cold level, under the lock. The tree is walked again: a block
// before the fetched ones that left, or a key collision, ends it; a page
// that arrived locally meanwhile is kept and the fetched one discarded.
func (m *Manager) onboardShared(f *sharedFetch) {
	sh, p, tpb := m.shared, f.plan, m.cfg.TokensPerBlock
	lo := p.wantFrom[f.from]
	// Room first, so making it cannot evict the blocks being linked.
	to := f.to
	for ; to > f.from; to = f.from + (to-f.from)/2 {
		var n need
		for _, lc := range p.wantLC[lo:p.wantFrom[to]] {
			n = n.add(sh.dst.groupOf(lc), 1)
		}
		if m.reserveAt(sh.dst.index, n) == nil {
			break
		}
	}
	used := 0
	defer func() { sh.stats.DiscardedPages += int64(len(f.blobs) - used) }()
	if to == f.from {
		return
	}
	var arrivals []arrival
	cur := m.root(p.scope)
	for b := 0; b < p.start+to; b++ {
		blk, dg := p.input[b*tpb:(b+1)*tpb], p.blockDigests(b, tpb)
		c := m.child(cur, p.keys[b])
		if c != nil && !m.holds(c, blk, dg) {
			break
		}
		if b < p.start+f.from {
			if c == nil {
				break
			}
			cur = c
			continue
		}
		fresh := c == nil
		if fresh {
			c = m.newNode(cur, p.keys[b], blk, dg)
			m.addChild(cur, c)
		}
		before := len(arrivals)
		j := b - p.start
		for i := p.wantFrom[j]; i < p.wantFrom[j+1]; i++ {
			lc := p.wantLC[i]
			if m.pagesOf(c)[lc] != nil {
				continue
			}
			bl := f.blobs[i-lo]
			h, _ := blob.Decode(bl, tpb) // verified by the store
			a := arrival{p: m.newPage(sh.dst.groupOf(lc), lc), n: c, payload: bl[h.Size():], hdr: h, fresh: fresh}
			arrivals = append(arrivals, a)
		}
		if fresh && len(arrivals) == before {
			m.prune = append(m.prune, c)
		}
		cur = c
	}
	used = m.landArrivals(arrivals)
}

// landArrivals lands arrivals, in block order, one transaction per slot
// group, and links the pages of the transactions submitted into the tree
// with their events; it returns how many pages it linked. A page whose disk
// write fails later is lost when its transaction settles (see landShared).
func (m *Manager) landArrivals(arrivals []arrival) int {
	sh, used := m.shared, 0
	byGroup := map[*slotGroup][]arrival{}
	var order []*slotGroup
	for _, a := range arrivals {
		g := a.p.group
		if _, ok := byGroup[g]; !ok {
			order = append(order, g)
		}
		byGroup[g] = append(byGroup[g], a)
	}
	blocks := map[*node]bool{}
	for _, g := range order {
		as := byGroup[g]
		if err := m.landShared(g, as); err != nil {
			for _, a := range as {
				m.freePage(a.p)
				if a.fresh && !m.hasPages(a.n) {
					m.prune = append(m.prune, a.n)
				}
			}
			continue
		}
		for _, a := range as {
			a.p.node = a.n
			m.pagesOf(a.n)[a.p.lc] = a.p
			a.p.refresh()
			used++
			blocks[a.n] = a.fresh
			sh.stats.OnboardedPages++
			sh.stats.OnboardedBytes += int64(len(a.payload))
		}
	}
	sh.stats.OnboardedBlocks += int64(len(blocks))
	// Events in block order: a new block is stored, then each page reports
	// the level it came from.
	for i, a := range arrivals {
		if a.p.node == nil {
			continue
		}
		if a.fresh && (i == 0 || arrivals[i-1].n != a.n) {
			m.emitStored(a.n, 0)
		}
		m.emitUpdated(a.n, a.p.lc, sh.level, layout.CacheLevel(sh.dst.index))
	}
	return used
}

// landShared is one transaction of arrivals into group g: the shared stream
// waits the slots' fences, copies the payloads into the host slots in a host
// function (or has the disk workers write them, with new headers, to the
// disk slots, waiting for them without holding a host function: waitHost),
// records the finish event and attaches it to the slots and pages. A blob
// the disk cannot take fails only its page (see diskBatch): the page is lost
// (dropped from the tree, counted in LostPages) when the transaction
// settles, and a cache holding it meanwhile learns it before reading it
// (checkBlobs), as for a migration to disk.
func (m *Manager) landShared(g *slotGroup, as []arrival) error {
	st := m.shared.stream
	waits := waitSet{}
	for _, a := range as {
		waits.addFence(g.fences[a.p.slot])
	}
	if err := waits.apply(st); err != nil {
		return err
	}
	var err error
	var disk *diskBatch
	if g.onDisk() {
		hdrs := make([]blob.Header, len(as))
		for i, a := range as {
			m.diskSeq++
			a.p.diskTag = m.diskSeq
			hdrs[i] = a.hdr
			hdrs[i].Tag = m.diskSeq
		}
		ops := make([]blobOp, len(as))
		for i, a := range as {
			ops[i] = blobOp{i: i, slot: a.p.slot, buf: a.payload, hdr: &hdrs[i]}
		}
		disk = newDiskBatch(len(as))
		err = m.diskIO(st, disk, g.dio.jobs(ops, true, disk))
	} else {
		dsts := make([][]byte, len(as))
		for i, a := range as {
			dsts[i] = g.hostSlot(a.p.slot)
		}
		err = st.HostFunc(func() error {
			for i, a := range as {
				copy(dsts[i], a.payload)
			}
			return nil
		})
	}
	if err != nil {
		m.drainAfterFailure(st)
		return err
	}
	ev, err := m.events.record(st)
	if err != nil {
		m.drainAfterFailure(st)
		return err
	}
	fl := &inflight{ev: ev, disk: disk, landing: true}
	for i, a := range as {
		g.fences[a.p.slot].add(&m.events, ev)
		a.p.inflight, a.p.inflightIdx = fl, int32(i)
		fl.pages = append(fl.pages, a.p)
	}
	m.pending = append(m.pending, fl)
	return nil
}

// probeShared is ProbeReuseDigests with a shared tier: the local match, or
// the blocks the shared tier holds past it now (less ReuseMatchBackoff), if
// longer. keys are the chain keys of input's first full blocks, as the
// lookup computed them (nil when it asked the tier nothing: every block is
// local, or none is full).
func (m *Manager) probeShared(scope blockhash.Scope, input []config.Token, digests []blockhash.DigestAt) (tokens int, keys []blockhash.Key) {
	local := m.probeLocal(scope, input, digests)
	p, ok := m.planShared(scope, input, digests)
	if !ok {
		return local, nil
	}
	k := m.matchShared(p)
	if k == 0 {
		return local, p.keys
	}
	tpb := m.cfg.TokensPerBlock
	t := max((p.start+k)*tpb-m.cfg.ReuseMatchBackoff, 0)
	if !m.cfg.EnablePartialReuse {
		t = t / tpb * tpb
	}
	return max(local, t), p.keys
}

// writeBack queues the blob of p, a page eviction is about to drop from the
// last local level, for the shared tier (WriteBackOnEviction): the shared
// stream waits the slot's fence, then reads the payload and queues it (a
// host slot is copied in a host function; a disk slot's blob is read and
// checked by the disk workers, the stream waiting for them without holding
// a host function), and the finish event joins the slot's fence so its next
// owner waits for the read.
func (m *Manager) writeBack(p *page) {
	sh := m.shared
	if sh == nil || sh.policy != config.WriteBackOnEviction || !p.group.level.last ||
		p.lost || p.node == nil || p.node.isPartial(m.cfg.TokensPerBlock) {
		return
	}
	g, slot := p.group, p.slot
	key, hdr := m.sharedKey(p.lc, p.node.key), m.blobHeader(p, 0)
	size := m.lcCodec[p.lc].coldBytes
	store, lost := sh.store, &sh.lostWrites
	queue := func(read func(dst []byte) error) {
		b := make([]byte, hdr.Size()+int(size))
		payload := b[hdr.Size():]
		if err := read(payload); err != nil {
			lost.Add(1) // the page is dropped anyway: only its write is lost
			return
		}
		hdr.Seal(payload)
		hdr.Put(b)
		store.Put(key, b)
	}
	groups, slots := []*slotGroup{g}, []int32{slot}
	var err error
	if g.onDisk() {
		dio, want := g.dio, m.wantOf(p)
		err = m.sharedDiskJob(groups, slots, func() {
			queue(func(dst []byte) error { return dio.do([]blobOp{{slot: slot, buf: dst, want: want}}, false) })
		})
	} else {
		src := g.hostSlot(slot)
		err = m.sharedHostFunc(groups, slots, func() error {
			queue(func(dst []byte) error { copy(dst, src); return nil })
			return nil
		})
	}
	if err != nil {
		sh.stats.LostWrites++
		return
	}
	sh.stats.WriteBacks++
}

// sharedHostFunc runs fn on the shared stream after the fences of the given
// slots, and adds its finish event to them.
func (m *Manager) sharedHostFunc(groups []*slotGroup, slots []int32, fn func() error) error {
	return m.sharedOnStream(groups, slots, func(st device.Stream) error { return st.HostFunc(fn) })
}

// sharedDiskJob runs job, blob I/O, on the disk workers in the shared
// stream's order after the fences of the given slots: a host function hands
// it over (it never blocks), the stream waits for it without holding a host
// function (waitHost), and the finish event joins the slots' fences. If the
// wait cannot be enqueued, sharedDiskJob waits for the job itself, so
// nothing reuses the slots early.
func (m *Manager) sharedDiskJob(groups []*slotGroup, slots []int32, job func()) error {
	return m.sharedOnStream(groups, slots, func(st device.Stream) error {
		done := make(chan struct{})
		q := m.diskQ
		if err := st.HostFunc(func() error {
			q.push([]func(){func() { defer close(done); job() }})
			return nil
		}); err != nil {
			return err
		}
		if err := waitHost(st, done); err != nil {
			<-done
			return err
		}
		return nil
	})
}

// sharedOnStream enqueues work on the shared stream after the fences of the
// given slots, and adds the finish event to them.
func (m *Manager) sharedOnStream(groups []*slotGroup, slots []int32, enqueue func(device.Stream) error) error {
	st := m.shared.stream
	waits := waitSet{}
	for i, g := range groups {
		waits.addFence(g.fences[slots[i]])
	}
	if err := waits.apply(st); err != nil {
		return err
	}
	if err := enqueue(st); err != nil {
		m.drainAfterFailure(st)
		return err
	}
	ev, err := m.events.record(st)
	if err != nil {
		m.drainAfterFailure(st)
		return err
	}
	for i, g := range groups {
		g.fences[slots[i]].add(&m.events, ev)
	}
	m.events.release(ev)
	return nil
}

// writeThrough queues the blobs of pages just published by a commit
// (WriteThroughOnCommit): GPU pages are encoded into pinned staging on the
// shared stream, one codec call per batching representative, after their
// fences (which hold the commit's event); a host function then queues each
// blob. Pages already on a cold level are queued from their slots as
// write-back does.
func (m *Manager) writeThrough(pages []*page) {
	sh := m.shared
	if sh == nil || sh.policy != config.WriteThroughOnCommit {
		return
	}
	byRep := map[*slotGroup]map[layout.LayerGroupID][]*page{}
	for _, p := range pages {
		if p.lost || p.node == nil || p.node.isPartial(m.cfg.TokensPerBlock) || p.level() != 0 {
			continue
		}
		if byRep[p.group] == nil {
			byRep[p.group] = map[layout.LayerGroupID][]*page{}
		}
		rep := m.lcCodec[p.lc].rep
		byRep[p.group][rep] = append(byRep[p.group][rep], p)
	}
	for g, reps := range byRep {
		for rep, ps := range reps {
			for len(ps) > 0 {
				u := unit{src: g, rep: rep}
				n := m.stagedUnitSize(rep, len(ps))
				for _, p := range ps[:n] {
					u.moves = append(u.moves, move{p: p, srcSlot: p.slot})
				}
				ps = ps[n:]
				if err := m.encodeShared(u); err != nil {
					sh.stats.LostWrites += int64(len(u.moves))
					continue
				}
				sh.stats.WriteThroughs += int64(len(u.moves))
			}
		}
	}
}

// stagedUnitSize caps a unit encoded into the page ring, as unitSize does
// for disk transactions.
func (m *Manager) stagedUnitSize(rep layout.LayerGroupID, n int) int {
	if m.lcCodec[rep].loc == codec.Device {
		n = min(n, staging.MaxIndexBatchPairs)
	}
	return min(n, int(max(m.pageRing.Capacity()/m.lcCodec[rep].coldBytes/staging.PageRingCopies, 1)))
}

// encodeShared encodes one unit of GPU pages into pinned staging on the
// shared stream and queues each blob from a host function.
func (m *Manager) encodeShared(u unit) error {
	st := m.shared.stream
	waits := waitSet{}
	for _, mv := range u.moves {
		waits.addFence(u.src.fences[mv.srcSlot])
	}
	if err := waits.apply(st); err != nil {
		return err
	}
	buf, size, err := m.stage(u, st)
	if err != nil {
		return err
	}
	release, err := m.codecCall(u, st, true, buf.Ptr(), func(i int, mv move) codec.PageIndexPair {
		return codec.PageIndexPair{Dst: int32(i), Src: mv.srcSlot}
	})
	if err == nil {
		host, store := buf.Host(), m.shared.store
		keys := make([]sharedtier.Key, len(u.moves))
		hdrs := make([]blob.Header, len(u.moves))
		for i, mv := range u.moves {
			keys[i], hdrs[i] = m.sharedKey(mv.p.lc, mv.p.node.key), m.blobHeader(mv.p, 0)
		}
		err = st.HostFunc(func() error {
			for i := range keys {
				b := make([]byte, hdrs[i].Size()+int(size))
				payload := b[hdrs[i].Size():]
				copy(payload, host[int64(i)*size:int64(i+1)*size])
				hdrs[i].Seal(payload)
				hdrs[i].Put(b)
				store.Put(keys[i], b)
			}
			return nil
		})
	}
	if err != nil {
		m.drainAfterFailure(st)
		joinRelease(release, buf.Release)()
		return err
	}
	ev, err := m.events.record(st)
	joinRelease(release, buf.Release)()
	if err != nil {
		m.drainAfterFailure(st)
		return err
	}
	for _, mv := range u.moves {
		u.src.fences[mv.srcSlot].add(&m.events, ev)
	}
	m.events.release(ev)
	return nil
}
