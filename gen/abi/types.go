package abi

import (
	"github.com/kvcm/kvcm/core/abimodel"
	"github.com/kvcm/kvcm/gen/spec"
)

// StatusCode is the code of a kvcm_status. Codes are stable: new codes are
// only ever added.
//
//kvcm:enum trim=Err cprefix=KVCM_ERR_ cpp=StatusCode
//kvcm:gocodes code
//kvcm:since 1
type StatusCode int32

const (
	// OK is success. Functions report success with a NULL status, never with
	// a status of this code; kvcm_status_code(NULL) returns it.
	//
	//kvcm:cname KVCM_OK
	OK StatusCode = 0
	// ErrInvalidArgument: an argument is NULL where it must not be, out of
	// its documented range, or a struct's struct_size or abi_version is bad.
	// The message names the argument.
	ErrInvalidArgument StatusCode = 1
	// ErrInvalidHandle: a handle is 0, was never issued, was already freed
	// or consumed, or is a handle of another type.
	ErrInvalidHandle StatusCode = 2
	// ErrInvalidState: the call is not allowed in the object's current state
	// (for example Resize on a SUSPENDED cache), or the resource it needs is
	// held elsewhere (a persistent disk tier's directory another live manager
	// holds).
	ErrInvalidState StatusCode = 3
	// ErrOutOfPages: a cache level cannot supply the pages the call needs,
	// even after evicting everything evictable.
	ErrOutOfPages StatusCode = 4
	// ErrResumeRefused: Resume was refused because the GPU level's
	// utilization by active caches is above max_util_for_resume.
	ErrResumeRefused StatusCode = 5
	// ErrInvalidConfig: the manager configuration is invalid; the message
	// names the field, such as "layers[2].buffers[0].size".
	ErrInvalidConfig StatusCode = 6
	// ErrCodecRejected: the cold-page codec rejected the configuration or
	// reported values the manager cannot use (at manager creation).
	ErrCodecRejected StatusCode = 7
	// ErrDataLost: a failure (an asynchronous one of a migration, a disk read
	// or a codec, or a failed decode) destroyed pages a cache holds. Every
	// call on that cache but close fails with it from the first call after
	// the failure is known; the cache can only be closed. Lost pages are
	// never published: the next request with that prefix recomputes them.
	ErrDataLost StatusCode = 8
	// ErrBufferTooSmall: a caller-provided buffer is smaller than the count
	// reported through the call's needed-count out-parameter. Nothing was
	// written to the buffers and nothing changed.
	ErrBufferTooSmall StatusCode = 9
	// ErrClosed: the manager has been closed.
	ErrClosed StatusCode = 10
	// ErrDevice: the device (or its emulation) failed: out of memory, an
	// unknown stream, a copy outside any allocation, a failed stream.
	ErrDevice StatusCode = 11
	// ErrUnsupported: the request is valid but this build cannot serve it
	// (for example a CUDA device in a build without the CUDA backend).
	ErrUnsupported StatusCode = 12
	// ErrInternal: a bug: a panic inside the library. The library is
	// poisoned from then on.
	ErrInternal StatusCode = 13
	// ErrPoisoned: an earlier call panicked; the library refuses every call
	// that could touch its state. Restart the process.
	ErrPoisoned StatusCode = 14
	// ErrCodecFailed: a codec's encode or decode failed synchronously (it
	// returned false). A failed decode drops the pages it was bringing back:
	// the cache that needed them fails with KVCM_ERR_DATA_LOST from then on
	// and the next request recomputes them. A failed encode leaves its pages
	// where they were, still usable; a call that needed their slots fails
	// with KVCM_ERR_OUT_OF_PAGES naming the failure as its cause.
	ErrCodecFailed StatusCode = 15
	// ErrIO: reading or writing a disk tier's file failed (ENOSPC, EIO,
	// EFBIG, EOF from a truncated file): creating, sizing or resizing the
	// file, or, asynchronously, reading or writing a page's blob (a blob read
	// back that fails its integrity check counts as a failed read). Then
	// that page alone is lost: the stream of a cache resuming it reports the
	// error, and its caches fail with KVCM_ERR_DATA_LOST. The library is not
	// poisoned.
	ErrIO StatusCode = 16
)

