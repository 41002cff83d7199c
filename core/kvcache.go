package core

import (
	"cmp"
	"fmt"
	"math"
	"slices"

	"github.com/kvcm/kvcm/core/blockhash"
	"github.com/kvcm/kvcm/core/config"
	"github.com/kvcm/kvcm/core/device"
	"github.com/kvcm/kvcm/core/layout"
)

// Status is a cache's place in its lifecycle: SUSPENDED → ACTIVE → CLOSED,
// with ACTIVE ⇄ SUSPENDED as often as the engine needs.
type Status int

const (
	// Suspended: the cache holds its pages but the engine does not use
	// them; with colder levels they may move there.
	Suspended Status = iota
	// Active: the pages are on the GPU, pinned, and in use on the cache's
	// stream.
	Active
	// Closed: every page is released. Terminal.
	Closed
)

func (s Status) String() string {
	switch s {
	case Suspended:
		return "SUSPENDED"
	case Active:
		return "ACTIVE"
	case Closed:
		return "CLOSED"
	}
	return fmt.Sprintf("Status(%d)", int(s))
}

// MaxCapacity is the largest capacity, in tokens, a cache may have.
const MaxCapacity = math.MaxInt32

// BadPageIndex marks a block without a page in a layer group (released out of
// a sliding window, or beyond the capacity).
const BadPageIndex int32 = -1

// PriorityFunc returns the eviction priority of the page of layer group
// (lifecycle) lc of the cache's block at blockIndex, in [MinPriority,
// MaxPriority] (values outside are clamped), as KVCacheManagerV2's
// custom_priority_callback(block_ordinal, life_cycle). As there, it is asked
// when Resize allocates the page (once per block and layer group, for every
// beam's page), before Resize changes anything: the page, private until it is
// committed, is ranked for eviction by it, and the block keeps it when it is
// committed. A block whose page was allocated otherwise (a partial-reuse
// copy), or that has none in a layer group, is asked at its commit. It runs
// with the manager's lock held and must not call into the manager; a panic
// in it fails the Resize or Commit, changing nothing.
type PriorityFunc func(blockIndex int, lc layout.LayerGroupID) int

// CacheOptions configures CreateKVCache.
type CacheOptions struct {
	// Scope separates reuse: blocks are shared only within one scope.
	Scope blockhash.Scope
	// InputTokens is the prompt; the longest cached prefix of it is reused,
	// all of it when all of it is cached (less Config.ReuseMatchBackoff).
	// An engine that must compute the last prompt token leaves it out.
	InputTokens []config.Token
	// InputDigests are the multimodal digest tokens of InputTokens, sorted
	// by position (blockhash.DigestAt); InputTokens' values there are
	// ignored. A block's digests enter its key (see package blockhash), so
	// only a prompt with the same items at the same positions reuses it.
	InputDigests []blockhash.DigestAt
	// TextOnly refuses digest tokens for this cache, in InputDigests and in
	// commits (KVCacheManagerV2's text_only); Config.TextOnly does so for
	// every cache.
	TextOnly bool
	// Priority, if set, gives the cache's pages their eviction priority, as
	// they are allocated (see PriorityFunc).
	Priority PriorityFunc
	// ExpectedPromptLength, if set, is the prefill/generation boundary of
	// the statistics (KVCacheManagerV2's expected_prompt_length): once the
	// history has reached it, capacity growth counts as generation-phase
	// allocation (LayerGroupStats.GenAllocBlocks). Unset, it is
	// len(InputTokens), and without input tokens no growth counts as
	// generation. It changes no allocation or reuse.
	ExpectedPromptLength *int
	// FreshBlocks, if positive, is a reuse plan that leaves a run of the
	// cached prefix's blocks to the engine: the cache reuses the matched
	// prefix but its FreshBlocks blocks from block FreshFromBlock on, and
	// gets fresh GPU pages for those, which the engine computes while the
	// reused tail after them comes up from colder levels. History and
	// commit rules are in freshrun.go; FreshRange says what the cache got.
	FreshBlocks    int
	FreshFromBlock int
}

// cacheBlock is one block of a cache: beam 0's page per lifecycle (nil where
// a sliding window released it) and, once registered or reused, its tree
// node. beams holds the pages of beams 1.. of a block whose beams do not all
// see beam 0's pages (see beam.go); it is nil otherwise.
type cacheBlock struct {
	pages []*page
	node  *node
	beams [][]*page
}

// KVCache is one request's KV cache. The invariant
// committed ≤ history ≤ capacity holds at every return. Once a page the cache
// holds is known lost (see ErrDataLost), every call on it but Close fails
// with ErrDataLost.
type KVCache struct {
	m      *Manager
	id     uint64
	status Status
	scope  blockhash.Scope
	stream device.Stream
	// next is the stream Resume(nil) uses: the last one set or resumed on.
	next     device.Stream
	priority PriorityFunc
	// committed counts the committed tokens; tail holds those of the last,
	// incomplete block. Full blocks' tokens live in the tree only.
	committed int
	tail      []config.Token
	// tailDigests are the digest tokens of tail, positions relative to it;
	// orphanDigests those of orphan, relative to it.
	tailDigests   []blockhash.DigestAt
	orphanDigests []blockhash.DigestAt
	textOnly      bool
	history       int
	capacity      int
	blocks        []cacheBlock
	// chain is the tree node of the last committed full block (the scope
	// root before any); the cache pins it so later commits can link to it.
	chain          *node
	stopped        bool
	pendingPartial bool
	// stopPrio is the priority per lifecycle of block stopPrioAt, asked by
	// a commit with isEnd before it changed anything, for the partial block
	// its stop publishes (see publishesAtStop).
	stopPrio   []int
	stopPrioAt int
	// detached: a key collision stopped publishing (see publish); orphan
	// holds the tokens of the full blocks committed since.
	detached bool
	orphan   []config.Token
	reused   int
	// promptLen is the prefill/generation boundary of the statistics
	// (CacheOptions.ExpectedPromptLength), -1 for none: growth once the
	// history has reached it counts as generation-phase allocation.
	promptLen int
	// pendingSsm is the cache's SSM snapshot lookup (at creation, with SSM
	// layers and input tokens) until CommitPendingStats adds it to the
	// manager's SSM snapshot statistics, as KVCacheManagerV2 holds it
	// pending; DiscardPendingStats and Close drop it.
	pendingSsm SsmSnapshotStats
	// pending holds, per layer group, the cache's reuse and allocation
	// counts until CommitPendingStats adds them to the manager's iteration
	// statistics (DiscardPendingStats and Close drop them); nil while none.
	pending []LayerGroupStats
	// allocRuns are the runs of blocks whose allocations are pending, in
	// the order they were allocated (see onShrink).
	allocRuns []allocRun
	// lost is the ErrDataLost of a cache holding a lost page (sticky);
	// seenLosses is the manager's loss count when the cache last looked.
	lost       error
	seenLosses uint64
	// rows is the blocks' page rows, numLC a block for cap(blocks) blocks
	// (see blockRows).
	rows []*page
	// low is, per lifecycle, the block below which every non-sink block has
	// released its page: Resize visits only blocks from there to the first
	// one still in the window.
	low []int
	// stats is this cache's share of the manager's block counters.
	stats BlockStats
	// width is the beam width (0 reads as 1; see beam.go).
	width int
	// scratchOn: the cache uses SWA scratch slots (see scratch.go); scratch
	// holds them per layer group, ACTIVE caches only.
	scratchOn bool
	scratch   [][]*page
	// avgCapacity and avgHistory are the cache's mean capacity and history
	// length, sampled for pool rebalancing (see rebalance.go).
	avgCapacity, avgHistory mean
	// ssm is the cache's SSM state page (one per request, in the SSM layer
	// group): nil before the first Resume of a cache that reused no
	// snapshot. ssmShared: ssm is still the reused snapshot, a tree page the
	// first Resume copies into a private one.
	ssm       *page
	ssmShared bool
	// stopState is a copy of the SSM state at the committed length, taken
	// when commits stopped on a partial block while the cache could compute
	// on (see stopCommits); the partial block published at close gets it.
	// Held by the cache, nil otherwise.
	stopState *page
	// stopOwn: commits stopped on a partial block of an ACTIVE cache whose
	// capacity is the committed length, so it cannot compute on without a
	// Resize; the block published at close takes the cache's own state, as
	// KVCacheManagerV2 moves the state at a final commit, and a Resize past
	// the committed length first takes the copy (stopState).
	stopOwn bool
	// diag is the reuse match's diagnostics at creation.
	diag ReuseDiagnostics
	// freshFrom and freshTo are the fresh run's tokens (see freshrun.go);
	// owed: its commit is still to come; freshInput its input tokens
	// while owed.
	freshFrom, freshTo int
	owed               bool
	freshInput         []config.Token
	// asked holds the PriorityFunc's answers DecodeSteps asked before its
	// steps (see askPriority); empty otherwise.
	asked []askedPriority
	// runEvent is the event DecodeSteps recorded on the cache's stream
	// before its steps, which their commits and window releases take
	// instead of recording their own (see streamEvent); nil otherwise.
	runEvent *sharedEvent
	// tailPending: the last Resume left the tail's fences out of the
	// stream's waits, and WaitFreshTail has not enqueued them on the
	// cache's stream yet (see freshrun.go).
	tailPending bool
}

// ReuseDiagnostics says how a cache's reuse was cut at creation
// (KVCacheManagerV2's _get_num_reusable_tokens_before_pruning and
// _before_hybrid_pruning): ContentTokens are the tokens of the prompt's full
// blocks the tree holds by content, AttentionTokens those the attention
// layer groups could reuse (their pages present); with partial reuse both
// add the matching head of one more block (for AttentionTokens, of a block
// whose attention pages are on the GPU level). The reused tokens are at most
// AttentionTokens: with SSM layers they end at an SSM snapshot (see
// CreateKVCache). All three are after ReuseMatchBackoff.
type ReuseDiagnostics struct {
	ContentTokens, AttentionTokens int
}

