package abi

import "github.com/kvcm/kvcm/gen/spec"

// PageIndexPair is the destination and source index of one logical page
// copy, exactly the design's struct alignas(8) PageIndexPair: 8 bytes,
// 8-byte aligned, dst at offset 0 and src at offset 4, so a device work item
// fetches both with one aligned 64-bit load and a host codec iterates the
// same array.
//
//kvcm:struct
//kvcm:align 8
//kvcm:since 1
type PageIndexPair struct {
	// Dst is the destination index: a cold page on encode, a hot slot on
	// decode.
	Dst int32
	// Src is the source index: a hot slot on encode, a cold page on decode.
	Src int32
}

// PoolDesc describes one pool of a pool group: its base address and the
// bytes each slot occupies in it. Slot s starts at base + s*slot_bytes.
//
//kvcm:struct
//kvcm:since 1
//kvcm:go inout github.com/kvcm/kvcm/core/layout.PoolDesc
type PoolDesc struct {
	// Base is the pool's base address (0 for cold levels, whose storage is
	// never exposed).
	Base DevicePtr
	// SlotBytes is the bytes one slot occupies in this pool.
	SlotBytes int64
}

// PoolGroupDesc describes one pool group: its index, its slots, the layer
// groups whose pages it holds (ascending) and its pools in slot-layout order.
// One slot index addresses the same slot in every pool of the group.
//
//kvcm:struct
//kvcm:since 1
//kvcm:go inout github.com/kvcm/kvcm/core/layout.PoolGroupDesc
type PoolGroupDesc struct {
	// Index is the group's index within its level; descriptor i has index i.
	Index PoolGroupIndex
	// NumSlots is how many slots the group has (for the GPU level: the most
	// it can ever use, reserved up front).
	NumSlots int64
	// LifeCycles are the member layer groups, ascending.
	LifeCycles spec.In[LayerGroupID] `len:"NumLifeCycles" own:"borrowed"`
	// NumLifeCycles is the length of life_cycles.
	NumLifeCycles spec.Size
	// Pools are the group's pools in slot-layout order.
	Pools spec.In[PoolDesc] `len:"NumPools" own:"borrowed"`
	// NumPools is the length of pools.
	NumPools spec.Size
}

