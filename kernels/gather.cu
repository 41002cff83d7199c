// Lossless gather/scatter cold-page codec kernels (kvcm core/codec/gpucodec).
//
// The cold format is the default codec's: cold page c of a lifecycle is the
// concatenation, in pool order, of the page's slot bytes in every pool of its
// hot pool group, at coldBase + c*coldStride. The page indices are device
// resident PageIndexPair {int32 dst; int32 src} records (alignas(8)); each
// work item fetches its pair with one aligned 64-bit load.
//
// Work is split into tiles of at most a tile size that never span two pools:
// tile t covers page t / tilesPerPage and, within it, the pool whose
// firstTile range holds t % tilesPerPage. One warp moves one tile with up to
// tile/512 independent 16-byte loads per lane in flight before the stores,
// which is what reading mapped pinned host memory over PCIe needs.
//
// A pair whose hot slot is outside [0, numSlots) or whose cold page is
// negative is skipped and sets *err to 1 (a host-mapped word the codec checks
// in stream order); valid pairs of the same launch are still copied.
//
// Every parameter is 8 bytes wide so the host passes a flat uint64 array:
// (idx, nPairs, coldBase, coldStride, pools, numPools, tilesPerPage,
// numSlots, toHot, tileBytes, err).

#define KVCM_MAX_POOLS 128

struct PoolEntry {
    unsigned long long base;       // hot pool base (device or mapped host address)
    unsigned long long slotBytes;  // bytes of one slot in this pool
    unsigned long long coldOff;    // offset of this pool's bytes inside a cold page
    unsigned long long firstTile;  // first tile of this pool inside a page
};

struct TileRef {
    const unsigned char* src;
    unsigned char* dst;
    unsigned long long bytes;
    bool ok;
};

// locate resolves tile t to its source and destination bytes.
__device__ __forceinline__ TileRef locate(const PoolEntry* sp, unsigned long long numPools,
                                          const int2* __restrict__ idx, unsigned long long t,
                                          unsigned long long tilesPerPage, unsigned long long coldBase,
                                          unsigned long long coldStride, unsigned long long numSlots,
                                          unsigned long long toHot, unsigned long long tile) {
    TileRef ref;
    const unsigned long long pair = t / tilesPerPage;
    const unsigned long long r = t - pair * tilesPerPage;
    unsigned long long p = 0;
    while (p + 1 < numPools && sp[p + 1].firstTile <= r) {
        ++p;
    }
    const int2 pr = idx[pair];  // one aligned 64-bit load: x = dst, y = src
    const long long hot = toHot ? pr.x : pr.y;
    const long long cold = toHot ? pr.y : pr.x;
    ref.ok = hot >= 0 && (unsigned long long)hot < numSlots && cold >= 0;
    const unsigned long long off = (r - sp[p].firstTile) * tile;
    const unsigned long long rest = sp[p].slotBytes - off;
    ref.bytes = rest < tile ? rest : tile;
    unsigned char* hotp = (unsigned char*)(sp[p].base + (unsigned long long)hot * sp[p].slotBytes + off);
    unsigned char* coldp = (unsigned char*)(coldBase + (unsigned long long)cold * coldStride + sp[p].coldOff + off);
    ref.src = toHot ? coldp : hotp;
    ref.dst = toHot ? hotp : coldp;
    return ref;
}

__device__ __forceinline__ void load_pools(PoolEntry* sp, const PoolEntry* __restrict__ pools,
                                           unsigned long long numPools) {
    for (unsigned long long i = threadIdx.x; i < numPools; i += blockDim.x) {
        sp[i] = pools[i];
    }
    __syncthreads();
}

// Loads of the 16-byte kernels. LOAD 0: ld.global.cs (evict-first
// streaming); 1: the same with the L2::256B prefetch-size hint, so L2 fetches
// 256-byte lines (larger PCIe read requests from mapped host memory); 2:
// ld.global.nc (read-only path) with the same hint.
template <int LOAD>
__device__ __forceinline__ uint4 load16(const uint4* p) {
    uint4 v;
    if (LOAD == 0) {
        v = __ldcs(p);
    } else if (LOAD == 1) {
        asm("ld.global.cs.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
            : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
            : "l"(p));
    } else {
        asm("ld.global.nc.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
            : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
            : "l"(p));
    }
    return v;
}

