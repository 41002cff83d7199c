package abi

import "github.com/kvcm/kvcm/gen/spec"

// BufferLocation says where the buffer of a layer and role lives in the hot
// layout. For base page index b (from kvcm_kv_cache_get_base_page_indices),
// the buffer's kernel-facing page index is b*scale + offset, and its block of
// data starts at pool_base + (b*scale + offset) * bytes: page indices count
// in units of bytes (the buffer's size per block) from pool_base.
//
//kvcm:struct
//kvcm:since 1
//kvcm:go out github.com/kvcm/kvcm/core.BufferLocation
//kvcm:pyvalue
type BufferLocation struct {
	// LayerGroup is the buffer's layer group.
	LayerGroup LayerGroupID `go:"LifeCycle"`
	// Pool is the buffer's pool within its hot pool group.
	Pool int32
	// PoolBase is the pool's base address; it never changes.
	PoolBase DevicePtr
	// Scale multiplies a base page index.
	Scale int64
	// Offset is added to the scaled base page index.
	Offset int64
	// Bytes is the buffer's size per block (its stride unit).
	Bytes int64
}

// BlockStats counts block allocation outcomes as kvcm counts them (as
// TensorRT-LLM's V1 manager does): blocks are counted once per cache,
// whatever the number of layer groups, and reused blocks are part of the
// allocations. KVCacheManagerV2's counts are kvcm_kv_cache_stats_delta (a
// cache's) and kvcm_layer_group_iteration_stats (a layer group's).
//
//kvcm:struct
//kvcm:since 1
//kvcm:go out github.com/kvcm/kvcm/core.BlockStats
//kvcm:pyvalue
type BlockStats struct {
	// AllocTotalBlocks = alloc_new_blocks + reused_blocks.
	AllocTotalBlocks int64
	// AllocNewBlocks were allocated fresh by resize.
	AllocNewBlocks int64
	// ReusedBlocks were matched at creation (partial ones too).
	ReusedBlocks int64
	// MissedBlocks are full input blocks that were not reused.
	MissedBlocks int64
	// Evictions counts pages evicted from any level.
	Evictions int64
	// LostPages counts pages whose migration failed asynchronously.
	LostPages int64
	// HitRate is reused_blocks / (reused_blocks + missed_blocks), 0 when
	// nothing was looked up.
	HitRate float64 `go:"HitRate()"`
}

// PoolGroupStats is the state of one pool group of one level, in slots.
// available = free + evictable.
//
//kvcm:struct
//kvcm:since 1
//kvcm:go out github.com/kvcm/kvcm/core.PoolGroupStats
//kvcm:pyvalue
type PoolGroupStats struct {
	// Level is the cache level.
	Level CacheLevel
	// Tier is the level's tier kind.
	Tier TierKind
	// Index is the pool group's index within its level.
	Index PoolGroupIndex
	// PageBytes is the bytes of one page (slot) of the group.
	PageBytes int64
	// Total is the group's slots.
	Total int64
	// Free is the group's unused slots.
	Free int64
	// Evictable is the group's slots held only by the cache (reusable).
	Evictable int64
	// Available = free + evictable.
	Available int64
}

// PeakBlockStats is the largest number of slots in use in one pool group
// during an iteration.
//
//kvcm:struct
//kvcm:since 1
//kvcm:go out github.com/kvcm/kvcm/core.PeakBlockStats
//kvcm:pyvalue
type PeakBlockStats struct {
	// Index is the pool group's index within its level.
	Index PoolGroupIndex
	// PeakUsed is the peak of used slots since the previous call.
	PeakUsed int64
	// Total is the group's slots.
	Total int64
}

// MigrationStats counts the pages and bytes moved on one migration path
// (bytes as they travel: hot page bytes on GPU to GPU, cold blob bytes
// otherwise).
//
//kvcm:struct
//kvcm:since 1
//kvcm:go out github.com/kvcm/kvcm/core/abimodel.PathMigrationStats
//kvcm:pyvalue
type MigrationStats struct {
	// Path is the migration path.
	Path MigrationPath
	// Pages is the number of pages moved.
	Pages int64
	// Bytes is the number of bytes moved.
	Bytes int64
}

// CacheEvent reports a change of the set of reusable blocks. seq increases
// by one per event of a manager, starting at 1.
//
//kvcm:struct
//kvcm:since 1
//kvcm:cppns c
//kvcm:go out github.com/kvcm/kvcm/core.CacheEvent
//kvcm:cppvalue CacheEvent out order=seq,kind,key,parent,layerGroup,level,tokens,cacheId
//kvcm:pyvalue order=seq,kind,key,parent,tokens,layer_group,level,cache_id
//kvcm:cppdoc One cache event (see KVCacheManager::drainEvents).
type CacheEvent struct {
	// Seq is the event's sequence number.
	Seq uint64
	// Key is the block's chained content hash.
	Key uint64
	// Parent is the key of the previous block (or the scope's root).
	Parent uint64
	// Kind says what happened.
	Kind EventKind
	// LayerGroup is the layer group of an updated page.
	LayerGroup LayerGroupID
	// Level is the level an updated page is on now, or -1 when that layer
	// group's page was dropped while the block keeps pages of other layer
	// groups (a block losing its last page is KVCM_EVENT_BLOCK_REMOVED).
	Level CacheLevel
	// Tokens of a stored block: points into the caller's token buffer
	// passed to kvcm_manager_drain_events (NULL when num_tokens is 0).
	Tokens spec.In[Token] `len:"NumTokens" nullable:"true" own:"borrowed"`
	// NumTokens is the length of tokens.
	NumTokens spec.Size
	// CacheID is the id (kvcm_kv_cache_get_id) of the cache whose commit
	// stored the block; 0 for other kinds.
	CacheID uint64 `pydefault:"0"`
}

