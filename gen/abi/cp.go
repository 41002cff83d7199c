package abi

import "github.com/kvcm/kvcm/gen/spec"

// CPIndex is the handle of a CP-aware KV index (the five-method interface of
// core/cp: predict_prefix_reuse, get_cp_cached_blocks,
// notify_blocks_allocated, notify_blocks_freed, get_allocation_priority).
// 0 is never valid. A CP index is a null index, a manager-backed index or a
// delegating index over a caller's vtable; the kvcm_cp_* functions work on
// every kind. Every kind is safe for concurrent use.
//
//kvcm:handle
//kvcm:gohandle cpObj CP index
//kvcm:gomodel github.com/kvcm/kvcm/core/abimodel.CPIndex
//kvcm:since 1
type CPIndex uint64

// CPRequestID is one request id: len bytes at data (UTF-8 by convention; not
// NUL-terminated; may be empty, data is then NULL or anything).
//
//kvcm:struct
//kvcm:since 1
//kvcm:cppns c
//kvcm:go in github.com/kvcm/kvcm/core/abimodel.RequestID
type CPRequestID struct {
	// Data holds the id's bytes.
	Data spec.CStr `len:"Len" nullable:"true" own:"borrowed" go:"ID"`
	// Len is the id's length in bytes.
	Len spec.Size
}

// CPIndexVtable is the C form of an external CP index (the design's
// CPAwareKVManager). Every method slot may be NULL: a missing method behaves
// as the null index's (score 0, no cached blocks, no-op, input order), which
// is how an index offers only some capabilities. A slot is called only when
// struct_size covers it and it is non-null. Every slot takes the object's
// self first; request ids are request_id_len bytes at request_id (not
// NUL-terminated), tokens int32 arrays, block keys uint64 arrays of the
// chained block hashes the manager's radix tree uses. Pointer arguments are
// borrowed for the call.
//
// Every method slot returns 0 on success; any other value is a failure,
// which the library contains: it counts a fault (kvcm_cp_get_fault_count)
// and answers with the null behaviour. Scores are clamped into [0, 1] (NaN
// becomes 0); a priority order that is not a permutation is repaired (ids
// invented or repeated are dropped, omitted ids appended in input order). An
// external index can never break scheduling.
//
// The library may call slots from any thread, concurrently; slots must not
// call functions that take a manager's lock (notifications arrive from
// inside kvcm_kv_cache_create, kvcm_kv_cache_commit and
// kvcm_kv_cache_close of caches of a manager the index is attached to).
// destroy, when non-null, is called exactly once, after every other call.
//
//kvcm:vtable
//kvcm:versioned
//kvcm:since 1
//kvcm:gocaller github.com/kvcm/kvcm/core/abimodel.ExternalCP
//kvcm:cppimpl
type CPIndexVtable struct {
	// PredictPrefixReuse writes to score the predicted fraction of the
	// request's tokens whose KV can be reused, in [0, 1].
	PredictPrefixReuse func(self spec.VoidPtr, requestID spec.CStr, requestIDLen spec.Size, tokens spec.In[Token], numTokens spec.Size, score spec.Out[float64]) int32 `nullable:"true"`
	// GetCPCachedBlocks writes to keys (capacity elements) the keys of blocks
	// the index knows to be cached for the request, in chain order, and their
	// number to needed. When needed exceeds capacity it writes nothing else;
	// the library calls again with a larger buffer.
	GetCPCachedBlocks func(self spec.VoidPtr, requestID spec.CStr, requestIDLen spec.Size, keys spec.Out[uint64], capacity spec.Size, needed spec.Out[spec.Size]) int32 `nullable:"true"`
	// NotifyBlocksAllocated: the request holds these blocks (allocation,
	// registration at commit).
	NotifyBlocksAllocated func(self spec.VoidPtr, requestID spec.CStr, requestIDLen spec.Size, keys spec.In[uint64], numKeys spec.Size) int32 `nullable:"true"`
	// NotifyBlocksFreed: the request released these blocks for good (terminal
	// frees only; suspend, resume and level moves never call it).
	NotifyBlocksFreed func(self spec.VoidPtr, requestID spec.CStr, requestIDLen spec.Size, keys spec.In[uint64], numKeys spec.Size) int32 `nullable:"true"`
	// GetAllocationPriority writes to order (num_request_ids elements) the
	// indices of request_ids from highest to lowest predicted overlap.
	GetAllocationPriority func(self spec.VoidPtr, requestIds spec.In[CPRequestID], numRequestIds spec.Size, order spec.Out[spec.Size]) int32 `nullable:"true" sized:"order=numRequestIds" cpp:"-"`
	// Destroy releases the index. Called exactly once; may be NULL.
	Destroy func(self spec.VoidPtr) `nullable:"true" cpp:"-"`
}

