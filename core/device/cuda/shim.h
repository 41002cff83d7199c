// shim.h declares the few CUDA driver API types, constants and struct layouts
// kvcm needs, so that the package builds without CUDA headers or libraries.
// Every layout is checked against the CUDA 12.8 / 13.0 headers by size and
// offset below. The driver itself is loaded at run time (shim.c).
#ifndef KVCM_CUDA_SHIM_H
#define KVCM_CUDA_SHIM_H

#include <stddef.h>
#include <stdint.h>

typedef int kv_CUresult;               // enum cudaError_enum
typedef int kv_CUdevice;               // CUdevice_v1
typedef uint64_t kv_CUdeviceptr;       // CUdeviceptr_v2 (unsigned long long)
typedef struct kv_CUctx_st* kv_CUcontext;
typedef struct kv_CUstream_st* kv_CUstream;
typedef struct kv_CUevent_st* kv_CUevent;
typedef struct kv_CUmod_st* kv_CUmodule;
typedef struct kv_CUfunc_st* kv_CUfunction;

// CUmemLocation_v1
typedef struct {
	int type;  // CUmemLocationType
	int id;
} kv_CUmemLocation;

// CUmemcpyAttributes_v1 (CUDA 12.8+)
typedef struct {
	int srcAccessOrder;  // CUmemcpySrcAccessOrder
	kv_CUmemLocation srcLocHint;
	kv_CUmemLocation dstLocHint;
	unsigned int flags;  // CUmemcpyFlags
} kv_CUmemcpyAttributes;

// CUmemAllocationProp_v1 (virtual memory management)
typedef struct {
	int type;                  // CUmemAllocationType: PINNED = 1
	int requestedHandleTypes;  // CUmemAllocationHandleType: NONE = 0
	kv_CUmemLocation location;
	void* win32HandleMetaData;
	struct {
		unsigned char compressionType;
		unsigned char gpuDirectRDMACapable;
		unsigned short usage;
		unsigned char reserved[4];
	} allocFlags;
} kv_CUmemAllocationProp;

// CUmemAccessDesc_v1
typedef struct {
	kv_CUmemLocation location;
	int flags;  // CUmemAccess_flags: PROT_READWRITE = 3
} kv_CUmemAccessDesc;

_Static_assert(sizeof(kv_CUmemAllocationProp) == 32, "CUmemAllocationProp layout");
_Static_assert(offsetof(kv_CUmemAllocationProp, location) == 8, "CUmemAllocationProp.location");
_Static_assert(offsetof(kv_CUmemAllocationProp, win32HandleMetaData) == 16, "CUmemAllocationProp.win32HandleMetaData");
_Static_assert(offsetof(kv_CUmemAllocationProp, allocFlags) == 24, "CUmemAllocationProp.allocFlags");
_Static_assert(sizeof(kv_CUmemAccessDesc) == 12, "CUmemAccessDesc layout");
_Static_assert(sizeof(kv_CUdeviceptr) == 8, "CUdeviceptr is 64-bit");
_Static_assert(sizeof(kv_CUmemLocation) == 8, "CUmemLocation layout");
_Static_assert(sizeof(kv_CUmemcpyAttributes) == 24, "CUmemcpyAttributes layout");
_Static_assert(offsetof(kv_CUmemcpyAttributes, srcLocHint) == 4, "CUmemcpyAttributes.srcLocHint");
_Static_assert(offsetof(kv_CUmemcpyAttributes, dstLocHint) == 12, "CUmemcpyAttributes.dstLocHint");
_Static_assert(offsetof(kv_CUmemcpyAttributes, flags) == 20, "CUmemcpyAttributes.flags");
_Static_assert(sizeof(size_t) == 8, "64-bit platform");

