package core

import (
	"slices"

	"github.com/kvcm/kvcm/core/config"
	"github.com/kvcm/kvcm/core/layout"
)

// BlockStats counts block allocation outcomes as kvcm counts them (Manager.Stats,
// KVCache.Stats): blocks are counted once per cache, whatever the number of
// layer groups, and reused blocks are part of the allocations, as TensorRT-LLM's
// V1 manager counts them. KVCacheManagerV2's per-request and per-layer-group
// counts are RequestStats and LayerGroupStats.
type BlockStats struct {
	// AllocTotalBlocks = AllocNewBlocks + ReusedBlocks.
	AllocTotalBlocks int64
	// AllocNewBlocks were allocated fresh by Resize, once per beam (as
	// KVCacheManagerV2 counts them).
	AllocNewBlocks int64
	// ReusedBlocks were matched in the tree at creation (partial ones too).
	ReusedBlocks int64
	// MissedBlocks are full input blocks that were not reused.
	MissedBlocks int64
	// Evictions counts pages evicted from any level.
	Evictions int64
	// LostPages counts pages whose data a failure destroyed: an
	// asynchronous failure of their migration (a disk read or write, a
	// codec's asynchronous work), or a codec's failed Decode. Failures are
	// counted once known: at the latest when the stream that waited for the
	// migration has passed it.
	LostPages int64
}

// HitRate is ReusedBlocks over the blocks looked up.
func (s BlockStats) HitRate() float64 {
	if n := s.ReusedBlocks + s.MissedBlocks; n > 0 {
		return float64(s.ReusedBlocks) / float64(n)
	}
	return 0
}

func (s *BlockStats) add(d BlockStats) {
	s.AllocTotalBlocks += d.AllocTotalBlocks
	s.AllocNewBlocks += d.AllocNewBlocks
	s.ReusedBlocks += d.ReusedBlocks
	s.MissedBlocks += d.MissedBlocks
	s.Evictions += d.Evictions
	s.LostPages += d.LostPages
}

type statCounters struct {
	total, iter BlockStats
	// lc counts each layer group's iteration; reusedFull, reusedPartial
	// ([layer group][level]) and cachedTokens ([level]) the reuse of an
	// iteration by the level the reused pages were on. Each resets with its
	// own getter.
	lc                        []LayerGroupStats
	reusedFull, reusedPartial [][]int64
	cachedTokens              []int64
	// ssm counts the SSM layer group's (ssmLC) snapshot lookups.
	ssm   SsmSnapshotStats
	ssmLC layout.LayerGroupID
}

// LayerGroupStats counts one layer group's page outcomes and movements
// during an iteration (KVCacheManagerV2's KVCacheIterationStatsDelta, whose
// fields carry an iter_ prefix), by KVCacheManagerV2's rules: a reuse counts
// reused blocks only, every page allocated for a cache (by Resize, a fresh
// run, or a partial block's private copy) counts as an allocation, and an
// allocation before the history reached the prompt is a missed block. A
// block counts in a layer group when the layer group has (or gets) a page
// for it: a sliding-window layer group counts only the blocks inside its
// window; the SSM layer group counts movements only. The reuse, miss and
// allocation counts are a cache's pending counts until it commits them; the
// movements count when they happen.
type LayerGroupStats struct {
	// AllocTotalBlocks are the pages allocated for caches (as in
	// KVCacheManagerV2, equal to AllocNewBlocks: a reused page is not an
	// allocation).
	AllocTotalBlocks int64
	// AllocNewBlocks are the pages allocated for caches.
	AllocNewBlocks int64
	// ReusedBlocks = FullReusedBlocks + PartialReusedBlocks.
	ReusedBlocks int64
	// FullReusedBlocks are tree pages a new cache shares.
	FullReusedBlocks int64
	// PartialReusedBlocks are partially matched blocks a new cache copied
	// (each also one allocation and one intra-device copy).
	PartialReusedBlocks int64
	// MissedBlocks are the pages allocated before the cache's history had
	// reached its prompt: prefill blocks the cache computes.
	MissedBlocks int64
	// GenAllocBlocks are the pages allocated once the cache's history had
	// reached its prompt (generation-phase growth).
	GenAllocBlocks int64
	// Onboard*: pages brought to the GPU from a colder level; Offload*:
	// pages moved from the GPU to a colder level; IntraDeviceCopy*: GPU to
	// GPU copies (partial reuse, defragmentation); HostDropped*: pages
	// dropped from the host level. Bytes as they travel (cold page bytes
	// off the GPU, hot page bytes on it).
	OnboardBlocks, OnboardBytes                 int64
	OffloadBlocks, OffloadBytes                 int64
	IntraDeviceCopyBlocks, IntraDeviceCopyBytes int64
	HostDroppedBlocks, HostDroppedBytes         int64
}

