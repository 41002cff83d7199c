package abi

import "github.com/kvcm/kvcm/gen/spec"

// BufferID names one buffer: a layer and a role (KVCacheManagerV2's
// BufferId).
//
//kvcm:struct
//kvcm:since 2
//kvcm:cppvalue BufferName arg
//kvcm:cppdoc BufferName names one buffer: a layer and a role (KVCacheManagerV2's
//kvcm:cppdoc BufferId; kvcm::BufferId is the C struct with a borrowed role).
//kvcm:cppmethod bool operator==(BufferName const& o) const { return layerId == o.layerId && role == o.role; }
//kvcm:go in github.com/kvcm/kvcm/core/layout.BufferKey
type BufferID struct {
	// LayerID is the buffer's layer.
	LayerID int32 `go:"Layer"`
	// Role is the buffer's role within the layer, such as "key".
	Role spec.CStr `own:"borrowed"`
}

// ExpandedBuffer is one buffer of an aggregated page (KVCacheManagerV2's
// ExpandedBuffer).
//
//kvcm:struct
//kvcm:since 2
//kvcm:go out github.com/kvcm/kvcm/core/abimodel.ExpandedBuffer
type ExpandedBuffer struct {
	// Buffer is the buffer's position in the buffers argument of
	// kvcm_manager_get_aggregated_pages.
	Buffer spec.Size
	// Expansion is how many of the buffer's own pages one block holds: 1, or
	// tokens_per_block over its tokens_per_block_override.
	Expansion int32
}

// AggregatedPageDesc is a run of buffers that lie side by side in every GPU
// slot of one pool (KVCacheManagerV2's AggregatedPageDesc): for each
// aggregated page index i of a cache's layer group
// (kvcm_kv_cache_get_aggregated_page_indices), the run's bytes are
// [base + i*stride, base + i*stride + size): one copy moves every buffer of
// the run for that block.
//
//kvcm:struct
//kvcm:since 2
//kvcm:cppvalue AggregatedPage out
//kvcm:cppdoc AggregatedPage is a run of buffers side by side in every GPU slot of one
//kvcm:cppdoc pool (KVCacheManagerV2's AggregatedPageDesc): for an aggregated page index
//kvcm:cppdoc i (KVCache::aggregatedPageIndices), its bytes are
//kvcm:cppdoc [base + i * stride, base + i * stride + size). Each buffer's `buffer` is
//kvcm:cppdoc its position in the list given to KVCacheManager::aggregatedPages.
//kvcm:go out github.com/kvcm/kvcm/core/abimodel.AggregatedPage
type AggregatedPageDesc struct {
	// Base is the run's address in slot 0.
	Base DevicePtr
	// Size is the run's bytes per block, the sum of its buffers'.
	Size int64
	// Stride is the bytes between slots: the pool's slot size.
	Stride int64
	// LayerGroup is the layer group whose page indices address the run.
	LayerGroup LayerGroupID
	// Buffers are the run's buffers in slot order.
	Buffers spec.In[ExpandedBuffer] `len:"NumBuffers" own:"borrowed"`
	// NumBuffers is the length of buffers.
	NumBuffers spec.Size
}

// PageIndexConverter turns base page indices into a buffer's kernel page
// indices (KVCacheManagerV2's PageIndexConverter): base b becomes, for k in
// [0, expansion), (b*scale + offset)*expansion + k, where offset is
// layer_offset for indices counted from the pool's base address (PER_LAYER,
// kvcm_buffer_location.pool_base) and 0 for indices counted from the
// buffer's own base address (SHARED, pool_base + layer_offset * bytes);
// KVCM_BAD_PAGE_INDEX stays KVCM_BAD_PAGE_INDEX. A kernel page index counts
// page_stride bytes (kvcm_manager_get_page_stride).
//
//kvcm:struct
//kvcm:since 2
//kvcm:go out github.com/kvcm/kvcm/core.PageIndexConverter
//kvcm:pyvalue
type PageIndexConverter struct {
	// Scale multiplies a base page index.
	Scale int64
	// Expansion is how many of the buffer's own pages one block holds.
	Expansion int32
	// LayerOffset is the buffer's offset in its pool's slot, in blocks of
	// the buffer (kvcm_buffer_location.offset).
	LayerOffset int64
}