// TierKind is the kind of a cache tier.
//
//kvcm:enum trim=Tier cprefix=KVCM_TIER_ cpp=TierKind
//kvcm:pyenum CacheTier GPU=GPU_MEM,HOST=HOST_MEM
//kvcm:since 1
type TierKind int32

const (
	// TierGPU is device memory, where batches execute. Exactly one, first.
	TierGPU TierKind = 0
	// TierHost is mapped pinned host memory.
	TierHost TierKind = 1
	// TierDisk is one file per cold pool group under a directory.
	TierDisk TierKind = 2
	// TierShared is the shared tier on a Redis Cluster, after every local
	// tier. It is configured by kvcm_manager_config.shared_tier, not in
	// cache_tiers; it names the level kvcm_manager_get_shared_level reports.
	//
	//kvcm:since 2
	TierShared TierKind = 3
)

// SharedWritePolicy says when committed blocks are written to the shared
// tier; writes are asynchronous either way and skip blocks already there.
//
//kvcm:enum trim=Shared cprefix=KVCM_SHARED_ cpp=SharedWritePolicy
//kvcm:since 2
type SharedWritePolicy int32

const (
	// SharedWriteBackOnEviction writes a block when it is evicted from the
	// last local level (the default).
	SharedWriteBackOnEviction SharedWritePolicy = 0
	// SharedWriteThroughOnCommit writes a block when it is committed.
	SharedWriteThroughOnCommit SharedWritePolicy = 1
)

// DeviceKind selects the device a manager allocates from.
//
//kvcm:enum trim=Device cprefix=KVCM_DEVICE_ cpp=DeviceKind
//kvcm:since 1
type DeviceKind int32

const (
	// DeviceAuto uses CUDA where the build and the machine have it and the
	// emulated device otherwise.
	DeviceAuto DeviceKind = DeviceKind(abimodel.DeviceAuto)
	// DeviceEmu is the host emulation of a device (no GPU needed).
	DeviceEmu DeviceKind = DeviceKind(abimodel.DeviceEmu)
	// DeviceCUDA is a CUDA device (device_ordinal selects which).
	DeviceCUDA DeviceKind = DeviceKind(abimodel.DeviceCUDA)
)

// BlockKey selects how a manager keys committed blocks (the hashes that
// cache events and the CP-aware interface carry).
//
//kvcm:enum trim=BlockKey cprefix=KVCM_BLOCK_KEY_ cpp=BlockKey
//kvcm:since 1
type BlockKey int32

const (
	// BlockKeySha256 is the specified chained SHA-256 key, the default: every
	// binding and other processes compute the same keys.
	BlockKeySha256 BlockKey = 0
	// BlockKeyXxh3 is the 64-bit XXH3 hash of the same bytes: several times
	// cheaper, but not a cryptographic hash and compatible with no other
	// process's keys. Use it only where block keys never leave the manager
	// (no CP-aware index, no consumer of cache events that hashes blocks
	// itself).
	BlockKeyXxh3 BlockKey = 1
)

// MemoryKind says where an allocation lives.
//
//kvcm:enum trim=Memory cprefix=KVCM_MEMORY_ cpp=MemoryKind
//kvcm:since 1
type MemoryKind int32

const (
	// MemoryDevice is device memory; the host reaches it only by copies.
	MemoryDevice MemoryKind = 0
	// MemoryHostMapped is page-locked host memory mapped into the device
	// address space at the same address as on the host.
	MemoryHostMapped MemoryKind = 1
)

// PageIndexLocation says where the kvcm_page_index_pair array of an encode or
// decode call lives. It mirrors the design's enum class PageIndexLocation : int.
//
//kvcm:enum trim=PageIndex cprefix=KVCM_PAGE_INDEX_ cpp=PageIndexLocation cppbase=int
//kvcm:since 1
type PageIndexLocation int32