// ColdPageCodecVtable is the C form of the design's IKvCacheColdPageCodec.
// Every slot takes the codec's self first. A slot is called only when
// struct_size covers it; get_batching_layer_group_id may be NULL (the identity,
// which disables cross-layer-group batching). The library serializes calls
// on one codec (one lock per manager) but may make them from any thread; a
// codec must not call functions that take the manager's lock (the kvcm_stream_*
// functions are allowed, and are how a portable codec enqueues its work).
//
// Contract (the design's): configure is called exactly once, before any other
// slot, with every hot pool group; returning false rejects the complete
// configuration. query_cold_page_bytes returns a fixed size per layer group; 0
// is failure, and so is a size above INT64_MAX (such as SIZE_MAX), which the
// error reports as returned. get_batching_layer_group_id returns the smallest layer group of
// its argument's equivalence class; negative is failure. query_page_index_location
// selects where encode's and decode's index pairs live; KVCM_PAGE_INDEX_BAD_LOCATION
// is failure. encode and decode enqueue work on stream and do not synchronize it;
// their bool reports synchronous validation and submission, not completion.
// Host index pointers are valid only until the call returns; device index
// pointers until the work enqueued on stream completes. Data base pointers may
// be used by work enqueued on stream but not retained beyond it. destroy is
// called exactly once, after all the codec's work has completed.
//
// Addresses. The hot pool bases given to configure are device memory: on CUDA
// they are not host-addressable, and host code reaches them only through
// copies (kvcm_stream_batch_copy). The cold base given to encode (dst_base)
// and decode (src_base) is always mapped pinned host memory (the host tier's
// pool, or the pinned staging ring of a disk tier): the same address is valid
// on the host and on the device, but host code may touch it only in stream
// order, from a host function enqueued with kvcm_stream_enqueue_host_func,
// since earlier work on the stream (a disk read, the hot-page copies) is
// asynchronous.
//
// Streams and scratch. encode and decode receive one of the manager's own
// migration streams (GPU-to-host evictions, host-to-GPU onboardings, disk
// transfers), each valid until after destroy. The manager orders a C codec's
// calls across these streams: a call's work starts only after the work of
// the codec's previous call, on whatever stream, has completed, as if all
// ran on one stream. Scratch memory (kvcm_stream_alloc_memory) must not be
// freed while work that uses it is queued, and a codec must not synchronize
// the stream to find out. Keep scratch across calls instead (a later call's
// work runs after an earlier call's, so it reuses the scratch safely) and
// free it in destroy, which runs after all work has completed; what is left
// is freed anyway when the manager is destroyed. A host function must not free memory itself (on
// CUDA a host function may not call into CUDA): to drop per-call scratch
// early, let a host function mark it done and free it in a later call.
//
//kvcm:vtable
//kvcm:versioned
//kvcm:goimpl default github.com/kvcm/kvcm/core/abimodel.DefaultCodec
//kvcm:gocaller github.com/kvcm/kvcm/core/abimodel.ExternalCodec
//kvcm:since 1
type ColdPageCodecVtable struct {
	// Configure supplies every hot pool group's layout and base addresses,
	// once: gpu_descs is a contiguous array ordered by pool group index,
	// borrowed for the call. Returns false to reject the configuration.
	Configure func(self spec.VoidPtr, gpuDescs spec.In[PoolGroupDesc], numGpuDescs PoolGroupIndex) bool
	// QueryColdPageBytes returns the fixed cold-page size of a layer group;
	// zero indicates failure.
	QueryColdPageBytes func(self spec.VoidPtr, layerGroupID LayerGroupID) spec.Size
	// GetBatchingLayerGroupID returns the smallest layer group of the
	// argument's codec-equivalence class, negative on failure. NULL means the
	// identity.
	GetBatchingLayerGroupID func(self spec.VoidPtr, layerGroupID LayerGroupID) LayerGroupID `nullable:"true" fail:"-1"`
	// QueryPageIndexLocation selects where the index pairs of both encode and
	// decode live; KVCM_PAGE_INDEX_BAD_LOCATION on failure.
	QueryPageIndexLocation func(self spec.VoidPtr, layerGroupID LayerGroupID) PageIndexLocation `fail:"KVCM_PAGE_INDEX_BAD_LOCATION"`
	// Encode enqueues on stream the encoding of hot slots page_indices[i].src
	// into cold pages at dst_base + page_indices[i].dst * cold page bytes.
	Encode func(self spec.VoidPtr, layerGroupID LayerGroupID, dstBasePtr spec.VoidPtr, pageIndices spec.In[PageIndexPair], numBasePages spec.Size, stream Stream) bool
	// Decode enqueues on stream the decoding of cold pages at src_base +
	// page_indices[i].src * cold page bytes into hot slots page_indices[i].dst.
	Decode func(self spec.VoidPtr, layerGroupID LayerGroupID, srcBasePtr spec.ConstVoidPtr, pageIndices spec.In[PageIndexPair], numBasePages spec.Size, stream Stream) bool
	// Destroy releases the codec. Called exactly once.
	Destroy func(self spec.VoidPtr)
}

// ColdPageCodec is a codec object: a vtable and the self pointer its slots
// receive. Ownership of a codec object is transferred (consumed) by the
// functions that take it; the caller must not use or destroy it afterwards.
//
//kvcm:struct
//kvcm:cpp ColdPageCodecObject
//kvcm:since 1
type ColdPageCodec struct {
	// Vtable is the codec's function table (static storage is typical); it
	// must stay valid until destroy has been called.
	Vtable spec.In[ColdPageCodecVtable] `own:"borrowed"`
	// Self is passed as the first argument of every slot.
	Self spec.VoidPtr `own:"owned"`
}

// CopyDesc is one copy of size bytes from src to dst; both may be device or
// host-mapped addresses.
//
//kvcm:struct
//kvcm:since 1
//kvcm:go in github.com/kvcm/kvcm/core/device.CopyDesc
type CopyDesc struct {
	// Dst is the destination address.
	Dst DevicePtr
	// Src is the source address.
	Src DevicePtr
	// Size is the number of bytes to copy.
	Size uint64
}

// CreateDefaultColdPageCodec creates the default lossless concatenating codec
// as a codec object: the cold page of a layer group is the concatenation, in
// pool order, of its slot bytes in every pool of its hot pool group; indices
// are on the host; one batch copy per call. It is not needed to select the
// default (pass NULL to kvcm_manager_create); it exists as the reference for
// codec authors and to demonstrate the ownership transfer. The object can be
// consumed exactly once (by kvcm_manager_create or
// kvcm_cold_page_codec_destroy); its slots may also be called directly.
//
//kvcm:since 1
//kvcm:thread any
//kvcm:param out out Receives the codec object; the caller owns it until it hands it on.
type CreateDefaultColdPageCodec func(out spec.Out[ColdPageCodec]) *Status