enum {
	KV_CUDA_SUCCESS = 0,
	KV_CUDA_ERROR_OUT_OF_MEMORY = 2,
	KV_CUDA_ERROR_NO_DEVICE = 100,
	KV_CUDA_ERROR_NOT_READY = 600,
	KV_CUDA_ERROR_NOT_SUPPORTED = 801,
	KV_CU_STREAM_NON_BLOCKING = 0x1,
	KV_CU_EVENT_DISABLE_TIMING = 0x2,
	KV_CU_MEMHOSTREGISTER_PORTABLE = 0x01,
	KV_CU_MEMHOSTREGISTER_DEVICEMAP = 0x02,
	KV_CU_MEMCPY_SRC_ACCESS_ORDER_STREAM = 0x1,
	KV_CU_MEMCPY_SRC_ACCESS_ORDER_DURING_API_CALL = 0x2,
	KV_CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE = 0x1,
	KV_CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16,
	KV_CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY = 19,
	KV_CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR = 39,
	KV_CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING = 41,
	KV_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75,
	KV_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76,
	KV_CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 102,
	KV_CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK = 0,
	KV_CU_FUNC_ATTRIBUTE_NUM_REGS = 4,
};

// Batch-copy modes, chosen from the driver version (or forced to legacy).
enum {
	KV_BATCH_LEGACY = 0,  // per-descriptor cuMemcpyAsync (drivers before 12.8)
	KV_BATCH_V12080 = 1,  // cuMemcpyBatchAsync, CUDA 12.8 ABI (with failIdx)
	KV_BATCH_V13000 = 2,  // cuMemcpyBatchAsync, CUDA 13.0 ABI (_v2, no failIdx)
};

// Bytes of one upload segment: must equal KVCM_UPLOAD_SEGMENT of
// kernels/upload.cu.
#define KV_UPLOAD_SEGMENT 4064

// kv_load opens the driver library at path, initializes it and resolves every
// entry point. It returns 0, or -1 with a message in err (the library or a
// required symbol is missing), or a positive CUresult from cuInit or
// cuDriverGetVersion. It is idempotent once it has succeeded.
int kv_load(const char* path, char* err, size_t errlen);
int kv_driver_version(void);
int kv_batch_mode(void);  // the best mode this driver offers
const char* kv_error_name(kv_CUresult r);
const char* kv_error_string(kv_CUresult r);

kv_CUresult kv_device_count(int* n);
kv_CUresult kv_device_get(kv_CUdevice* d, int ordinal);
kv_CUresult kv_device_name(kv_CUdevice d, char* name, int len);
kv_CUresult kv_device_attr(kv_CUdevice d, int attr, int* v);
kv_CUresult kv_device_total_mem(kv_CUdevice d, size_t* bytes);
kv_CUresult kv_primary_retain(kv_CUdevice d, kv_CUcontext* c);
kv_CUresult kv_primary_release(kv_CUdevice d);