// HitRate is ReusedBlocks over the pages looked up (ReusedBlocks +
// MissedBlocks), 0 when none was.
func (s LayerGroupStats) HitRate() float64 {
	if n := s.ReusedBlocks + s.MissedBlocks; n > 0 {
		return float64(s.ReusedBlocks) / float64(n)
	}
	return 0
}

// SsmSnapshotStats counts the SSM snapshot lookups of the SSM layer group
// (KVCacheManagerV2's SsmSnapshotIterationStatsDelta): one lookup per cache
// created with input tokens, a hit when it reused a snapshot, counted when
// the cache commits its pending statistics (KVCache.CommitPendingStats). ReusedTokens
// and UnreusedTokens split the lookups' input tokens; a hit is aligned when
// its reused length is a whole number of blocks (a full block's snapshot),
// unaligned when it resumed from a partial block's state.
type SsmSnapshotStats struct {
	Lookups, Hits, Misses        int64
	ReusedTokens, UnreusedTokens int64
	AlignedHits, UnalignedHits   int64
}

// HitRate is Hits / Lookups, 0 without lookups.
func (s SsmSnapshotStats) HitRate() float64 {
	if s.Lookups == 0 {
		return 0
	}
	return float64(s.Hits) / float64(s.Lookups)
}

// onLookup counts the SSM snapshot lookup of a cache created with
// inputTokens of which reused were reused.
func (st *SsmSnapshotStats) onLookup(inputTokens, reused, tpb int) {
	if inputTokens == 0 {
		return
	}
	st.Lookups++
	st.ReusedTokens += int64(reused)
	st.UnreusedTokens += int64(inputTokens - reused)
	switch {
	case reused == 0:
		st.Misses++
	case reused%tpb == 0:
		st.Hits++
		st.AlignedHits++
	default:
		st.Hits++
		st.UnalignedHits++
	}
}

func (st *SsmSnapshotStats) add(d SsmSnapshotStats) {
	st.Lookups += d.Lookups
	st.Hits += d.Hits
	st.Misses += d.Misses
	st.ReusedTokens += d.ReusedTokens
	st.UnreusedTokens += d.UnreusedTokens
	st.AlignedHits += d.AlignedHits
	st.UnalignedHits += d.UnalignedHits
}

// GetAndResetSsmSnapshotIterationStats returns the SSM snapshot counters
// since the last call by layer group (KVCacheManagerV2's
// get_and_reset_ssm_snapshot_iteration_stats) and starts new ones: empty
// without SSM layers or lookups.
func (m *Manager) GetAndResetSsmSnapshotIterationStats() map[layout.LayerGroupID]SsmSnapshotStats {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := m.ssmSnapshotStats()
	m.stats.ssm = SsmSnapshotStats{}
	return out
}

// SsmSnapshotIterationStats is GetAndResetSsmSnapshotIterationStats without
// the reset.
func (m *Manager) SsmSnapshotIterationStats() map[layout.LayerGroupID]SsmSnapshotStats {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.ssmSnapshotStats()
}

func (m *Manager) ssmSnapshotStats() map[layout.LayerGroupID]SsmSnapshotStats {
	out := map[layout.LayerGroupID]SsmSnapshotStats{}
	if m.stats.ssm != (SsmSnapshotStats{}) {
		out[m.stats.ssmLC] = m.stats.ssm
	}
	return out
}