// reserveBlocks makes room for n blocks (see blockRows).
func (c *KVCache) reserveBlocks(n int) {
	r := blockRows{c.blocks, c.rows}
	r.reserve(n, len(c.m.lt.LifeCycles))
	c.blocks, c.rows = r.blocks, r.rows
}

// growBlocks appends n blocks without pages or nodes (see blockRows.grow).
func (c *KVCache) growBlocks(n int) {
	r := blockRows{c.blocks, c.rows}
	r.grow(n, len(c.m.lt.LifeCycles))
	c.blocks, c.rows = r.blocks, r.rows
}

// addBlock appends a block without pages, after node (nil: none yet).
func (c *KVCache) addBlock(n *node) *cacheBlock {
	r := blockRows{c.blocks, c.rows}
	cb := r.add(n, len(c.m.lt.LifeCycles))
	c.blocks, c.rows = r.blocks, r.rows
	return cb
}

// CreateKVCache creates a SUSPENDED cache holding the longest reusable cached
// prefix of opts.InputTokens: full blocks are shared; with partial reuse, the
// matching head of one more block is copied into a private page. With a
// shared tier the match continues into it: the blocks it holds past the
// local tree are fetched without the manager's lock and onboarded to the
// first cold level (see sharedlevel.go); Resume brings them to the GPU.
func (m *Manager) CreateKVCache(opts CacheOptions) (*KVCache, error) {
	input, err := m.textOrDigests("input_digest_positions", opts.InputTokens, opts.InputDigests, opts.TextOnly)
	if err != nil {
		return nil, err
	}
	var fetched *sharedFetch
	if m.shared != nil {
		fetched = m.fetchShared(opts.Scope, input, opts.InputDigests)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.checkOpen(); err != nil {
		return nil, err
	}
	promptLen := len(opts.InputTokens)
	switch {
	case opts.ExpectedPromptLength != nil && *opts.ExpectedPromptLength < 0:
		return nil, argErr("expected_prompt_length", "%d is negative", *opts.ExpectedPromptLength)
	case opts.ExpectedPromptLength != nil:
		promptLen = *opts.ExpectedPromptLength
	case promptLen == 0:
		promptLen = -1
	}
	if err := m.checkFreshRun(&opts); err != nil {
		return nil, err
	}
	m.settle()
	if fetched != nil {
		m.onboardShared(fetched)
	}
	tpb := m.cfg.TokensPerBlock
	mt := m.findMatch(opts.Scope, input, opts.InputDigests)
	if opts.FreshBlocks > 0 {
		mt.partial, mt.partLen = nil, 0
	}
	// Its pages come from the tree, which holds no lost page.
	c := &KVCache{m: m, scope: opts.Scope, priority: opts.Priority, seenLosses: m.losses, textOnly: opts.TextOnly || m.cfg.TextOnly}
	m.nextID++
	c.id = m.nextID
	// Room for the prompt and a few decoded blocks, so prefill does not grow
	// the cache's slices again.
	promptBlocks := m.lt.BlocksFor(len(opts.InputTokens)) + 4
	spare := m.spareRows(promptBlocks)
	c.blocks, c.rows = spare.blocks, spare.rows
	c.reserveBlocks(promptBlocks)

	// Hold the path first, so making room for a partial copy cannot evict it.
	full := len(mt.path) * tpb
	c.growBlocks(len(mt.path))
	for b, n := range mt.path {
		cb := &c.blocks[b]
		cb.node = n
		for lc, p := range m.pagesOf(n) {
			// A page the window needs at the path's end may be missing
			// when the partial block moves the window past it.
			if p != nil && m.lt.Needs(layout.LayerGroupID(lc), b, full) {
				cb.pages[lc] = p
				m.ref(p, false)
			}
		}
	}
	if snap := mt.snapshot(m); snap != nil {
		c.ssm, c.ssmShared = snap, true
		m.ref(snap, false)
	}
	fresh := c.takeFreshRun(&mt, opts.FreshFromBlock, opts.FreshBlocks, input)
	full = len(mt.path) * tpb
	if mt.partial != nil {
		if pages := m.copyPartial(mt.partial); pages != nil {
			copy(c.addBlock(nil).pages, pages)
		} else {
			mt.partLen = 0
			c.cutToFullBlocks(&mt)
			full = len(mt.path) * tpb
		}
	}
	reused := mt.tokens(tpb)
	// The partial tokens may slide a window past some of the path's pages.
	for b := range mt.path {
		for lc, p := range c.blocks[b].pages {
			if p != nil && !m.lt.Needs(layout.LayerGroupID(lc), b, reused) {
				c.blocks[b].pages[lc] = nil
				m.unref(p, false)
			}
		}
	}
	c.tail = append(make([]config.Token, 0, tpb), input[full:reused]...)
	c.tailDigests = blockhash.DigestsIn(opts.InputDigests, full, reused)
	c.committed = reused
	if fresh > 0 {
		c.committed = c.freshFrom
	}
	c.history, c.capacity, c.reused = reused, reused, reused
	c.chain = m.root(opts.Scope)
	switch {
	case fresh > 0 && opts.FreshFromBlock > 0:
		c.chain = mt.path[opts.FreshFromBlock-1]
	case fresh == 0 && len(mt.path) > 0:
		c.chain = mt.path[len(mt.path)-1]
	}
	c.chain.users++
	m.caches[c.id] = c
	c.promptLen = promptLen
	c.scratchOn = m.cfg.EnableSwaScratchReuse()
	c.sampleCreate()
	c.diag = ReuseDiagnostics{ContentTokens: mt.contentBlocks*tpb + mt.contentPart, AttentionTokens: mt.usableBlocks*tpb + mt.attentionPart}
	c.stats = m.stats.onCreate(len(opts.InputTokens)/tpb, len(mt.path)-fresh, mt.partLen > 0)
	m.onCreatePages(c, mt, c.freshFrom/tpb, fresh)
	if fresh > 0 {
		c.stats.add(m.stats.onAllocate(fresh))
		c.onAllocateBlocks(c.freshFrom/tpb, c.freshFrom/tpb+fresh, nil, 1, false)
	}
	if m.lt.SSM >= 0 {
		c.pendingSsm.onLookup(len(opts.InputTokens), reused, tpb)
	}
	m.safePoint()
	return c, nil
}

// cutToFullBlocks makes a new cache whose partial block could not be copied
// start from the full blocks of mt's path it can use without it: those whose
// pages every lifecycle needs at their end are there (the partial block may
// have moved a window past missing ones) and, with SSM layers, up to the
// last one holding a snapshot (the state it holds is the partial block's
// end).
func (c *KVCache) cutToFullBlocks(mt *match) {
	m := c.m
	mt.partial = nil
	mt.path = mt.path[:m.usablePrefix(mt.path)]
	if m.lt.SSM >= 0 {
		if c.ssm != nil {
			m.unref(c.ssm, false)
			c.ssm, c.ssmShared = nil, false
		}
		for len(mt.path) > 0 && m.pagesOf(mt.path[len(mt.path)-1])[m.lt.SSM] == nil {
			mt.path = mt.path[:len(mt.path)-1]
		}
	}
	for b := len(c.blocks) - 1; b >= len(mt.path); b-- {
		for lc, p := range c.blocks[b].pages {
			if p != nil {
				c.blocks[b].pages[lc] = nil
				m.unref(p, false)
			}
		}
	}
	c.blocks = c.blocks[:len(mt.path)]
	// The shorter path may need pages a window had no use for at the
	// longer one.
	full := len(mt.path) * m.cfg.TokensPerBlock
	for b, n := range mt.path {
		for lc, p := range m.pagesOf(n) {
			if c.blocks[b].pages[lc] == nil && p != nil && m.lt.Needs(layout.LayerGroupID(lc), b, full) {
				c.blocks[b].pages[lc] = p
				m.ref(p, false)
			}
		}
	}
	if snap := mt.snapshot(m); snap != nil {
		c.ssm, c.ssmShared = snap, true
		m.ref(snap, false)
	}
}

// copyPartial copies every attention page of src into new private GPU pages
// held by the new cache, on the manager's stream (an SSM snapshot is the
// cache's state, copied by its first Resume). It returns nil, changing
// nothing, when the GPU level has no room.
func (m *Manager) copyPartial(src *node) []*page {
	all := m.pagesOf(src)
	// A source still arriving (decoded back) must be known good first.
	m.settlePages(func(fn func(p *page)) {
		for _, p := range all {
			fn(p)
		}
	})
	if !m.hotComplete(src) {
		return nil
	}
	srcPages := all
	if m.lt.SSM >= 0 {
		srcPages = slices.Clone(all)
		srcPages[m.lt.SSM] = nil
	}
	lvl := m.levels[0]
	var few [4]groupNeed
	n := need(few[:0])
	for lc, sp := range srcPages {
		if sp == nil {
			continue
		}
		n = n.add(lvl.groupOf(layout.LayerGroupID(lc)), 1)
		sp.active++ // pinned in place while room is made and the copy is submitted
		sp.refresh()
	}
	defer func() {
		for _, sp := range srcPages {
			if sp != nil {
				sp.active--
				sp.refresh()
			}
		}
	}()
	if m.reserveAt(0, n) != nil {
		return nil
	}
	pages := make([]*page, len(srcPages))
	var descs []device.CopyDesc
	waits := waitSet{}
	for lc, sp := range srcPages {
		if sp == nil {
			continue
		}
		dp := m.newPage(lvl.groupOf(layout.LayerGroupID(lc)), layout.LayerGroupID(lc))
		dp.held = 1
		pages[lc] = dp
		waits.addFence(sp.group.fences[sp.slot])
		waits.addFence(dp.group.fences[dp.slot])
		for pool := range sp.group.desc.PoolBytes {
			descs = append(descs, device.CopyDesc{
				Dst: dp.group.slotAddr(pool, dp.slot), Src: sp.group.slotAddr(pool, sp.slot),
				Size: sp.group.desc.PoolBytes[pool],
			})
		}
	}
	ev, err := m.submit(waits, descs)
	if err != nil {
		for _, p := range pages {
			if p != nil {
				m.freePage(p)
			}
		}
		return nil
	}
	for lc, sp := range srcPages {
		if sp == nil {
			continue
		}
		sp.group.fences[sp.slot].add(&m.events, ev)
		dp := pages[lc]
		dp.group.fences[dp.slot].add(&m.events, ev)
		dp.refresh() // held by a suspended cache: evictable to a colder level
	}
	m.events.release(ev)
	return pages
}

// submit runs one copy transaction on the manager's stream: wait, copy,
// record one finish event (returned with one reference).
func (m *Manager) submit(waits waitSet, descs []device.CopyDesc) (*sharedEvent, error) {
	if err := waits.apply(m.stream); err != nil {
		return nil, err
	}
	if err := m.stream.BatchCopy(descs); err != nil {
		return nil, err
	}
	return m.events.record(m.stream)
}

// ID returns the cache's id, unique within its manager.
func (c *KVCache) ID() uint64 { return c.id }

// Status returns the cache's status.
func (c *KVCache) Status() Status {
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	return c.status
}

// NumCommittedTokens returns how many tokens are committed.
func (c *KVCache) NumCommittedTokens() int {
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	return c.committed
}

// HistoryLength returns how many tokens have their KV computed.
func (c *KVCache) HistoryLength() int {
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	return c.history
}

// Capacity returns how many tokens the cache holds pages for.
func (c *KVCache) Capacity() int {
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	return c.capacity
}

// CommittedTokens returns a copy of the committed tokens: those of the
// chain's full blocks (kept in the tree), then of the blocks a key collision
// kept out of it, then of the incomplete last block.
// A CLOSED cache has released its blocks: it returns nil.
func (c *KVCache) CommittedTokens() []config.Token {
	m := c.m
	m.mu.Lock()
	defer m.mu.Unlock()
	if c.status == Closed {
		return nil
	}
	out := make([]config.Token, c.committed)
	end := c.committed - len(c.tail) - len(c.orphan)
	copy(out[end:], c.orphan)
	copy(out[end+len(c.orphan):], c.tail)
	for n := c.chain; n.parent != 0; n = m.parentOf(n) {
		end -= int(n.ntok)
		copy(out[end:], m.tokensOf(n))
	}
	return out
}

// CommittedDigests returns the digest tokens of CommittedTokens (whose
// values there are 0), sorted by position. A CLOSED cache returns nil.
func (c *KVCache) CommittedDigests() []blockhash.DigestAt {
	m := c.m
	m.mu.Lock()
	defer m.mu.Unlock()
	if c.status == Closed {
		return nil
	}
	var out []blockhash.DigestAt
	add := func(base int, ds []blockhash.DigestAt) {
		for _, d := range ds {
			out = append(out, blockhash.DigestAt{Pos: base + d.Pos, Digest: d.Digest})
		}
	}
	end := c.committed - len(c.tail) - len(c.orphan)
	var chain []*node
	for n := c.chain; n.parent != 0; n = m.parentOf(n) {
		chain = append(chain, n)
	}
	pos := end
	for _, n := range chain {
		pos -= int(n.ntok)
	}
	for i := len(chain) - 1; i >= 0; i-- {
		add(pos, m.digestsOf(chain[i]))
		pos += int(chain[i].ntok)
	}
	add(end, c.orphanDigests)
	add(end+len(c.orphan), c.tailDigests)
	return out
}

// Scope returns the reuse scope the cache was created in.
func (c *KVCache) Scope() blockhash.Scope { return c.scope }

// ReusedTokens returns how many tokens were reused at creation.
func (c *KVCache) ReusedTokens() int { return c.reused }

// ReuseDiagnostics returns how the cache's reuse was cut at creation.
func (c *KVCache) ReuseDiagnostics() ReuseDiagnostics { return c.diag }

// Stream returns the stream of an ACTIVE cache, nil otherwise.
func (c *KVCache) Stream() device.Stream {
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	return c.stream
}

// eachPage calls fn once for every distinct page the cache references, over
// every beam.
func (c *KVCache) eachPage(fn func(p *page)) {
	for i := range c.blocks {
		c.blocks[i].eachPage(fn)
	}
	if c.ssm != nil {
		fn(c.ssm)
	}
}

// Resume makes a SUSPENDED cache ACTIVE on stream: pages on colder levels are
// brought back to the GPU (decoded), every page is pinned there, and stream
// waits until they are ready, but for a fresh run's tail while the run is
// owed: stream waits for the pages the run's compute reads and writes, and
// the tail's readiness is WaitFreshTail's (see freshrun.go). With SSM layers the first Resume gives the
// cache its SSM state page: a copy of the reused snapshot (on stream), or a
// fresh page when it reused none. It returns ErrResumeRefused while the GPU
// level is busier than MaxUtilForResume, ErrOutOfPages when the GPU cannot
// take the pages back (or give the SSM state a slot), ErrCodecFailed when the codec failed to decode some (they are
// dropped) and ErrDataLost when a failure destroyed one of them (close the
// cache then). With SWA scratch reuse it takes the scratch slots of the
// cache's current step again (Suspend released them). On error the cache
// stays SUSPENDED.
//
// The decode runs asynchronously: a failure of it that is not known yet when
// Resume returns reaches stream (which waits for the decode) and, once known
// (at the latest when stream has passed that point), makes the cache's next
// call return ErrDataLost.
func (c *KVCache) Resume(stream device.Stream) error {
	m := c.m
	m.mu.Lock()
	defer m.mu.Unlock()
	if c.status != Suspended {
		return stateErr("resume", c.status)
	}
	if stream == nil {
		if stream = c.next; stream == nil {
			return argErr("stream", "must not be nil when the cache has no stream yet (SetStream or an earlier Resume)")
		}
	}
	m.settlePages(c.eachPage)
	if err := c.checkLost(); err != nil {
		return err
	}
	if u := m.hotUtilization(c); u > m.cfg.MaxUtil() {
		return fmt.Errorf("%w (%.3f > %.3f)", ErrResumeRefused, u, m.cfg.MaxUtil())
	}
	pinned := m.pinned[:0]
	var cold []*page
	pin := func(p *page) {
		p.held--
		m.ref(p, true)
		pinned = append(pinned, p)
	}
	c.eachPage(func(p *page) {
		if p.level() == 0 {
			pin(p)
		} else {
			cold = append(cold, p)
		}
	})
	err := m.migrate(cold, 0)
	if err == nil {
		for _, p := range cold {
			pin(p)
		}
		err = c.checkLost() // a decode whose failure is known already
	}
	waits := waitSet{skip: stream}
	var sc scratchPlan
	var scratch []*page
	if err == nil {
		sc, scratch, err = c.takeScratch(&waits)
	}
	ready := c.eachPage
	if c.owed {
		ready = c.eachPageButTail
	}
	if err == nil {
		ready(func(p *page) { waits.addFence(p.group.fences[p.slot]) })
		err = waits.apply(stream)
	}
	if err == nil {
		err = m.checkBlobs(stream, ready)
	}
	if err == nil && m.lt.SSM >= 0 && (c.ssm == nil || c.ssmShared) {
		err = c.ownSsmState(stream)
	}
	if err != nil {
		for _, p := range pinned {
			p.active--
			p.held++
			p.refresh()
		}
		for _, p := range scratch {
			m.unref(p, true)
		}
		m.pinned = pinned
		m.safePoint()
		return fmt.Errorf("resume cache %d: %w", c.id, err)
	}
	c.commitScratch(sc, scratch)
	m.pinned = pinned
	c.stream, c.next, c.status = stream, stream, Active
	c.tailPending = c.owed
	m.safePoint()
	return nil
}

// ownSsmState gives a resuming cache its private SSM state page on the GPU
// level: a copy, on stream, of the reused snapshot (pinned by Resume, which
// it then releases; one intra-device copy of the SSM layer group in the
// iteration statistics), or a fresh page. On error it changes nothing.
func (c *KVCache) ownSsmState(stream device.Stream) error {
	m := c.m
	g := m.levels[0].groupOf(m.lt.SSM)
	if err := m.reserveAt(0, need(nil).add(g, 1)); err != nil {
		return fmt.Errorf("SSM state: %w", err)
	}
	np := m.newPage(g, m.lt.SSM)
	m.ref(np, true)
	src := c.ssm
	if !c.ssmShared {
		src = nil
	}
	if err := m.copyPage(stream, np, src); err != nil {
		m.unref(np, true)
		return fmt.Errorf("SSM state: %w", err)
	}
	if src != nil {
		m.unref(src, true)
		// KVCacheManagerV2 counts this deferred copy in the iteration
		// statistics at once.
		m.stats.onMoved(m.lt.SSM, HotToHot, g.desc.PageBytes())
	}
	c.ssm, c.ssmShared = np, false
	return nil
}

// copyPage makes stream wait for dst's slot and, with a source, copies src
// (a page of the same layer group on the GPU level) into dst on stream,
// fencing both slots by the copy.
func (m *Manager) copyPage(stream device.Stream, dst, src *page) error {
	waits := waitSet{skip: stream}
	waits.addFence(dst.group.fences[dst.slot])
	if src != nil {
		waits.addFence(src.group.fences[src.slot])
	}
	if err := waits.apply(stream); err != nil || src == nil {
		return err
	}
	descs := make([]device.CopyDesc, len(src.group.desc.PoolBytes))
	for pool, n := range src.group.desc.PoolBytes {
		descs[pool] = device.CopyDesc{Dst: dst.group.slotAddr(pool, dst.slot), Src: src.group.slotAddr(pool, src.slot), Size: n}
	}
	if err := stream.BatchCopy(descs); err != nil {
		return err
	}
	ev, err := m.events.record(stream)
	if err != nil {
		return err
	}
	src.group.fences[src.slot].add(&m.events, ev)
	dst.group.fences[dst.slot].add(&m.events, ev)
	m.events.release(ev)
	return nil
}

// SetStream moves the cache to stream, as setting KVCacheManagerV2's
// cuda_stream does. An ACTIVE cache's work continues on stream, which first
// waits for everything enqueued on the old one so far (an event orders
// them); a SUSPENDED cache resumes on it when Resume gets a nil stream.
func (c *KVCache) SetStream(stream device.Stream) error {
	m := c.m
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case stream == nil:
		return argErr("stream", "must not be nil")
	case c.status == Closed:
		return stateErr("set stream", c.status)
	case c.status == Active && stream != c.stream:
		ev, err := m.events.record(c.stream)
		if err != nil {
			return fmt.Errorf("record cache event: %w", err)
		}
		defer m.events.release(ev)
		if err := stream.Wait(ev.ev); err != nil {
			return fmt.Errorf("order the new stream after the old: %w", err)
		}
		c.stream = stream
	}
	c.next = stream
	return nil
}

