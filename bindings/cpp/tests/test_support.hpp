// Shared helpers of the C++ binding tests: the deterministic page-byte writer
// of tests/conformance/README.md, page I/O through a host-mapped staging
// buffer and batch copies, and test codecs.
#pragma once

#include <kvcm/kvcm.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace kvcm_test {

// ---- the page-byte writer (tests/conformance/README.md; internal/testkit/fakeengine) ----------

inline constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ULL;

inline uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

inline uint64_t fnv1a(void const* data, size_t n, uint64_t h = 0xcbf29ce484222325ULL)
{
    auto const* p = static_cast<unsigned char const*>(data);
    for (size_t i = 0; i < n; ++i)
    {
        h ^= p[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}

// prefix[p] is the hash of tokens[0..p].
inline std::vector<uint64_t> prefixHashes(uint64_t seed, std::vector<kvcm::Token> const& tokens, size_t upTo)
{
    std::vector<uint64_t> out;
    out.reserve(upTo);
    uint64_t h = mix64(seed ^ 0x6b76636d2d66616bULL);
    for (size_t p = 0; p < upTo; ++p)
    {
        h = mix64(h + kGolden + static_cast<uint64_t>(static_cast<uint32_t>(tokens[p])) * 0xd6e8feb86659fd93ULL);
        out.push_back(h);
    }
    return out;
}

inline uint64_t bufferSalt(int32_t layer, std::string const& role)
{
    return mix64((static_cast<uint64_t>(static_cast<uint32_t>(layer)) << 32) ^ fnv1a(role.data(), role.size()) ^ kGolden);
}

// fillToken writes the tok bytes of position pos of one buffer. zeroLow clears
// the low (even-offset) byte of every 16-bit little-endian element.
inline void fillToken(uint8_t* dst, size_t tok, uint64_t prefix, int64_t pos, uint64_t salt, bool zeroLow = false)
{
    uint64_t x = mix64(prefix ^ mix64(static_cast<uint64_t>(pos) + kGolden) ^ salt);
    size_t i = 0;
    for (; i + 8 <= tok; i += 8)
    {
        x += kGolden;
        uint64_t v = mix64(x);
        if (zeroLow)
        {
            v &= 0xff00ff00ff00ff00ULL;
        }
        for (int b = 0; b < 8; ++b)
        {
            dst[i + b] = static_cast<uint8_t>(v >> (8 * b));
        }
    }
    if (i < tok)
    {
        x += kGolden;
        uint64_t v = mix64(x);
        if (zeroLow)
        {
            v &= 0xff00ff00ff00ff00ULL;
        }
        for (; i < tok; ++i)
        {
            dst[i] = static_cast<uint8_t>(v);
            v >>= 8;
        }
    }
}

// ---- page I/O ------------------------------------------------------------------------

// PageIO moves bytes between host vectors and device addresses through one
// host-mapped staging buffer: stage writes or reads, then flush() submits one
// batch copy on the stream and synchronizes.
class PageIO
{
public:
    PageIO(kvcm::KVCacheManager& m, kvcm::StreamView stream, size_t stagingBytes)
        : mStream(stream)
        , mStaging(m.allocMemory(kvcm::MemoryKind::kHostMapped, stagingBytes))
    {
    }

    // Queues a write of n bytes to dst; returns the staging bytes to fill.
    uint8_t* stageWrite(kvcm::DevicePtr dst, size_t n)
    {
        size_t const off = take(n);
        mDescs.push_back(kvcm::CopyDesc{dst, mStaging.ptr() + off, n});
        return host() + off;
    }
    // Queues a read of n bytes from src; returns the staging offset to read
    // after flush().
    size_t stageRead(kvcm::DevicePtr src, size_t n)
    {
        size_t const off = take(n);
        mDescs.push_back(kvcm::CopyDesc{mStaging.ptr() + off, src, n});
        return off;
    }
    void flush()
    {
        if (!mDescs.empty())
        {
            mStream.batchCopy(mDescs);
        }
        mStream.synchronize();
        mDescs.clear();
        mUsed = 0;
    }
    [[nodiscard]] uint8_t const* at(size_t off) const { return host() + off; }

    void write(kvcm::DevicePtr dst, std::vector<uint8_t> const& bytes)
    {
        std::memcpy(stageWrite(dst, bytes.size()), bytes.data(), bytes.size());
        flush();
    }
    std::vector<uint8_t> read(kvcm::DevicePtr src, size_t n)
    {
        size_t const off = stageRead(src, n);
        flush();
        return std::vector<uint8_t>(at(off), at(off) + n);
    }

private:
    uint8_t* host() const { return static_cast<uint8_t*>(mStaging.hostData()); }
    size_t take(size_t n)
    {
        if (mUsed + n > mStaging.size())
        {
            throw std::runtime_error("PageIO: staging buffer too small");
        }
        size_t const off = mUsed;
        mUsed += (n + 7) / 8 * 8;
        return off;
    }

    kvcm::StreamView mStream;
    kvcm::DeviceMemory mStaging;
    std::vector<kvcm::CopyDesc> mDescs;
    size_t mUsed = 0;
};

// KvWriter is the fake engine of the tests: it writes the writer's bytes of
// token positions into a cache's pages and verifies them, with the page
// layout of tests/conformance/README.md (through the manager's buffer
// locations and page indices, on the stream).
class KvWriter
{
public:
    KvWriter(kvcm::KVCacheManager& m, kvcm::KVCacheManagerConfig const& cfg, kvcm::StreamView stream, uint64_t seed,
        bool zeroLow = false, size_t stagingBytes = size_t{1} << 20)
        : mIO(m, stream, stagingBytes)
        , mSeed(seed)
        , mZeroLow(zeroLow)
        , mTpb(cfg.tokensPerBlock)
    {
        std::vector<kvcm::AttentionLayerConfig> layers = cfg.layers;
        std::stable_sort(layers.begin(), layers.end(),
            [](auto const& a, auto const& b) { return a.layerId < b.layerId; });
        for (auto const& l : layers)
        {
            for (auto const& b : l.buffers)
            {
                Buf buf;
                buf.layer = l.layerId;
                buf.role = b.role;
                buf.lg = m.layerGroupOf(l.layerId);
                buf.loc = m.bufferLocation(l.layerId, b.role);
                buf.tok = static_cast<size_t>(b.size / cfg.tokensPerBlock);
                buf.salt = bufferSalt(l.layerId, b.role);
                mBufs.push_back(buf);
            }
        }
        std::vector<kvcm::SsmLayerConfig> ssm = cfg.ssmLayers;
        std::stable_sort(ssm.begin(), ssm.end(), [](auto const& a, auto const& b) { return a.layerId < b.layerId; });
        for (auto const& l : ssm)
        {
            for (auto const& b : l.buffers)
            {
                Buf buf;
                buf.layer = l.layerId;
                buf.role = b.role;
                buf.lg = m.layerGroupOf(l.layerId);
                buf.loc = m.bufferLocation(l.layerId, b.role);
                buf.tok = static_cast<size_t>(b.size); // a whole state
                buf.salt = bufferSalt(l.layerId, b.role);
                mStates.push_back(buf);
            }
        }
    }

    // Writes positions [from, to) of tokens into one beam's pages; every
    // block must have a page. With SSM layers it also writes the state after
    // to positions.
    void write(kvcm::KVCache const& c, std::vector<kvcm::Token> const& tokens, int64_t from, int64_t to,
        int32_t beam = kvcm::kDefaultBeamIndex)
    {
        auto const prefix = prefixHashes(mSeed, tokens, static_cast<size_t>(to));
        auto const idx = indices(c, beam);
        for (size_t i = 0; from < to && i < mStates.size(); ++i)
        {
            auto const& b = mStates[i];
            fillToken(mIO.stageWrite(stateAddress(c, b), b.tok), b.tok, stateSeed(prefix, to), to, b.salt, mZeroLow);
        }
        for (int64_t pos = from; pos < to; ++pos)
        {
            for (size_t bi = 0; bi < mBufs.size(); ++bi)
            {
                auto const& b = mBufs[bi];
                auto const& ix = idx.at(b.lg);
                size_t const blk = static_cast<size_t>(pos / mTpb);
                if (blk >= ix.size() || ix[blk] == kvcm::kBadPageIndex)
                {
                    throw std::runtime_error("KvWriter: no page for position " + std::to_string(pos) + " of layer "
                        + std::to_string(b.layer));
                }
                fillToken(mIO.stageWrite(address(b, ix[blk], pos), b.tok), b.tok, prefix[pos], pos, b.salt, mZeroLow);
            }
            if ((pos - from) % 64 == 63)
            {
                mIO.flush();
            }
        }
        mIO.flush();
    }

    struct Verified
    {
        int64_t mismatches = 0; // buffers-positions whose bytes differ
        int64_t checked = 0;    // buffers-positions compared
        std::string digest;     // FNV-1a 64 of the expected bytes, README order
    };

    // Reads positions [from, to) of one beam back (skipping blocks without a
    // page) and compares them with the writer.
    Verified verify(kvcm::KVCache const& c, std::vector<kvcm::Token> const& tokens, int64_t from, int64_t to,
        int32_t beam = kvcm::kDefaultBeamIndex)
    {
        auto const prefix = prefixHashes(mSeed, tokens, static_cast<size_t>(to));
        auto const idx = indices(c, beam);
        Verified out;
        uint64_t h = 0xcbf29ce484222325ULL;
        std::vector<uint8_t> want;
        for (int64_t pos = from; pos < to; ++pos)
        {
            struct Pending
            {
                size_t buf;
                size_t off;
            };
            std::vector<Pending> pend;
            for (size_t bi = 0; bi < mBufs.size(); ++bi)
            {
                auto const& b = mBufs[bi];
                auto const& ix = idx.at(b.lg);
                size_t const blk = static_cast<size_t>(pos / mTpb);
                if (blk >= ix.size() || ix[blk] == kvcm::kBadPageIndex)
                {
                    continue;
                }
                pend.push_back({bi, mIO.stageRead(address(b, ix[blk], pos), b.tok)});
            }
            mIO.flush();
            for (auto const& p : pend)
            {
                auto const& b = mBufs[p.buf];
                want.assign(b.tok, 0);
                fillToken(want.data(), b.tok, prefix[pos], pos, b.salt, mZeroLow);
                h = fnv1a(want.data(), want.size(), h);
                ++out.checked;
                if (std::memcmp(want.data(), mIO.at(p.off), b.tok) != 0)
                {
                    ++out.mismatches;
                }
            }
        }
        char hex[17];
        std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
        out.digest = hex;
        return out;
    }

    // Reads the SSM state back and compares it with the writer's state after
    // the first n tokens; the digest is FNV-1a 64 of the expected bytes of
    // every SSM buffer, in ascending layer id and configuration order.
    Verified verifyState(kvcm::KVCache const& c, std::vector<kvcm::Token> const& tokens, int64_t n)
    {
        auto const prefix = prefixHashes(mSeed, tokens, static_cast<size_t>(n));
        Verified out;
        uint64_t h = 0xcbf29ce484222325ULL;
        std::vector<uint8_t> want;
        for (auto const& b : mStates)
        {
            auto const got = mIO.read(stateAddress(c, b), b.tok);
            want.assign(b.tok, 0);
            fillToken(want.data(), b.tok, stateSeed(prefix, n), n, b.salt, mZeroLow);
            h = fnv1a(want.data(), want.size(), h);
            ++out.checked;
            if (got != want)
            {
                ++out.mismatches;
            }
        }
        char hex[17];
        std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
        out.digest = hex;
        return out;
    }

private:
    struct Buf
    {
        int32_t layer = 0;
        std::string role;
        kvcm::LayerGroupId lg = 0;
        kvcm::BufferLocation loc{};
        size_t tok = 0;
        uint64_t salt = 0;
    };

    std::map<kvcm::LayerGroupId, std::vector<int32_t>> indices(kvcm::KVCache const& c, int32_t beam) const
    {
        std::map<kvcm::LayerGroupId, std::vector<int32_t>> out;
        for (auto const& b : mBufs)
        {
            if (out.count(b.lg) == 0)
            {
                out[b.lg] = c.basePageIndices(b.lg, beam);
            }
        }
        return out;
    }

    // stateSeed is the prefix hash the state after n positions derives from.
    uint64_t stateSeed(std::vector<uint64_t> const& prefix, int64_t n) const
    {
        return n == 0 ? mix64(mSeed ^ 0x6b76636d2d66616bULL) : prefix[static_cast<size_t>(n - 1)];
    }

    kvcm::DevicePtr stateAddress(kvcm::KVCache const& c, Buf const& b) const
    {
        int32_t const slot = c.ssmBlockBaseIndex(b.lg);
        if (slot == kvcm::kBadPageIndex)
        {
            throw std::runtime_error("KvWriter: the cache has no SSM state");
        }
        int64_t const page = static_cast<int64_t>(slot) * b.loc.scale + b.loc.offset;
        return b.loc.pool_base + static_cast<uint64_t>(page * b.loc.bytes);
    }

    kvcm::DevicePtr address(Buf const& b, int32_t base, int64_t pos) const
    {
        int64_t const page = static_cast<int64_t>(base) * b.loc.scale + b.loc.offset;
        return b.loc.pool_base + static_cast<uint64_t>(page * b.loc.bytes)
            + static_cast<uint64_t>((pos % mTpb) * static_cast<int64_t>(b.tok));
    }

    PageIO mIO;
    uint64_t mSeed;
    bool mZeroLow;
    int64_t mTpb;
    std::vector<Buf> mBufs;
    std::vector<Buf> mStates; // SSM buffers: tok is the state's bytes
};

// ---- test codecs -------------------------------------------------------------------

struct CodecCounters
{
    std::atomic<int> constructed{0};
    std::atomic<int> destroyed{0};
    std::atomic<int> configured{0};
    std::atomic<int> encodeCalls{0};
    std::atomic<int> decodeCalls{0};
    std::atomic<int64_t> encodedPages{0};
    std::atomic<int64_t> decodedPages{0};
};

// HalfCodec is a compressing codec with a fixed cold size of half the hot
// page: it keeps the high byte of every 16-bit little-endian element of every
// pool's slot, in pool order; decode writes those bytes back and zeroes the
// low bytes. It is lossless for data whose low bytes are zero.
//
// With host indices (the default) it is a portable CPU codec, as on CUDA: it
// stages hot slots through host-mapped scratch it allocates on the stream's
// device (kvcm_stream_alloc_memory) and moves them with batch copies, and
// compresses or expands between the scratch and the cold pages (pinned host
// memory, so host-readable) in host functions, all in stream order. With
// device indices the pairs are only readable by stream work, so its host
// functions read them, and the hot pools, directly: valid on the emulated
// device only, where device addresses are host addresses.
class HalfCodec final : public kvcm::IKvCacheColdPageCodec
{
public:
    explicit HalfCodec(std::shared_ptr<CodecCounters> counters,
        kvcm::PageIndexLocation location = kvcm::PageIndexLocation::kHost)
        : mCounters(std::move(counters))
        , mLocation(location)
    {
        ++mCounters->constructed;
    }
    ~HalfCodec() override
    {
        // Called after all work the codec enqueued has completed.
        for (auto const& [stream, scratch] : mScratch)
        {
            for (kvcm::DevicePtr p : scratch.all)
            {
                (void)kvcm::StreamView(stream).tryFreeMemory(p);
            }
        }
        ++mCounters->destroyed;
    }

    bool configure(kvcm::PoolGroupDesc const* gpuDescs, kvcm::PoolGroupIndex numGpuDescs) noexcept override
    {
        if (mConfigured)
        {
            return false; // exactly once
        }
        mConfigured = true;
        ++mCounters->configured;
        try
        {
            for (kvcm::PoolGroupIndex i = 0; i < numGpuDescs; ++i)
            {
                auto const& d = gpuDescs[i];
                if (d.index != i || d.num_pools == 0)
                {
                    return false;
                }
                auto g = std::make_shared<Group>();
                g->numSlots = d.num_slots;
                for (size_t p = 0; p < d.num_pools; ++p)
                {
                    if (d.pools[p].slot_bytes <= 0 || d.pools[p].slot_bytes % 2 != 0)
                    {
                        return false;
                    }
                    g->pools.push_back(d.pools[p]);
                    g->pageBytes += d.pools[p].slot_bytes;
                }
                for (size_t l = 0; l < d.num_life_cycles; ++l)
                {
                    mGroups[d.life_cycles[l]] = g;
                }
            }
            return true;
        }
        catch (...)
        {
            return false;
        }
    }

    [[nodiscard]] size_t queryColdPageBytes(kvcm::LayerGroupId lg) const noexcept override
    {
        auto const* g = group(lg);
        return g == nullptr ? 0 : static_cast<size_t>(g->pageBytes / 2);
    }

    [[nodiscard]] kvcm::PageIndexLocation queryPageIndexLocation(kvcm::LayerGroupId lg) const noexcept override
    {
        return group(lg) == nullptr ? kvcm::PageIndexLocation::kBadLocation : mLocation;
    }

    bool encode(kvcm::LayerGroupId lg, void* dstBasePtr, kvcm::PageIndexPair const* pageIndices, size_t numBasePages,
        kvcm::cudaStream_t stream) noexcept override
    {
        return submit(true, lg, static_cast<uint8_t*>(dstBasePtr), pageIndices, numBasePages, stream);
    }

    bool decode(kvcm::LayerGroupId lg, void const* srcBasePtr, kvcm::PageIndexPair const* pageIndices,
        size_t numBasePages, kvcm::cudaStream_t stream) noexcept override
    {
        return submit(false, lg, static_cast<uint8_t*>(const_cast<void*>(srcBasePtr)), pageIndices, numBasePages,
            stream);
    }

private:
    struct Group
    {
        int64_t numSlots = 0;
        int64_t pageBytes = 0;
        std::vector<kvcm::PoolDesc> pools;
    };

    // Host-mapped scratch of one stream. Work on one stream runs in order, so
    // the current buffer is reused by every call on it; a buffer outgrown
    // stays allocated (earlier work may still use it) until destruction.
    struct Scratch
    {
        kvcm::DevicePtr cur = 0;
        size_t size = 0;
        std::vector<kvcm::DevicePtr> all;
    };

    [[nodiscard]] Group const* group(kvcm::LayerGroupId lg) const noexcept
    {
        auto it = mGroups.find(lg);
        return it == mGroups.end() ? nullptr : it->second.get();
    }

    static uint8_t* hostPtr(kvcm::DevicePtr p) { return reinterpret_cast<uint8_t*>(static_cast<uintptr_t>(p)); }

    // Compresses (encode) or expands (decode) one page between its hot bytes
    // (pool after pool, hot[p] for pool p) and its cold blob.
    static void convert(bool encodeDir, Group const& g, uint8_t* const* hot, uint8_t* cold)
    {
        for (size_t p = 0; p < g.pools.size(); ++p)
        {
            int64_t const half = g.pools[p].slot_bytes / 2;
            for (int64_t i = 0; i < half; ++i)
            {
                if (encodeDir)
                {
                    cold[i] = hot[p][2 * i + 1];
                }
                else
                {
                    hot[p][2 * i] = 0;
                    hot[p][2 * i + 1] = cold[i];
                }
            }
            cold += half;
        }
    }

    // The direct form: every pair, hot pools addressed in place (emu only).
    static int transferInPlace(bool encodeDir, Group const& g, uint8_t* cold, kvcm::PageIndexPair const* pairs, size_t n)
    {
        std::vector<uint8_t*> hot(g.pools.size());
        for (size_t k = 0; k < n; ++k)
        {
            kvcm::PageIndexPair const pr = pairs[k];
            int32_t const slot = encodeDir ? pr.src : pr.dst;
            int32_t const page = encodeDir ? pr.dst : pr.src;
            if (slot < 0 || slot >= g.numSlots || page < 0)
            {
                return 1;
            }
            for (size_t p = 0; p < g.pools.size(); ++p)
            {
                hot[p] = hostPtr(g.pools[p].base + static_cast<uint64_t>(slot) * g.pools[p].slot_bytes);
            }
            convert(encodeDir, g, hot.data(), cold + static_cast<int64_t>(page) * (g.pageBytes / 2));
        }
        return 0;
    }

    kvcm::DevicePtr scratchFor(kvcm::StreamView s, size_t bytes) noexcept
    {
        try
        {
            Scratch& sc = mScratch[s.handle()];
            if (sc.size < bytes)
            {
                size_t const size = std::max(bytes, sc.size * 2);
                kvcm::DevicePtr const p = s.tryAllocMemory(kvcm::MemoryKind::kHostMapped, size);
                if (p == 0)
                {
                    return 0;
                }
                sc.all.push_back(p);
                sc.cur = p;
                sc.size = size;
            }
            return sc.cur;
        }
        catch (...)
        {
            return 0;
        }
    }

    bool submit(bool encodeDir, kvcm::LayerGroupId lg, uint8_t* cold, kvcm::PageIndexPair const* pageIndices,
        size_t n, kvcm::cudaStream_t stream) noexcept
    {
        auto it = mGroups.find(lg);
        if (it == mGroups.end())
        {
            return false;
        }
        if (n == 0)
        {
            return true;
        }
        if (cold == nullptr || pageIndices == nullptr || stream == nullptr)
        {
            return false;
        }
        std::shared_ptr<Group const> g = it->second;
        int64_t const coldBytes = g->pageBytes / 2;
        kvcm::StreamView s(stream);
        if (mLocation == kvcm::PageIndexLocation::kDevice)
        {
            // Device indices stay valid until the stream work completes.
            if (!s.tryEnqueueHostFunc([encodeDir, g, cold, pageIndices, n]()
                    { return transferInPlace(encodeDir, *g, cold, pageIndices, n); }))
            {
                return false;
            }
            count(encodeDir, n);
            return true;
        }
        try
        {
            // Host indices are valid only during this call: validate and
            // consume them now.
            for (size_t k = 0; k < n; ++k)
            {
                int32_t const slot = encodeDir ? pageIndices[k].src : pageIndices[k].dst;
                int32_t const page = encodeDir ? pageIndices[k].dst : pageIndices[k].src;
                if (slot < 0 || slot >= g->numSlots || page < 0)
                {
                    return false;
                }
            }
            kvcm::DevicePtr const scratch = scratchFor(s, n * static_cast<size_t>(g->pageBytes));
            if (scratch == 0)
            {
                return false;
            }
            // Slot k of the scratch holds page k's hot bytes, pool after pool.
            std::vector<kvcm::CopyDesc> descs;
            std::vector<uint8_t*> colds;
            descs.reserve(n * g->pools.size());
            colds.reserve(n);
            for (size_t k = 0; k < n; ++k)
            {
                int32_t const slot = encodeDir ? pageIndices[k].src : pageIndices[k].dst;
                int32_t const page = encodeDir ? pageIndices[k].dst : pageIndices[k].src;
                kvcm::DevicePtr stage = scratch + k * static_cast<uint64_t>(g->pageBytes);
                for (auto const& pool : g->pools)
                {
                    kvcm::DevicePtr const hot = pool.base + static_cast<uint64_t>(slot) * pool.slot_bytes;
                    auto const size = static_cast<uint64_t>(pool.slot_bytes);
                    descs.push_back(encodeDir ? kvcm::CopyDesc{stage, hot, size} : kvcm::CopyDesc{hot, stage, size});
                    stage += size;
                }
                colds.push_back(cold + static_cast<int64_t>(page) * coldBytes);
            }
            auto work = [encodeDir, g, scratch, colds = std::move(colds)]()
            {
                std::vector<uint8_t*> hot(g->pools.size());
                for (size_t k = 0; k < colds.size(); ++k)
                {
                    uint8_t* stage = hostPtr(scratch + k * static_cast<uint64_t>(g->pageBytes));
                    for (size_t p = 0; p < g->pools.size(); ++p)
                    {
                        hot[p] = stage;
                        stage += g->pools[p].slot_bytes;
                    }
                    convert(encodeDir, *g, hot.data(), colds[k]);
                }
            };
            // Encode: hot slots -> scratch, then compress into the cold pages.
            // Decode: expand the cold pages into scratch, then scratch -> hot.
            // Only the second submission writes the destination, so when it
            // fails nothing was written there (the contract of a false return).
            bool const submitted = encodeDir
                ? s.tryBatchCopy(descs.data(), descs.size()) && s.tryEnqueueHostFunc(std::move(work))
                : s.tryEnqueueHostFunc(std::move(work)) && s.tryBatchCopy(descs.data(), descs.size());
            if (submitted)
            {
                count(encodeDir, n);
            }
            return submitted;
        }
        catch (...)
        {
            return false;
        }
    }

    void count(bool encodeDir, size_t n)
    {
        (encodeDir ? mCounters->encodeCalls : mCounters->decodeCalls)++;
        (encodeDir ? mCounters->encodedPages : mCounters->decodedPages) += static_cast<int64_t>(n);
    }

    std::shared_ptr<CodecCounters> mCounters;
    kvcm::PageIndexLocation mLocation;
    bool mConfigured = false;
    std::map<kvcm::LayerGroupId, std::shared_ptr<Group>> mGroups;
    std::map<kvcm_stream, Scratch> mScratch;
};

// ScriptedCodec fails where told to, for construction-failure tests. It
// relies on the default getBatchingLayerGroupId.
class ScriptedCodec final : public kvcm::IKvCacheColdPageCodec
{
public:
    enum class Fail
    {
        kNothing,
        kConfigure,
        kColdBytes,
        kLocation,
    };

    ScriptedCodec(std::shared_ptr<CodecCounters> counters, Fail fail)
        : mCounters(std::move(counters))
        , mFail(fail)
    {
        ++mCounters->constructed;
    }
    ~ScriptedCodec() override { ++mCounters->destroyed; }

    bool configure(kvcm::PoolGroupDesc const* gpuDescs, kvcm::PoolGroupIndex n) noexcept override
    {
        ++mCounters->configured;
        for (kvcm::PoolGroupIndex i = 0; i < n; ++i)
        {
            int64_t bytes = 0;
            for (size_t p = 0; p < gpuDescs[i].num_pools; ++p)
            {
                bytes += gpuDescs[i].pools[p].slot_bytes;
            }
            for (size_t l = 0; l < gpuDescs[i].num_life_cycles; ++l)
            {
                mBytes[gpuDescs[i].life_cycles[l]] = static_cast<size_t>(bytes);
            }
        }
        return mFail != Fail::kConfigure;
    }
    [[nodiscard]] size_t queryColdPageBytes(kvcm::LayerGroupId lg) const noexcept override
    {
        auto it = mBytes.find(lg);
        return mFail == Fail::kColdBytes || it == mBytes.end() ? 0 : it->second;
    }
    [[nodiscard]] kvcm::PageIndexLocation queryPageIndexLocation(kvcm::LayerGroupId) const noexcept override
    {
        return mFail == Fail::kLocation ? kvcm::PageIndexLocation::kBadLocation : kvcm::PageIndexLocation::kHost;
    }
    bool encode(kvcm::LayerGroupId, void*, kvcm::PageIndexPair const*, size_t, kvcm::cudaStream_t) noexcept override
    {
        return false;
    }
    bool decode(kvcm::LayerGroupId, void const*, kvcm::PageIndexPair const*, size_t, kvcm::cudaStream_t) noexcept override
    {
        return false;
    }

private:
    std::shared_ptr<CodecCounters> mCounters;
    Fail mFail;
    std::map<kvcm::LayerGroupId, size_t> mBytes;
};

// ---- configurations -------------------------------------------------------------------

// The device the tests run on: the emulated device, or CUDA with
// KVCM_TEST_DEVICE=cuda (tests that rely on the emulator's host-addressable
// device memory skip themselves there).
inline kvcm::DeviceKind testDevice()
{
    char const* d = std::getenv("KVCM_TEST_DEVICE");
    return d != nullptr && std::string(d) == "cuda" ? kvcm::DeviceKind::kCuda : kvcm::DeviceKind::kEmu;
}

#define KVCM_SKIP_UNLESS_EMU()                                                                                         \
    do                                                                                                                 \
    {                                                                                                                  \
        if (kvcm_test::testDevice() != kvcm::DeviceKind::kEmu)                                                         \
        {                                                                                                              \
            GTEST_SKIP() << "needs the emulated device (host-addressable device memory)";                             \
        }                                                                                                              \
    } while (0)

// Two full-attention layers with key and value buffers of bufferBytes per
// block: one layer group, one pool group of one pool (4 buffers per slot).
inline kvcm::KVCacheManagerConfig smallConfig(int64_t gpuQuota, int64_t hostQuota = 0, int64_t bufferBytes = 128)
{
    kvcm::KVCacheManagerConfig cfg;
    cfg.tokensPerBlock = 4;
    cfg.device = testDevice();
    cfg.cacheTiers.push_back(kvcm::GpuCacheTierConfig(gpuQuota));
    if (hostQuota > 0)
    {
        cfg.cacheTiers.push_back(kvcm::HostCacheTierConfig(hostQuota));
    }
    for (int32_t layer = 0; layer < 2; ++layer)
    {
        cfg.layers.push_back(kvcm::AttentionLayerConfig{layer, {{"key", bufferBytes}, {"value", bufferBytes}}});
    }
    return cfg;
}

inline std::vector<kvcm::Token> tokenRange(kvcm::Token first, size_t n)
{
    std::vector<kvcm::Token> out(n);
    for (size_t i = 0; i < n; ++i)
    {
        out[i] = first + static_cast<kvcm::Token>(i);
    }
    return out;
}

// Expects `stmt` to throw kvcm::Error with `expectedCode` whose message
// contains `needle` (a std::string).
#define EXPECT_KVCM_ERROR_NAMING(stmt, expectedCode, needle)                                                           \
    do                                                                                                                 \
    {                                                                                                                  \
        try                                                                                                            \
        {                                                                                                              \
            stmt;                                                                                                      \
            ADD_FAILURE() << #stmt " did not throw kvcm::Error";                                                       \
        }                                                                                                              \
        catch (kvcm::Error const& e)                                                                                   \
        {                                                                                                              \
            EXPECT_EQ(e.code(), expectedCode) << e.what();                                                             \
            EXPECT_NE(e.message().find(needle), std::string::npos) << e.message();                                     \
        }                                                                                                              \
    } while (0)

// Expects `stmt` to throw a kInvalidArgument kvcm::Error naming `field`.
#define EXPECT_ARGUMENT_ERROR(stmt, field)                                                                             \
    EXPECT_KVCM_ERROR_NAMING(stmt, kvcm::StatusCode::kInvalidArgument, std::string(field) + ": ")

// Expects `stmt` to throw a kInvalidConfig kvcm::Error naming `field`.
#define EXPECT_CONFIG_ERROR(stmt, field)                                                                               \
    EXPECT_KVCM_ERROR_NAMING(stmt, kvcm::StatusCode::kInvalidConfig, std::string("invalid config: ") + (field) + ": ")

// Expects `stmt` to throw kvcm::Error with `code`.
#define EXPECT_KVCM_ERROR(stmt, expectedCode) EXPECT_KVCM_ERROR_NAMING(stmt, expectedCode, std::string())

} // namespace kvcm_test