func newStatCounters(numLC, numLevels int) statCounters {
	s := statCounters{lc: make([]LayerGroupStats, numLC), cachedTokens: make([]int64, numLevels)}
	s.reusedFull, s.reusedPartial = make([][]int64, numLC), make([][]int64, numLC)
	for lc := range s.reusedFull {
		s.reusedFull[lc], s.reusedPartial[lc] = make([]int64, numLevels), make([]int64, numLevels)
	}
	return s
}

func (s *statCounters) count(d BlockStats) {
	s.total.add(d)
	s.iter.add(d)
}

// onCreate counts a new cache's reuse and returns what it counted (the
// cache's own counters start from it).
func (s *statCounters) onCreate(inputBlocks, reusedFull int, partial bool) BlockStats {
	reused := reusedFull
	if partial {
		reused++
	}
	d := BlockStats{
		AllocTotalBlocks: int64(reused), ReusedBlocks: int64(reused),
		MissedBlocks: int64(max(inputBlocks-reusedFull, 0)),
	}
	s.count(d)
	return d
}

// onAllocate counts blocks Resize allocated and returns what it counted.
func (s *statCounters) onAllocate(newBlocks int) BlockStats {
	d := BlockStats{AllocTotalBlocks: int64(newBlocks), AllocNewBlocks: int64(newBlocks)}
	s.count(d)
	return d
}

// onCreatePages counts a new cache's pages per layer group: the shared tree
// pages of its first full blocks by the level each was on and the tokens they
// hold (the manager's by-level counts), and, pending in the cache, what
// KVCacheManagerV2 counts for a reuse in each attention layer group (the SSM
// layer group's state counts as a snapshot lookup instead):
//   - every page the cache reuses is a reused block, a full one for a full
//     block of the path, a partial one for the matching head of one more
//     block; reuse allocates nothing and misses nothing (a block is missed
//     when Resize allocates it, see onAllocateBlocks);
//   - the partial block's private copy is one allocation (a fresh GPU page,
//     not missed: the tree still offers its source) and one intra-device
//     copy, which counts at once as page movements do.
//
// A reused block's tokens count at the coldest level of its pages, the
// partial tokens at the GPU level. The k blocks of the path from block from
// are a fresh run's (see freshrun.go): computed, not reused.
func (m *Manager) onCreatePages(c *KVCache, mt match, from, k int) {
	s, lt, tpb := &m.stats, m.lt, m.cfg.TokensPerBlock
	for b := range mt.path {
		if b >= from && b < from+k {
			continue
		}
		coldest := 0
		for lc, p := range c.blocks[b].pages {
			if p == nil {
				continue
			}
			lvl := p.level()
			coldest = max(coldest, lvl)
			s.reusedFull[lc][lvl]++
		}
		s.cachedTokens[coldest] += int64(tpb)
	}
	if mt.partLen > 0 {
		s.cachedTokens[0] += int64(mt.partLen)
	}
	for lc := range s.lc {
		if lt.IsSSM(layout.LayerGroupID(lc)) {
			continue
		}
		full := int64(0)
		for b := range mt.path {
			if b >= from && b < from+k {
				continue
			}
			if c.blocks[b].pages[lc] != nil {
				full++
			}
		}
		partial := int64(0)
		if mt.partLen > 0 && c.blocks[len(mt.path)].pages[lc] != nil {
			partial = 1
			s.reusedPartial[lc][0]++
			s.onMoved(layout.LayerGroupID(lc), HotToHot, m.levels[0].groupOf(layout.LayerGroupID(lc)).desc.PageBytes())
		}
		if full+partial == 0 {
			continue
		}
		st := c.pendingOf(lc)
		st.FullReusedBlocks += full
		st.PartialReusedBlocks += partial
		st.ReusedBlocks += full + partial
		st.AllocTotalBlocks += partial
		st.AllocNewBlocks += partial
	}
}

// RequestStats counts one cache's blocks as KVCacheManagerV2's per-request
// KVCacheStatsDelta does: the sums, over the attention layer groups, of the
// cache's LayerGroupStats of the same names (so a block counts once per
// attention layer group holding a page for it). AllocTotalBlocks equals
// AllocNewBlocks; a reused block is not an allocation.
type RequestStats struct {
	AllocTotalBlocks, AllocNewBlocks, ReusedBlocks, MissedBlocks int64
}