// lossUnchecked reports whether checkLost has anything to do: decodes to
// settle, a loss the cache has not looked at, or its own loss to report.
func (c *KVCache) lossUnchecked() bool {
	return c.lost != nil || c.seenLosses != c.m.losses || len(c.m.pending) > 0
}

// checkLost returns ErrDataLost when the cache holds a page a failure
// destroyed, after accounting every failure known now. Pages are scanned only
// when pages were lost since the last look; the verdict is final.
func (c *KVCache) checkLost() error {
	m := c.m
	if len(m.pending) > 0 {
		m.settle()
	}
	if c.lost != nil || c.seenLosses == m.losses {
		return c.lost
	}
	c.seenLosses = m.losses
	lost := 0
	var cause error
	c.eachPage(func(p *page) {
		if p.lost {
			if lost == 0 {
				cause = m.lostBy[p]
			}
			lost++
		}
	})
	if lost > 0 {
		c.lost = fmt.Errorf("%w: cache %d has %d pages whose data a failure destroyed (%v); close it",
			ErrDataLost, c.id, lost, cause)
	}
	return c.lost
}

// Prefetch moves the pages of a SUSPENDED cache that are on levels colder
// than level up to level, without pinning them: they stay evictable, and
// Resume finds them closer. On error some pages may have moved; none is lost
// but those a failed codec Decode could not bring to the GPU level
// (ErrCodecFailed; see Resume).
func (c *KVCache) Prefetch(level layout.CacheLevel) error {
	m := c.m
	m.mu.Lock()
	defer m.mu.Unlock()
	if c.status != Suspended {
		return stateErr("prefetch", c.status)
	}
	if _, err := m.level(level); err != nil {
		return err
	}
	if err := c.checkLost(); err != nil {
		return err
	}
	var up []*page
	c.eachPage(func(p *page) {
		if p.level() > int(level) {
			up = append(up, p)
		}
	})
	err := m.migrate(up, int(level))
	m.safePoint()
	if err != nil {
		return fmt.Errorf("prefetch cache %d to level %d: %w", c.id, level, err)
	}
	return nil
}