// SsmSnapshotIterationStats counts the SSM snapshot lookups of the SSM layer
// group during an iteration (KVCacheManagerV2's
// SsmSnapshotIterationStatsDelta): one lookup per cache created with input
// tokens, a hit when it reused a snapshot, counted when the cache commits its
// pending statistics (kvcm_kv_cache_commit_pending_stats; discarding or
// closing drops it).
//
//kvcm:struct
//kvcm:since 2
//kvcm:go out github.com/kvcm/kvcm/core/abimodel.SsmSnapshotIterationStats
//kvcm:pyvalue SsmSnapshotIterationStatsDelta prefix=iter_ counters
type SsmSnapshotIterationStats struct {
	// LayerGroup is the SSM layer group.
	LayerGroup LayerGroupID `py:"-"`
	// SnapshotLookups = snapshot_hits + snapshot_misses.
	SnapshotLookups int64 `go:"Lookups"`
	// SnapshotHits are lookups that reused a snapshot.
	SnapshotHits int64 `go:"Hits"`
	// SnapshotMisses are lookups that reused none.
	SnapshotMisses int64 `go:"Misses"`
	// ReusedTokens are the input tokens the hits reused.
	ReusedTokens int64
	// UnreusedTokens are the lookups' input tokens left to compute.
	UnreusedTokens int64
	// AlignedSnapshotHits are hits on a block boundary (a full block's
	// snapshot).
	AlignedSnapshotHits int64 `go:"AlignedHits"`
	// UnalignedSnapshotHits are hits inside a block (the state of a partial
	// block published at close).
	UnalignedSnapshotHits int64 `go:"UnalignedHits"`
}

// KVCacheStatsDelta counts one cache's blocks as KVCacheManagerV2's
// per-request KVCacheStatsDelta: the sums, over the attention layer groups,
// of the kvcm_layer_group_iteration_stats fields of the same names that the
// cache counts (a block counts once per attention layer group holding a page
// for it).
//
//kvcm:struct
//kvcm:since 2
//kvcm:go out github.com/kvcm/kvcm/core.RequestStats
//kvcm:pyvalue KVCacheStatsDelta counters
type KVCacheStatsDelta struct {
	// AllocTotalBlocks are the pages allocated for the cache (equal to
	// alloc_new_blocks: a reused page is no allocation).
	AllocTotalBlocks int64
	// AllocNewBlocks are the pages allocated for the cache.
	AllocNewBlocks int64
	// ReusedBlocks are the pages the cache reused (full and partial blocks).
	ReusedBlocks int64
	// MissedBlocks are the pages allocated while the cache's history was
	// short of its prompt.
	MissedBlocks int64
}

// LayerGroupIterationStats counts one layer group's page outcomes and moves
// during an iteration (KVCacheManagerV2's KVCacheIterationStatsDelta), by
// KVCacheManagerV2's rules: a reuse counts reused blocks only; every page
// allocated for a cache (by resize, a fresh run, or a partial block's
// private copy) is an allocation, a missed block while the cache's history
// is short of its prompt and generation-phase growth after. A block counts
// in a layer group when the layer group has or gets a page for it; the SSM
// layer group counts page moves only.
//
//kvcm:struct
//kvcm:since 2
//kvcm:go out github.com/kvcm/kvcm/core/abimodel.LayerGroupIterationStats
//kvcm:pyvalue KVCacheIterationStatsDelta prefix=iter_ counters
type LayerGroupIterationStats struct {
	// LayerGroup is the layer group.
	LayerGroup LayerGroupID `py:"-"`
	// AllocTotalBlocks are the pages allocated for caches (equal to
	// alloc_new_blocks: a reused page is no allocation).
	AllocTotalBlocks int64
	// AllocNewBlocks are the pages allocated for caches.
	AllocNewBlocks int64
	// ReusedBlocks = full_reused_blocks + partial_reused_blocks.
	ReusedBlocks int64
	// FullReusedBlocks are tree pages new caches share.
	FullReusedBlocks int64
	// PartialReusedBlocks are partially matched blocks new caches copied
	// (each also one allocation and one intra-device copy).
	PartialReusedBlocks int64
	// MissedBlocks are the pages allocated for caches whose history was
	// short of their prompt (prefill blocks they compute).
	MissedBlocks int64
	// GenAllocBlocks are the pages allocated for caches whose history had
	// reached their prompt.
	GenAllocBlocks int64
	// OnboardBlocks are pages brought to the GPU from a colder level.
	OnboardBlocks int64
	// OnboardBytes are their bytes as they travelled.
	OnboardBytes int64
	// OffloadBlocks are pages moved from the GPU to a colder level.
	OffloadBlocks int64
	// OffloadBytes are their bytes as they travelled.
	OffloadBytes int64
	// IntraDeviceCopyBlocks are GPU to GPU page copies.
	IntraDeviceCopyBlocks int64
	// IntraDeviceCopyBytes are their bytes.
	IntraDeviceCopyBytes int64
	// HostDroppedBlocks are pages dropped from the host level.
	HostDroppedBlocks int64
	// HostDroppedBytes are their (cold page) bytes.
	HostDroppedBytes int64
}

