// shim.c loads the CUDA driver at run time (dlopen + cuGetProcAddress) and
// wraps the entry points kvcm uses. Each wrapper that needs a context makes
// the device's primary context current on the calling OS thread first, in the
// same C call, so that Go's moving goroutines between threads never leaves a
// driver call without its context.
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shim.h"
#include "_cgo_export.h"

#define KV_CB  // CUDA_CB is empty on Linux

typedef void (*kv_hostfn)(void*);

typedef kv_CUresult (*pf_cuInit)(unsigned);
typedef kv_CUresult (*pf_cuDriverGetVersion)(int*);
typedef kv_CUresult (*pf_cuGetProcAddress_v2)(const char*, void**, int, uint64_t, int*);
typedef kv_CUresult (*pf_cuGetProcAddress_v1)(const char*, void**, int, uint64_t);
typedef kv_CUresult (*pf_cuGetErrorName)(kv_CUresult, const char**);

static struct {
	int loaded;
	int version;
	void* lib;
	pf_cuGetProcAddress_v2 getProc2;
	pf_cuGetProcAddress_v1 getProc1;
	pf_cuGetErrorName getErrorName;
	pf_cuGetErrorName getErrorString;

	kv_CUresult (*deviceGetCount)(int*);
	kv_CUresult (*deviceGet)(kv_CUdevice*, int);
	kv_CUresult (*deviceGetName)(char*, int, kv_CUdevice);
	kv_CUresult (*deviceGetAttribute)(int*, int, kv_CUdevice);
	kv_CUresult (*deviceTotalMem)(size_t*, kv_CUdevice);
	kv_CUresult (*primaryRetain)(kv_CUcontext*, kv_CUdevice);
	kv_CUresult (*primaryRelease)(kv_CUdevice);
	kv_CUresult (*ctxGetCurrent)(kv_CUcontext*);
	kv_CUresult (*ctxSetCurrent)(kv_CUcontext);
	kv_CUresult (*ctxSynchronize)(void);
	kv_CUresult (*memAlloc)(kv_CUdeviceptr*, size_t);
	kv_CUresult (*memFree)(kv_CUdeviceptr);
	kv_CUresult (*memGetInfo)(size_t*, size_t*);
	kv_CUresult (*memHostRegister)(void*, size_t, unsigned);
	kv_CUresult (*memHostUnregister)(void*);
	kv_CUresult (*memHostGetDevicePointer)(kv_CUdeviceptr*, void*, unsigned);
	kv_CUresult (*memGetAllocationGranularity)(size_t*, const kv_CUmemAllocationProp*, int);
	kv_CUresult (*memAddressReserve)(kv_CUdeviceptr*, size_t, size_t, kv_CUdeviceptr, unsigned long long);
	kv_CUresult (*memAddressFree)(kv_CUdeviceptr, size_t);
	kv_CUresult (*memCreate)(uint64_t*, size_t, const kv_CUmemAllocationProp*, unsigned long long);
	kv_CUresult (*memRelease)(uint64_t);
	kv_CUresult (*memMap)(kv_CUdeviceptr, size_t, size_t, uint64_t, unsigned long long);
	kv_CUresult (*memUnmap)(kv_CUdeviceptr, size_t);
	kv_CUresult (*memSetAccess)(kv_CUdeviceptr, size_t, const kv_CUmemAccessDesc*, size_t);
	kv_CUresult (*streamCreate)(kv_CUstream*, unsigned);
	kv_CUresult (*streamDestroy)(kv_CUstream);
	kv_CUresult (*streamSynchronize)(kv_CUstream);
	kv_CUresult (*streamWaitEvent)(kv_CUstream, kv_CUevent, unsigned);
	kv_CUresult (*streamGetCtx)(kv_CUstream, kv_CUcontext*);
	kv_CUresult (*eventCreate)(kv_CUevent*, unsigned);
	kv_CUresult (*eventDestroy)(kv_CUevent);
	kv_CUresult (*eventRecord)(kv_CUevent, kv_CUstream);
	kv_CUresult (*eventQuery)(kv_CUevent);
	kv_CUresult (*eventSynchronize)(kv_CUevent);
	kv_CUresult (*eventElapsedTime)(float*, kv_CUevent, kv_CUevent);
	kv_CUresult (*launchHostFunc)(kv_CUstream, kv_hostfn, void*);
	kv_CUresult (*streamWaitValue32)(kv_CUstream, kv_CUdeviceptr, uint32_t, unsigned);  // optional
	kv_CUresult (*memcpyAsync)(kv_CUdeviceptr, kv_CUdeviceptr, size_t, kv_CUstream);
	kv_CUresult (*memsetD8Async)(kv_CUdeviceptr, unsigned char, size_t, kv_CUstream);
	kv_CUresult (*moduleLoadDataEx)(kv_CUmodule*, const void*, unsigned, int*, void**);
	kv_CUresult (*moduleUnload)(kv_CUmodule);
	kv_CUresult (*moduleGetFunction)(kv_CUfunction*, kv_CUmodule, const char*);
	kv_CUresult (*funcGetAttribute)(int*, int, kv_CUfunction);
	kv_CUresult (*launchKernel)(kv_CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
	                            kv_CUstream, void**, void**);
	// cuMemcpyBatchAsync, CUDA 12.8 ABI (failIdx) and CUDA 13.0 ABI (_v2).
	kv_CUresult (*batch12080)(uint64_t*, uint64_t*, size_t*, size_t, kv_CUmemcpyAttributes*, size_t*, size_t, size_t*,
	                          kv_CUstream);
	kv_CUresult (*batch13000)(uint64_t*, uint64_t*, size_t*, size_t, kv_CUmemcpyAttributes*, size_t*, size_t,
	                          kv_CUstream);
} g;