// ManagerGetAggregatedPages merges buffers into the fewest runs of
// contiguous bytes for bulk transfer (KVCacheManagerV2's
// get_aggregated_pages): buffers are grouped by layer group and pool, in the
// order each (layer group, pool) first appears in buffers, sorted by their
// place in the slot, and adjacent ones merge. Each buffer lands in exactly
// one run, so members needs num_buffers entries. The descriptors' buffers
// point into the caller's members buffer. num_descs is always written; when
// descs or members is smaller than needed nothing else is written and
// KVCM_ERR_BUFFER_TOO_SMALL is returned (NULL buffers with capacity 0 ask
// for the count, successfully). An unknown or repeated buffer is
// KVCM_ERR_INVALID_ARGUMENT naming its position.
//
//kvcm:since 2
//kvcm:thread manager
//kvcm:call AggregatedPages
//kvcm:param manager in The manager.
//kvcm:param buffers borrowed,nullable,len=numBuffers,convert The buffers to aggregate, in any order (NULL only when num_buffers is 0).
//kvcm:param numBuffers in The number of buffers.
//kvcm:param descs out,nullable,len=descsCap,buffer=numDescs Receives the runs.
//kvcm:param descsCap in Capacity of descs, in elements.
//kvcm:param members out,nullable,len=membersCap,of=descs.buffers Receives every run's buffers.
//kvcm:param membersCap in Capacity of members, in elements.
//kvcm:param numDescs out Receives the number of runs.
type ManagerGetAggregatedPages func(manager Manager, buffers spec.In[BufferID], numBuffers spec.Size, descs spec.Out[AggregatedPageDesc], descsCap spec.Size, members spec.Out[ExpandedBuffer], membersCap spec.Size, numDescs spec.Out[spec.Size]) *Status

// ManagerGetPageIndexConverter returns the page index converter of the
// buffer of a layer and role (KVCacheManagerV2's get_page_index_converter).
//
//kvcm:since 2
//kvcm:thread manager
//kvcm:call Core().PageIndexConverter
//kvcm:param manager in The manager.
//kvcm:param layerID in The layer id.
//kvcm:param role borrowed,string,go=github.com/kvcm/kvcm/core/config.DataRole The buffer's role, such as "key".
//kvcm:param out out,result Receives the converter.
type ManagerGetPageIndexConverter func(manager Manager, layerID int32, role spec.CStr, out spec.Out[PageIndexConverter]) *Status

// ManagerGetPageStride returns the bytes between consecutive kernel page
// indices of a buffer (KVCacheManagerV2's get_page_stride): its bytes per
// block over its expansion.
//
//kvcm:since 2
//kvcm:thread manager
//kvcm:call PageStride
//kvcm:param manager in The manager.
//kvcm:param layerID in The layer id.
//kvcm:param role borrowed,string,go=github.com/kvcm/kvcm/core/config.DataRole The buffer's role, such as "key".
//kvcm:param out out,result Receives the stride in bytes.
type ManagerGetPageStride func(manager Manager, layerID int32, role spec.CStr, out spec.Out[int64]) *Status

// ManagerGetPageIndexUpperBound returns one past the largest SHARED kernel
// page index of a buffer (KVCacheManagerV2's get_page_index_upper_bound):
// its pool, viewed from the buffer's own base address as an array of the
// buffer's pages, so that an engine can wrap it as a tensor.
//
//kvcm:since 2
//kvcm:thread manager
//kvcm:call Core().PageIndexUpperBound
//kvcm:param manager in The manager.
//kvcm:param layerID in The layer id.
//kvcm:param role borrowed,string,go=github.com/kvcm/kvcm/core/config.DataRole The buffer's role, such as "key".
//kvcm:param out out,result Receives the bound.
type ManagerGetPageIndexUpperBound func(manager Manager, layerID int32, role spec.CStr, out spec.Out[int64]) *Status

// KVCacheGetAggregatedPageIndices writes, for an ACTIVE cache, the
// aggregated page index of each block of a layer group in a beam
// (KVCacheManagerV2's get_aggregated_page_indices): the block's GPU slot,
// which addresses every kvcm_aggregated_page_desc of the layer group, and
// KVCM_BAD_PAGE_INDEX where the block has no page; with valid_only only the
// blocks that have one. beam is in [0, beam width) (KVCM_DEFAULT_BEAM_INDEX
// for a single-beam cache).
//
//kvcm:since 2
//kvcm:thread manager
//kvcm:call Core().AggregatedPageIndices
//kvcm:param cache in The cache.
//kvcm:param layerGroup in The layer group.
//kvcm:param beam in The beam.
//kvcm:param validOnly in Whether to skip blocks without a page.
//kvcm:param indices out,nullable,len=capacity,buffer=needed,go=int32 Receives the indices.
//kvcm:param capacity in Capacity of indices, in elements.
//kvcm:param needed out Receives the number of indices.
type KVCacheGetAggregatedPageIndices func(cache KVCache, layerGroup LayerGroupID, beam int32, validOnly bool, indices spec.Out[int32], capacity spec.Size, needed spec.Out[spec.Size]) *Status