// Every function below first makes c current on the calling OS thread.
kv_CUresult kv_ctx_sync(kv_CUcontext c);
kv_CUresult kv_mem_alloc(kv_CUcontext c, kv_CUdeviceptr* p, size_t n);
kv_CUresult kv_mem_free(kv_CUcontext c, kv_CUdeviceptr p);
kv_CUresult kv_mem_get_info(kv_CUcontext c, size_t* free, size_t* total);
kv_CUresult kv_host_register(kv_CUcontext c, void* p, size_t n, kv_CUdeviceptr* dev);
kv_CUresult kv_host_unregister(kv_CUcontext c, void* p);
// Virtual memory management, for growable device memory: a reserved range
// into which physical chunks (cuMemCreate on the device) are mapped
// read-write for the device.
kv_CUresult kv_vmm_granularity(kv_CUcontext c, int ordinal, size_t* gran);
kv_CUresult kv_vmm_reserve(kv_CUcontext c, kv_CUdeviceptr* p, size_t size, size_t align);
kv_CUresult kv_vmm_free(kv_CUcontext c, kv_CUdeviceptr p, size_t size);
kv_CUresult kv_vmm_map(kv_CUcontext c, int ordinal, kv_CUdeviceptr p, size_t size, uint64_t* handle);
kv_CUresult kv_vmm_unmap(kv_CUcontext c, kv_CUdeviceptr p, size_t size, uint64_t handle);
kv_CUresult kv_stream_create(kv_CUcontext c, kv_CUstream* s);
kv_CUresult kv_stream_destroy(kv_CUcontext c, kv_CUstream s);
// kv_stream_check_ctx sets *same to whether the CUstream s (0: the legacy
// default stream) belongs to context c.
kv_CUresult kv_stream_check_ctx(kv_CUcontext c, uintptr_t s, int* same);
static inline kv_CUstream kv_stream_of(uintptr_t s) { return (kv_CUstream)s; }
kv_CUresult kv_stream_sync(kv_CUcontext c, kv_CUstream s);
kv_CUresult kv_stream_wait_event(kv_CUcontext c, kv_CUstream s, kv_CUevent e);
kv_CUresult kv_event_create(kv_CUcontext c, kv_CUevent* e, int timing);
kv_CUresult kv_event_destroy(kv_CUcontext c, kv_CUevent e);
kv_CUresult kv_event_record(kv_CUcontext c, kv_CUevent e, kv_CUstream s);
kv_CUresult kv_event_query(kv_CUcontext c, kv_CUevent e);
kv_CUresult kv_event_sync(kv_CUcontext c, kv_CUevent e);
kv_CUresult kv_event_elapsed(kv_CUcontext c, float* ms, kv_CUevent start, kv_CUevent end);
kv_CUresult kv_host_func(kv_CUcontext c, kv_CUstream s, uintptr_t handle);
kv_CUresult kv_memset8(kv_CUcontext c, kv_CUstream s, kv_CUdeviceptr p, unsigned char v, size_t n);
// kv_stream_wait_value32 makes s wait until the 32-bit word at addr (device
// memory or registered host memory) is at least value
// (cuStreamWaitValue32, CU_STREAM_WAIT_VALUE_GEQ); CUDA_ERROR_NOT_SUPPORTED
// where the driver has no stream memory operations.
kv_CUresult kv_stream_wait_value32(kv_CUcontext c, kv_CUstream s, kv_CUdeviceptr addr, uint32_t value);

// kv_batch_copy submits count copies (struct-of-arrays) as one
// cuMemcpyBatchAsync with one attribute (srcOrder, PREFER_OVERLAP_WITH_COMPUTE)
// in mode, or as count cuMemcpyAsync calls in KV_BATCH_LEGACY. *failIdx
// receives the failing index where the driver reports one, else count.
kv_CUresult kv_batch_copy(kv_CUcontext c, kv_CUstream s, int mode, const uint64_t* dsts, const uint64_t* srcs,
                          const uint64_t* sizes, size_t count, int srcOrder, size_t* failIdx);

// kv_copy_from_host copies n bytes of ordinary host memory src to dst in
// stream order, consuming src before it returns: one cuMemcpyBatchAsync entry
// with CU_MEMCPY_SRC_ACCESS_ORDER_DURING_API_CALL, or (KV_BATCH_LEGACY) one
// launch of upload (kvcm_upload_segment) per KV_UPLOAD_SEGMENT bytes.
kv_CUresult kv_copy_from_host(kv_CUcontext c, kv_CUstream s, int mode, kv_CUfunction upload, kv_CUdeviceptr dst,
                              const void* src, size_t n);

kv_CUresult kv_module_load(kv_CUcontext c, kv_CUmodule* m, const void* image, char* log, size_t loglen);
kv_CUresult kv_module_unload(kv_CUcontext c, kv_CUmodule m);
kv_CUresult kv_module_function(kv_CUcontext c, kv_CUfunction* f, kv_CUmodule m, const char* name);
kv_CUresult kv_func_attr(kv_CUcontext c, kv_CUfunction f, int attr, int* v);
// kv_launch launches f with nargs 8-byte parameters taken from args.
kv_CUresult kv_launch(kv_CUcontext c, kv_CUstream s, kv_CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                      unsigned bx, unsigned by, unsigned bz, unsigned shmem, const uint64_t* args, int nargs);

#endif