// ReusedBlocksAtLevel counts one layer group's pages reused during an
// iteration from one level (the level each was on when a new cache reused
// it).
//
//kvcm:struct
//kvcm:since 2
//kvcm:go out github.com/kvcm/kvcm/core/abimodel.ReusedBlocksAtLevel
type ReusedBlocksAtLevel struct {
	// LayerGroup is the layer group.
	LayerGroup LayerGroupID
	// Level is the cache level.
	Level CacheLevel
	// FullBlocks are shared tree pages reused from the level.
	FullBlocks int64
	// PartialBlocks are partially reused blocks copied from the level.
	PartialBlocks int64
}

// PoolGroupPeakBlockStats holds KVCacheManagerV2's peaks of one pool group
// during an iteration, each the largest count sampled at the end of an
// operation.
//
//kvcm:struct
//kvcm:since 2
//kvcm:go out github.com/kvcm/kvcm/core.PeakBlockStats
//kvcm:pyvalue
type PoolGroupPeakBlockStats struct {
	// Index is the pool group's index within its level.
	Index PoolGroupIndex `py:"-"`
	// Available is the peak of free + evictable slots.
	Available int64
	// Unavailable is the peak of total - available slots.
	Unavailable int64
	// Evictable is the peak of evictable slots.
	Evictable int64
}

// BlockEvent reports a change of the set of reusable blocks, with
// priorities and the level a page left (kvcm_cache_event cannot carry
// them). seq increases by one per event of a manager, starting at 1.
//
//kvcm:struct
//kvcm:since 2
//kvcm:cppns c
//kvcm:go out github.com/kvcm/kvcm/core.CacheEvent
//kvcm:cppvalue BlockEvent out order=seq,kind,key,parent,layerGroup,level,oldLevel,priority,oldPriority,tokens,cacheId
//kvcm:cppdoc One block event of ABI version 2 (see KVCacheManager::drainBlockEvents):
//kvcm:cppdoc a CacheEvent with the block's eviction priority and, for updates, what
//kvcm:cppdoc changed. A page onboarded from the shared tier has
//kvcm:cppdoc KVCacheManager::sharedLevel() as its old level.
type BlockEvent struct {
	// Seq is the event's sequence number.
	Seq uint64
	// Key is the block's chained content hash.
	Key uint64
	// Parent is the key of the previous block (or the scope's root).
	Parent uint64
	// CacheID is the id of the cache whose commit stored the block; 0 for
	// other kinds.
	CacheID uint64
	// Kind says what happened.
	Kind EventKind
	// LayerGroup is the layer group of an updated page.
	LayerGroup LayerGroupID
	// Level is where an updated page is now (-1: dropped while the block
	// keeps pages of other layer groups); 0 for a stored block.
	Level CacheLevel
	// OldLevel is where an updated page was (-1: it filled a gap).
	OldLevel CacheLevel
	// Priority is the block's eviction priority (the new one of a priority
	// update).
	Priority int32
	// OldPriority is the priority before a priority update (else priority).
	OldPriority int32
	// Tokens of a stored block: points into the caller's token buffer
	// (NULL when num_tokens is 0).
	Tokens spec.In[Token] `len:"NumTokens" nullable:"true" own:"borrowed"`
	// NumTokens is the length of tokens.
	NumTokens spec.Size
}

// ManagerCreate validates the configuration, selects the device, derives the
// layout and allocates every level, in the design's order: consume the codec,
// validate, allocate the GPU level, configure the codec with the GPU pool
// groups, query and validate every layer group's cold format, allocate the
// cold levels and staging.
//
// The codec is consumed by this call, on success and on every failure path:
// whatever this function returns (including KVCM_ERR_INVALID_ARGUMENT for a
// NULL out or a bad config, KVCM_ERR_POISONED, or a codec that rejects the
// configuration), the codec's destroy slot has been called (or, for the
// default codec object, the library's codec released) by the time it
// returns, unless the manager now owns the codec. The caller must never use
// or destroy the codec object again. Pass NULL to use the default codec. (A
// codec object whose vtable is NULL, or whose vtable's struct_size does not
// cover the destroy slot, cannot be destroyed: it is reported as
// KVCM_ERR_INVALID_ARGUMENT and leaked.)
//
//kvcm:since 1
//kvcm:thread any
//kvcm:param config borrowed,convert The configuration; read during the call only.
//kvcm:param codec consumed,nullable The cold-page codec object, or NULL for the default codec. Consumed on success and on failure.
//kvcm:param out out Receives the manager handle (0 on failure).
type ManagerCreate func(config spec.In[ManagerConfig], codec spec.In[ColdPageCodec], out spec.Out[Manager]) *Status

// ManagerDestroy closes every KV cache of the manager still open, ACTIVE or
// SUSPENDED, in creation order, as kvcm_kv_cache_close does (their handles
// become invalid; a cache created with a request id notifies its CP index of
// the terminal free), lets go of the attached CP index, synchronizes and
// destroys the streams it created, releases every level's memory, the codec
// and the memory it allocated, and frees the handle. It always releases
// everything: an error is reported after the release, and the handle is
// consumed even then. Go's Manager.Close follows the same rule.
//
//kvcm:since 1
//kvcm:thread handle
//kvcm:param manager consumed The manager to destroy.
type ManagerDestroy func(manager Manager) *Status