// attachStreamEvent records an event on the cache's stream and adds it to the
// fence of every given page (every page of the cache, scratch slots
// included, when pages is nil):
// later users wait for this cache's work.
func (c *KVCache) attachStreamEvent(pages func(fn func(p *page))) error {
	ev, err := c.streamEvent()
	if err != nil {
		return fmt.Errorf("record cache event: %w", err)
	}
	switch {
	case pages == nil && len(c.blocks) >= fenceQueryMin && ev.completed():
		// The stream had caught up: the event orders nothing (see
		// fenceQueryMin).
	case pages == nil:
		// Looped here: a closure handed to pages would be allocated.
		for i := range c.blocks {
			b := &c.blocks[i]
			for _, p := range b.pages {
				if p != nil {
					p.group.fences[p.slot].add(&c.m.events, ev)
				}
			}
			for k := range b.beams {
				for lc, p := range b.beams[k] {
					if p != nil && b.firstOf(k+1, lc) {
						p.group.fences[p.slot].add(&c.m.events, ev)
					}
				}
			}
		}
		for _, s := range c.scratch {
			for _, p := range s {
				p.group.fences[p.slot].add(&c.m.events, ev)
			}
		}
		if c.ssm != nil {
			c.ssm.group.fences[c.ssm.slot].add(&c.m.events, ev)
		}
	default:
		pages(func(p *page) { p.group.fences[p.slot].add(&c.m.events, ev) })
	}
	c.m.events.release(ev)
	return nil
}

// streamEvent returns an event the caller releases that captures the
// cache's stream's work so far: DecodeSteps' run event while its steps run
// (no engine work comes between them, so it is the event each would record,
// and recording it before them keeps a failing stream from leaving the run
// half applied), else a new one.
func (c *KVCache) streamEvent() (*sharedEvent, error) {
	if ev := c.runEvent; ev != nil {
		ev.refs++
		return ev, nil
	}
	return c.m.events.record(c.stream)
}

// Suspend makes an ACTIVE cache SUSPENDED. Its pages stay reachable; with
// colder levels they may be evicted there and come back on Resume. Its
// scratch slots are released: scratch KV lives for one step.
func (c *KVCache) Suspend() error {
	m := c.m
	m.mu.Lock()
	defer m.mu.Unlock()
	if c.status != Active {
		return stateErr("suspend", c.status)
	}
	if err := c.checkLost(); err != nil {
		return err
	}
	if err := c.attachStreamEvent(nil); err != nil {
		return err
	}
	c.eachPage(func(p *page) {
		p.held++
		m.unref(p, true)
	})
	c.freeScratch() // scratch KV lives for one step only
	c.stream, c.status, c.tailPending = nil, Suspended, false
	m.safePoint()
	return nil
}

// Close releases every page: committed blocks stay cached for reuse until
// evicted, private pages are freed. Closing a closed cache does nothing.
// Manager.Close closes the caches still open.
func (c *KVCache) Close() error {
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	return c.closeLocked(false)
}

// closeLocked closes the cache with the manager's lock held. An ACTIVE
// cache's pages are fenced by an event on its stream; when recording it
// fails, a forced close (the manager's) releases the pages anyway and
// reports the error, an ordinary one changes nothing.
func (c *KVCache) closeLocked(force bool) error {
	m := c.m
	if c.status == Closed {
		return nil
	}
	active := c.status == Active
	var err error
	if active {
		if err = c.attachStreamEvent(nil); err != nil && !force {
			return err
		}
	}
	c.stopCommits(true)
	if c.pendingPartial {
		c.registerPartial(false)
	}
	if c.stopState != nil {
		m.unref(c.stopState, false)
		c.stopState = nil
	}
	c.freeScratch()
	c.sampleClose()
	// Deepest first, so a chain's tail is released (and evicted) first.
	for b := len(c.blocks) - 1; b >= 0; b-- {
		cb := &c.blocks[b]
		for _, p := range cb.pages {
			if p != nil {
				m.unref(p, active)
			}
		}
		for k := range cb.beams {
			for lc, p := range cb.beams[k] {
				if p != nil && cb.firstOf(k+1, lc) {
					m.unref(p, active)
				}
			}
		}
	}
	m.putSpareRows(blockRows{c.blocks, c.rows})
	c.blocks, c.rows = nil, nil
	if c.ssm != nil {
		m.unref(c.ssm, active)
		c.ssm = nil
	}
	c.pending, c.allocRuns = nil, nil
	c.pendingSsm = SsmSnapshotStats{}
	c.chain.users--
	m.prune = append(m.prune, c.chain)
	c.stream, c.status = nil, Closed
	delete(m.caches, c.id)
	m.safePoint()
	return err
}

// Resize sets the capacity (tokens with pages) and the history length (tokens
// whose KV is computed; a negative value keeps it) of an ACTIVE cache. New
// pages come from the GPU level, evicting if needed; pages a sliding window no
// longer needs are released. With SWA scratch reuse, the new blocks that are
// out of their window by the end of the step get no page but scratch slots
// (see ScratchDesc), and a capacity change needs the previous step computed.
// On error nothing changes.
func (c *KVCache) Resize(capacity, history int) error {
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	if c.resizeInBlock(capacity, history) {
		return nil
	}
	return c.resize(capacity, history)
}

// resizeInBlock is a decode step's Resize, done in a function of its own so
// that it runs without resize's large frame: the capacity stays within the
// last block, no window releases a block, no scratch slots, nothing to settle
// or report lost. It reports false, changing nothing, for any other resize
// (resize checks it and says what is wrong).
func (c *KVCache) resizeInBlock(capacity, history int) bool {
	m := c.m
	historyGiven := history >= 0
	if !historyGiven {
		history = c.history
	}
	k, tpb := len(c.blocks), m.cfg.TokensPerBlock
	if c.status != Active || history < c.history || capacity < history || capacity > min(k*tpb, MaxCapacity) || capacity <= (k-1)*tpb ||
		c.scratchOn || c.lossUnchecked() || c.windowMoves(history) {
		return false
	}
	c.sampleResize(capacity, history, historyGiven)
	c.capacity, c.history = capacity, history
	if len(m.prune) > 0 {
		m.safePoint()
	}
	return true
}