static void* resolve(const char* name, int version) {
	void* p = NULL;
	kv_CUresult r;
	if (g.getProc2) {
		int status = 0;
		r = g.getProc2(name, &p, version, 0 /* CU_GET_PROC_ADDRESS_DEFAULT */, &status);
		if (status != 0) p = NULL;
	} else {
		r = g.getProc1(name, &p, version, 0);
	}
	return r == KV_CUDA_SUCCESS ? p : NULL;
}

int kv_load(const char* path, char* err, size_t errlen) {
	// The library is opened even when the driver is already loaded, so that a
	// path that does not exist always fails; the first driver loaded stays.
	void* lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!lib) {
		const char* e = dlerror();
		snprintf(err, errlen, "dlopen %s: %s", path, e ? e : "unknown error");
		return -1;
	}
	if (g.loaded) {
		dlclose(lib);
		return 0;
	}
	pf_cuInit init = (pf_cuInit)dlsym(lib, "cuInit");
	pf_cuDriverGetVersion ver = (pf_cuDriverGetVersion)dlsym(lib, "cuDriverGetVersion");
	g.getProc2 = (pf_cuGetProcAddress_v2)dlsym(lib, "cuGetProcAddress_v2");
	g.getProc1 = g.getProc2 ? NULL : (pf_cuGetProcAddress_v1)dlsym(lib, "cuGetProcAddress");
	g.getErrorName = (pf_cuGetErrorName)dlsym(lib, "cuGetErrorName");
	g.getErrorString = (pf_cuGetErrorName)dlsym(lib, "cuGetErrorString");
	if (!init || !ver || (!g.getProc2 && !g.getProc1)) {
		snprintf(err, errlen, "%s has no cuInit, cuDriverGetVersion or cuGetProcAddress (driver older than CUDA 11.3?)",
		         path);
		dlclose(lib);
		memset(&g, 0, sizeof g);
		return -1;
	}
	kv_CUresult r = init(0);
	if (r != KV_CUDA_SUCCESS) {
		snprintf(err, errlen, "cuInit");
		g.lib = lib;  // keep: the error name is looked up through it
		return r;
	}
	int version = 0;
	r = ver(&version);
	if (r != KV_CUDA_SUCCESS) {
		snprintf(err, errlen, "cuDriverGetVersion");
		g.lib = lib;
		return r;
	}
	// Request the CUDA 12.0 ABI of every ordinary entry point (the one the
	// signatures above declare); an older driver gets its own version.
	int want = version < 12000 ? version : 12000;
	const char* missing = NULL;