// ManagerGetTokensPerBlock returns the configured block size.
//
//kvcm:since 1
//kvcm:thread manager
//kvcm:call Core().TokensPerBlock
//kvcm:param manager in The manager.
//kvcm:param out out,result Receives the tokens per block.
type ManagerGetTokensPerBlock func(manager Manager, out spec.Out[int32]) *Status

// ManagerGetNumLayerGroups returns the number of layer groups.
//
//kvcm:since 1
//kvcm:thread manager
//kvcm:call Core().NumLayerGroups
//kvcm:param manager in The manager.
//kvcm:param out out,result Receives the number of layer groups.
type ManagerGetNumLayerGroups func(manager Manager, out spec.Out[int32]) *Status

// ManagerGetNumLevels returns the number of cache levels (configured tiers).
//
//kvcm:since 1
//kvcm:thread manager
//kvcm:call NumLevels
//kvcm:param manager in The manager.
//kvcm:param out out,result Receives the number of levels.
type ManagerGetNumLevels func(manager Manager, out spec.Out[int32]) *Status

// ManagerGetDeviceKind returns the kind of device the manager selected
// (KVCM_DEVICE_EMU or KVCM_DEVICE_CUDA, never AUTO).
//
//kvcm:since 1
//kvcm:thread manager
//kvcm:call DeviceKind
//kvcm:param manager in The manager.
//kvcm:param out out,result Receives the device kind.
type ManagerGetDeviceKind func(manager Manager, out spec.Out[DeviceKind]) *Status

// ManagerGetLayerGroupOf returns the layer group of a layer.
//
//kvcm:since 1
//kvcm:thread manager
//kvcm:call Core().LayerGroupOf
//kvcm:param manager in The manager.
//kvcm:param layerID in The layer id.
//kvcm:param out out,result Receives the layer group.
type ManagerGetLayerGroupOf func(manager Manager, layerID int32, out spec.Out[LayerGroupID]) *Status

// ManagerGetBufferLocation returns where the buffer of a layer and role
// lives in the hot layout.
//
//kvcm:since 1
//kvcm:thread manager
//kvcm:call Core().Buffer
//kvcm:param manager in The manager.
//kvcm:param layerID in The layer id.
//kvcm:param role borrowed,string,go=github.com/kvcm/kvcm/core/config.DataRole The buffer's role, such as "key".
//kvcm:param out out,result Receives the location.
type ManagerGetBufferLocation func(manager Manager, layerID int32, role spec.CStr, out spec.Out[BufferLocation]) *Status

// ManagerGetPoolGroupDescs describes the pool groups of a level in that
// level's grouping order. For the GPU level these are the descriptors a codec
// is configured with (pools with base addresses; num_slots is the reserved
// maximum). For a cold level each group has one pool of the encoded page size
// and base 0. The descriptors' life_cycles and pools point into the caller's
// life_cycles and pools buffers. The three counts are always written; when
// any buffer is smaller than its count, nothing else is written and
// KVCM_ERR_BUFFER_TOO_SMALL is returned (NULL buffers with capacity 0 ask for
// the counts, successfully).
//
//kvcm:since 1
//kvcm:thread manager
//kvcm:call PoolGroupDescs
//kvcm:param manager in The manager.
//kvcm:param level in The cache level.
//kvcm:param descs out,nullable,len=descsCap,buffer=numDescs Receives the descriptors.
//kvcm:param descsCap in Capacity of descs, in elements.
//kvcm:param lifeCycles out,nullable,len=lifeCyclesCap,of=descs.life_cycles,buffer=numLifeCycles Receives every descriptor's layer groups.
//kvcm:param lifeCyclesCap in Capacity of life_cycles, in elements.
//kvcm:param pools out,nullable,len=poolsCap,of=descs.pools,buffer=numPools Receives every descriptor's pools.
//kvcm:param poolsCap in Capacity of pools, in elements.
//kvcm:param numDescs out Receives the number of descriptors.
//kvcm:param numLifeCycles out Receives the total number of layer-group entries.
//kvcm:param numPools out Receives the total number of pools.
type ManagerGetPoolGroupDescs func(manager Manager, level CacheLevel, descs spec.Out[PoolGroupDesc], descsCap spec.Size, lifeCycles spec.Out[LayerGroupID], lifeCyclesCap spec.Size, pools spec.Out[PoolDesc], poolsCap spec.Size, numDescs spec.Out[spec.Size], numLifeCycles spec.Out[spec.Size], numPools spec.Out[spec.Size]) *Status

// ManagerGetQuota returns the byte quota of a cache level.
//
//kvcm:since 1
//kvcm:thread manager
//kvcm:call Core().Quota
//kvcm:param manager in The manager.
//kvcm:param level in The cache level.
//kvcm:param out out,result Receives the quota in bytes.
type ManagerGetQuota func(manager Manager, level CacheLevel, out spec.Out[int64]) *Status

