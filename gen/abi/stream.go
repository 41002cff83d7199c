package abi

import "github.com/kvcm/kvcm/gen/spec"

// ManagerCreateStream creates a stream on the manager's device. Destroy it
// with kvcm_manager_destroy_stream; the manager destroys the streams it
// created that are still alive when it is destroyed.
//
//kvcm:since 1
//kvcm:thread manager
//kvcm:call CreateStreamHandle
//kvcm:param manager in The manager.
//kvcm:param out out,result Receives the stream.
type ManagerCreateStream func(manager Manager, out spec.Out[Stream]) *Status

// ManagerDestroyStream synchronizes and destroys a stream created with
// kvcm_manager_create_stream. While an ACTIVE cache of the manager uses the
// stream it fails with KVCM_ERR_INVALID_STATE, naming the cache, and changes
// nothing: suspend or close the cache first.
//
//kvcm:since 1
//kvcm:thread manager
//kvcm:call DestroyStream
//kvcm:param manager in The manager.
//kvcm:param stream in The stream; destroyed on success, still alive on failure.
type ManagerDestroyStream func(manager Manager, stream Stream) *Status

// ManagerAllocMemory allocates memory on the manager's device: device memory
// or mapped pinned host memory (whose device address is its host address).
// The manager frees what is still allocated when it is destroyed.
//
//kvcm:since 1
//kvcm:thread manager
//kvcm:call AllocMemory
//kvcm:param manager in The manager.
//kvcm:param kind in The memory kind.
//kvcm:param size in The size in bytes (positive).
//kvcm:param out out,result Receives the address.
type ManagerAllocMemory func(manager Manager, kind MemoryKind, size uint64, out spec.Out[DevicePtr]) *Status

// ManagerFreeMemory frees memory allocated with kvcm_manager_alloc_memory.
// No enqueued work may still use it.
//
//kvcm:since 1
//kvcm:thread manager
//kvcm:call FreeMemory
//kvcm:param manager in The manager.
//kvcm:param ptr consumed The address kvcm_manager_alloc_memory returned.
type ManagerFreeMemory func(manager Manager, ptr DevicePtr) *Status

// StreamAllocMemory allocates memory on the device that owns a stream:
// device memory or mapped pinned host memory (whose device address is its
// host address). It is for codecs, which see streams but no manager: a
// portable CPU codec stages hot pages through host-mapped scratch with
// kvcm_stream_batch_copy and works on them in host functions, on the emulated
// device and on CUDA alike. Free it with kvcm_stream_free_memory; what is
// still allocated is freed when the manager owning the device is destroyed
// (after the codec's destroy slot has run).
//
//kvcm:since 1
//kvcm:thread stream
//kvcm:call github.com/kvcm/kvcm/core/abimodel.Devices.Alloc
//kvcm:param stream in A stream of the device to allocate on.
//kvcm:param kind in The memory kind.
//kvcm:param size in The size in bytes (positive).
//kvcm:param out out,result Receives the address.
type StreamAllocMemory func(stream Stream, kind MemoryKind, size uint64, out spec.Out[DevicePtr]) *Status

// StreamFreeMemory frees memory allocated with kvcm_stream_alloc_memory on
// the device of the stream. No enqueued work may still use it.
//
//kvcm:since 1
//kvcm:thread stream
//kvcm:call github.com/kvcm/kvcm/core/abimodel.Devices.Free
//kvcm:param stream in A stream of the device the memory was allocated on.
//kvcm:param ptr consumed The address kvcm_stream_alloc_memory returned.
type StreamFreeMemory func(stream Stream, ptr DevicePtr) *Status

// StreamSynchronize blocks until all work enqueued on the stream has
// completed and reports the first asynchronous failure since the previous
// synchronize.
//
//kvcm:since 1
//kvcm:thread stream
//kvcm:call github.com/kvcm/kvcm/core/abimodel.Devices.Synchronize
//kvcm:param stream in The stream.
type StreamSynchronize func(stream Stream) *Status

// StreamEnqueueHostFunc enqueues a host function to run in stream order on a
// host thread. A nonzero return of the function is an asynchronous failure of
// the stream. Codecs use it to run CPU work on the stream they are given.
// An enqueued function runs exactly once, unless the stream's device is closed
// before it ran (the emulated device then cancels queued work): destroying a
// manager synchronizes the streams it created and its own streams first, so
// work enqueued on them runs before kvcm_manager_destroy returns; work still
// queued on a stream the caller destroyed without synchronizing, or on a
// foreign stream, may be dropped, so a function that frees user_data must be
// known to have run (synchronize the stream) before its owner is destroyed.
//
//kvcm:since 1
//kvcm:thread stream
//kvcm:param stream in The stream.
//kvcm:param fn in The function.
//kvcm:param userData borrowed,nullable Passed to fn; never dereferenced by the library. It must stay valid until fn has run.
type StreamEnqueueHostFunc func(stream Stream, fn HostFunc, userData spec.VoidPtr) *Status

// StreamBatchCopy enqueues every copy as one submission (cuMemcpyBatchAsync on
// CUDA). On a synchronous error nothing is enqueued. The descriptor array is
// read during the call only.
//
//kvcm:since 1
//kvcm:thread stream
//kvcm:call github.com/kvcm/kvcm/core/abimodel.Devices.BatchCopy
//kvcm:param stream in The stream.
//kvcm:param descs borrowed,nullable,len=numDescs,convert The copies (NULL only when num_descs is 0).
//kvcm:param numDescs in The number of copies.
type StreamBatchCopy func(stream Stream, descs spec.In[CopyDesc], numDescs spec.Size) *Status

// StreamCopyFromHost enqueues a copy of size bytes of ordinary (pageable)
// host memory into device-accessible memory at dst. The source is consumed
// before the call returns, so the caller may reuse it at once; the copy runs
// in stream order.
//
//kvcm:since 1
//kvcm:thread stream
//kvcm:param stream in The stream.
//kvcm:param dst in The destination address.
//kvcm:param src borrowed,len=size The source bytes, read during the call only.
//kvcm:param size in The number of bytes.
type StreamCopyFromHost func(stream Stream, dst DevicePtr, src spec.ConstVoidPtr, size spec.Size) *Status