#define RESOLVE(field, name)                              \
	do {                                                  \
		*(void**)&g.field = resolve(name, want);          \
		if (!g.field && !missing) missing = name;         \
	} while (0)
	RESOLVE(deviceGetCount, "cuDeviceGetCount");
	RESOLVE(deviceGet, "cuDeviceGet");
	RESOLVE(deviceGetName, "cuDeviceGetName");
	RESOLVE(deviceGetAttribute, "cuDeviceGetAttribute");
	RESOLVE(deviceTotalMem, "cuDeviceTotalMem");
	RESOLVE(primaryRetain, "cuDevicePrimaryCtxRetain");
	RESOLVE(primaryRelease, "cuDevicePrimaryCtxRelease");
	RESOLVE(ctxGetCurrent, "cuCtxGetCurrent");
	RESOLVE(ctxSetCurrent, "cuCtxSetCurrent");
	RESOLVE(ctxSynchronize, "cuCtxSynchronize");
	RESOLVE(memAlloc, "cuMemAlloc");
	RESOLVE(memFree, "cuMemFree");
	RESOLVE(memGetInfo, "cuMemGetInfo");
	RESOLVE(memHostRegister, "cuMemHostRegister");
	RESOLVE(memHostUnregister, "cuMemHostUnregister");
	RESOLVE(memHostGetDevicePointer, "cuMemHostGetDevicePointer");
	RESOLVE(memGetAllocationGranularity, "cuMemGetAllocationGranularity");
	RESOLVE(memAddressReserve, "cuMemAddressReserve");
	RESOLVE(memAddressFree, "cuMemAddressFree");
	RESOLVE(memCreate, "cuMemCreate");
	RESOLVE(memRelease, "cuMemRelease");
	RESOLVE(memMap, "cuMemMap");
	RESOLVE(memUnmap, "cuMemUnmap");
	RESOLVE(memSetAccess, "cuMemSetAccess");
	RESOLVE(streamCreate, "cuStreamCreate");
	RESOLVE(streamDestroy, "cuStreamDestroy");
	RESOLVE(streamSynchronize, "cuStreamSynchronize");
	RESOLVE(streamWaitEvent, "cuStreamWaitEvent");
	RESOLVE(streamGetCtx, "cuStreamGetCtx");
	RESOLVE(eventCreate, "cuEventCreate");
	RESOLVE(eventDestroy, "cuEventDestroy");
	RESOLVE(eventRecord, "cuEventRecord");
	RESOLVE(eventQuery, "cuEventQuery");
	RESOLVE(eventSynchronize, "cuEventSynchronize");
	RESOLVE(eventElapsedTime, "cuEventElapsedTime");
	RESOLVE(launchHostFunc, "cuLaunchHostFunc");
	RESOLVE(memcpyAsync, "cuMemcpyAsync");
	RESOLVE(memsetD8Async, "cuMemsetD8Async");
	RESOLVE(moduleLoadDataEx, "cuModuleLoadDataEx");
	RESOLVE(moduleUnload, "cuModuleUnload");
	RESOLVE(moduleGetFunction, "cuModuleGetFunction");
	RESOLVE(funcGetAttribute, "cuFuncGetAttribute");
	RESOLVE(launchKernel, "cuLaunchKernel");