// ManagerResizeLevel changes the byte quota of a cache level. Shrinking
// evicts what no longer fits, defragments the survivors and releases the
// rest; growing adds slots. GPU pools grow and shrink in place within the
// GPU tier's max_quota, so base addresses and the page indices of ACTIVE
// caches stay valid; for that reason pages of ACTIVE caches never move, and
// shrinking fails with KVCM_ERR_INVALID_STATE while an ACTIVE cache pins a
// page in a slot beyond the new size (suspend or close it first). Shrinking
// fails with KVCM_ERR_OUT_OF_PAGES when the pages that cannot be evicted need
// more slots than the new size keeps, and a quota beyond max_quota (GPU), or
// one that would give a pool group more than 2^31-1 slots, fails with
// KVCM_ERR_INVALID_ARGUMENT naming quota. On error the sizes are unchanged
// (pages evicted on the way may have moved to colder levels).
//
//kvcm:since 1
//kvcm:thread manager
//kvcm:call Core().ResizeLevel
//kvcm:param manager in The manager.
//kvcm:param level in The cache level.
//kvcm:param quota in The new quota in bytes (positive).
type ManagerResizeLevel func(manager Manager, level CacheLevel, quota int64) *Status

// ManagerProbeReuse returns how many tokens of an input a new KV cache in a
// scope would reuse now. It changes nothing.
//
//kvcm:since 1
//kvcm:thread manager
//kvcm:call ProbeReuse
//kvcm:param manager in The manager.
//kvcm:param scope borrowed,convert The reuse scope.
//kvcm:param tokens borrowed,nullable,len=numTokens,slice,go=github.com/kvcm/kvcm/core/config.Token The input tokens (NULL only when num_tokens is 0).
//kvcm:param numTokens in The number of tokens.
//kvcm:param out out,result Receives the number of reusable tokens.
type ManagerProbeReuse func(manager Manager, scope spec.In[ReuseScope], tokens spec.In[Token], numTokens spec.Size, out spec.Out[int64]) *Status

// ManagerProbeFirstNewBlockKey returns the key of the first full block of
// an input past its reusable prefix (see kvcm_manager_probe_reuse): the block
// a new KV cache in the scope would compute and commit first. found is false
// (and key 0) when no full block of the input lies past that prefix. It
// changes nothing.
//
//kvcm:since 2
//kvcm:thread manager
//kvcm:call ProbeFirstNewBlockKey
//kvcm:param manager in The manager.
//kvcm:param scope borrowed,convert The reuse scope.
//kvcm:param hasLoraID in,into=scope.HasLoRA Whether scope.lora_id is a LoRA adapter id, 0 included.
//kvcm:param tokens borrowed,nullable,len=numTokens,slice,go=github.com/kvcm/kvcm/core/config.Token The input tokens (NULL only when num_tokens is 0).
//kvcm:param numTokens in The number of tokens.
//kvcm:param key out,result Receives the block's key (its chained content hash).
//kvcm:param found out,result Receives whether there is such a block.
type ManagerProbeFirstNewBlockKey func(manager Manager, scope spec.In[ReuseScope], hasLoraID bool, tokens spec.In[Token], numTokens spec.Size, key spec.Out[uint64], found spec.Out[bool]) *Status

// ManagerProbeReuseV2 is kvcm_manager_probe_reuse with a has_lora_id flag:
// set, scope.lora_id is a LoRA adapter id even when it is 0.
//
//kvcm:since 2
//kvcm:thread manager
//kvcm:call ProbeReuse
//kvcm:param manager in The manager.
//kvcm:param scope borrowed,convert The reuse scope.
//kvcm:param hasLoraID in,into=scope.HasLoRA Whether scope.lora_id is a LoRA adapter id, 0 included.
//kvcm:param tokens borrowed,nullable,len=numTokens,slice,go=github.com/kvcm/kvcm/core/config.Token The input tokens (NULL only when num_tokens is 0).
//kvcm:param numTokens in The number of tokens.
//kvcm:param out out,result Receives the number of reusable tokens.
type ManagerProbeReuseV2 func(manager Manager, scope spec.In[ReuseScope], hasLoraID bool, tokens spec.In[Token], numTokens spec.Size, out spec.Out[int64]) *Status

// ReusePage is one block of a reuse match in one layer group
// (kvcm_manager_probe_reuse_pages): the tokens of the block matched and the
// page covering the most of them, KVCacheManagerV2's partial-coverage page.
//
//kvcm:struct
//kvcm:since 2
//kvcm:go out github.com/kvcm/kvcm/core.ReusePage
type ReusePage struct {
	// Matched are the tokens of the block the match holds (tokens_per_block
	// but in its last block).
	Matched int32
	// Covered are the tokens of the block the page holds the KV of; 0 where
	// no page of the layer group holds the matched tokens.
	Covered int32
	// Level is the page's cache level, -1 without a page.
	Level CacheLevel
	// Slot is the page's slot at its level, KVCM_BAD_PAGE_INDEX without a
	// page.
	Slot int32
}

// ManagerProbeReusePages matches an input against the committed blocks by
// content (whatever their pages) and writes one entry per block of the match
// with the page of a layer group covering the most of it: a block's own page
// covers its tokens, and a block position also has the pages of the partial
// blocks committed beside it whose tokens the block starts with, each
// covering its own tokens (KVCacheManagerV2's partial-coverage pages). The
// match ends with the matching head of one more block: with partial, as far
// as a block there agrees with the input (less than a block); else only at a
// partial block the input holds whole. The matched tokens are the entries'
// matched tokens summed. It changes nothing.
//
//kvcm:since 2
//kvcm:thread manager
//kvcm:param manager in The manager.
//kvcm:param scope borrowed,convert The reuse scope.
//kvcm:param hasLoraID in,into=scope.HasLoRA Whether scope.lora_id is a LoRA adapter id, 0 included.
//kvcm:param tokens borrowed,nullable,len=numTokens,slice,go=github.com/kvcm/kvcm/core/config.Token The input tokens (NULL only when num_tokens is 0).
//kvcm:param numTokens in The number of tokens.
//kvcm:param layerGroup in The layer group.
//kvcm:param partial in Whether the match may end inside a block.
//kvcm:param pages out,nullable,len=capacity,buffer=needed Receives one entry per block of the match.
//kvcm:param capacity in Capacity of pages, in elements.
//kvcm:param needed out Receives the number of entries.
type ManagerProbeReusePages func(manager Manager, scope spec.In[ReuseScope], hasLoraID bool, tokens spec.In[Token], numTokens spec.Size, layerGroup LayerGroupID, partial bool, pages spec.Out[ReusePage], capacity spec.Size, needed spec.Out[spec.Size]) *Status