// PendingRequestStats returns the cache's pending counts (PendingStats) as
// one RequestStats: what CommitPendingStats would commit now, all zero when
// nothing is pending.
func (c *KVCache) PendingRequestStats() RequestStats {
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	var out RequestStats
	for lc, st := range c.pending {
		if c.m.lt.IsSSM(layout.LayerGroupID(lc)) {
			continue
		}
		out.AllocTotalBlocks += st.AllocTotalBlocks
		out.AllocNewBlocks += st.AllocNewBlocks
		out.ReusedBlocks += st.ReusedBlocks
		out.MissedBlocks += st.MissedBlocks
	}
	return out
}

// pendingOf returns the cache's pending counts of layer group lc.
func (c *KVCache) pendingOf(lc int) *LayerGroupStats {
	if c.pending == nil {
		c.pending = make([]LayerGroupStats, len(c.m.stats.lc))
	}
	return &c.pending[lc]
}

// allocRun is a run of blocks [begin, end) whose pages of layer group lc
// (beams of them per block) a cache holds as pending allocations, all of
// them generation-phase or all missed: what a shrink takes back.
type allocRun struct {
	lc, begin, end, beams int
	generation            bool
}

// count adds the run's blocks from..to (within it) to st, or takes them
// back with sign -1.
func (r allocRun) count(st *LayerGroupStats, from, to int, sign int64) {
	k := sign * int64((to-from)*r.beams)
	st.AllocNewBlocks += k
	st.AllocTotalBlocks += k
	if r.generation {
		st.GenAllocBlocks += k
	} else {
		st.MissedBlocks += k
	}
}

// onAllocateBlocks counts, pending in the cache, the pages Resize (or a
// fresh run at creation) allocated for blocks from..to in the attention
// layer groups, as KVCacheManagerV2 counts them: each page (beams per block)
// is one allocation, a generation-phase one once the history reached the
// prompt and a missed block before (a prefill block the cache computes).
// has reports whether block b got a page of layer group lc (nil: every
// block did). The SSM layer group has no pages per block.
func (c *KVCache) onAllocateBlocks(from, to int, has func(b, lc int) bool, beams int, generation bool) {
	for lc := range c.m.lt.LifeCycles {
		if c.m.lt.IsSSM(layout.LayerGroupID(lc)) {
			continue
		}
		for b := from; b < to; {
			if has != nil && !has(b, lc) {
				b++
				continue
			}
			end := b + 1
			for end < to && (has == nil || has(end, lc)) {
				end++
			}
			r := allocRun{lc: lc, begin: b, end: end, beams: beams, generation: generation}
			r.count(c.pendingOf(lc), b, end, 1)
			if n := len(c.allocRuns); n > 0 {
				if last := &c.allocRuns[n-1]; last.lc == lc && last.end == b && last.beams == beams && last.generation == generation {
					last.end = end
					b = end
					continue
				}
			}
			c.allocRuns = append(c.allocRuns, r)
			b = end
		}
	}
}

// onShrink takes back, as KVCacheManagerV2 does, the pending allocations of
// blocks from..to that a shrinking Resize released: the latest runs first,
// down to the first run ending at or before from (committed or discarded
// allocations are no longer pending and stay counted).
func (c *KVCache) onShrink(from, to int) {
	for i := len(c.allocRuns) - 1; i >= 0; i-- {
		r := &c.allocRuns[i]
		if r.end <= from {
			break
		}
		lo, hi := max(from, r.begin), min(to, r.end)
		if lo >= hi {
			continue
		}
		r.count(c.pendingOf(r.lc), lo, hi, -1)
		if lo <= r.begin {
			c.allocRuns = slices.Delete(c.allocRuns, i, i+1)
		} else {
			r.end = lo
		}
	}
}

// onMoved counts one page's migration on path, of bytes as it travels.
func (s *statCounters) onMoved(lc layout.LayerGroupID, path Path, bytes int64) {
	st := &s.lc[lc]
	switch path {
	case HotToHot:
		st.IntraDeviceCopyBlocks++
		st.IntraDeviceCopyBytes += bytes
	case HotToHost, HotToDisk:
		st.OffloadBlocks++
		st.OffloadBytes += bytes
	case HostToHot, DiskToHot:
		st.OnboardBlocks++
		st.OnboardBytes += bytes
	}
}