// resize is Resize with the manager's lock held.
func (c *KVCache) resize(capacity, history int) error {
	m := c.m
	if c.status != Active {
		return stateErr("resize", c.status)
	}
	historyGiven := history >= 0
	if !historyGiven {
		history = c.history
	}
	switch {
	case history < c.history:
		return argErr("history_length", "must not decrease (%d < %d)", history, c.history)
	case capacity < history:
		return argErr("capacity", "must be at least history_length (%d < %d)", capacity, history)
	case capacity > MaxCapacity:
		return argErr("capacity", "%d exceeds the largest sequence, %d tokens", capacity, MaxCapacity)
	}
	if c.stopOwn && capacity > c.committed {
		c.takeStopCopy()
	}
	// The two checks are guarded here so that a decode step calls neither
	// when it has nothing to check.
	if c.scratchOn {
		if err := c.checkScratchStep(capacity, history); err != nil {
			return err
		}
	}
	if c.lossUnchecked() {
		if err := c.checkLost(); err != nil {
			return err
		}
	}
	// A decode step within the last block (the capacity needs the blocks
	// there are): no page to take or release.
	tpb := m.cfg.TokensPerBlock
	if k := len(c.blocks); capacity <= k*tpb && capacity > (k-1)*tpb && !c.scratchOn && !c.windowMoves(history) {
		c.sampleResize(capacity, history, historyGiven)
		c.capacity, c.history = capacity, history
		if len(m.prune) > 0 || len(m.pending) > 0 {
			m.safePoint()
		}
		return nil
	}
	lt, lvl := m.lt, m.levels[0]
	oldBlocks, newBlocks := len(c.blocks), lt.BlocksFor(capacity)
	sc := c.planScratch(history, capacity)
	needs := func(b, lc int) bool { return lt.Needs(layout.LayerGroupID(lc), b, history) && !sc.in(lc, b) }
	prios, err := c.allocPriorities(oldBlocks, newBlocks, needs)
	if err != nil {
		return fmt.Errorf("resize cache %d to %d tokens: %w", c.id, capacity, err)
	}
	if newBlocks > oldBlocks || sc.grow {
		var few [4]groupNeed
		n := need(few[:0])
		for lc := range lt.LifeCycles {
			id := layout.LayerGroupID(lc)
			if k := (lt.NewPagesNeeded(id, oldBlocks, newBlocks, history) - sc.newBlocksIn(lc, oldBlocks, newBlocks)) * c.beamWidth(); k > 0 {
				n = n.add(lvl.groupOf(id), k)
			}
			if sc.on {
				if k := sc.slots[lc] - len(c.scratchOf(lc)); k > 0 {
					n = n.add(lvl.groupOf(id), k)
				}
			}
		}
		if err := m.reserveAt(0, n); err != nil {
			return fmt.Errorf("resize cache %d to %d tokens: %w", c.id, capacity, err)
		}
	}
	waits := waitSet{skip: c.stream}
	added := m.adopted[:0]
	c.growBlocks(max(newBlocks-oldBlocks, 0))
	for b := oldBlocks; b < newBlocks; b++ {
		cb := &c.blocks[b]
		for lc := range lt.LifeCycles {
			if needs(b, lc) {
				p := m.newPage(lvl.groupOf(layout.LayerGroupID(lc)), layout.LayerGroupID(lc))
				if prios != nil {
					p.setPriority(prios[b-oldBlocks][lc])
				}
				m.ref(p, true)
				cb.pages[lc] = p
				added = append(added, p)
				waits.addFence(p.group.fences[p.slot])
			}
		}
		added = c.newBeamRows(cb, added, &waits)
	}
	nPages := len(added)
	added = c.addScratch(sc, added, &waits)
	m.adopted = added
	released := c.releasable(newBlocks, history)
	released = c.scratchReleases(sc, released, oldBlocks)
	dropScratch := c.excessScratch(sc)
	if !waits.empty() {
		err = waits.apply(c.stream)
	}
	if err == nil && (len(released) > 0 || len(dropScratch) > 0) {
		// The stream may still read or write the released pages.
		err = c.attachStreamEvent(func(fn func(p *page)) {
			for _, r := range released {
				fn(r.p)
			}
			for _, p := range dropScratch {
				fn(p)
			}
		})
	}
	if err != nil {
		c.blocks = c.blocks[:oldBlocks]
		for _, p := range added {
			m.unref(p, true)
		}
		return err
	}
	c.commitScratch(sc, added[nPages:])
	for _, r := range released {
		c.blocks[r.b].clearPage(r.lc, r.p)
	}
	for i := len(released) - 1; i >= 0; i-- {
		m.unref(released[i].p, true)
	}
	c.blocks = c.blocks[:min(len(c.blocks), newBlocks)]
	for lc := range c.low {
		c.low[lc] = max(c.low[lc], lt.FirstKeptBlock(layout.LayerGroupID(lc), history))
	}
	generation := c.promptLen >= 0 && c.history >= c.promptLen
	c.sampleResize(capacity, history, historyGiven)
	c.capacity, c.history = capacity, history
	switch {
	case newBlocks > oldBlocks:
		c.stats.add(m.stats.onAllocate((newBlocks - oldBlocks) * c.beamWidth()))
		c.onAllocateBlocks(oldBlocks, newBlocks, needs, c.beamWidth(), generation)
	case newBlocks < oldBlocks:
		c.onShrink(newBlocks, oldBlocks)
	}
	m.safePoint()
	return nil
}

// windowMoves reports whether some sliding window would release a block once
// history tokens are computed: its first kept block passes its low-water mark.
func (c *KVCache) windowMoves(history int) bool {
	if !c.m.windowed {
		return false
	}
	lt := c.m.lt
	for lc := range lt.LifeCycles {
		if lt.LifeCycles[lc].Window.Size == 0 {
			continue
		}
		low := 0
		if c.low != nil {
			low = c.low[lc]
		}
		if lt.FirstKeptBlock(layout.LayerGroupID(lc), history) > max(low, lt.SinkBlocks(layout.LayerGroupID(lc))) {
			return true
		}
	}
	return false
}

// releasedPage is a page Resize releases: block b's page of lifecycle lc
// (of any beam).
type releasedPage struct {
	b, lc int
	p     *page
}

// releasable lists, in block then lifecycle order, the pages of the blocks at
// or beyond newBlocks and those a sliding window no longer needs once history
// tokens are computed. Per lifecycle it visits only the blocks from its
// low-water mark to its first kept block, so a step costs the blocks it
// releases, not the blocks the cache holds.
func (c *KVCache) releasable(newBlocks, history int) []releasedPage {
	m, lt := c.m, c.m.lt
	if c.low == nil {
		c.low = make([]int, len(lt.LifeCycles))
	}
	out := m.dropped[:0]
	for lc := range lt.LifeCycles {
		if lt.LifeCycles[lc].Window.Size == 0 {
			continue // full attention keeps every block
		}
		id := layout.LayerGroupID(lc)
		hi := min(lt.FirstKeptBlock(id, history), newBlocks, len(c.blocks))
		for b := max(c.low[lc], lt.SinkBlocks(id)); b < hi; b++ {
			cb := &c.blocks[b]
			for k := range c.beamWidth() {
				if p := cb.beamPages(k)[lc]; p != nil && cb.firstOf(k, lc) {
					out = append(out, releasedPage{b, lc, p})
				}
			}
		}
	}
	for b := newBlocks; b < len(c.blocks); b++ {
		cb := &c.blocks[b]
		for k := range c.beamWidth() {
			for lc, p := range cb.beamPages(k) {
				if p != nil && cb.firstOf(k, lc) {
					out = append(out, releasedPage{b, lc, p})
				}
			}
		}
	}
	if len(out) > 1 {
		slices.SortStableFunc(out, func(x, y releasedPage) int {
			if x.b != y.b {
				return cmp.Compare(x.b, y.b)
			}
			return cmp.Compare(x.lc, y.lc)
		})
	}
	m.dropped = out
	return out
}

// Commit appends computed tokens to the committed sequence; every block they
// complete is published in the radix tree for reuse. Committed tokens are
// history: when they pass the history length it advances to them, as
// KVCacheManagerV2's commit does (releasing pages a sliding window no longer
// needs, after publishing them), so the tokens must fit in the capacity. With
// isEnd no further commits are accepted; with partial reuse enabled the
// trailing partial block is published then, as KVCacheManagerV2 commits it
// when commits stop (else when the cache closes; see stopCommits). Commit first
// waits for any decode still bringing those blocks' pages back, so that a
// page lost to its failure is never published (the cache gets ErrDataLost
// instead). With several beams the tokens' KV must be in beam 0 (see
// CommitBeamSearch). With SSM layers a commit must start or end at the
// history length (KVCacheManagerV2's rule): the cache's one SSM state is
// that of the history, or of the commit's end once the work on the cache's
// stream that computed its tokens is done; other commits fail with
// ErrInvalidArgument naming tokens.
func (c *KVCache) Commit(tokens []config.Token, isEnd bool) error {
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	if !isEnd && c.commitInBlock(tokens) {
		return nil
	}
	return c.commit(tokens, nil, nil, isEnd)
}