// ColdPageCodecDestroy destroys a codec object the caller owns and will not
// hand on: it calls the vtable's destroy slot (for the default codec, it
// releases the library's codec). The object is consumed even when the call
// fails.
//
//kvcm:since 1
//kvcm:thread any
//kvcm:param codec consumed The codec object to destroy.
type ColdPageCodecDestroy func(codec spec.In[ColdPageCodec]) *Status

// BuiltinCodec names one of the library's built-in cold-page codecs.
//
//kvcm:enum trim=BuiltinCodec cprefix=KVCM_BUILTIN_CODEC_ cpp=BuiltinCodec
//kvcm:since 2
type BuiltinCodec int32

const (
	// BuiltinCodecDefault is the default lossless concatenating codec (the
	// codec kvcm_create_default_cold_page_codec makes).
	BuiltinCodecDefault BuiltinCodec = 0
	// BuiltinCodecGather is the lossless gather codec: the default codec's
	// cold bytes, with the page indices on the device and one CUDA kernel per
	// call. CUDA only.
	BuiltinCodecGather BuiltinCodec = 1
	// BuiltinCodecFp8 is the fixed-ratio lossy codec for fp16 or bf16 pages:
	// FP8 e4m3 with one float32 scale per block of elements (0.516 of the hot
	// bytes with 128-element blocks). CUDA only; every pool's slot bytes must
	// be a multiple of 2 * block_elems.
	BuiltinCodecFp8 BuiltinCodec = 2
	// BuiltinCodecAuto is lossless: per lifecycle the default codec or, on
	// CUDA, the staged codec (the gather kernel into device staging, then
	// DMA of contiguous chunks, so eviction and onboarding overlap near the
	// two-stream DMA limit; 128 MiB of device memory per migrating stream),
	// from the lifecycle's bytes per page and pool against a measured
	// crossover (1 MiB unless crossover_bytes says otherwise). On the
	// emulated device it is the default codec.
	BuiltinCodecAuto BuiltinCodec = 3
)

// ElementType is the element type of hot pages, for codecs that read values.
//
//kvcm:enum trim=Element cprefix=KVCM_ELEMENT_ cpp=ElementType
//kvcm:since 2
type ElementType int32

const (
	// ElementFloat16 is IEEE 754 binary16.
	ElementFloat16 ElementType = 0
	// ElementBfloat16 is bfloat16.
	ElementBfloat16 ElementType = 1
)

// BuiltinCodecOptions selects a built-in codec for
// kvcm_create_builtin_cold_page_codec. Zero-initialize it and set
// struct_size = sizeof(kvcm_builtin_codec_options) and abi_version =
// KVCM_ABI_VERSION; all zero is the default codec.
//
//kvcm:struct
//kvcm:versioned
//kvcm:since 2
//kvcm:cppvalue BuiltinColdPageCodecOptions
//kvcm:go in github.com/kvcm/kvcm/core/codec/gpucodec.Spec
//kvcm:cppdoc BuiltinColdPageCodecOptions selects one of the library's built-in codecs
//kvcm:cppdoc (kvcm_builtin_codec_options): kind, and the options of the FP8 and auto
//kvcm:cppdoc codecs.
type BuiltinCodecOptions struct {
	// Kind is the codec.
	Kind BuiltinCodec
	// Element is the FP8 codec's hot element type (every pool's).
	Element ElementType `go:"Format"`
	// BlockElems is the FP8 codec's number of elements per scale: a power of
	// two in [8, 256]; 0 means 128.
	BlockElems int32
	// CrossoverBytes is the auto codec's crossover: mean bytes per page and
	// pool at and above which a lifecycle takes the default codec; 0 means
	// the measured 1 MiB.
	CrossoverBytes int64
}

// CreateBuiltinColdPageCodec creates one of the library's built-in codecs as
// a codec object, to be consumed by kvcm_manager_create (or destroyed with
// kvcm_cold_page_codec_destroy). The default codec's object is the one
// kvcm_create_default_cold_page_codec makes. The gather, FP8 and auto codecs
// run on the manager's device, so the object only records the choice and
// kvcm_manager_create makes the codec once it has opened the device; their
// slots cannot be called directly (each fails). The gather and FP8 codecs
// have CUDA kernels only: on the emulated device kvcm_manager_create fails
// with KVCM_ERR_CODEC_REJECTED, saying so (the codec is consumed as always).
// Bad options fail here with KVCM_ERR_INVALID_ARGUMENT naming the field.
//
//kvcm:since 2
//kvcm:thread any
//kvcm:param options borrowed,convert The codec and its options; read during the call only.
//kvcm:param out out Receives the codec object; the caller owns it until it hands it on.
type CreateBuiltinColdPageCodec func(options spec.In[BuiltinCodecOptions], out spec.Out[ColdPageCodec]) *Status