const (
	// PageIndexBadLocation reports a failure or an unknown layer group. It
	// is never a valid location of an index array.
	PageIndexBadLocation PageIndexLocation = -1
	// PageIndexHost: the pairs are in host memory and valid only during the
	// call; the codec consumes them before it returns.
	PageIndexHost PageIndexLocation = 0
	// PageIndexDevice: the pairs are in device memory and valid until the
	// work the call enqueued on its stream has completed.
	PageIndexDevice PageIndexLocation = 1
)

// CacheStatus is a KV cache's place in its lifecycle: SUSPENDED → ACTIVE →
// CLOSED, with ACTIVE ⇄ SUSPENDED as often as the engine needs.
//
//kvcm:enum trim=Cache cprefix=KVCM_CACHE_ cpp=CacheStatus
//kvcm:since 1
type CacheStatus int32

const (
	// CacheSuspended: the cache holds its pages but the engine does not use
	// them; with colder levels they may move there.
	CacheSuspended CacheStatus = 0
	// CacheActive: the pages are on the GPU, pinned, and in use on the
	// cache's stream.
	CacheActive CacheStatus = 1
	// CacheClosed: every page is released. Terminal.
	CacheClosed CacheStatus = 2
)

// EventKind says what happened to a cached block.
//
//kvcm:enum trim=Event cprefix=KVCM_EVENT_ cpp=EventKind
//kvcm:since 1
type EventKind int32

const (
	// EventBlockStored: a block was published for reuse (on commit).
	EventBlockStored EventKind = 0
	// EventBlockRemoved: a block left the cache; it can no longer be reused.
	EventBlockRemoved EventKind = 1
	// EventBlockUpdated: a page of the block moved to another cache level,
	// or (level -1) one layer group's page was dropped while the block keeps
	// others.
	EventBlockUpdated EventKind = 2
	// EventBlockPriorityUpdated: the block's eviction priority changed (a
	// later block committed with a higher one raised it). Only
	// kvcm_manager_drain_block_events reports it.
	//
	//kvcm:since 2
	EventBlockPriorityUpdated EventKind = 3
)

// MigrationPath is one of the design's migration paths.
//
//kvcm:enum trim=Path cprefix=KVCM_PATH_ cpp=MigrationPath
//kvcm:since 1
type MigrationPath int32

const (
	// PathGPUToHost encodes GPU pages into host cold pages.
	PathGPUToHost MigrationPath = 0
	// PathHostToGPU decodes host cold pages into GPU pages.
	PathHostToGPU MigrationPath = 1
	// PathGPUToDisk encodes GPU pages through staging to disk.
	PathGPUToDisk MigrationPath = 2
	// PathDiskToGPU decodes disk pages through staging into GPU pages.
	PathDiskToGPU MigrationPath = 3
	// PathHostToDisk copies encoded blobs from host to disk.
	PathHostToDisk MigrationPath = 4
	// PathDiskToHost copies encoded blobs from disk to host.
	PathDiskToHost MigrationPath = 5
	// PathGPUToGPU copies GPU pages (partial reuse, defragmentation).
	PathGPUToGPU MigrationPath = 6
	// PathColdToCold copies encoded blobs between cold pool groups.
	PathColdToCold MigrationPath = 7
)

// Token is one input token id.
//
//kvcm:typedef
//kvcm:since 1
type Token int32

// LayerGroupID identifies a layer group (the design's LifeCycleId): the
// layers that share one attention-window shape.
//
//kvcm:typedef
//kvcm:cppalias LifeCycleId
//kvcm:since 1
type LayerGroupID int32

// PoolGroupIndex identifies a pool group within one cache level. Indices of
// different levels are unrelated and must never be compared.
//
//kvcm:typedef
//kvcm:since 1
type PoolGroupIndex int32