// commitInBlock is a decode step's Commit, done without commit's large
// frame: tokens that stay inside the block being filled and within the
// history, on a cache with nothing to settle or report lost and no fresh
// run owed (whose commits are checked against the run), so nothing is
// published or released. It reports false, changing nothing, for any other
// commit (commit checks it and says what is wrong).
func (c *KVCache) commitInBlock(tokens []config.Token) bool {
	m := c.m
	n := len(tokens)
	if c.status != Active || c.stopped || c.owed || len(c.tail)+n >= m.cfg.TokensPerBlock || c.committed+n > c.history ||
		m.lt.SSM >= 0 && n > 0 && c.committed != c.history && c.committed+n != c.history || c.lossUnchecked() {
		return false
	}
	// committed+n ≤ history ≤ capacity: the tokens fit.
	c.tail = append(c.tail, tokens...)
	c.committed += n
	return true
}

// CommitDigests is Commit for tokens with digest tokens (sorted by
// position in tokens, whose values there are ignored; see
// CacheOptions.InputDigests). A text-only cache refuses digests.
func (c *KVCache) CommitDigests(tokens []config.Token, digests []blockhash.DigestAt, isEnd bool) error {
	tokens, err := c.m.textOrDigests("digest_positions", tokens, digests, c.textOnly)
	if err != nil {
		return err
	}
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	return c.commit(tokens, digests, nil, isEnd)
}

// CommitBeamSearch is Commit after a beam search step: first beam j takes
// over the history of beam beamSearchIndices[j] (one entry per beam: beams
// reordered, forked or dropped, as the step chose; see SetBeamWidth for the
// copy on write of the diverging block), then tokens, converged and now in
// beam 0, are committed. A block the tokens complete is published once, from
// beam 0, and every beam sees beam 0's page of it from then on (the other
// beams' pages of it are released). A nil beamSearchIndices keeps the beams;
// on error nothing changes.
func (c *KVCache) CommitBeamSearch(tokens []config.Token, beamSearchIndices []int, isEnd bool) error {
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	return c.commit(tokens, nil, beamSearchIndices, isEnd)
}

// commit is Commit with the manager's lock held (a function of its own so
// that Commit's unlock is an open-coded defer); digests are the tokens'
// digest tokens (checked: see textOrDigests), parents the beam search
// indices of CommitBeamSearch (nil: keep the beams).
func (c *KVCache) commit(tokens []config.Token, digests []blockhash.DigestAt, parents []int, isEnd bool) error {
	m := c.m
	switch {
	case c.status != Active:
		return stateErr("commit", c.status)
	case c.stopped:
		return fmt.Errorf("%w: commit after stop_committing or is_end", ErrInvalidState)
	case c.committed+len(tokens) > c.capacity:
		return argErr("tokens", "committing %d tokens after %d would pass capacity %d",
			len(tokens), c.committed, c.capacity)
	case c.owed:
		if err := c.checkRunCommit(tokens, len(digests), parents != nil); err != nil {
			return err
		}
	case m.lt.SSM >= 0 && len(tokens) > 0 && c.committed != c.history && c.committed+len(tokens) != c.history:
		// The one SSM state is at the history length (or, for a commit from
		// there, at its end once the stream's work is done): a commit ending
		// anywhere else could not snapshot the state of its tokens.
		return argErr("tokens", "with SSM layers a commit starts or ends at the history length %d; %d tokens after %d do neither",
			c.history, len(tokens), c.committed)
	}
	if parents != nil {
		if err := c.checkBeamIndices(parents); err != nil {
			return err
		}
	}
	tpb := m.cfg.TokensPerBlock
	if end := c.committed + len(tokens); isEnd && c.priority != nil && c.publishesAtStop(end) {
		// The priority of the partial block the stop publishes is asked
		// before anything changes: a callback that fails fails the commit.
		prs, err := c.blockPriority(end / tpb)
		if err != nil {
			return err
		}
		c.stopPrio, c.stopPrioAt = prs, end/tpb
	}
	if parents == nil && len(c.tail)+len(tokens) < tpb && c.committed+len(tokens) <= c.history {
		// A decode step within the last block: no block to publish, no page
		// to release, no beam to reorder.
		if c.lossUnchecked() {
			if err := c.checkLost(); err != nil {
				return err
			}
		}
		for _, d := range digests {
			c.tailDigests = append(c.tailDigests, blockhash.DigestAt{Pos: len(c.tail) + d.Pos, Digest: d.Digest})
		}
		c.tail = append(c.tail, tokens...)
		c.committed += len(tokens)
		c.endCommits(isEnd)
		return nil
	}
	first := c.committed / tpb
	full := (c.committed + len(tokens)) / tpb
	// Nothing lost is published: the blocks' pages still arriving (decoded
	// by Resume) must be known good first.
	m.settlePages(func(fn func(p *page)) {
		for _, b := range c.blocks[first:min(full, len(c.blocks))] {
			for _, p := range b.pages {
				if p != nil {
					fn(p)
				}
			}
		}
	})
	if err := c.checkLost(); err != nil {
		return err
	}
	// The callback runs before anything changes: a panic in it changes
	// nothing.
	var prios [][]int
	if c.priority != nil {
		prios = make([][]int, max(full-first, 0))
	}
	for i := range prios {
		var err error
		if prios[i], err = c.blockPriority(first + i); err != nil {
			return err
		}
	}
	// Committed tokens are history: the pages a sliding window no longer
	// needs once they are are released after publishing.
	history := max(c.history, c.committed+len(tokens))
	if err := c.checkScratchHistory(history); err != nil {
		return err
	}
	var released []releasedPage
	beams := c.beamWidth() > 1 || parents != nil
	var sc scratchPlan
	var dropScratch []*page // scratch slots the shorter step no longer needs
	if history > c.history && !beams {
		released = c.releasable(len(c.blocks), history)
		sc = c.planScratch(history, c.capacity)
		dropScratch = c.excessScratch(sc)
	}
	var ev *sharedEvent
	if full > first || len(released) > 0 || beams || len(dropScratch) > 0 {
		// Recorded before anything changes, so a failure changes nothing;
		// it captures the cache's work that wrote the blocks (and last
		// used the pages the history advance releases).
		var err error
		if ev, err = c.streamEvent(); err != nil {
			return fmt.Errorf("record cache event: %w", err)
		}
		defer m.events.release(ev)
	}
	if beams {
		// The one step that can fail once the event is recorded; released
		// is listed after it, from the reordered beams.
		if parents != nil {
			if err := c.reorder(parents, history, ev); err != nil {
				return fmt.Errorf("commit cache %d: reorder beams: %w", c.id, err)
			}
		}
		if history > c.history {
			released = c.releasable(len(c.blocks), history)
		}
	}
	// An event that has completed orders nothing: the published pages'
	// fences need not hold it (see fenceQueryMin).
	fenced := ev != nil && !(full-first >= fenceQueryMin && ev.completed())
	rest, at := tokens, 0 // at: the position in tokens of rest
	for b := first; b < full; b++ {
		blk := rest[:tpb-len(c.tail)]
		dg := c.tailDigests
		for _, d := range blockhash.DigestsIn(digests, at, at+len(blk)) {
			dg = append(dg, blockhash.DigestAt{Pos: len(c.tail) + d.Pos, Digest: d.Digest})
		}
		rest, at = rest[len(blk):], at+len(blk)
		if len(c.tail) > 0 {
			c.tail = append(c.tail, blk...)
			blk = c.tail
		}
		var pr []int
		if prios != nil {
			pr = prios[b-first]
		}
		published := c.publish(b, blk, dg, pr)
		for _, p := range published {
			if fenced {
				p.group.fences[p.slot].add(&m.events, ev)
			}
		}
		m.writeThrough(published)
		c.unifyBlock(b, ev)
		c.tail, c.tailDigests = c.tail[:0], nil
	}
	for _, d := range blockhash.DigestsIn(digests, at, len(tokens)) {
		c.tailDigests = append(c.tailDigests, blockhash.DigestAt{Pos: len(c.tail) + d.Pos, Digest: d.Digest})
	}
	c.tail = append(c.tail, rest...)
	c.committed += len(tokens)
	if full > first && c.committed%tpb == 0 {
		c.snapshotSsm()
	}
	if c.owed && c.committed == c.freshTo {
		c.joinTail()
	}
	if history > c.history {
		for _, p := range dropScratch {
			p.group.fences[p.slot].add(&m.events, ev)
		}
		if sc.on {
			c.commitScratch(sc, nil)
		}
		c.advanceHistory(history, released, ev)
	}
	c.endCommits(isEnd)
	return nil
}

// endCommits stops further commits after a commit with isEnd.
func (c *KVCache) endCommits(isEnd bool) {
	if isEnd {
		c.stopCommits(false)
	}
}

// stopCommits refuses further commits (closing: the cache is being
// closed). With partial reuse, or with SSM layers, the trailing partial block
// of the committed tokens is published, as KVCacheManagerV2 commits it when
// commits stop (at commit with is_end, stop_committing or close). Without SSM
// layers an ACTIVE cache of one beam publishes it at once (publishStopped),
// others at close, when nobody writes into it any more. With SSM layers it is published with
// the SSM state at the committed length, so it is published only when that
// state exists: the history is the committed tokens when commits stop. A
// cache closing then gives its own state to the block; one that may compute
// on (is_end, stop_committing) keeps a copy of it for the block (stopState),
// best effort as every snapshot, taken when it may compute on: at once when
// its capacity is past the committed length, else at the Resize that grows
// it (stopOwn; see takeStopCopy).
func (c *KVCache) stopCommits(closing bool) {
	m := c.m
	if c.stopped && !(closing && m.lt.SSM >= 0 && !c.pendingPartial) {
		return
	}
	c.stopped = true
	if c.committed%m.cfg.TokensPerBlock == 0 {
		return
	}
	if m.lt.SSM < 0 {
		c.pendingPartial = m.cfg.EnablePartialReuse
		if c.pendingPartial && !closing && c.publishesAtStop(c.committed) {
			c.publishStopped()
		}
		return
	}
	if c.history != c.committed || c.ssm == nil || c.ssmShared || c.detached {
		return
	}
	if closing {
		c.pendingPartial = true
		return
	}
	if c.status != Active {
		return // the state cannot change before the cache resumes: closing gives it
	}
	if c.capacity == c.committed {
		c.stopOwn, c.pendingPartial = true, true
		return
	}
	if np := c.copyState(nil); np != nil {
		m.ref(np, false)
		c.stopState, c.pendingPartial = np, true
	}
}