#undef RESOLVE
	if (missing) {
		snprintf(err, errlen, "%s: cuGetProcAddress found no %s for CUDA %d", path, missing, want);
		memset(&g, 0, sizeof g);
		dlclose(lib);
		return -1;
	}
	// cuMemcpyBatchAsync by driver version: CUDA 13 changed its ABI (_v2
	// drops failIdx); cuGetProcAddress hands out the ABI of the version asked.
	if (version >= 13000) {
		*(void**)&g.batch13000 = resolve("cuMemcpyBatchAsync", 13000);
	}
	if (version >= 12080 && !g.batch13000) {
		*(void**)&g.batch12080 = resolve("cuMemcpyBatchAsync", 12080);
	}
	// Stream memory operations (cuStreamWaitValue32, the v2 entry point of
	// CUDA 12); optional: WaitHost falls back to a host function without it.
	*(void**)&g.streamWaitValue32 = resolve("cuStreamWaitValue32", want);
	g.lib = lib;
	g.version = version;
	g.loaded = 1;
	return 0;
}

int kv_driver_version(void) { return g.version; }

int kv_batch_mode(void) {
	if (g.batch13000) return KV_BATCH_V13000;
	if (g.batch12080) return KV_BATCH_V12080;
	return KV_BATCH_LEGACY;
}

const char* kv_error_name(kv_CUresult r) {
	const char* s = NULL;
	if (g.getErrorName && g.getErrorName(r, &s) == KV_CUDA_SUCCESS && s) return s;
	return NULL;
}

const char* kv_error_string(kv_CUresult r) {
	const char* s = NULL;
	if (g.getErrorString && g.getErrorString(r, &s) == KV_CUDA_SUCCESS && s) return s;
	return NULL;
}

static inline kv_CUresult set_ctx(kv_CUcontext c) {
	kv_CUcontext cur = NULL;
	if (g.ctxGetCurrent(&cur) == KV_CUDA_SUCCESS && cur == c) return KV_CUDA_SUCCESS;
	return g.ctxSetCurrent(c);
}

#define WITH_CTX(c)                                     \
	do {                                                \
		kv_CUresult r_ = set_ctx(c);                    \
		if (r_ != KV_CUDA_SUCCESS) return r_;           \
	} while (0)

kv_CUresult kv_device_count(int* n) { return g.deviceGetCount(n); }
kv_CUresult kv_device_get(kv_CUdevice* d, int ordinal) { return g.deviceGet(d, ordinal); }
kv_CUresult kv_device_name(kv_CUdevice d, char* name, int len) { return g.deviceGetName(name, len, d); }
kv_CUresult kv_device_attr(kv_CUdevice d, int attr, int* v) { return g.deviceGetAttribute(v, attr, d); }
kv_CUresult kv_device_total_mem(kv_CUdevice d, size_t* bytes) { return g.deviceTotalMem(bytes, d); }
kv_CUresult kv_primary_retain(kv_CUdevice d, kv_CUcontext* c) { return g.primaryRetain(c, d); }
kv_CUresult kv_primary_release(kv_CUdevice d) { return g.primaryRelease(d); }

kv_CUresult kv_ctx_sync(kv_CUcontext c) {
	WITH_CTX(c);
	return g.ctxSynchronize();
}

kv_CUresult kv_mem_alloc(kv_CUcontext c, kv_CUdeviceptr* p, size_t n) {
	WITH_CTX(c);
	return g.memAlloc(p, n);
}

kv_CUresult kv_mem_free(kv_CUcontext c, kv_CUdeviceptr p) {
	WITH_CTX(c);
	return g.memFree(p);
}

kv_CUresult kv_mem_get_info(kv_CUcontext c, size_t* free, size_t* total) {
	WITH_CTX(c);
	return g.memGetInfo(free, total);
}

kv_CUresult kv_host_register(kv_CUcontext c, void* p, size_t n, kv_CUdeviceptr* dev) {
	WITH_CTX(c);
	kv_CUresult r = g.memHostRegister(p, n, KV_CU_MEMHOSTREGISTER_PORTABLE | KV_CU_MEMHOSTREGISTER_DEVICEMAP);
	if (r != KV_CUDA_SUCCESS) return r;
	r = g.memHostGetDevicePointer(dev, p, 0);
	if (r != KV_CUDA_SUCCESS) g.memHostUnregister(p);
	return r;
}