// CPIndexObject is an external CP index: a vtable and the self pointer its
// slots receive. kvcm_cp_create_delegating consumes it.
//
//kvcm:struct
//kvcm:since 1
type CPIndexObject struct {
	// Vtable is the index's function table; it must stay valid until destroy
	// has been called (static storage is typical).
	Vtable spec.In[CPIndexVtable] `own:"borrowed"`
	// Self is passed as the first argument of every slot.
	Self spec.VoidPtr `own:"owned"`
}

// CPManagerBackedOptions configures kvcm_cp_create_manager_backed.
// Zero-initialize it and set struct_size = sizeof(kvcm_cp_manager_backed_options)
// and abi_version = KVCM_ABI_VERSION.
//
//kvcm:struct
//kvcm:versioned
//kvcm:since 1
//kvcm:cppns c
//kvcm:go in github.com/kvcm/kvcm/core/cp.ManagerBackedOptions
type CPManagerBackedOptions struct {
	// LevelWeights[l] is the fraction of a block's recompute cost that reuse
	// saves when the block is cached on level l (0 = GPU); levels past the
	// end use the last weight; each is clamped into [0, 1]. Empty selects
	// the defaults {1, 0.5, 0.25}.
	LevelWeights spec.In[float64] `len:"NumLevelWeights" nullable:"true" own:"borrowed"`
	// NumLevelWeights is the length of level_weights.
	NumLevelWeights spec.Size
	// Scope is the reuse scope of every request the index scores.
	Scope ReuseScope `go:"-"`
	// ScopeHasLoraID marks scope.lora_id as a LoRA adapter id, 0 included.
	ScopeHasLoraID bool `since:"2" go:"-"`
}

// CPCreateNull creates the null CP index: every score is 0, every order the
// input order, no state, notifications ignored. Enabling it changes nothing.
//
//kvcm:since 1
//kvcm:thread any
//kvcm:param out out Receives the index handle (0 on failure).
type CPCreateNull func(out spec.Out[CPIndex]) *Status

// CPCreateManagerBacked creates a CP index scoring requests from the
// manager's own block index across cache levels: the longest cached prefix
// of the request's full blocks (as the manager would reuse it), each block
// weighted by the level its pages are on, over the request's tokens. It
// mirrors the manager's cache events, so it must be created before the
// manager stores its first block (KVCM_ERR_INVALID_STATE otherwise). The
// index stays valid after the manager is destroyed; its scores are then 0.
//
//kvcm:since 1
//kvcm:thread manager
//kvcm:param manager in The manager whose blocks the index scores.
//kvcm:param options borrowed The options; read during the call only.
//kvcm:param out out Receives the index handle (0 on failure).
type CPCreateManagerBacked func(manager Manager, options spec.In[CPManagerBackedOptions], out spec.Out[CPIndex]) *Status

// CPCreateDelegating creates a CP index that forwards to an external index
// given as a vtable whose method slots may be NULL (see
// kvcm_cp_index_vtable). The object is consumed by this call, on success and
// on every failure path: when this function returns, either the new index
// owns it or its destroy slot (when non-null and covered by struct_size) has
// been called. The caller must never use or destroy the object again.
//
//kvcm:since 1
//kvcm:thread any
//kvcm:param object consumed The external index. Consumed on success and on failure.
//kvcm:param out out Receives the index handle (0 on failure).
type CPCreateDelegating func(object spec.In[CPIndexObject], out spec.Out[CPIndex]) *Status

// CPDestroy frees a CP index handle. A delegating index's destroy slot runs
// once nothing uses the index any more: at once, or when the last manager it
// is attached to and the last cache created while it was attached are done
// with it. The handle is consumed even when an error is reported.
//
//kvcm:since 1
//kvcm:thread handle
//kvcm:param cp consumed The index.
type CPDestroy func(cp CPIndex) *Status

// CPPredictPrefixReuse returns the predicted fraction of the request's
// tokens whose KV can be reused, in [0, 1] (never NaN). It may register the
// request's tokens for later get_allocation_priority and get_cached_blocks
// calls.
//
//kvcm:since 1
//kvcm:thread any
//kvcm:call PredictPrefixReuse
//kvcm:param cp in The index.
//kvcm:param requestID borrowed,nullable,len=requestIDLen,string The request id's bytes (NULL only when request_id_len is 0).
//kvcm:param requestIDLen in The request id's length in bytes.
//kvcm:param tokens borrowed,nullable,len=numTokens,slice,go=github.com/kvcm/kvcm/core/config.Token The request's tokens (NULL only when num_tokens is 0).
//kvcm:param numTokens in The number of tokens.
//kvcm:param out out,result Receives the score.
type CPPredictPrefixReuse func(cp CPIndex, requestID spec.CStr, requestIDLen spec.Size, tokens spec.In[Token], numTokens spec.Size, out spec.Out[float64]) *Status