func (s *LayerGroupStats) add(d LayerGroupStats) {
	s.AllocTotalBlocks += d.AllocTotalBlocks
	s.AllocNewBlocks += d.AllocNewBlocks
	s.ReusedBlocks += d.ReusedBlocks
	s.FullReusedBlocks += d.FullReusedBlocks
	s.PartialReusedBlocks += d.PartialReusedBlocks
	s.MissedBlocks += d.MissedBlocks
	s.GenAllocBlocks += d.GenAllocBlocks
	s.OnboardBlocks += d.OnboardBlocks
	s.OnboardBytes += d.OnboardBytes
	s.OffloadBlocks += d.OffloadBlocks
	s.OffloadBytes += d.OffloadBytes
	s.IntraDeviceCopyBlocks += d.IntraDeviceCopyBlocks
	s.IntraDeviceCopyBytes += d.IntraDeviceCopyBytes
	s.HostDroppedBlocks += d.HostDroppedBlocks
	s.HostDroppedBytes += d.HostDroppedBytes
}

// CommitPendingStats adds the cache's pending per-layer-group counts (its
// reuse and partial copy at creation, the pages Resize allocated for it
// since; see LayerGroupStats for the rules) to the manager's iteration statistics (GetAndResetLayerGroupIterationStats),
// and its SSM snapshot lookup to GetAndResetSsmSnapshotIterationStats,
// and clears them, as KVCacheManagerV2's commit_pending_stats does. Page
// movements (onboard, offload, copies, host drops) are not pending: they
// count when they happen. A closed cache has nothing pending.
func (c *KVCache) CommitPendingStats() {
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	for lc, d := range c.pending {
		c.m.stats.lc[lc].add(d)
	}
	c.pending, c.allocRuns = nil, c.allocRuns[:0]
	if c.pendingSsm != (SsmSnapshotStats{}) {
		c.m.stats.ssm.add(c.pendingSsm)
		c.m.stats.ssmLC = c.m.lt.SSM
		c.pendingSsm = SsmSnapshotStats{}
	}
}

// DiscardPendingStats drops the cache's pending per-layer-group counts and
// SSM snapshot lookup: they never reach the manager's iteration statistics.
// Close drops them too.
func (c *KVCache) DiscardPendingStats() {
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	c.pending, c.allocRuns = nil, c.allocRuns[:0]
	c.pendingSsm = SsmSnapshotStats{}
}

// PendingStats returns the cache's pending per-layer-group counts, indexed
// by layer group (all zero when none is pending).
func (c *KVCache) PendingStats() []LayerGroupStats {
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	out := make([]LayerGroupStats, len(c.m.stats.lc))
	copy(out, c.pending)
	return out
}

func (s *statCounters) onEvict() { s.count(BlockStats{Evictions: 1}) }

func (s *statCounters) onLost() { s.count(BlockStats{LostPages: 1}) }

// MigrationStats returns the pages and bytes moved on every migration path
// since the manager was created. Offload is the sum of the paths leaving the
// GPU, onboard of those reaching it.
func (m *Manager) MigrationStats() map[Path]MigrationCounter {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[Path]MigrationCounter, numPaths)
	for p, c := range m.migrations {
		out[Path(p)] = c
	}
	return out
}

// Stats returns the cumulative block statistics, with every failure known
// now accounted.
func (m *Manager) Stats() BlockStats {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.closed {
		m.settle()
	}
	return m.stats.total
}

// GetAndResetIterationStats returns the block statistics since the previous
// call and starts a new iteration.
func (m *Manager) GetAndResetIterationStats() BlockStats {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.closed {
		m.settle()
	}
	s := m.stats.iter
	m.stats.iter = BlockStats{}
	return s
}

// GetAndResetLayerGroupIterationStats returns each layer group's counters
// since the previous call, indexed by layer group, and starts a new
// iteration of them. A cache's reuse and allocation counts are there once it
// committed them (KVCache.CommitPendingStats); page movements count when they
// happen.
func (m *Manager) GetAndResetLayerGroupIterationStats() []LayerGroupStats {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := slices.Clone(m.stats.lc)
	clear(m.stats.lc)
	return out
}

