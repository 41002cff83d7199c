// Index upload fallback for drivers older than CUDA 12.8 (no
// cuMemcpyBatchAsync): the bytes travel inside the kernel's parameter block,
// which the driver copies when cuLaunchKernel is called, so the pageable
// source is consumed before the call returns, exactly as
// CU_MEMCPY_SRC_ACCESS_ORDER_DURING_API_CALL guarantees on newer drivers.
// The host splits an upload into segments of KVCM_UPLOAD_SEGMENT bytes, one
// launch each; the whole parameter block stays under the 4 KiB limit that
// every driver supports.

#define KVCM_UPLOAD_SEGMENT 4064

struct UploadSegment {
    unsigned long long dst;  // destination address (device or mapped host)
    unsigned long long n;    // bytes in data, at most KVCM_UPLOAD_SEGMENT
    unsigned char data[KVCM_UPLOAD_SEGMENT];
};

extern "C" __global__ void kvcm_upload_segment(const UploadSegment seg) {
    unsigned char* d = (unsigned char*)seg.dst;
    for (unsigned long long i = threadIdx.x; i < seg.n; i += blockDim.x) {
        d[i] = seg.data[i];
    }
}