// ManagerClearReusableBlocks drops every committed block from every level,
// so that nothing is reusable afterwards. As KVCacheManagerV2's, it refuses
// with KVCM_ERR_INVALID_STATE, changing nothing, while KV caches are open.
//
//kvcm:since 2
//kvcm:thread manager
//kvcm:call Core().ClearReusableBlocks
//kvcm:param manager in The manager.
type ManagerClearReusableBlocks func(manager Manager) *Status

// ManagerGetNumOpenCaches returns how many KV caches of the manager are open
// (created and not closed). KVCacheManagerV2's shutdown refuses while any
// is: the bindings' shutdown checks it before kvcm_manager_destroy.
//
//kvcm:since 2
//kvcm:thread manager
//kvcm:call NumOpenCaches
//kvcm:param manager in The manager.
//kvcm:param out out,result Receives the number of open caches.
type ManagerGetNumOpenCaches func(manager Manager, out spec.Out[spec.Size]) *Status

// ManagerGetStats returns the cumulative block statistics.
//
//kvcm:since 1
//kvcm:thread manager
//kvcm:call Core().Stats
//kvcm:param manager in The manager.
//kvcm:param out out,result Receives the statistics.
type ManagerGetStats func(manager Manager, out spec.Out[BlockStats]) *Status

// ManagerGetAndResetIterationStats returns the block statistics since the
// previous call and starts a new iteration.
//
//kvcm:since 1
//kvcm:thread manager
//kvcm:call Core().GetAndResetIterationStats
//kvcm:param manager in The manager.
//kvcm:param out out,result Receives the statistics.
type ManagerGetAndResetIterationStats func(manager Manager, out spec.Out[BlockStats]) *Status

// ManagerGetStorageStats returns the state of every pool group of a level, in
// that level's grouping order.
//
//kvcm:since 1
//kvcm:thread manager
//kvcm:call Core().StorageStats
//kvcm:param manager in The manager.
//kvcm:param level in The cache level.
//kvcm:param stats out,nullable,len=capacity,buffer=needed Receives one entry per pool group.
//kvcm:param capacity in Capacity of stats, in elements.
//kvcm:param needed out Receives the number of pool groups.
type ManagerGetStorageStats func(manager Manager, level CacheLevel, stats spec.Out[PoolGroupStats], capacity spec.Size, needed spec.Out[spec.Size]) *Status

// ManagerGetAndResetIterationPeakBlockStats returns, per pool group of a
// level, the peak of used slots since the previous call, and restarts the
// peaks from the current use. When the buffer is too small nothing is reset.
//
//kvcm:since 1
//kvcm:thread manager
//kvcm:call GetAndResetIterationPeakBlockStats
//kvcm:param manager in The manager.
//kvcm:param level in The cache level.
//kvcm:param stats out,nullable,len=capacity,buffer=needed,reset Receives one entry per pool group.
//kvcm:param capacity in Capacity of stats, in elements.
//kvcm:param needed out Receives the number of pool groups.
type ManagerGetAndResetIterationPeakBlockStats func(manager Manager, level CacheLevel, stats spec.Out[PeakBlockStats], capacity spec.Size, needed spec.Out[spec.Size]) *Status

// ManagerGetMigrationStats returns the pages and bytes moved on every
// migration path since the manager was created, one entry per path in path
// order.
//
//kvcm:since 1
//kvcm:thread manager
//kvcm:call MigrationStats
//kvcm:param manager in The manager.
//kvcm:param stats out,nullable,len=capacity,buffer=needed Receives one entry per path.
//kvcm:param capacity in Capacity of stats, in elements.
//kvcm:param needed out Receives the number of paths.
type ManagerGetMigrationStats func(manager Manager, stats spec.Out[MigrationStats], capacity spec.Size, needed spec.Out[spec.Size]) *Status

