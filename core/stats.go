package core

import (
	"github.com/kvcm/kvcm/core/config"
	"github.com/kvcm/kvcm/core/layout"
)

// BlockStats counts block allocation outcomes. Blocks are counted once per
// cache, whatever the number of layer groups.
type BlockStats struct {
	// AllocTotalBlocks = AllocNewBlocks + ReusedBlocks.
	AllocTotalBlocks int64
	// AllocNewBlocks were allocated fresh by Resize.
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
}

func (s *statCounters) count(d BlockStats) {
	s.total.add(d)
	s.iter.add(d)
}

func (s *statCounters) onCreate(inputBlocks, reusedFull int, partial bool) {
	reused := reusedFull
	if partial {
		reused++
	}
	s.count(BlockStats{
		AllocTotalBlocks: int64(reused), ReusedBlocks: int64(reused),
		MissedBlocks: int64(max(inputBlocks-reusedFull, 0)),
	})
}

func (s *statCounters) onAllocate(newBlocks int) {
	s.count(BlockStats{AllocTotalBlocks: int64(newBlocks), AllocNewBlocks: int64(newBlocks)})
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

// PoolGroupStats is the state of one pool group of one level, in slots.
// Available = Free + Evictable.
type PoolGroupStats struct {
	Level      layout.CacheLevel
	Tier       config.TierKind
	Index      layout.PoolGroupIndex
	LifeCycles []layout.LifeCycleID
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
		free, ev := int64(len(g.free)), int64(len(g.victims))
		out = append(out, PoolGroupStats{
			Level: level, Tier: lvl.kind, Index: g.desc.Index, LifeCycles: g.desc.LifeCycles,
			PageBytes: g.desc.PageBytes(), Total: g.numSlots, Free: free, Evictable: ev, Available: free + ev,
		})
	}
	return out, nil
}

// PeakBlockStats is the largest number of slots in use in one pool group
// during an iteration.
type PeakBlockStats struct {
	Index    layout.PoolGroupIndex
	PeakUsed int64
	Total    int64
}

// GetAndResetIterationPeakBlockStats returns, per pool group of level in that
// level's grouping order, the peak of used slots since the previous call, and
// restarts the peaks from the current use.
func (m *Manager) GetAndResetIterationPeakBlockStats(level layout.CacheLevel) ([]PeakBlockStats, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	lvl, err := m.level(level)
	if err != nil {
		return nil, err
	}
	out := make([]PeakBlockStats, 0, len(lvl.groups))
	for _, g := range lvl.groups {
		out = append(out, PeakBlockStats{Index: g.desc.Index, PeakUsed: g.peakUsed, Total: g.numSlots})
		g.peakUsed = g.used()
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
