// Fixed-ratio quantizing cold-page codec kernels (kvcm core/codec/gpucodec):
// 16-bit floating point hot pages (fp16 or bf16) <-> FP8 e4m3 cold pages
// with one float32 scale per block of 8*L elements (L lanes of 8 elements,
// L a power of two up to 32; the default block is 128 elements, L = 16).
//
// Cold page layout of a lifecycle whose hot page spans pools 0..P-1:
//   [data of pool 0][data of pool 1]...[scales of pool 0][scales of pool 1]...
// where the data of pool p is slotBytes_p/2 bytes of e4m3 (one per element,
// in element order) at dataOff_p, and its scales are one little-endian
// float32 per block at scaleOff_p. The page is padded to 16 bytes.
//
// Encode: scale = amax/448 over the block (448 is e4m3's largest finite
// value), q = e4m3(x * 448/amax) rounded to nearest even and saturated to
// +-448. Decode: x' = q * scale rounded to the hot format. A block of zeros
// has scale 0 and decodes to zeros. Non-finite inputs are not preserved.
//
// Page indices are device-resident PageIndexPair {int32 dst; int32 src}
// records fetched with one aligned 64-bit load; a pair with a hot slot outside
// [0, numSlots) or a negative cold page is skipped and sets *err to 1.
// Every parameter is 8 bytes wide.

#define KVCM_Q_MAX_POOLS 128

struct QuantPool {
    unsigned long long base;        // hot pool base
    unsigned long long slotBytes;   // bytes of one slot (multiple of 16*L)
    unsigned long long dataOff;     // offset of this pool's e4m3 bytes in a cold page
    unsigned long long scaleOff;    // offset of this pool's scales in a cold page
    unsigned long long firstBlock;  // first block of this pool inside a page
};

