package abimodel

import (
	"cmp"
	"slices"

	"github.com/kvcm/kvcm/core"
	"github.com/kvcm/kvcm/core/layout"
)

// The get-and-reset statistics as the ABI returns them: rows that carry
// their layer group (and level), taken only when the caller's buffer has
// room for all of them. A size query (room 0) or a buffer too small resets
// nothing, so asking for the size first loses no counts.

// LayerGroupIterationStats is one layer group's iteration counters
// (kvcm_layer_group_iteration_stats).
type LayerGroupIterationStats struct {
	LayerGroup layout.LayerGroupID
	core.LayerGroupStats
}

// SsmSnapshotIterationStats is one SSM layer group's snapshot lookups of an
// iteration (kvcm_ssm_snapshot_iteration_stats).
type SsmSnapshotIterationStats struct {
	LayerGroup layout.LayerGroupID
	core.SsmSnapshotStats
}

// ReusedBlocksAtLevel counts one layer group's pages reused from one level
// during an iteration (kvcm_reused_blocks_at_level).
type ReusedBlocksAtLevel struct {
	LayerGroup    layout.LayerGroupID
	Level         layout.CacheLevel
	FullBlocks    int64
	PartialBlocks int64
}

// takeIfFits returns take() and its length when room holds all n entries,
// otherwise nil and n without calling take. Room 0 takes nothing, also when
// n is 0 (an entry counted after n was read is then not lost).
func takeIfFits[T any](n, room int, take func() []T) ([]T, int) {
	if room < n || room == 0 {
		return nil, n
	}
	got := take()
	return got, len(got)
}

// GetAndResetLayerGroupIterationStats returns every layer group's counters
// since the last reset, in layer group order, and resets them, when room
// holds one row per layer group; otherwise nil and the number of rows,
// resetting nothing.
func (mgr *Manager) GetAndResetLayerGroupIterationStats(room int) ([]LayerGroupIterationStats, int, error) {
	rows, n := takeIfFits(mgr.m.NumLayerGroups(), room, func() []LayerGroupIterationStats {
		stats := mgr.m.GetAndResetLayerGroupIterationStats()
		out := make([]LayerGroupIterationStats, len(stats))
		for lg, s := range stats {
			out[lg] = LayerGroupIterationStats{LayerGroup: layout.LayerGroupID(lg), LayerGroupStats: s}
		}
		return out
	})
	return rows, n, nil
}

// GetAndResetSsmSnapshotIterationStats returns the snapshot lookups of the
// SSM layer groups that had any since the last reset, in layer group order,
// and resets them, when room holds them all; otherwise nil and their number,
// resetting nothing.
func (mgr *Manager) GetAndResetSsmSnapshotIterationStats(room int) ([]SsmSnapshotIterationStats, int, error) {
	rows, n := takeIfFits(len(mgr.m.SsmSnapshotIterationStats()), room, func() []SsmSnapshotIterationStats {
		byLG := mgr.m.GetAndResetSsmSnapshotIterationStats()
		out := make([]SsmSnapshotIterationStats, 0, len(byLG))
		for lg, s := range byLG {
			out = append(out, SsmSnapshotIterationStats{LayerGroup: lg, SsmSnapshotStats: s})
		}
		slices.SortFunc(out, func(a, b SsmSnapshotIterationStats) int { return cmp.Compare(a.LayerGroup, b.LayerGroup) })
		return out
	})
	return rows, n, nil
}

// GetAndResetIterationReusedBlocksByLevel returns the pages reused since the
// last reset, one row per layer group and level (layer group major), and
// resets the counts, when room holds every row; otherwise nil and the number
// of rows, resetting nothing.
func (mgr *Manager) GetAndResetIterationReusedBlocksByLevel(room int) ([]ReusedBlocksAtLevel, int, error) {
	n := mgr.m.NumLayerGroups() * len(mgr.m.Layout().Levels)
	rows, n := takeIfFits(n, room, func() []ReusedBlocksAtLevel {
		var out []ReusedBlocksAtLevel
		for lg, r := range mgr.m.GetAndResetIterationReusedBlocksByLevel() {
			for level := range r.Full {
				out = append(out, ReusedBlocksAtLevel{LayerGroup: layout.LayerGroupID(lg), Level: layout.CacheLevel(level),
					FullBlocks: r.Full[level], PartialBlocks: r.Partial[level]})
			}
		}
		return out
	})
	return rows, n, nil
}

// GetAndResetIterationCachedTokensByLevel returns the tokens reused since
// the last reset by the level their data was on, one count per level, and
// resets them, when room holds a count per level; otherwise nil and the
// number of levels, resetting nothing.
func (mgr *Manager) GetAndResetIterationCachedTokensByLevel(room int) ([]int64, int, error) {
	counts, n := takeIfFits(len(mgr.m.Layout().Levels), room, mgr.m.GetAndResetIterationCachedTokensByLevel)
	return counts, n, nil
}