// ManagerDrainEvents removes the oldest queued cache events, as many whole
// events as fit in both buffers, and writes them in order; it skips (removes
// without writing) KVCM_EVENT_BLOCK_PRIORITY_UPDATED events, which
// kvcm_cache_event cannot carry (kvcm_manager_drain_block_events reports
// them). A stored block's
// tokens go into the tokens buffer and the event points at them. dropped
// receives the number of events lost to a full queue since the previous
// drain. Call it until num_events is 0 to empty the queue. When events_cap is
// not 0 but the oldest event's tokens do not fit in tokens_cap, nothing is
// removed, num_tokens receives the number of tokens that event needs and
// KVCM_ERR_BUFFER_TOO_SMALL is returned (the dropped count is kept for the
// next drain).
//
//kvcm:since 1
//kvcm:thread manager
//kvcm:call Events().DrainCacheEvents
//kvcm:param manager in The manager.
//kvcm:param events out,nullable,len=eventsCap,buffer=numEvents,take Receives the events.
//kvcm:param eventsCap in Capacity of events, in elements.
//kvcm:param tokens out,nullable,len=tokensCap,of=events.tokens,buffer=numTokens Receives the tokens of stored blocks.
//kvcm:param tokensCap in Capacity of tokens, in elements.
//kvcm:param numEvents out Receives the number of events written.
//kvcm:param numTokens out Receives the number of tokens written (on KVCM_ERR_BUFFER_TOO_SMALL, the tokens the oldest event needs).
//kvcm:param dropped out,nullable,result Receives the number of events dropped since the previous drain.
type ManagerDrainEvents func(manager Manager, events spec.Out[CacheEvent], eventsCap spec.Size, tokens spec.Out[Token], tokensCap spec.Size, numEvents spec.Out[spec.Size], numTokens spec.Out[spec.Size], dropped spec.Out[uint64]) *Status

// ManagerDrainBlockEvents is kvcm_manager_drain_events with kvcm_block_event
// records, which also report KVCM_EVENT_BLOCK_PRIORITY_UPDATED events. Both
// drain the one queue.
//
//kvcm:since 2
//kvcm:thread manager
//kvcm:call Events().Drain
//kvcm:param manager in The manager.
//kvcm:param events out,nullable,len=eventsCap,buffer=numEvents,take Receives the events.
//kvcm:param eventsCap in Capacity of events, in elements.
//kvcm:param tokens out,nullable,len=tokensCap,of=events.tokens,buffer=numTokens Receives the tokens of stored blocks.
//kvcm:param tokensCap in Capacity of tokens, in elements.
//kvcm:param numEvents out Receives the number of events written.
//kvcm:param numTokens out Receives the number of tokens written (on KVCM_ERR_BUFFER_TOO_SMALL, the tokens the oldest event needs).
//kvcm:param dropped out,nullable,result Receives the number of events dropped since the previous drain.
type ManagerDrainBlockEvents func(manager Manager, events spec.Out[BlockEvent], eventsCap spec.Size, tokens spec.Out[Token], tokensCap spec.Size, numEvents spec.Out[spec.Size], numTokens spec.Out[spec.Size], dropped spec.Out[uint64]) *Status

// ManagerGetAndResetLayerGroupIterationStats returns every layer group's
// counters since the previous call, in layer group order, and restarts them.
// When the buffer is too small nothing is reset.
//
//kvcm:since 2
//kvcm:thread manager
//kvcm:call GetAndResetLayerGroupIterationStats
//kvcm:param manager in The manager.
//kvcm:param stats out,nullable,len=capacity,buffer=needed,reset Receives one entry per layer group.
//kvcm:param capacity in Capacity of stats, in elements.
//kvcm:param needed out Receives the number of layer groups.
type ManagerGetAndResetLayerGroupIterationStats func(manager Manager, stats spec.Out[LayerGroupIterationStats], capacity spec.Size, needed spec.Out[spec.Size]) *Status

// ManagerGetAndResetSsmSnapshotIterationStats returns the SSM snapshot
// counters since the previous call, one entry per SSM layer group that
// counted a lookup (none without SSM layers), and restarts them. When the
// buffer is too small nothing is reset.
//
//kvcm:since 2
//kvcm:thread manager
//kvcm:call GetAndResetSsmSnapshotIterationStats
//kvcm:param manager in The manager.
//kvcm:param stats out,nullable,len=capacity,buffer=needed,reset Receives one entry per SSM layer group with lookups.
//kvcm:param capacity in Capacity of stats, in elements.
//kvcm:param needed out Receives the number of entries.
type ManagerGetAndResetSsmSnapshotIterationStats func(manager Manager, stats spec.Out[SsmSnapshotIterationStats], capacity spec.Size, needed spec.Out[spec.Size]) *Status

// ManagerGetAndResetIterationReusedBlocksByLevel returns, for every layer
// group and level (layer group major), the pages reused from that level
// since the previous call, and restarts the counts. When the buffer is too
// small nothing is reset.
//
//kvcm:since 2
//kvcm:thread manager
//kvcm:call GetAndResetIterationReusedBlocksByLevel
//kvcm:param manager in The manager.
//kvcm:param rows out,nullable,len=capacity,buffer=needed,reset Receives one entry per layer group and level.
//kvcm:param capacity in Capacity of rows, in elements.
//kvcm:param needed out Receives the number of layer groups times levels.
type ManagerGetAndResetIterationReusedBlocksByLevel func(manager Manager, rows spec.Out[ReusedBlocksAtLevel], capacity spec.Size, needed spec.Out[spec.Size]) *Status

// ManagerGetAndResetIterationCachedTokensByLevel returns, per level, the
// tokens new caches reused since the previous call by the level their data
// was on (a full block at the coldest level of its pages, partially reused
// tokens at the GPU level), and restarts the counts. When the buffer is too
// small nothing is reset.
//
//kvcm:since 2
//kvcm:thread manager
//kvcm:call GetAndResetIterationCachedTokensByLevel
//kvcm:param manager in The manager.
//kvcm:param tokens out,nullable,len=capacity,buffer=needed,reset,go=int64 Receives one count per level.
//kvcm:param capacity in Capacity of tokens, in elements.
//kvcm:param needed out Receives the number of levels.
type ManagerGetAndResetIterationCachedTokensByLevel func(manager Manager, tokens spec.Out[int64], capacity spec.Size, needed spec.Out[spec.Size]) *Status