kv_CUresult kv_host_unregister(kv_CUcontext c, void* p) {
	WITH_CTX(c);
	return g.memHostUnregister(p);
}

static kv_CUmemAllocationProp vmm_prop(int ordinal) {
	kv_CUmemAllocationProp p;
	memset(&p, 0, sizeof p);
	p.type = 1;           // CU_MEM_ALLOCATION_TYPE_PINNED
	p.location.type = 1;  // CU_MEM_LOCATION_TYPE_DEVICE
	p.location.id = ordinal;
	return p;
}

kv_CUresult kv_vmm_granularity(kv_CUcontext c, int ordinal, size_t* gran) {
	WITH_CTX(c);
	kv_CUmemAllocationProp p = vmm_prop(ordinal);
	return g.memGetAllocationGranularity(gran, &p, 1 /* CU_MEM_ALLOC_GRANULARITY_RECOMMENDED */);
}

kv_CUresult kv_vmm_reserve(kv_CUcontext c, kv_CUdeviceptr* p, size_t size, size_t align) {
	WITH_CTX(c);
	return g.memAddressReserve(p, size, align, 0, 0);
}

kv_CUresult kv_vmm_free(kv_CUcontext c, kv_CUdeviceptr p, size_t size) {
	WITH_CTX(c);
	return g.memAddressFree(p, size);
}

kv_CUresult kv_vmm_map(kv_CUcontext c, int ordinal, kv_CUdeviceptr p, size_t size, uint64_t* handle) {
	WITH_CTX(c);
	kv_CUmemAllocationProp prop = vmm_prop(ordinal);
	kv_CUresult r = g.memCreate(handle, size, &prop, 0);
	if (r != KV_CUDA_SUCCESS) return r;
	r = g.memMap(p, size, 0, *handle, 0);
	if (r != KV_CUDA_SUCCESS) {
		g.memRelease(*handle);
		return r;
	}
	kv_CUmemAccessDesc acc;
	memset(&acc, 0, sizeof acc);
	acc.location = prop.location;
	acc.flags = 3;  // CU_MEM_ACCESS_FLAGS_PROT_READWRITE
	r = g.memSetAccess(p, size, &acc, 1);
	if (r != KV_CUDA_SUCCESS) {
		g.memUnmap(p, size);
		g.memRelease(*handle);
	}
	return r;
}

kv_CUresult kv_vmm_unmap(kv_CUcontext c, kv_CUdeviceptr p, size_t size, uint64_t handle) {
	WITH_CTX(c);
	kv_CUresult r = g.memUnmap(p, size);
	kv_CUresult r2 = g.memRelease(handle);
	return r != KV_CUDA_SUCCESS ? r : r2;
}

kv_CUresult kv_stream_create(kv_CUcontext c, kv_CUstream* s) {
	WITH_CTX(c);
	return g.streamCreate(s, KV_CU_STREAM_NON_BLOCKING);
}

kv_CUresult kv_stream_destroy(kv_CUcontext c, kv_CUstream s) {
	WITH_CTX(c);
	return g.streamDestroy(s);
}

kv_CUresult kv_stream_check_ctx(kv_CUcontext c, uintptr_t s, int* same) {
	WITH_CTX(c);
	kv_CUcontext owner = NULL;
	kv_CUresult r = g.streamGetCtx((kv_CUstream)s, &owner);
	*same = r == KV_CUDA_SUCCESS && owner == c;
	return r;
}

kv_CUresult kv_stream_sync(kv_CUcontext c, kv_CUstream s) {
	WITH_CTX(c);
	return g.streamSynchronize(s);
}

kv_CUresult kv_stream_wait_event(kv_CUcontext c, kv_CUstream s, kv_CUevent e) {
	WITH_CTX(c);
	return g.streamWaitEvent(s, e, 0);
}

