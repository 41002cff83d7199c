package layout

import (
	"cmp"
	"fmt"
	"slices"
)

// ExpandedBuffer is one buffer of an aggregated page with its expansion: how
// many of the buffer's own pages one block holds (1, or tokens_per_block
// over the buffer's tokens_per_block_override).
type ExpandedBuffer struct {
	Buffer    BufferKey
	Expansion int
}

// AggregatedPage is a run of buffers that lie side by side in every slot of
// one pool of a layer group: for slot s of the pool, the run's bytes are
// [s*SlotBytes + Offset, s*SlotBytes + Offset + Size) from the pool's base.
type AggregatedPage struct {
	LayerGroup LayerGroupID
	Pool       int
	// Offset is the run's first byte within a slot.
	Offset int64
	// Size is the run's bytes per slot: the sum of its buffers' sizes.
	Size int64
	// SlotBytes is the pool's slot size, the stride between slots.
	SlotBytes int64
	// Buffers are the run's buffers in slot order.
	Buffers []ExpandedBuffer
}

// AggregatedPages merges buffers into the fewest runs of contiguous bytes
// (KVCacheManagerV2's get_aggregated_pages): buffers are grouped by layer
// group and pool, in the order each (layer group, pool) first appears in
// buffers, and within a pool sorted by their offset in the slot; adjacent
// ones merge into one run. The order of buffers does not matter otherwise.
// An unknown or repeated buffer is an error naming it.
func (lt *Layout) AggregatedPages(buffers []BufferKey) ([]AggregatedPage, error) {
	type poolKey struct {
		lg   LayerGroupID
		pool int
	}
	var order []poolKey
	members := map[poolKey][]BufferKey{}
	seen := make(map[BufferKey]int, len(buffers))
	for i, b := range buffers {
		loc, ok := lt.Buffers[b]
		if !ok {
			return nil, fmt.Errorf("buffers[%d]: no buffer %q in layer %d", i, b.Role, b.Layer)
		}
		if j, dup := seen[b]; dup {
			return nil, fmt.Errorf("buffers[%d]: buffer %q of layer %d is buffers[%d] already", i, b.Role, b.Layer, j)
		}
		seen[b] = i
		k := poolKey{loc.LifeCycle, loc.Pool}
		if _, ok := members[k]; !ok {
			order = append(order, k)
		}
		members[k] = append(members[k], b)
	}
	var out []AggregatedPage
	for _, k := range order {
		bs := members[k]
		slices.SortFunc(bs, func(a, b BufferKey) int { return cmp.Compare(lt.Buffers[a].Offset, lt.Buffers[b].Offset) })
		pool := lt.LifeCycles[k.lg].Pools[k.pool]
		var run *AggregatedPage
		for _, b := range bs {
			loc := lt.Buffers[b]
			start := loc.Offset * loc.Bytes
			if run == nil || run.Offset+run.Size != start {
				out = append(out, AggregatedPage{LayerGroup: k.lg, Pool: k.pool, Offset: start, SlotBytes: pool.SlotBytes()})
				run = &out[len(out)-1]
			}
			run.Size += loc.Bytes
			run.Buffers = append(run.Buffers, ExpandedBuffer{Buffer: b, Expansion: loc.Expansion})
		}
	}
	return out, nil
}