// copyState returns a new page of the SSM layer group, of node n (nil: a
// private page), holding a copy of the ACTIVE cache's SSM state as the work
// on its stream so far leaves it: on the GPU level where a slot can be made
// free there, else on the first colder level that has room (KVCacheManagerV2
// tries every level), encoded by the codec as an eviction would. It returns
// nil when no level has room or the copy fails: a snapshot is best effort.
// takeStopCopy takes the copy of the SSM state at the committed length for
// the partial block of a cache that gave its own state (stopOwn) and is about
// to compute on; without room for it the block is published as a closing
// cache's is, with the state closing finds at the committed length.
func (c *KVCache) takeStopCopy() {
	c.stopOwn = false
	if np := c.copyState(nil); np != nil {
		c.m.ref(np, false)
		c.stopState = np
		return
	}
	c.pendingPartial = false // closing decides, by the history then
}

func (c *KVCache) copyState(n *node) *page {
	m := c.m
	for lvl := range m.levels {
		g := m.levels[lvl].groupOf(m.lt.SSM)
		if m.reserveAt(lvl, need(nil).add(g, 1)) != nil {
			continue
		}
		if lvl == 0 {
			np := m.newPage(g, m.lt.SSM)
			if err := m.copyPage(c.stream, np, c.ssm); err != nil {
				m.freePage(np)
				return nil
			}
			np.node = n
			return np
		}
		np := m.pages.alloc()
		np.lc, np.node, np.heapIdx = m.lt.SSM, n, -1
		if err := m.copyToCold(c.stream, np, c.ssm, lvl); err != nil {
			m.pages.release(np)
			return nil
		}
		return np
	}
	return nil
}

// snapshotSsm copies the cache's SSM state, which the engine's work on the
// cache's stream brought to the committed tokens, into a new page of the
// committed chain's last block (KVCacheManagerV2's commit_min_snapshot), so a
// request reusing that block resumes from it: on the GPU level, or a colder
// one without a GPU slot (see copyState). It is best effort, as in
// KVCacheManagerV2: without a slot on any level, or when the block has a
// snapshot already, the block stays without one (and reuse stops before it).
func (c *KVCache) snapshotSsm() {
	m, n := c.m, c.chain
	if m.lt.SSM < 0 || c.ssm == nil || c.ssmShared || c.detached || n.parent == 0 || m.pagesOf(n)[m.lt.SSM] != nil {
		return
	}
	np := c.copyState(n)
	if np == nil {
		return
	}
	m.pagesOf(n)[m.lt.SSM] = np
	m.tick++
	np.lastUsed = m.tick
	np.refresh()
	m.emitUpdated(n, m.lt.SSM, DroppedLevel, layout.CacheLevel(np.level()))
}

// advanceHistory sets a larger history length within the capacity and
// releases the pages a sliding window no longer needs (released, from
// releasable); ev, recorded on the cache's stream, fences them.
func (c *KVCache) advanceHistory(history int, released []releasedPage, ev *sharedEvent) {
	m, lt := c.m, c.m.lt
	for _, r := range released {
		r.p.group.fences[r.p.slot].add(&m.events, ev)
		c.blocks[r.b].clearPage(r.lc, r.p)
	}
	for i := len(released) - 1; i >= 0; i-- {
		m.unref(released[i].p, true)
	}
	for lc := range c.low {
		c.low[lc] = max(c.low[lc], lt.FirstKeptBlock(layout.LayerGroupID(lc), history))
	}
	c.history = history
	m.safePoint()
}

// StopCommitting refuses further commits; tokens computed from now on (for
// example generated ones) are never published. With partial reuse the
// trailing partial block of the committed tokens is published now (see
// stopCommits).
func (c *KVCache) StopCommitting() {
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	c.stopCommits(false)
}

// publish links block b, holding tokens blk with digest tokens dg, into the
// tree after the cache's chain, with priority per lifecycle (nil: the
// defaults). If an equal block is already there, the cache follows the
// existing node and keeps its own pages private, except where the node has
// no page of a lifecycle or only one on a colder level that no cache
// references: there the cache's page replaces it (see dropColder).
func (c *KVCache) publish(b int, blk []config.Token, dg []blockhash.DigestAt, priority []int) []*page {
	m := c.m
	cb := &c.blocks[b]
	if cb.node != nil {
		return nil
	}
	if c.detached {
		c.orphanBlock(blk, dg)
		return nil
	}
	// With one full-block child the tokens name it without a key (see
	// childHolding); a new node needs its key.
	var next *node
	if c.chain.nkids == 0 {
		next = m.childHolding(c.chain, blk, dg)
	}
	var key blockhash.Key
	if next == nil {
		key = m.hasher.NextDigests(c.chain.key, blk, dg)
		next = m.child(c.chain, key)
	}
	if next != nil && !m.holds(next, blk, dg) {
		// A 64-bit key collision: never link to another block's content;
		// this cache publishes nothing more.
		c.detached = true
		c.orphanBlock(blk, dg)
		return nil
	}
	var published []*page
	switch {
	case next == nil:
		next = m.newNode(c.chain, key, blk, dg)
		c.setPriority(next, priority)
		published = c.adopt(next, cb.pages)
		m.addChild(c.chain, next)
		cb.node = next
		m.emitStored(next, c.id)
	default:
		// An equal block lost pages to eviction, or keeps them colder than
		// ours: ours fill the gaps.
		c.dropColder(next, cb.pages)
		had := m.hasPages(next)
		missing := make([]*page, len(cb.pages))
		for lc, p := range cb.pages {
			if m.pagesOf(next)[lc] == nil {
				missing[lc] = p
			}
		}
		if published = c.adopt(next, missing); len(published) > 0 {
			cb.node = next
			if !had {
				m.emitStored(next, c.id)
			} else {
				for _, p := range published {
					m.emitUpdated(next, p.lc, DroppedLevel, layout.CacheLevel(p.level()))
				}
			}
		}
	}
	c.chain.users--
	next.users++
	c.chain = next
	return published
}

// dropColder drops the pages of n, an equal block already in the tree, that
// lie on a colder level than the cache's own page of the same lifecycle,
// that no cache references, no migration is placing and no failure has lost
// (those keep their own accounting), so that publish adopts the cache's
// pages in their place: a block an engine recomputed rather than read back
// from host or disk is then shared from the upper level instead of staying
// cold.
func (c *KVCache) dropColder(n *node, pages []*page) {
	m := c.m
	row := m.pagesOf(n)
	for lc, p := range pages {
		old := row[lc]
		if p == nil || old == nil || old.level() <= p.level() || old.active > 0 || old.held > 0 || old.moving || old.lost {
			continue
		}
		m.drop(old)
	}
}

// orphanBlock keeps a block a key collision kept out of the tree.
func (c *KVCache) orphanBlock(blk []config.Token, dg []blockhash.DigestAt) {
	for _, d := range dg {
		c.orphanDigests = append(c.orphanDigests, blockhash.DigestAt{Pos: len(c.orphan) + d.Pos, Digest: d.Digest})
	}
	c.orphan = append(c.orphan, blk...)
}

// adopt moves private pages into node n and returns them, in scratch valid
// until the next adopt.
func (c *KVCache) adopt(n *node, pages []*page) []*page {
	adopted := c.m.adopted[:0]
	row := c.m.pagesOf(n)
	for lc, p := range pages {
		if p != nil {
			p.node = n
			row[lc] = p
			p.refresh()
			adopted = append(adopted, p)
		}
	}
	c.m.adopted = adopted
	return adopted
}

func (c *KVCache) setPriority(n *node, prs []int) {
	if c.priority == nil {
		return
	}
	m := c.m
	copy(m.prioOf(n), prs)
	// Ancestors never rank below descendants, so a chain drains from its
	// tail, in every lifecycle.
	for lc, pr := range prs {
		for a := m.parentOf(n); a != nil && a.parent != 0 && m.prioOf(a)[lc] < pr; a = m.parentOf(a) {
			old := m.prioOf(a)[lc]
			m.prioOf(a)[lc] = pr
			if m.hasPages(a) { // a stored block
				m.emitPriority(a, layout.LayerGroupID(lc), old)
			}
			if p := m.pagesOf(a)[lc]; p != nil {
				p.refresh()
			}
		}
	}
}

// blockPriority returns the priority of block b in every lifecycle as it is
// committed: the one its page got at allocation (see allocPriorities), else
// what the cache's PriorityFunc says now (for a page allocated otherwise, or
// none), clamped into [MinPriority, MaxPriority]; a panic in the callback is
// an error.
func (c *KVCache) blockPriority(b int) ([]int, error) {
	prs := make([]int, len(c.m.lt.LifeCycles))
	for lc := range prs {
		if c.priority == nil {
			prs[lc] = DefaultPriority
			continue
		}
		if b < len(c.blocks) {
			if p := c.blocks[b].pages[lc]; p != nil && p.prioSet {
				prs[lc] = int(p.prio)
				continue
			}
		}
		pr, err := c.askPriority(b, layout.LayerGroupID(lc))
		if err != nil {
			return nil, err
		}
		prs[lc] = pr
	}
	return prs, nil
}

