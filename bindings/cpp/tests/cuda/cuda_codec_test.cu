// C++ cold-page codecs that launch their own CUDA work on the stream the
// manager gives them, plugged into a manager on the CUDA backend through the C
// ABI (kvcm.hpp over kvcm.h and libkvcm.so), with a host tier; every page is
// verified to the byte after a round trip through the host tier.
//
//   XorKernelCodec   device indices (the manager uploads them into its index
//                    ring); one kernel per call reads the pairs on the GPU and
//                    moves each page between the hot pools and the mapped
//                    pinned cold page, XOR-ing every byte with a key that
//                    depends on its offset: a cold format of the codec's own,
//                    so a page that bypassed the codec would not decode.
//   MemcpyCodec      host indices; one cudaMemcpyAsync per page and pool (the
//                    default codec's concatenating format).
//
// Built and run on the GPU machine by scripts/gpu-check.sh (nvcc, and the
// libkvcm.so built on a machine with Go by `make lib`); not built where there
// is no nvcc. Exit status 0 when every case passed. The last line is
// "cuda codec test: <P> passed, <F> failed".
#include <cuda_runtime.h>

#include <kvcm/kvcm.hpp>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace {

#define CUDA_CHECK(call)                                                                                               \
    do                                                                                                                 \
    {                                                                                                                  \
        cudaError_t e_ = (call);                                                                                       \
        if (e_ != cudaSuccess)                                                                                         \
        {                                                                                                              \
            throw std::runtime_error(std::string(#call) + ": " + cudaGetErrorName(e_) + ": " + cudaGetErrorString(e_)); \
        }                                                                                                              \
    } while (0)

#define EXPECT(cond, ...)                                                                                              \
    do                                                                                                                 \
    {                                                                                                                  \
        if (!(cond))                                                                                                   \
        {                                                                                                              \
            char msg_[512];                                                                                            \
            std::snprintf(msg_, sizeof msg_, __VA_ARGS__);                                                             \
            throw std::runtime_error(std::string(__FILE__ ":") + std::to_string(__LINE__) + ": " #cond ": " + msg_);   \
        }                                                                                                              \
    } while (0)

constexpr int kMaxPools = 16;

// One hot pool group as the kernel sees it (passed by value).
struct PoolTable
{
    unsigned long long base[kMaxPools];
    long long slotBytes[kMaxPools];
    int numPools;
    long long numSlots;
    long long pageBytes;
};

__host__ __device__ inline unsigned char xorKey(long long offset)
{
    return static_cast<unsigned char>(0x5a + offset * 7 + (offset >> 8));
}

// One block per pair (grid-stride): the block walks the page's pools and
// moves each byte, XOR-ed with its key. Pairs whose hot slot is outside the
// group or whose cold page is negative are counted in *bad and skipped.
__global__ void xorTransfer(PoolTable t, kvcm_page_index_pair const* pairs, size_t n, unsigned char* cold, int toCold,
    unsigned int* bad)
{
    for (size_t i = blockIdx.x; i < n; i += gridDim.x)
    {
        kvcm_page_index_pair const p = pairs[i];
        long long const hotSlot = toCold ? p.src : p.dst;
        long long const coldPage = toCold ? p.dst : p.src;
        if (hotSlot < 0 || hotSlot >= t.numSlots || coldPage < 0)
        {
            if (threadIdx.x == 0)
            {
                atomicAdd(bad, 1u);
            }
            continue;
        }
        long long off = 0;
        for (int k = 0; k < t.numPools; ++k)
        {
            unsigned char* hot = reinterpret_cast<unsigned char*>(t.base[k]) + hotSlot * t.slotBytes[k];
            unsigned char* c = cold + coldPage * t.pageBytes + off;
            for (long long b = threadIdx.x; b < t.slotBytes[k]; b += blockDim.x)
            {
                unsigned char const key = xorKey(off + b);
                if (toCold)
                {
                    c[b] = hot[b] ^ key;
                }
                else
                {
                    hot[b] = c[b] ^ key;
                }
            }
            off += t.slotBytes[k];
        }
    }
}

// What both codecs share: the layout from configure, call counters.
class CodecBase : public kvcm::IKvCacheColdPageCodec
{
public:
    bool configure(kvcm::PoolGroupDesc const* descs, kvcm::PoolGroupIndex n) noexcept override
    {
        if (mConfigured || n < 0)
        {
            return false;
        }
        mConfigured = true;
        for (kvcm::PoolGroupIndex i = 0; i < n; ++i)
        {
            auto const& d = descs[i];
            if (d.num_pools == 0 || d.num_pools > kMaxPools)
            {
                return false;
            }
            Group g{};
            g.table.numPools = static_cast<int>(d.num_pools);
            g.table.numSlots = d.num_slots;
            for (size_t k = 0; k < d.num_pools; ++k)
            {
                g.table.base[k] = d.pools[k].base;
                g.table.slotBytes[k] = d.pools[k].slot_bytes;
                g.table.pageBytes += d.pools[k].slot_bytes;
            }
            g.lifeCycles.assign(d.life_cycles, d.life_cycles + d.num_life_cycles);
            mGroups.push_back(g);
        }
        return true;
    }
    size_t queryColdPageBytes(kvcm::LayerGroupId lg) const noexcept override
    {
        Group const* g = group(lg);
        return g ? static_cast<size_t>(g->table.pageBytes) : 0;
    }

    std::atomic<long long> encodes{0}, decodes{0}, pairs{0}, launches{0}, wrongStream{0};

protected:
    struct Group
    {
        PoolTable table;
        std::vector<kvcm::LifeCycleId> lifeCycles;
    };
    Group const* group(kvcm::LayerGroupId lg) const noexcept
    {
        for (auto const& g : mGroups)
        {
            for (auto l : g.lifeCycles)
            {
                if (l == lg)
                {
                    return &g;
                }
            }
        }
        return nullptr;
    }
    void count(bool encode, size_t n, kvcm::cudaStream_t stream) noexcept
    {
        (encode ? encodes : decodes)++;
        pairs += static_cast<long long>(n);
        if (stream == nullptr)
        {
            wrongStream++;
        }
    }

private:
    bool mConfigured = false;
    std::vector<Group> mGroups;
};

class XorKernelCodec final : public CodecBase
{
public:
    XorKernelCodec()
    {
        CUDA_CHECK(cudaMalloc(&mBad, sizeof(unsigned int)));
        CUDA_CHECK(cudaMemset(mBad, 0, sizeof(unsigned int)));
    }
    ~XorKernelCodec() override { cudaFree(mBad); }

    kvcm::PageIndexLocation queryPageIndexLocation(kvcm::LayerGroupId lg) const noexcept override
    {
        return group(lg) ? kvcm::PageIndexLocation::kDevice : kvcm::PageIndexLocation::kBadLocation;
    }
    bool encode(kvcm::LayerGroupId lg, void* dst, kvcm::PageIndexPair const* idx, size_t n,
        kvcm::cudaStream_t stream) noexcept override
    {
        return launch(lg, static_cast<unsigned char*>(dst), idx, n, stream, true);
    }
    bool decode(kvcm::LayerGroupId lg, void const* src, kvcm::PageIndexPair const* idx, size_t n,
        kvcm::cudaStream_t stream) noexcept override
    {
        return launch(lg, static_cast<unsigned char*>(const_cast<void*>(src)), idx, n, stream, false);
    }

    unsigned int badPairs() const
    {
        unsigned int h = 0;
        CUDA_CHECK(cudaMemcpy(&h, mBad, sizeof h, cudaMemcpyDeviceToHost));
        return h;
    }

private:
    bool launch(kvcm::LayerGroupId lg, unsigned char* cold, kvcm::PageIndexPair const* idx, size_t n,
        kvcm::cudaStream_t stream, bool toCold) noexcept
    {
        Group const* g = group(lg);
        if (g == nullptr || cold == nullptr || (n > 0 && idx == nullptr))
        {
            return false;
        }
        count(toCold, n, stream);
        if (n == 0)
        {
            return true;
        }
        unsigned const blocks = static_cast<unsigned>(n < 4096 ? n : 4096);
        xorTransfer<<<blocks, 256, 0, stream>>>(g->table, idx, n, cold, toCold ? 1 : 0, mBad);
        launches++;
        return cudaGetLastError() == cudaSuccess;
    }

    unsigned int* mBad = nullptr;
};

class MemcpyCodec final : public CodecBase
{
public:
    kvcm::PageIndexLocation queryPageIndexLocation(kvcm::LayerGroupId lg) const noexcept override
    {
        return group(lg) ? kvcm::PageIndexLocation::kHost : kvcm::PageIndexLocation::kBadLocation;
    }
    bool encode(kvcm::LayerGroupId lg, void* dst, kvcm::PageIndexPair const* idx, size_t n,
        kvcm::cudaStream_t stream) noexcept override
    {
        return copy(lg, static_cast<unsigned char*>(dst), idx, n, stream, true);
    }
    bool decode(kvcm::LayerGroupId lg, void const* src, kvcm::PageIndexPair const* idx, size_t n,
        kvcm::cudaStream_t stream) noexcept override
    {
        return copy(lg, static_cast<unsigned char*>(const_cast<void*>(src)), idx, n, stream, false);
    }

private:
    bool copy(kvcm::LayerGroupId lg, unsigned char* cold, kvcm::PageIndexPair const* idx, size_t n,
        kvcm::cudaStream_t stream, bool toCold) noexcept
    {
        Group const* g = group(lg);
        if (g == nullptr || cold == nullptr || (n > 0 && idx == nullptr))
        {
            return false;
        }
        PoolTable const& t = g->table;
        for (size_t i = 0; i < n; ++i) // host indices: validated before anything is enqueued
        {
            long long const hot = toCold ? idx[i].src : idx[i].dst;
            long long const c = toCold ? idx[i].dst : idx[i].src;
            if (hot < 0 || hot >= t.numSlots || c < 0)
            {
                return false;
            }
        }
        count(toCold, n, stream);
        for (size_t i = 0; i < n; ++i)
        {
            long long const hot = toCold ? idx[i].src : idx[i].dst;
            long long const c = toCold ? idx[i].dst : idx[i].src;
            long long off = 0;
            for (int k = 0; k < t.numPools; ++k)
            {
                void* h = reinterpret_cast<unsigned char*>(t.base[k]) + hot * t.slotBytes[k];
                void* cp = cold + c * t.pageBytes + off;
                cudaError_t e = toCold ? cudaMemcpyAsync(cp, h, t.slotBytes[k], cudaMemcpyDefault, stream)
                                       : cudaMemcpyAsync(h, cp, t.slotBytes[k], cudaMemcpyDefault, stream);
                if (e != cudaSuccess)
                {
                    return false; // earlier copies stay enqueued: the manager fences the call
                }
                launches++;
                off += t.slotBytes[k];
            }
        }
        return true;
    }
};

// The bytes of one buffer page: a function of the request tag, block, layer,
// role and offset.
unsigned char patternByte(int tag, int block, int layer, int role, long long i)
{
    uint32_t x = static_cast<uint32_t>(tag * 7919 + block * 104729 + layer * 31 + role * 17) ^ static_cast<uint32_t>(i * 2654435761u);
    x ^= x >> 13;
    x *= 0x5bd1e995u;
    x ^= x >> 15;
    return static_cast<unsigned char>(x);
}

char const* const kRoles[] = {"key", "value"};
constexpr int kLayers = 2;
constexpr int kBufferBytes = 4096; // per block and buffer: 4 pools of 4 KiB
constexpr int kTokensPerBlock = 16;
constexpr int kGpuPages = 8;

template <class Fn>
void forEachPage(kvcm::KVCacheManager& m, kvcm::KVCache& c, Fn fn)
{
    for (int layer = 0; layer < kLayers; ++layer)
    {
        for (int role = 0; role < 2; ++role)
        {
            kvcm::BufferLocation const loc = m.bufferLocation(layer, kRoles[role]);
            std::vector<int32_t> const idx = c.basePageIndices(loc.layer_group);
            for (size_t b = 0; b < idx.size(); ++b)
            {
                if (idx[b] == kvcm::kBadPageIndex)
                {
                    continue;
                }
                auto addr = static_cast<uintptr_t>(loc.pool_base)
                    + static_cast<uintptr_t>((static_cast<int64_t>(idx[b]) * loc.scale + loc.offset) * loc.bytes);
                fn(static_cast<int>(b), layer, role, reinterpret_cast<void*>(addr), loc.bytes);
            }
        }
    }
}

// Writes every page of an ACTIVE cache with its pattern through its stream.
void writeAll(kvcm::KVCacheManager& m, kvcm::KVCache& c, cudaStream_t s, int tag)
{
    std::vector<unsigned char> host;
    forEachPage(m, c, [&](int block, int layer, int role, void* dev, int64_t n) {
        host.resize(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i)
        {
            host[static_cast<size_t>(i)] = patternByte(tag, block, layer, role, i);
        }
        CUDA_CHECK(cudaMemcpyAsync(dev, host.data(), static_cast<size_t>(n), cudaMemcpyHostToDevice, s));
        CUDA_CHECK(cudaStreamSynchronize(s));
    });
}

// Reads every page back and compares it byte for byte; returns the pages.
int verifyAll(kvcm::KVCacheManager& m, kvcm::KVCache& c, cudaStream_t s, int tag)
{
    int pages = 0;
    std::vector<unsigned char> host;
    forEachPage(m, c, [&](int block, int layer, int role, void* dev, int64_t n) {
        host.assign(static_cast<size_t>(n), 0xee);
        CUDA_CHECK(cudaMemcpyAsync(host.data(), dev, static_cast<size_t>(n), cudaMemcpyDeviceToHost, s));
        CUDA_CHECK(cudaStreamSynchronize(s));
        for (int64_t i = 0; i < n; ++i)
        {
            EXPECT(host[static_cast<size_t>(i)] == patternByte(tag, block, layer, role, i),
                "tag %d block %d layer %d %s: byte %lld is %#x, want %#x", tag, block, layer, kRoles[role],
                static_cast<long long>(i), host[static_cast<size_t>(i)], patternByte(tag, block, layer, role, i));
        }
        ++pages;
    });
    return pages;
}

std::vector<kvcm::Token> tokens(int from, int n)
{
    std::vector<kvcm::Token> out(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i)
    {
        out[static_cast<size_t>(i)] = static_cast<kvcm::Token>(from + i);
    }
    return out;
}

// One round trip through the host tier with codec C.
template <class C>
void roundTrip(char const* name)
{
    auto owned = std::make_unique<C>();
    C* codec = owned.get(); // the manager owns it from here; valid until the manager is destroyed
    kvcm::KVCacheManagerConfig cfg;
    cfg.tokensPerBlock = kTokensPerBlock;
    cfg.device = kvcm::DeviceKind::kCuda;
    int64_t const pageBytes = int64_t{kLayers} * 2 * kBufferBytes;
    cfg.cacheTiers = {kvcm::GpuCacheTierConfig(kGpuPages * pageBytes), kvcm::HostCacheTierConfig(4 * kGpuPages * pageBytes)};
    for (int l = 0; l < kLayers; ++l)
    {
        cfg.layers.push_back({l, {{"key", kBufferBytes}, {"value", kBufferBytes}}});
    }
    kvcm::KVCacheManager m(cfg, std::move(owned));
    EXPECT(m.deviceKind() == kvcm::DeviceKind::kCuda, "device kind %d", static_cast<int>(m.deviceKind()));
    auto stream = m.createStream();
    cudaStream_t const s = stream.cudaStream();

    int const blocks = kGpuPages / 2;
    auto const promptA = tokens(0, blocks * kTokensPerBlock);
    auto a = m.createKVCache(promptA);
    a.resume(stream);
    a.resize(static_cast<int64_t>(promptA.size()), static_cast<int64_t>(promptA.size()));
    writeAll(m, a, s, 1);
    a.commit(promptA);
    a.suspend();

    // B needs every GPU page: A's held pages are encoded to the host tier.
    auto const promptB = tokens(1000, kGpuPages * kTokensPerBlock);
    auto b = m.createKVCache(promptB);
    b.resume(stream);
    b.resize(static_cast<int64_t>(promptB.size()), static_cast<int64_t>(promptB.size()));
    writeAll(m, b, s, 2);
    b.commit(promptB);
    b.close();
    EXPECT(m.migrationStats(kvcm::MigrationPath::kGpuToHost).pages >= blocks, "gpu→host %lld pages",
        static_cast<long long>(m.migrationStats(kvcm::MigrationPath::kGpuToHost).pages));

    a.resume(stream); // decoded back into (other) GPU slots
    int const pagesA = verifyAll(m, a, s, 1);
    EXPECT(pagesA == blocks * kLayers * 2, "%d pages verified", pagesA);
    a.close();

    // A closed cache's cached blocks come back through the codec as well.
    auto c = m.createKVCache(promptB);
    EXPECT(c.reusedTokens() == static_cast<int64_t>(promptB.size()), // cached whole: reused whole
        "reused %lld tokens", static_cast<long long>(c.reusedTokens()));
    c.resume(stream);
    int const pagesB = verifyAll(m, c, s, 2);
    c.close();

    long long const toHost = m.migrationStats(kvcm::MigrationPath::kGpuToHost).pages;
    long long const toGpu = m.migrationStats(kvcm::MigrationPath::kHostToGpu).pages;
    EXPECT(toGpu > 0, "host→gpu %lld pages", toGpu);
    EXPECT(codec->encodes > 0 && codec->decodes > 0, "%lld encodes, %lld decodes", codec->encodes.load(),
        codec->decodes.load());
    EXPECT(codec->wrongStream == 0, "%lld calls without a stream", codec->wrongStream.load());
    CUDA_CHECK(cudaDeviceSynchronize());
    if constexpr (std::is_same_v<C, XorKernelCodec>)
    {
        EXPECT(codec->badPairs() == 0, "%u bad pairs", codec->badPairs());
    }
    std::printf("PASS %-8s %d + %d pages verified to the byte; %lld encodes, %lld decodes, %lld pairs, %lld CUDA launches "
                "on the manager's streams; gpu→host %lld, host→gpu %lld pages\n",
        name, pagesA, pagesB, codec->encodes.load(), codec->decodes.load(), codec->pairs.load(), codec->launches.load(),
        toHost, toGpu);
}

} // namespace

int main()
{
    int device = 0;
    if (cudaGetDeviceCount(&device) != cudaSuccess || device == 0)
    {
        std::printf("SKIP: no CUDA device\ncuda codec test: 0 passed, 0 failed, 2 skipped\n");
        return 0;
    }
    int passed = 0, failed = 0;
    auto run = [&](char const* name, void (*fn)(char const*)) {
        try
        {
            fn(name);
            ++passed;
        }
        catch (std::exception const& e)
        {
            std::printf("FAIL %s: %s\n", name, e.what());
            ++failed;
        }
    };
    run("kernel", &roundTrip<XorKernelCodec>);
    run("memcpy", &roundTrip<MemcpyCodec>);
    std::printf("kvcm %s, live handles %llu\n", kvcm::libraryVersion().c_str(),
        static_cast<unsigned long long>(kvcm::liveHandleCount()));
    if (kvcm::liveHandleCount() != 0)
    {
        std::printf("FAIL leak: %llu live handles\n", static_cast<unsigned long long>(kvcm::liveHandleCount()));
        ++failed;
    }
    std::printf("cuda codec test: %d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}
