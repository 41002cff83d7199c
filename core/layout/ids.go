package layout

import "github.com/kvcm/kvcm/core/device"

// LayerGroupID identifies a layer group: the layers that share one attention
// window shape and therefore allocate and release pages together (the
// design's lifecycle: its LayerGroupId and LifeCycleId are one ID). It is the
// stable semantic key of the storage layout.
type LayerGroupID int32

// PoolGroupIndex identifies a pool group within one cache level. Indices of
// different levels are unrelated and must never be compared.
type PoolGroupIndex int32

// CacheLevel orders the cache tiers from hottest (0, GPU) to coldest.
type CacheLevel int32

// GPULevel is the hot level, where batches execute.
const GPULevel CacheLevel = 0

// PoolDesc describes one pool of a pool group: its base address and the bytes
// each slot occupies in it. Slot s of the pool starts at Base + s*SlotBytes.
type PoolDesc struct {
	Base      device.Ptr
	SlotBytes int64
}

// PoolGroupDesc describes one hot pool group as handed to a cold-page codec:
// its index, how many slots it has, the lifecycles whose pages it holds (in
// ascending order), and its pools in slot-layout order. One slot index
// addresses the same slot in every pool of the group; a page of any member
// lifecycle occupies one whole slot.
type PoolGroupDesc struct {
	Index      PoolGroupIndex
	NumSlots   int64
	LifeCycles []LayerGroupID
	Pools      []PoolDesc
}

// PageBytes is the total bytes one slot occupies across all pools.
func (d PoolGroupDesc) PageBytes() int64 {
	var n int64
	for _, p := range d.Pools {
		n += p.SlotBytes
	}
	return n
}