// CPGetCachedBlocks writes the keys of blocks the index knows to be cached
// for the request, in chain order. needed is always written; when capacity
// is smaller, nothing else is written and KVCM_ERR_BUFFER_TOO_SMALL is
// returned (NULL with capacity 0 asks for the count, successfully). The
// answer can change between two calls.
//
//kvcm:since 1
//kvcm:thread any
//kvcm:call GetCachedBlocks
//kvcm:param cp in The index.
//kvcm:param requestID borrowed,nullable,len=requestIDLen,string The request id's bytes (NULL only when request_id_len is 0).
//kvcm:param requestIDLen in The request id's length in bytes.
//kvcm:param keys out,nullable,len=capacity,buffer=needed,go=github.com/kvcm/kvcm/core/blockhash.Key Receives the block keys.
//kvcm:param capacity in Capacity of keys, in elements.
//kvcm:param needed out Receives the number of keys.
type CPGetCachedBlocks func(cp CPIndex, requestID spec.CStr, requestIDLen spec.Size, keys spec.Out[uint64], capacity spec.Size, needed spec.Out[spec.Size]) *Status

// CPNotifyBlocksAllocated tells the index that the request holds these
// blocks (on allocation and on registration at commit). A manager with the
// index attached calls it itself.
//
//kvcm:since 1
//kvcm:thread any
//kvcm:call NotifyBlocksAllocated
//kvcm:param cp in The index.
//kvcm:param requestID borrowed,nullable,len=requestIDLen,string The request id's bytes (NULL only when request_id_len is 0).
//kvcm:param requestIDLen in The request id's length in bytes.
//kvcm:param keys borrowed,nullable,len=numKeys,slice,go=github.com/kvcm/kvcm/core/blockhash.Key The block keys (NULL only when num_keys is 0).
//kvcm:param numKeys in The number of keys.
type CPNotifyBlocksAllocated func(cp CPIndex, requestID spec.CStr, requestIDLen spec.Size, keys spec.In[uint64], numKeys spec.Size) *Status

// CPNotifyBlocksFreed tells the index that the request released these blocks
// for good: terminal frees only (finish, abort); suspend, resume and moves
// between cache levels never call it. A manager with the index attached
// calls it itself when a cache closes.
//
//kvcm:since 1
//kvcm:thread any
//kvcm:call NotifyBlocksFreed
//kvcm:param cp in The index.
//kvcm:param requestID borrowed,nullable,len=requestIDLen,string The request id's bytes (NULL only when request_id_len is 0).
//kvcm:param requestIDLen in The request id's length in bytes.
//kvcm:param keys borrowed,nullable,len=numKeys,slice,go=github.com/kvcm/kvcm/core/blockhash.Key The block keys (NULL only when num_keys is 0).
//kvcm:param numKeys in The number of keys.
type CPNotifyBlocksFreed func(cp CPIndex, requestID spec.CStr, requestIDLen spec.Size, keys spec.In[uint64], numKeys spec.Size) *Status

// CPGetAllocationPriority orders requests from highest to lowest predicted
// overlap with the cache: order receives a permutation of 0 ..
// num_request_ids-1 (ties keep the input order).
//
//kvcm:since 1
//kvcm:thread any
//kvcm:call GetAllocationPriority
//kvcm:param cp in The index.
//kvcm:param requestIds borrowed,nullable,len=numRequestIds,convert The request ids (NULL only when num_request_ids is 0).
//kvcm:param numRequestIds in The number of request ids.
//kvcm:param order out,nullable,len=numRequestIds,sized,go=int Receives num_request_ids indices into request_ids.
type CPGetAllocationPriority func(cp CPIndex, requestIds spec.In[CPRequestID], numRequestIds spec.Size, order spec.Out[spec.Size]) *Status

// CPGetFaultCount returns how many failures, out-of-range scores and
// repaired orders a delegating index's external index produced (0 for the
// other kinds).
//
//kvcm:since 1
//kvcm:thread any
//kvcm:call FaultCount
//kvcm:param cp in The index.
//kvcm:param out out,result Receives the count.
type CPGetFaultCount func(cp CPIndex, out spec.Out[uint64]) *Status

// ManagerAttachCP makes the manager notify a CP index about the caches
// created with a request id (kvcm_kv_cache_options.request_id): the full
// blocks a cache reuses at kvcm_kv_cache_create and the full blocks each
// kvcm_kv_cache_commit completes are notified allocated, and every block
// notified allocated is notified freed once, when the cache closes (also by
// kvcm_manager_destroy). Suspend, resume, resize, prefetch and moves between
// cache levels notify nothing. Caches keep the index they were created with;
// attaching another index (or kvcm_manager_detach_cp) affects only caches
// created afterwards. The manager keeps the index alive while it uses it,
// also after kvcm_cp_destroy.
//
//kvcm:since 1
//kvcm:thread manager
//kvcm:param manager in The manager.
//kvcm:param cp in The index to notify.
type ManagerAttachCP func(manager Manager, cp CPIndex) *Status

// ManagerDetachCP stops notifying the attached CP index about caches
// created from now on. Nothing attached is not an error.
//
//kvcm:since 1
//kvcm:thread manager
//kvcm:call DetachCP
//kvcm:param manager in The manager.
type ManagerDetachCP func(manager Manager) *Status