// askPriority calls the cache's PriorityFunc (set) for block b of lifecycle
// lc, clamped into [MinPriority, MaxPriority]; a panic in it is an error.
// While DecodeSteps runs its steps, it answers what DecodeSteps asked.
func (c *KVCache) askPriority(b int, lc layout.LayerGroupID) (pr int, err error) {
	for _, a := range c.asked {
		if a.b == b && a.lc == lc {
			return a.pr, nil // asked by DecodeSteps before its steps
		}
	}
	defer func() {
		if r := recover(); r != nil {
			pr, err = 0, fmt.Errorf("%w: priority callback failed for block %d, layer group %d: %v",
				ErrInvalidArgument, b, lc, r)
		}
	}()
	return min(max(c.priority(b, lc), MinPriority), MaxPriority), nil
}

// allocPriorities asks the cache's PriorityFunc, before anything changes,
// about every page Resize allocates for blocks from..to-1 (KVCacheManagerV2
// asks as it allocates a page, not as it commits it): one row per block, one
// entry per lifecycle, valid where need(b, lc). Nil without a PriorityFunc.
func (c *KVCache) allocPriorities(from, to int, need func(b, lc int) bool) ([][]int, error) {
	if c.priority == nil || to <= from {
		return nil, nil
	}
	nlc := len(c.m.lt.LifeCycles)
	flat := make([]int, (to-from)*nlc)
	rows := make([][]int, to-from)
	for b := from; b < to; b++ {
		rows[b-from] = flat[(b-from)*nlc : (b-from+1)*nlc]
		for lc := range nlc {
			if !need(b, lc) {
				continue
			}
			pr, err := c.askPriority(b, layout.LayerGroupID(lc))
			if err != nil {
				return nil, err
			}
			rows[b-from][lc] = pr
		}
	}
	return rows, nil
}

// publishesAtStop reports whether commits stopping at end tokens publish the
// trailing partial block at once (publishStopped): with partial reuse, no
// SSM layers, an ACTIVE cache of one beam, and end inside a block.
func (c *KVCache) publishesAtStop(end int) bool {
	m := c.m
	return m.lt.SSM < 0 && m.cfg.EnablePartialReuse && c.status == Active && c.beamWidth() == 1 &&
		end%m.cfg.TokensPerBlock != 0
}

// publishStopped publishes the trailing partial block of an ACTIVE cache
// whose commits stopped (registerPartial), its pages fenced by the cache's
// work so far as a commit fences the blocks it publishes: a cache reusing it
// copies the pages after the work that wrote them. The tokens the cache
// computes on write past the block's tokens, which nobody reads from the
// block. Best effort: a page still arriving or lost, an event that cannot
// be recorded, or a priority callback that fails (stop_committing asks it
// here) leaves it to close.
func (c *KVCache) publishStopped() {
	m := c.m
	b := c.committed / m.cfg.TokensPerBlock
	if b >= len(c.blocks) || c.blocks[b].node != nil {
		return
	}
	m.settlePages(c.blocks[b].eachPage)
	ev, err := m.events.record(c.stream)
	if err != nil {
		return
	}
	defer m.events.release(ev)
	c.registerPartial(true)
	if n := c.blocks[b].node; n != nil {
		for _, p := range m.pagesOf(n) {
			if p != nil {
				p.group.fences[p.slot].add(&m.events, ev)
			}
		}
	}
}

// registerPartial publishes the trailing partial block at close, when nobody
// writes into it any more. With SSM layers the block gets the SSM state at
// its end (see stopCommits): the copy taken when commits stopped, else the
// cache's own state, which the closing cache gives up; an equal partial block
// already published without a state gets it instead. The block's priority
// is stopPrio where a commit with isEnd asked it, else asked now; when the
// callback fails the block gets the defaults, or, with strict (publishing
// before close), is left unpublished.
func (c *KVCache) registerPartial(strict bool) {
	m := c.m
	tpb := m.cfg.TokensPerBlock
	b := c.committed / tpb
	if b >= len(c.blocks) || c.blocks[b].node != nil {
		return
	}
	for lc, p := range c.blocks[b].pages {
		if layout.LayerGroupID(lc) != m.lt.SSM && (p == nil || p.lost) {
			return
		}
	}
	var state *page
	if m.lt.SSM >= 0 {
		if state = c.stopState; state == nil {
			state = c.ssm
		}
		if state == nil || state.lost || state.node != nil {
			return
		}
	}
	blk, dg := c.tail, c.tailDigests
	for id := c.chain.first; id != 0; {
		sib := m.nodes.at(id)
		if sib.isPartial(tpb) && m.holds(sib, blk, dg) {
			if state != nil && m.pagesOf(sib)[m.lt.SSM] == nil {
				had := m.hasPages(sib)
				c.adoptState(sib, state)
				if had {
					m.emitUpdated(sib, m.lt.SSM, DroppedLevel, layout.CacheLevel(state.level()))
				} else {
					m.emitStored(sib, c.id)
				}
			}
			return
		}
		id = sib.next
	}
	pr := c.stopPrio
	if pr == nil || c.stopPrioAt != b {
		var err error
		if pr, err = c.blockPriority(b); err != nil {
			if strict {
				return
			}
			c.priority = nil // Close cannot fail for it: the defaults
			pr, _ = c.blockPriority(b)
		}
	}
	n := m.newNode(c.chain, m.hasher.NextDigests(c.chain.key, blk, dg), blk, dg)
	c.setPriority(n, pr)
	c.adopt(n, c.blocks[b].pages)
	if state != nil {
		c.adoptState(n, state)
	}
	m.addChild(c.chain, n)
	c.blocks[b].node = n
	m.emitStored(n, c.id)
}

// adoptState makes state, a page of the closing cache (its SSM state or
// stopState), the SSM snapshot of node n; the cache's reference to it is
// dropped as it closes.
func (c *KVCache) adoptState(n *node, state *page) {
	m := c.m
	state.node = n
	m.pagesOf(n)[m.lt.SSM] = state
	m.tick++
	state.lastUsed = m.tick
	state.refresh()
}

// BasePageIndices returns, for an ACTIVE cache, the GPU slot of each block in
// layer group lg in beam DefaultBeamIndex (see BasePageIndicesOfBeam),
// BadPageIndex where the block has no page. Turn a base index into a buffer's
// page index with BufferLocation.PageIndex.
func (c *KVCache) BasePageIndices(lg layout.LayerGroupID) ([]int32, error) {
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	return c.basePageIndices(lg, nil)
}

// AppendBasePageIndices is BasePageIndices appending to dst.
func (c *KVCache) AppendBasePageIndices(dst []int32, lg layout.LayerGroupID) ([]int32, error) {
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	return c.basePageIndices(lg, dst)
}

// AggregatedPageIndices returns, for an ACTIVE cache, the aggregated page
// index of each block of layer group lg in beam (in [0, BeamWidth());
// KVCacheManagerV2's get_aggregated_page_indices): the block's hot slot in
// that beam, which addresses every AggregatedPageDesc of the layer group;
// BadPageIndex where the block has no page, or with validOnly only the
// blocks that have one.
func (c *KVCache) AggregatedPageIndices(lg layout.LayerGroupID, beam int, validOnly bool) ([]int32, error) {
	idx, err := c.AppendBasePageIndicesOfBeam(nil, lg, beam)
	if err != nil || !validOnly {
		return idx, err
	}
	return slices.DeleteFunc(idx, func(i int32) bool { return i == BadPageIndex }), nil
}

func (c *KVCache) basePageIndices(lg layout.LayerGroupID, dst []int32) ([]int32, error) {
	return c.beamPageIndices(lg, DefaultBeamIndex, dst)
}

// SsmBlockBaseIndex returns, for an ACTIVE cache, the GPU slot of its SSM
// state in layer group lg (KVCacheManagerV2's get_ssm_block_base_index);
// BadPageIndex for an attention layer group. Turn it into a buffer's page
// index with BufferLocation.PageIndex.
func (c *KVCache) SsmBlockBaseIndex(lg layout.LayerGroupID) (int32, error) {
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	if c.status != Active {
		return BadPageIndex, stateErr("SSM block base index", c.status)
	}
	if lg < 0 || int(lg) >= len(c.m.lt.LifeCycles) {
		return BadPageIndex, argErr("layer_group_id", "%d out of [0, %d)", lg, len(c.m.lt.LifeCycles))
	}
	if err := c.checkLost(); err != nil {
		return BadPageIndex, err
	}
	if !c.m.lt.IsSSM(lg) || c.ssm == nil {
		return BadPageIndex, nil
	}
	return c.ssm.slot, nil
}

// Stats returns the block counters this cache added to the manager's since
// it was created: its reused and missed blocks at creation, the blocks Resize
// allocated for it since (Evictions and LostPages stay 0: they are the
// manager's).
func (c *KVCache) Stats() BlockStats {
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	return c.stats
}

// CachedTokensByLevel returns, indexed by cache level, how many of the
// cache's tokens with computed KV (its history) are held on that level: a
// block's tokens count at the coldest level of its pages (beam 0's), and a
// block whose every page was released (out of a sliding window) counts
// nowhere.
func (c *KVCache) CachedTokensByLevel() []int {
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	out := make([]int, len(c.m.levels))
	tpb := c.m.cfg.TokensPerBlock
	for b, blk := range c.blocks {
		n := min(max(c.history-b*tpb, 0), tpb)
		if n == 0 {
			break
		}
		coldest := -1
		for _, p := range blk.pages {
			if p != nil {
				coldest = max(coldest, p.level())
			}
		}
		if coldest >= 0 {
			out[coldest] += n
		}
	}
	return out
}

// Residency returns how many of the cache's pages are on each cache level,
// indexed by level.
func (c *KVCache) Residency() []int {
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	out := make([]int, len(c.m.levels))
	c.eachPage(func(p *page) { out[p.level()]++ })
	return out
}