kv_CUresult kv_event_create(kv_CUcontext c, kv_CUevent* e, int timing) {
	WITH_CTX(c);
	return g.eventCreate(e, timing ? 0 : KV_CU_EVENT_DISABLE_TIMING);
}

kv_CUresult kv_event_destroy(kv_CUcontext c, kv_CUevent e) {
	WITH_CTX(c);
	return g.eventDestroy(e);
}

kv_CUresult kv_event_record(kv_CUcontext c, kv_CUevent e, kv_CUstream s) {
	WITH_CTX(c);
	return g.eventRecord(e, s);
}

kv_CUresult kv_event_query(kv_CUcontext c, kv_CUevent e) {
	WITH_CTX(c);
	return g.eventQuery(e);
}

kv_CUresult kv_event_sync(kv_CUcontext c, kv_CUevent e) {
	WITH_CTX(c);
	return g.eventSynchronize(e);
}

kv_CUresult kv_event_elapsed(kv_CUcontext c, float* ms, kv_CUevent start, kv_CUevent end) {
	WITH_CTX(c);
	return g.eventElapsedTime(ms, start, end);
}

// host_trampoline runs on a driver thread in stream order and calls back into
// Go with the handle of the Go closure. It makes no CUDA call.
static void KV_CB host_trampoline(void* user) { kvcmCudaHostFunc((uintptr_t)user); }

kv_CUresult kv_host_func(kv_CUcontext c, kv_CUstream s, uintptr_t handle) {
	WITH_CTX(c);
	return g.launchHostFunc(s, host_trampoline, (void*)handle);
}

kv_CUresult kv_stream_wait_value32(kv_CUcontext c, kv_CUstream s, kv_CUdeviceptr addr, uint32_t value) {
	if (!g.streamWaitValue32) return KV_CUDA_ERROR_NOT_SUPPORTED;
	WITH_CTX(c);
	return g.streamWaitValue32(s, addr, value, 0 /* CU_STREAM_WAIT_VALUE_GEQ */);
}

kv_CUresult kv_memset8(kv_CUcontext c, kv_CUstream s, kv_CUdeviceptr p, unsigned char v, size_t n) {
	WITH_CTX(c);
	return g.memsetD8Async(p, v, n, s);
}

static kv_CUresult batch(kv_CUstream s, int mode, uint64_t* dsts, uint64_t* srcs, size_t* sizes, size_t count,
                         int srcOrder, size_t* failIdx) {
	kv_CUmemcpyAttributes attr;
	memset(&attr, 0, sizeof attr);
	attr.srcAccessOrder = srcOrder;
	attr.flags = KV_CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE;
	size_t attrIdx = 0;
	*failIdx = count;
	if (mode == KV_BATCH_V13000) {
		return g.batch13000(dsts, srcs, sizes, count, &attr, &attrIdx, 1, s);
	}
	size_t fi = (size_t)-1;
	kv_CUresult r = g.batch12080(dsts, srcs, sizes, count, &attr, &attrIdx, 1, &fi, s);
	if (r != KV_CUDA_SUCCESS && fi < count) *failIdx = fi;
	return r;
}

kv_CUresult kv_batch_copy(kv_CUcontext c, kv_CUstream s, int mode, const uint64_t* dsts, const uint64_t* srcs,
                          const uint64_t* sizes, size_t count, int srcOrder, size_t* failIdx) {
	WITH_CTX(c);
	*failIdx = count;
	if (count == 0) return KV_CUDA_SUCCESS;
	if ((mode == KV_BATCH_V13000 && g.batch13000) || (mode == KV_BATCH_V12080 && g.batch12080)) {
		return batch(s, mode, (uint64_t*)dsts, (uint64_t*)srcs, (size_t*)sizes, count, srcOrder, failIdx);
	}
	for (size_t i = 0; i < count; i++) {
		kv_CUresult r = g.memcpyAsync(dsts[i], srcs[i], sizes[i], s);
		if (r != KV_CUDA_SUCCESS) {
			*failIdx = i;
			return r;
		}
	}
	return KV_CUDA_SUCCESS;
}

