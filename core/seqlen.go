package core

import (
	"github.com/kvcm/kvcm/core/config"
	"github.com/kvcm/kvcm/core/layout"
)

// ClampMaxSeqLenForMem returns the longest sequence, at most upperBound
// tokens, whose pages fit the GPU level's slots next to batchSize-1
// one-token requests (KVCacheManagerV2's clamp_max_seq_len_for_mem): a
// layer group needs, for n computed tokens, its sink blocks and the blocks
// of its window. It returns 0 when not even one token fits, and counts slots,
// not free ones: what the level could hold with nothing cached.
func (m *Manager) ClampMaxSeqLenForMem(batchSize, upperBound int) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.checkOpen(); err != nil {
		return 0, err
	}
	switch {
	case batchSize <= 0:
		return 0, argErr("batch_size", "must be positive, got %d", batchSize)
	case upperBound < 0:
		return 0, argErr("token_num_upper_bound", "must not be negative, got %d", upperBound)
	}
	upperBound = min(upperBound, MaxCapacity)
	lvl := m.levels[0]
	remaining := make([]int64, len(lvl.groups))
	for i, g := range lvl.groups {
		remaining[i] = g.numSlots
	}
	need := func(n int) []int64 {
		out := make([]int64, len(lvl.groups))
		for lc := range m.lt.LifeCycles {
			id := layout.LayerGroupID(lc)
			out[lvl.lcMap[id]] += m.lt.PagesNeeded(id, config.RequestDesc{Capacity: n, HistoryLength: n})
		}
		return out
	}
	for i, k := range need(1) {
		if remaining[i] -= k * int64(batchSize-1); remaining[i] < 0 {
			return 0, nil
		}
	}
	tpb := m.cfg.TokensPerBlock
	fits := func(blocks int) bool {
		for i, k := range need(blocks * tpb) {
			if k > remaining[i] {
				return false
			}
		}
		return true
	}
	if upperBound == 0 || !fits(1) {
		return 0, nil
	}
	lo, hi := 1, m.lt.BlocksFor(upperBound)
	if fits(hi) {
		return upperBound, nil
	}
	for lo < hi-1 {
		if mid := (lo + hi) / 2; fits(mid) {
			lo = mid
		} else {
			hi = mid
		}
	}
	return min(lo*tpb, upperBound), nil
}