__device__ __forceinline__ float h_to_f32(unsigned short h, unsigned long long bf16) {
    if (bf16) {
        return __uint_as_float(((unsigned int)h) << 16);
    }
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ unsigned int f32_to_h(float f, unsigned long long bf16) {
    unsigned short h;
    if (bf16) {
        asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
    } else {
        asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    }
    return h;
}

// e4m3x2 packs lo into the low byte and hi into the high byte.
__device__ __forceinline__ unsigned int e4m3x2(float lo, float hi) {
    unsigned short r;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
    return r;
}

// e4m3x2_to_f32 unpacks two e4m3 values (low byte first).
__device__ __forceinline__ void e4m3x2_to_f32(unsigned short q, float& lo, float& hi) {
    unsigned int h2;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"(q));
    unsigned short l = (unsigned short)(h2 & 0xffffu), u = (unsigned short)(h2 >> 16);
    asm("cvt.f32.f16 %0, %1;" : "=f"(lo) : "h"(l));
    asm("cvt.f32.f16 %0, %1;" : "=f"(hi) : "h"(u));
}

struct BlockRef {
    unsigned char* hot;    // this lane's 16 hot bytes
    unsigned char* data;   // this lane's 8 cold bytes
    float* scale;          // the block's scale
    bool ok;
};

__device__ __forceinline__ BlockRef locate(const QuantPool* sp, unsigned long long numPools,
                                           const int2* __restrict__ idx, unsigned long long g,
                                           unsigned long long blocksPerPage, unsigned long long coldBase,
                                           unsigned long long coldStride, unsigned long long numSlots,
                                           unsigned long long toHot, unsigned lanes, unsigned sub) {
    BlockRef ref;
    const unsigned long long pair = g / blocksPerPage;
    const unsigned long long r = g - pair * blocksPerPage;
    unsigned long long p = 0;
    while (p + 1 < numPools && sp[p + 1].firstBlock <= r) {
        ++p;
    }
    const int2 pr = idx[pair];  // one aligned 64-bit load: x = dst, y = src
    const long long hot = toHot ? pr.x : pr.y;
    const long long cold = toHot ? pr.y : pr.x;
    ref.ok = hot >= 0 && (unsigned long long)hot < numSlots && cold >= 0;
    const unsigned long long bip = r - sp[p].firstBlock;
    const unsigned long long page = coldBase + (unsigned long long)cold * coldStride;
    ref.hot = (unsigned char*)(sp[p].base + (unsigned long long)hot * sp[p].slotBytes +
                               bip * (16ull * lanes) + 16ull * sub);
    ref.data = (unsigned char*)(page + sp[p].dataOff + bip * (8ull * lanes) + 8ull * sub);
    ref.scale = (float*)(page + sp[p].scaleOff + bip * 4ull);
    return ref;
}

__device__ __forceinline__ void load_qpools(QuantPool* sp, const QuantPool* __restrict__ pools,
                                            unsigned long long numPools) {
    for (unsigned long long i = threadIdx.x; i < numPools; i += blockDim.x) {
        sp[i] = pools[i];
    }
    __syncthreads();
}

extern "C" __global__ void __launch_bounds__(256)
kvcm_quant_encode(const int2* __restrict__ idx, unsigned long long nPairs, unsigned long long coldBase,
                  unsigned long long coldStride, const QuantPool* __restrict__ pools,
                  unsigned long long numPools, unsigned long long blocksPerPage,
                  unsigned long long numSlots, unsigned long long bf16, unsigned long long log2Lanes,
                  unsigned int* err) {
    __shared__ QuantPool sp[KVCM_Q_MAX_POOLS];
    load_qpools(sp, pools, numPools);
    const unsigned lane = threadIdx.x & 31;
    const unsigned lanes = 1u << log2Lanes;
    const unsigned sub = lane & (lanes - 1);
    const unsigned grp = lane >> log2Lanes;
    const unsigned long long perWarp = 32u >> log2Lanes;
    const unsigned long long warp = ((unsigned long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const unsigned long long nwarps = ((unsigned long long)gridDim.x * blockDim.x) >> 5;
    const unsigned long long nBlocks = nPairs * blocksPerPage;
    for (unsigned long long b0 = warp * perWarp; b0 < nBlocks; b0 += nwarps * perWarp) {
        const unsigned long long g = b0 + grp;
        bool active = g < nBlocks;
        BlockRef ref;
        uint4 raw = make_uint4(0u, 0u, 0u, 0u);
        if (active) {
            ref = locate(sp, numPools, idx, g, blocksPerPage, coldBase, coldStride, numSlots, 0ull, lanes, sub);
            if (!ref.ok) {
                active = false;
                if (sub == 0) {
                    *(volatile unsigned int*)err = 1u;
                }
            } else {
                raw = __ldcs((const uint4*)ref.hot);
            }
        }
        const unsigned int w[4] = {raw.x, raw.y, raw.z, raw.w};
        float v[8];
        float amax = 0.0f;
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            v[2 * k] = h_to_f32((unsigned short)(w[k] & 0xffffu), bf16);
            v[2 * k + 1] = h_to_f32((unsigned short)(w[k] >> 16), bf16);
            amax = fmaxf(amax, fmaxf(fabsf(v[2 * k]), fabsf(v[2 * k + 1])));
        }
        for (unsigned o = lanes >> 1; o > 0; o >>= 1) {
            amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
        }
        if (active) {
            const float inv = amax > 0.0f ? 448.0f / amax : 0.0f;
            uint2 q;
            q.x = e4m3x2(v[0] * inv, v[1] * inv) | (e4m3x2(v[2] * inv, v[3] * inv) << 16);
            q.y = e4m3x2(v[4] * inv, v[5] * inv) | (e4m3x2(v[6] * inv, v[7] * inv) << 16);
            __stcs((uint2*)ref.data, q);
            if (sub == 0) {
                *ref.scale = amax / 448.0f;
            }
        }
    }
}

extern "C" __global__ void __launch_bounds__(256)
kvcm_quant_decode(const int2* __restrict__ idx, unsigned long long nPairs, unsigned long long coldBase,
                  unsigned long long coldStride, const QuantPool* __restrict__ pools,
                  unsigned long long numPools, unsigned long long blocksPerPage,
                  unsigned long long numSlots, unsigned long long bf16, unsigned long long log2Lanes,
                  unsigned int* err) {
    __shared__ QuantPool sp[KVCM_Q_MAX_POOLS];
    load_qpools(sp, pools, numPools);
    const unsigned lane = threadIdx.x & 31;
    const unsigned lanes = 1u << log2Lanes;
    const unsigned sub = lane & (lanes - 1);
    const unsigned grp = lane >> log2Lanes;
    const unsigned long long perWarp = 32u >> log2Lanes;
    const unsigned long long warp = ((unsigned long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const unsigned long long nwarps = ((unsigned long long)gridDim.x * blockDim.x) >> 5;
    const unsigned long long nBlocks = nPairs * blocksPerPage;
    for (unsigned long long b0 = warp * perWarp; b0 < nBlocks; b0 += nwarps * perWarp) {
        const unsigned long long g = b0 + grp;
        if (g >= nBlocks) {
            continue;
        }
        const BlockRef ref = locate(sp, numPools, idx, g, blocksPerPage, coldBase, coldStride, numSlots, 1ull, lanes, sub);
        if (!ref.ok) {
            if (sub == 0) {
                *(volatile unsigned int*)err = 1u;
            }
            continue;
        }
        const uint2 q = __ldcs((const uint2*)ref.data);
        const float s = *ref.scale;
        const unsigned int qw[2] = {q.x, q.y};
        unsigned int out[4];
#pragma unroll
        for (int k = 0; k < 2; ++k) {
            float a, b, c, d;
            e4m3x2_to_f32((unsigned short)(qw[k] & 0xffffu), a, b);
            e4m3x2_to_f32((unsigned short)(qw[k] >> 16), c, d);
            out[2 * k] = f32_to_h(a * s, bf16) | (f32_to_h(b * s, bf16) << 16);
            out[2 * k + 1] = f32_to_h(c * s, bf16) | (f32_to_h(d * s, bf16) << 16);
        }
        __stcs((uint4*)ref.hot, make_uint4(out[0], out[1], out[2], out[3]));
    }
}