// Mirrors struct UploadSegment of kernels/upload.cu.
typedef struct {
	uint64_t dst;
	uint64_t n;
	unsigned char data[KV_UPLOAD_SEGMENT];
} kv_upload_segment;

_Static_assert(sizeof(kv_upload_segment) <= 4096, "kernel parameters must fit in 4 KiB");

kv_CUresult kv_copy_from_host(kv_CUcontext c, kv_CUstream s, int mode, kv_CUfunction upload, kv_CUdeviceptr dst,
                              const void* src, size_t n) {
	WITH_CTX(c);
	if (n == 0) return KV_CUDA_SUCCESS;
	if ((mode == KV_BATCH_V13000 && g.batch13000) || (mode == KV_BATCH_V12080 && g.batch12080)) {
		uint64_t d = dst, sp = (uint64_t)(uintptr_t)src;
		size_t size = n, fi;
		return batch(s, mode, &d, &sp, &size, 1, KV_CU_MEMCPY_SRC_ACCESS_ORDER_DURING_API_CALL, &fi);
	}
	if (!upload) return KV_CUDA_ERROR_NOT_SUPPORTED;
	// 4 KiB: on the heap, neither on small C stacks nor in thread-local
	// storage (a Go c-shared library's TLS must fit glibc's static surplus,
	// or dlopen of libkvcm fails). Launches copy their parameters.
	kv_upload_segment* seg = malloc(sizeof *seg);
	if (!seg) return KV_CUDA_ERROR_OUT_OF_MEMORY;
	kv_CUresult r = KV_CUDA_SUCCESS;
	for (size_t off = 0; off < n && r == KV_CUDA_SUCCESS; off += KV_UPLOAD_SEGMENT) {
		size_t len = n - off < KV_UPLOAD_SEGMENT ? n - off : KV_UPLOAD_SEGMENT;
		seg->dst = dst + off;
		seg->n = len;
		memcpy(seg->data, (const unsigned char*)src + off, len);
		void* params[1] = {seg};
		r = g.launchKernel(upload, 1, 1, 1, 256, 1, 1, 0, s, params, NULL);
	}
	free(seg);
	return r;
}

kv_CUresult kv_module_load(kv_CUcontext c, kv_CUmodule* m, const void* image, char* log, size_t loglen) {
	WITH_CTX(c);
	int opts[2] = {5 /* CU_JIT_ERROR_LOG_BUFFER */, 6 /* CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES */};
	void* vals[2] = {log, (void*)(uintptr_t)loglen};
	if (loglen > 0) log[0] = 0;
	return g.moduleLoadDataEx(m, image, loglen > 0 ? 2 : 0, opts, vals);
}

kv_CUresult kv_module_unload(kv_CUcontext c, kv_CUmodule m) {
	WITH_CTX(c);
	return g.moduleUnload(m);
}

kv_CUresult kv_module_function(kv_CUcontext c, kv_CUfunction* f, kv_CUmodule m, const char* name) {
	WITH_CTX(c);
	return g.moduleGetFunction(f, m, name);
}

kv_CUresult kv_func_attr(kv_CUcontext c, kv_CUfunction f, int attr, int* v) {
	WITH_CTX(c);
	return g.funcGetAttribute(v, attr, f);
}

kv_CUresult kv_launch(kv_CUcontext c, kv_CUstream s, kv_CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                      unsigned bx, unsigned by, unsigned bz, unsigned shmem, const uint64_t* args, int nargs) {
	WITH_CTX(c);
	void* params[32];
	if (nargs < 0 || nargs > 32) return 1;  // CUDA_ERROR_INVALID_VALUE
	for (int i = 0; i < nargs; i++) params[i] = (void*)&args[i];
	return g.launchKernel(f, gx, gy, gz, bx, by, bz, shmem, s, params, NULL);
}