// gather16 moves tiles of PER_LANE*512 bytes (PER_LANE 16-byte loads per
// lane, all in flight before the stores). It requires every pool base, slot
// size, cold offset, cold stride and cold base to be multiples of 16 bytes;
// the host computes firstTile and tilesPerPage with the same tile size.
template <int PER_LANE, int LOAD>
__device__ __forceinline__ void gather16(const int2* __restrict__ idx, unsigned long long nPairs,
                                         unsigned long long coldBase, unsigned long long coldStride,
                                         const PoolEntry* __restrict__ pools, unsigned long long numPools,
                                         unsigned long long tilesPerPage, unsigned long long numSlots,
                                         unsigned long long toHot, unsigned int* err) {
    __shared__ PoolEntry sp[KVCM_MAX_POOLS];
    load_pools(sp, pools, numPools);
    constexpr unsigned long long tile = PER_LANE * 512ull;
    const unsigned lane = threadIdx.x & 31;
    const unsigned long long warp = ((unsigned long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const unsigned long long nwarps = ((unsigned long long)gridDim.x * blockDim.x) >> 5;
    const unsigned long long nTiles = nPairs * tilesPerPage;
    for (unsigned long long t = warp; t < nTiles; t += nwarps) {
        const TileRef ref = locate(sp, numPools, idx, t, tilesPerPage, coldBase, coldStride, numSlots, toHot, tile);
        if (!ref.ok) {
            if (lane == 0) {
                *(volatile unsigned int*)err = 1u;
            }
            continue;
        }
        const uint4* s = (const uint4*)ref.src;
        uint4* d = (uint4*)ref.dst;
        const unsigned nvec = (unsigned)(ref.bytes >> 4);
        uint4 v[PER_LANE];
#pragma unroll
        for (int k = 0; k < PER_LANE; ++k) {
            const unsigned j = lane + 32u * k;
            if (j < nvec) {
                v[k] = load16<LOAD>(s + j);
            }
        }
#pragma unroll
        for (int k = 0; k < PER_LANE; ++k) {
            const unsigned j = lane + 32u * k;
            if (j < nvec) {
                __stcs(d + j, v[k]);
            }
        }
    }
}

#define KVCM_GATHER16(name, perLane, load)                                                                   \
    extern "C" __global__ void __launch_bounds__(256)                                                        \
    name(const int2* __restrict__ idx, unsigned long long nPairs, unsigned long long coldBase,              \
         unsigned long long coldStride, const PoolEntry* __restrict__ pools, unsigned long long numPools,   \
         unsigned long long tilesPerPage, unsigned long long numSlots, unsigned long long toHot,           \
         unsigned long long tileBytes, unsigned int* err) {                                                \
        gather16<perLane, load>(idx, nPairs, coldBase, coldStride, pools, numPools, tilesPerPage, numSlots, \
                                toHot, err);                                                               \
    }

// The variants gpucodec.GatherOptions.Kernel selects; every tile size a
// variant uses is a multiple of 16 bytes.
KVCM_GATHER16(kvcm_gather16, 8, 0)      // 4 KiB tiles, streaming loads
KVCM_GATHER16(kvcm_gather16_pf, 8, 1)   // 4 KiB tiles, streaming loads, L2::256B
KVCM_GATHER16(kvcm_gather16_nc, 8, 2)   // 4 KiB tiles, read-only loads, L2::256B
KVCM_GATHER16(kvcm_gather16_8k, 16, 1)  // 8 KiB tiles, streaming loads, L2::256B

// kvcm_gather1 is the fallback for layouts that are not 16-byte aligned: the
// same tiles (tileBytes, the tile size of the 16-byte variant in use, so both
// share one pool table), moved one byte per lane and step.
extern "C" __global__ void __launch_bounds__(256)
kvcm_gather1(const int2* __restrict__ idx, unsigned long long nPairs, unsigned long long coldBase,
             unsigned long long coldStride, const PoolEntry* __restrict__ pools,
             unsigned long long numPools, unsigned long long tilesPerPage,
             unsigned long long numSlots, unsigned long long toHot, unsigned long long tileBytes,
             unsigned int* err) {
    __shared__ PoolEntry sp[KVCM_MAX_POOLS];
    load_pools(sp, pools, numPools);
    const unsigned lane = threadIdx.x & 31;
    const unsigned long long warp = ((unsigned long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const unsigned long long nwarps = ((unsigned long long)gridDim.x * blockDim.x) >> 5;
    const unsigned long long nTiles = nPairs * tilesPerPage;
    for (unsigned long long t = warp; t < nTiles; t += nwarps) {
        const TileRef ref = locate(sp, numPools, idx, t, tilesPerPage, coldBase, coldStride, numSlots, toHot,
                                   tileBytes);
        if (!ref.ok) {
            if (lane == 0) {
                *(volatile unsigned int*)err = 1u;
            }
            continue;
        }
        for (unsigned long long j = lane; j < ref.bytes; j += 32) {
            ref.dst[j] = ref.src[j];
        }
    }
}