// CacheLevel orders the cache tiers from hottest (0, the GPU) to coldest.
//
//kvcm:typedef
//kvcm:since 1
type CacheLevel int32

// DevicePtr is an address in the device's address space (a CUdeviceptr on
// CUDA). For host-mapped memory it is also the host address of the bytes.
//
//kvcm:typedef
//kvcm:since 1
type DevicePtr uint64

// Stream is a native stream handle: a CUstream (cudaStream_t) on CUDA, an
// opaque nonzero token on the emulated device. It is not a kvcm handle: the
// library resolves it against the streams of the live managers' devices.
//
//kvcm:typedef
//kvcm:cpp StreamHandle
//kvcm:since 1
type Stream uintptr

// Manager is the handle of a KV-cache manager. 0 is never valid.
//
//kvcm:handle
//kvcm:gohandle managerObj manager
//kvcm:gomodel github.com/kvcm/kvcm/core/abimodel.Manager
//kvcm:since 1
type Manager uint64

// KVCache is the handle of one request's KV cache. 0 is never valid.
//
//kvcm:handle
//kvcm:gohandle kvCacheObj KV cache
//kvcm:gomodel github.com/kvcm/kvcm/core/abimodel.Cache
//kvcm:since 1
type KVCache uint64

// PlannedDrop is the handle of a planned drop of committed sliding-window
// pages (kvcm_kv_cache_plan_committed_block_drop). 0 is never valid.
//
//kvcm:handle
//kvcm:gohandle plannedDropObj planned drop
//kvcm:gomodel github.com/kvcm/kvcm/core.PlannedDrop
//kvcm:since 2
type PlannedDrop uint64

// Status is an error: a code and a message. NULL means success. Free it
// with kvcm_status_free.
//
//kvcm:opaque
//kvcm:status
//kvcm:since 1
type Status struct{}

// HostFunc is a host function enqueued on a stream with
// kvcm_stream_enqueue_host_func. It runs on a host thread, in stream order,
// and returns 0 on success; any other value is an asynchronous failure of the
// stream (reported by a later synchronize). It must not call functions that
// take a manager's lock.
//
//kvcm:callback
//kvcm:since 1
type HostFunc func(userData spec.VoidPtr) int32

// PriorityFunc writes to priority the eviction priority, in
// [KVCM_MIN_PRIORITY, KVCM_MAX_PRIORITY] (values outside are clamped), of the
// cache's block at blockIndex, and returns 0. As KVCacheManagerV2 asks its
// custom_priority_callback, it is called when kvcm_kv_cache_resize allocates
// the block's pages (before anything changes): the pages are ranked by it
// while private, and the block keeps it when it is committed; a block whose
// pages came otherwise (a partial-reuse copy) is asked at its commit. Any
// other return value is a failure: kvcm_kv_cache_resize or
// kvcm_kv_cache_commit then fails with KVCM_ERR_INVALID_ARGUMENT and changes
// nothing (a trailing partial block published at close gets the default
// priority instead). It is called with the manager's lock held and must not
// call back into the library.
//
//kvcm:callback
//kvcm:since 1
//kvcm:gocaller github.com/kvcm/kvcm/core/abimodel.BlockPriorityFunc
type PriorityFunc func(userData spec.VoidPtr, blockIndex int64, priority spec.Out[int32]) int32

// LayerGroupPriorityFunc is PriorityFunc per layer group, as
// KVCacheManagerV2's custom_priority_callback(block_ordinal, life_cycle): it
// writes the eviction priority of the page of layer group layerGroup of the
// cache's block at blockIndex, and is called once per layer group of each
// block, when its page there is allocated. The rest is as for
// kvcm_priority_func.
//
//kvcm:callback
//kvcm:since 2
//kvcm:gocaller github.com/kvcm/kvcm/core/abimodel.LayerGroupPriorityFunc
type LayerGroupPriorityFunc func(userData spec.VoidPtr, blockIndex int64, layerGroup LayerGroupID, priority spec.Out[int32]) int32