// ManagerGetAndResetIterationPoolGroupPeakBlockStats returns, per pool group
// of a level, KVCacheManagerV2's peaks since the previous reset, and restarts
// them; it shares its iteration with
// kvcm_manager_get_and_reset_iteration_peak_block_stats (either resets
// both). When the buffer is too small nothing is reset.
//
//kvcm:since 2
//kvcm:thread manager
//kvcm:call GetAndResetIterationPeakBlockStats
//kvcm:param manager in The manager.
//kvcm:param level in The cache level.
//kvcm:param stats out,nullable,len=capacity,buffer=needed,reset Receives one entry per pool group.
//kvcm:param capacity in Capacity of stats, in elements.
//kvcm:param needed out Receives the number of pool groups.
type ManagerGetAndResetIterationPoolGroupPeakBlockStats func(manager Manager, level CacheLevel, stats spec.Out[PoolGroupPeakBlockStats], capacity spec.Size, needed spec.Out[spec.Size]) *Status

// ConfigValidate checks a configuration as kvcm_manager_create would (every
// error names the field, such as "layers[2].buffers[0].size"), without
// opening a device or allocating anything. A disk tier's directory is
// checked for writability. It does not run a codec, so a configuration it
// accepts may still be rejected by one.
//
//kvcm:since 1
//kvcm:thread any
//kvcm:call github.com/kvcm/kvcm/core/abimodel.ValidateConfig
//kvcm:param config borrowed,convert The configuration; read during the call only.
type ConfigValidate func(config spec.In[ManagerConfig]) *Status

// ManagerGetScratchPagesPerBlock returns how many sub-pages of a slot one
// block of the layer takes in a scratch slot of the buffer's pool (the
// layer's buffers in the pool). With scale and offset from
// kvcm_manager_get_buffer_location and blocks_per_slot = scale /
// pages_per_block, scratch block b of kvcm_kv_cache_get_scratch_desc's
// [begin, end) has the buffer page index slots[(b-begin)/blocks_per_slot] *
// scale + (((b-begin) % blocks_per_slot) * pages_per_block + offset) %
// scale (KVCacheManagerV2's PER_LAYER index mode, from pool_base).
//
//kvcm:since 2
//kvcm:thread manager
//kvcm:call ScratchPagesPerBlock
//kvcm:param manager in The manager.
//kvcm:param layerID in The layer id.
//kvcm:param role borrowed,string,go=github.com/kvcm/kvcm/core/config.DataRole The buffer's role, such as "key".
//kvcm:param out out,result Receives the sub-pages per block.
type ManagerGetScratchPagesPerBlock func(manager Manager, layerID int32, role spec.CStr, out spec.Out[int64]) *Status

// ManagerNeedAdjustment reports whether kvcm_manager_adjust would resize
// some level's pool groups now (KVCacheManagerV2's need_adjustment): at
// least rebalance_min_sampled_kv_caches closed caches were sampled,
// rebalance_cooldown_secs passed since the last adjustment (or the
// creation) and a level's split among its pool groups is off the sampled
// demand by rebalance_ratio_threshold. The GPU level rebalances within the
// slots its tier's max_quota reserved.
//
//kvcm:since 2
//kvcm:thread manager
//kvcm:call Core().NeedAdjustment
//kvcm:param manager in The manager.
//kvcm:param out out,result Receives whether an adjustment is due.
type ManagerNeedAdjustment func(manager Manager, out spec.Out[bool]) *Status

// ManagerAdjust resizes the pool groups of every level that is off its
// sampled demand to it, keeping the level's quota (KVCacheManagerV2's
// adjust), as kvcm_manager_resize_level does: pages in slots that go move
// with their bytes into slots that stay (evicting what does not fit to
// colder levels, never a page a cache holds); base addresses and the page
// indices of ACTIVE caches stay valid. A level whose adjustment fails (a
// shrinking pool group with too many busy slots, or an ACTIVE cache's page
// in a slot that would go: KVCM_ERR_INVALID_STATE) is left unchanged and
// its error reported after the other levels were adjusted. It restarts the
// cooldown.
//
//kvcm:since 2
//kvcm:thread manager
//kvcm:call Core().Adjust
//kvcm:param manager in The manager.
type ManagerAdjust func(manager Manager) *Status

// ManagerClampMaxSeqLenForMem returns the longest sequence, at most
// token_num_upper_bound tokens, whose pages fit the GPU level's slots next
// to batch_size - 1 one-token requests (KVCacheManagerV2's
// clamp_max_seq_len_for_mem): a layer group needs, for n computed tokens,
// its sink blocks and the blocks of its window. 0 when not even one token
// fits. It counts the level's slots, not its free ones.
//
//kvcm:since 2
//kvcm:thread manager
//kvcm:call ClampMaxSeqLenForMem
//kvcm:param manager in The manager.
//kvcm:param batchSize in The batch size (positive).
//kvcm:param tokenNumUpperBound in The longest sequence wanted (not negative).
//kvcm:param out out,result Receives the sequence length in tokens.
type ManagerClampMaxSeqLenForMem func(manager Manager, batchSize int64, tokenNumUpperBound int64, out spec.Out[int64]) *Status