// ReusedBlocksByLevel counts one layer group's reused pages of an iteration
// by the level each was on when a new cache reused it (indexed by level).
type ReusedBlocksByLevel struct {
	Full, Partial []int64
}

// GetAndResetIterationReusedBlocksByLevel returns, indexed by layer group,
// the pages reused since the previous call by the level they were on, and
// restarts the count.
func (m *Manager) GetAndResetIterationReusedBlocksByLevel() []ReusedBlocksByLevel {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := &m.stats
	out := make([]ReusedBlocksByLevel, len(s.reusedFull))
	for lc := range out {
		out[lc] = ReusedBlocksByLevel{Full: slices.Clone(s.reusedFull[lc]), Partial: slices.Clone(s.reusedPartial[lc])}
		clear(s.reusedFull[lc])
		clear(s.reusedPartial[lc])
	}
	return out
}

// GetAndResetIterationCachedTokensByLevel returns, indexed by level, the
// tokens new caches reused since the previous call by the level their data
// was on (a full block's tokens at the coldest level of its pages, partially
// reused tokens at the GPU level), and restarts the count.
func (m *Manager) GetAndResetIterationCachedTokensByLevel() []int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := slices.Clone(m.stats.cachedTokens)
	clear(m.stats.cachedTokens)
	return out
}

// PoolGroupStats is the state of one pool group of one level, in slots.
// Available = Free + Evictable.
type PoolGroupStats struct {
	Level      layout.CacheLevel
	Tier       config.TierKind
	Index      layout.PoolGroupIndex
	LifeCycles []layout.LayerGroupID
	PageBytes  int64
	Total      int64
	Free       int64
	Evictable  int64
	Available  int64
}

// StorageStats returns the state of every pool group of level, in that
// level's own grouping order.
func (m *Manager) StorageStats(level layout.CacheLevel) ([]PoolGroupStats, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	lvl, err := m.level(level)
	if err != nil {
		return nil, err
	}
	out := make([]PoolGroupStats, 0, len(lvl.groups))
	for _, g := range lvl.groups {
		free, ev := int64(g.free.len()), int64(g.victims.len())
		out = append(out, PoolGroupStats{
			Level: level, Tier: lvl.kind, Index: g.desc.Index, LifeCycles: g.desc.LifeCycles,
			PageBytes: g.desc.PageBytes(), Total: g.numSlots, Free: free, Evictable: ev, Available: free + ev,
		})
	}
	return out, nil
}

// PeakBlockStats holds the peaks of one pool group's slot counts during an
// iteration: the most slots in use, and KVCacheManagerV2's peaks of
// available (free + evictable), unavailable (total - available) and
// evictable slots, each the largest it reached.
type PeakBlockStats struct {
	Index       layout.PoolGroupIndex
	PeakUsed    int64
	Total       int64
	Available   int64
	Unavailable int64
	Evictable   int64
}

// GetAndResetIterationPeakBlockStats returns, per pool group of level in that
// level's grouping order, the peaks since the previous call, the current
// counts included (as KVCacheManagerV2 samples its storage before it answers:
// a manager no operation has touched yet reports its free slots as available),
// and restarts the peaks from the current counts.
func (m *Manager) GetAndResetIterationPeakBlockStats(level layout.CacheLevel) ([]PeakBlockStats, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	lvl, err := m.level(level)
	if err != nil {
		return nil, err
	}
	out := make([]PeakBlockStats, 0, len(lvl.groups))
	for _, g := range lvl.groups {
		g.notePeaks()
		out = append(out, PeakBlockStats{Index: g.desc.Index, PeakUsed: g.peakUsed, Total: g.numSlots,
			Available: g.peakAvail, Unavailable: g.peakUnavail, Evictable: g.peakEvictable})
		g.resetPeaks()
	}
	return out, nil
}

func (m *Manager) level(level layout.CacheLevel) (*storageLevel, error) {
	if err := m.checkOpen(); err != nil {
		return nil, err
	}
	if level < 0 || int(level) >= len(m.levels) {
		return nil, argErr("level", "%d out of [0, %d)", level, len(m.levels))
	}
	return m.levels[level], nil
}
