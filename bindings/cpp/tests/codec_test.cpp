// Codec tests: the design's interface and layouts, the adapter and its
// ownership transfer, the default codec, and a C++ compressing codec plugged
// into a manager with a host tier, verified to the byte.
#include "test_support.hpp"

#include <filesystem>
#include <string>
#include <type_traits>

#include <stdlib.h>

using namespace kvcm_test;

namespace {

// The design's static_asserts, and the C struct the pairs come in.
static_assert(sizeof(kvcm::PageIndexPair) == 8);
static_assert(std::is_trivially_copyable_v<kvcm::PageIndexPair>);
static_assert(alignof(kvcm::PageIndexPair) == 8);
static_assert(std::is_same_v<kvcm::PageIndexPair, kvcm_page_index_pair>);
static_assert(offsetof(kvcm::PageIndexPair, dst) == 0 && offsetof(kvcm::PageIndexPair, src) == 4);
static_assert(static_cast<int>(kvcm::PageIndexLocation::kBadLocation) == -1);
static_assert(static_cast<int>(kvcm::PageIndexLocation::kHost) == 0);
static_assert(static_cast<int>(kvcm::PageIndexLocation::kDevice) == 1);
static_assert(std::is_same_v<std::underlying_type_t<kvcm::PageIndexLocation>, int>);
static_assert(std::is_same_v<kvcm::LayerGroupId, kvcm::LifeCycleId>);
static_assert(std::has_virtual_destructor_v<kvcm::IKvCacheColdPageCodec>);
static_assert(std::is_abstract_v<kvcm::IKvCacheColdPageCodec>);
// Every method is noexcept, as the design spells them.
static_assert(noexcept(std::declval<kvcm::IKvCacheColdPageCodec&>().configure(nullptr, 0)));
static_assert(noexcept(std::declval<kvcm::IKvCacheColdPageCodec const&>().queryColdPageBytes(0)));
static_assert(noexcept(std::declval<kvcm::IKvCacheColdPageCodec const&>().getBatchingLayerGroupId(0)));
static_assert(noexcept(std::declval<kvcm::IKvCacheColdPageCodec const&>().queryPageIndexLocation(0)));
static_assert(noexcept(std::declval<kvcm::IKvCacheColdPageCodec&>().encode(0, nullptr, nullptr, 0, nullptr)));
static_assert(noexcept(std::declval<kvcm::IKvCacheColdPageCodec&>().decode(0, nullptr, nullptr, 0, nullptr)));
// The manager takes the codec by value.
static_assert(std::is_constructible_v<kvcm::KVCacheManager, kvcm::KVCacheManagerConfig const&,
    std::unique_ptr<kvcm::IKvCacheColdPageCodec>>);
static_assert(!std::is_copy_constructible_v<kvcm::KVCacheManager>);
static_assert(std::is_nothrow_move_constructible_v<kvcm::KVCacheManager>);
static_assert(!std::is_copy_constructible_v<kvcm::KVCache>);
static_assert(std::is_nothrow_move_constructible_v<kvcm::KVCache>);

class CodecTest : public ::testing::Test
{
protected:
    void TearDown() override { EXPECT_EQ(kvcm::liveHandleCount(), mHandlesBefore); }

    uint64_t mHandlesBefore = kvcm::liveHandleCount();
};

TEST_F(CodecTest, BatchingIdDefaultIsIdentity)
{
    auto counters = std::make_shared<CodecCounters>();
    auto codec = std::make_unique<ScriptedCodec>(counters, ScriptedCodec::Fail::kNothing);
    for (kvcm::LayerGroupId lg : {0, 1, 7, 42})
    {
        EXPECT_EQ(codec->getBatchingLayerGroupId(lg), lg);
    }
    // Through the C vtable the library calls.
    kvcm_cold_page_codec obj = kvcm::releaseColdPageCodec(std::move(codec));
    ASSERT_NE(obj.vtable, nullptr);
    EXPECT_EQ(obj.vtable->struct_size, sizeof(kvcm_cold_page_codec_vtable));
    EXPECT_EQ(obj.vtable->abi_version, KVCM_ABI_VERSION);
    ASSERT_NE(obj.vtable->get_batching_layer_group_id, nullptr);
    EXPECT_EQ(obj.vtable->get_batching_layer_group_id(obj.self, 3), 3);
    EXPECT_EQ(obj.vtable->query_page_index_location(obj.self, 0), KVCM_PAGE_INDEX_HOST);
    EXPECT_EQ(counters->destroyed, 0);
    // The C object owns the C++ codec: destroying it deletes the codec once.
    kvcm::detail::check(kvcm_cold_page_codec_destroy(&obj));
    EXPECT_EQ(counters->destroyed, 1);
}

TEST_F(CodecTest, AdapterTrampolinesCastSelfBack)
{
    auto counters = std::make_shared<CodecCounters>();
    auto* raw = new HalfCodec(counters);
    kvcm_cold_page_codec obj = kvcm::releaseColdPageCodec(std::unique_ptr<kvcm::IKvCacheColdPageCodec>(raw));
    EXPECT_EQ(obj.self, static_cast<void*>(static_cast<kvcm::IKvCacheColdPageCodec*>(raw)));
    kvcm_pool_desc pools[2] = {{0x10000, 64}, {0x20000, 32}};
    kvcm_layer_group_id lcs[2] = {0, 1};
    kvcm_pool_group_desc desc{0, 16, lcs, 2, pools, 2};
    EXPECT_TRUE(obj.vtable->configure(obj.self, &desc, 1));
    EXPECT_FALSE(obj.vtable->configure(obj.self, &desc, 1)); // exactly once
    EXPECT_EQ(obj.vtable->query_cold_page_bytes(obj.self, 0), 48u);
    EXPECT_EQ(obj.vtable->query_cold_page_bytes(obj.self, 1), 48u);
    EXPECT_EQ(obj.vtable->query_cold_page_bytes(obj.self, 2), 0u);
    EXPECT_EQ(obj.vtable->query_page_index_location(obj.self, 2), KVCM_PAGE_INDEX_BAD_LOCATION);
    // An empty transfer succeeds without touching the stream.
    EXPECT_TRUE(obj.vtable->encode(obj.self, 0, nullptr, nullptr, 0, 0));
    EXPECT_FALSE(obj.vtable->encode(obj.self, 5, nullptr, nullptr, 0, 0));
    obj.vtable->destroy(obj.self);
    EXPECT_EQ(counters->destroyed, 1);
}

TEST_F(CodecTest, ReleaseOfNullIsNoCodec)
{
    kvcm_cold_page_codec obj = kvcm::releaseColdPageCodec(nullptr);
    EXPECT_EQ(obj.vtable, nullptr);
    EXPECT_EQ(obj.self, nullptr);
}

TEST_F(CodecTest, DefaultCodecObject)
{
    auto codec = kvcm::createDefaultKvCacheColdPageCodec();
    ASSERT_NE(codec, nullptr);
    EXPECT_EQ(kvcm::liveHandleCount(), mHandlesBefore + 1); // an unconsumed default codec is a live handle
    auto* native = dynamic_cast<kvcm::NativeColdPageCodec*>(codec.get());
    ASSERT_NE(native, nullptr);
    // Its slots may be called directly: the reference behaviour.
    kvcm_pool_desc pools[2] = {{0x10000, 256}, {0x20000, 64}};
    kvcm_layer_group_id lcs[1] = {0};
    kvcm_pool_group_desc desc{0, 8, lcs, 1, pools, 2};
    EXPECT_TRUE(codec->configure(&desc, 1));
    EXPECT_EQ(codec->queryColdPageBytes(0), 320u); // concatenation of every pool's slot
    EXPECT_EQ(codec->queryColdPageBytes(1), 0u);   // unknown layer group
    EXPECT_EQ(codec->getBatchingLayerGroupId(0), 0);
    EXPECT_LT(codec->getBatchingLayerGroupId(1), 0);
    EXPECT_EQ(codec->queryPageIndexLocation(0), kvcm::PageIndexLocation::kHost);
    EXPECT_EQ(codec->queryPageIndexLocation(1), kvcm::PageIndexLocation::kBadLocation);
    {
        // An empty transfer is a no-op (on a live stream: the library resolves
        // the stream first).
        kvcm::KVCacheManager m(smallConfig(16 << 10));
        auto s = m.createStream();
        EXPECT_TRUE(codec->encode(0, reinterpret_cast<void*>(0x30000), nullptr, 0, s.cudaStream()));
        EXPECT_TRUE(codec->decode(0, reinterpret_cast<void*>(0x30000), nullptr, 0, s.cudaStream()));
        EXPECT_FALSE(codec->encode(1, reinterpret_cast<void*>(0x30000), nullptr, 0, s.cudaStream()));
    }
    codec.reset();
    EXPECT_EQ(kvcm::liveHandleCount(), mHandlesBefore); // the destructor destroyed the C object
}

TEST_F(CodecTest, DefaultCodecUnwrappedIntoManager)
{
    auto codec = kvcm::createDefaultKvCacheColdPageCodec();
    // Unwrapped: the C object itself goes to the library.
    kvcm_cold_page_codec obj = kvcm::releaseColdPageCodec(std::move(codec));
    ASSERT_NE(obj.vtable, nullptr);
    EXPECT_NE(obj.vtable, &kvcm::detail::kCodecAdapterVtable);
    kvcm::detail::check(kvcm_cold_page_codec_destroy(&obj));
    EXPECT_EQ(kvcm::liveHandleCount(), mHandlesBefore);

    {
        kvcm::KVCacheManager m(smallConfig(16 << 10, 16 << 10), kvcm::createDefaultKvCacheColdPageCodec());
        EXPECT_EQ(kvcm::liveHandleCount(), mHandlesBefore + 1); // the manager; the codec was consumed
        auto cold = m.storageStats(1);
        ASSERT_EQ(cold.size(), 1u);
        EXPECT_EQ(cold[0].page_bytes, 512); // the default codec: cold page = hot page (4 buffers x 128 B)
    }
}

// The design's construction contract: the codec is consumed when the
// constructor is invoked and destroyed exactly once on every failure path.
class ConstructionFailureDestroysCodec : public CodecTest
{
};

TEST_F(ConstructionFailureDestroysCodec, ConfigureReturnsFalse)
{
    auto counters = std::make_shared<CodecCounters>();
    auto codec = std::make_unique<ScriptedCodec>(counters, ScriptedCodec::Fail::kConfigure);
    EXPECT_KVCM_ERROR(kvcm::KVCacheManager(smallConfig(16 << 10, 16 << 10), std::move(codec)),
        kvcm::StatusCode::kCodecRejected);
    EXPECT_EQ(codec, nullptr); // moved from: consumed at the call
    EXPECT_EQ(counters->configured, 1);
    EXPECT_EQ(counters->destroyed, 1);
}

TEST_F(ConstructionFailureDestroysCodec, InvalidConfig)
{
    auto counters = std::make_shared<CodecCounters>();
    auto cfg = smallConfig(16 << 10);
    cfg.tokensPerBlock = 0;
    try
    {
        kvcm::KVCacheManager m(cfg, std::make_unique<ScriptedCodec>(counters, ScriptedCodec::Fail::kNothing));
        ADD_FAILURE() << "constructor did not throw";
    }
    catch (kvcm::Error const& e)
    {
        EXPECT_EQ(e.code(), kvcm::StatusCode::kInvalidConfig);
        EXPECT_NE(e.message().find("tokens_per_block"), std::string::npos) << e.what();
    }
    EXPECT_EQ(counters->configured, 0); // rejected before configuration
    EXPECT_EQ(counters->destroyed, 1);
}

TEST_F(ConstructionFailureDestroysCodec, InvalidLayer)
{
    auto counters = std::make_shared<CodecCounters>();
    auto cfg = smallConfig(16 << 10);
    cfg.layers[1].buffers[0].size = -5;
    try
    {
        kvcm::KVCacheManager m(cfg, std::make_unique<HalfCodec>(counters));
        ADD_FAILURE() << "constructor did not throw";
    }
    catch (kvcm::Error const& e)
    {
        EXPECT_EQ(e.code(), kvcm::StatusCode::kInvalidConfig);
        EXPECT_NE(e.message().find("layers[1].buffers[0].size"), std::string::npos) << e.what();
    }
    EXPECT_EQ(counters->destroyed, 1);
}

TEST_F(ConstructionFailureDestroysCodec, ZeroColdPageBytes)
{
    auto counters = std::make_shared<CodecCounters>();
    EXPECT_KVCM_ERROR(kvcm::KVCacheManager(smallConfig(16 << 10, 16 << 10),
                          std::make_unique<ScriptedCodec>(counters, ScriptedCodec::Fail::kColdBytes)),
        kvcm::StatusCode::kCodecRejected);
    EXPECT_EQ(counters->destroyed, 1);
}

TEST_F(ConstructionFailureDestroysCodec, BadLocationGpuOnly)
{
    // Configuration and validation happen for a GPU-only manager too.
    auto counters = std::make_shared<CodecCounters>();
    EXPECT_KVCM_ERROR(kvcm::KVCacheManager(
                          smallConfig(16 << 10), std::make_unique<ScriptedCodec>(counters, ScriptedCodec::Fail::kLocation)),
        kvcm::StatusCode::kCodecRejected);
    EXPECT_EQ(counters->configured, 1);
    EXPECT_EQ(counters->destroyed, 1);
}

TEST_F(ConstructionFailureDestroysCodec, DefaultCodecObjectOnFailure)
{
    auto cfg = smallConfig(16 << 10);
    cfg.cacheTiers.clear();
    EXPECT_KVCM_ERROR(kvcm::KVCacheManager(cfg, kvcm::createDefaultKvCacheColdPageCodec()),
        kvcm::StatusCode::kInvalidConfig);
    // The default codec's handle was consumed, not leaked.
    EXPECT_EQ(kvcm::liveHandleCount(), mHandlesBefore);
}

TEST_F(ConstructionFailureDestroysCodec, SuccessDestroysAtManagerDestruction)
{
    auto counters = std::make_shared<CodecCounters>();
    {
        kvcm::KVCacheManager m(smallConfig(16 << 10, 16 << 10), std::make_unique<HalfCodec>(counters));
        EXPECT_EQ(counters->configured, 1);
        EXPECT_EQ(counters->destroyed, 0);
    }
    EXPECT_EQ(counters->destroyed, 1);
}

// ---- the compressing codec, end to end ---------------------------------------------------

struct CompressCase
{
    kvcm::PageIndexLocation location;
    char const* name;
};

void PrintTo(CompressCase const& c, std::ostream* os)
{
    *os << c.name;
}

class CompressingCodec : public CodecTest, public ::testing::WithParamInterface<CompressCase>
{
};

TEST_P(CompressingCodec, EvictToHostAndBackByteExact)
{
    if (GetParam().location == kvcm::PageIndexLocation::kDevice)
    {
        KVCM_SKIP_UNLESS_EMU(); // its host functions read device memory directly
    }
    auto counters = std::make_shared<CodecCounters>();
    // One layer group of 2 layers x (key, value) x 128 B: a 512 B hot page,
    // a 256 B cold page. A GPU tier of 8 pages, a host tier of 32 cold pages.
    auto cfg = smallConfig(8 * 512, 32 * 256);
    cfg.enableStats = true;
    kvcm::KVCacheManager m(cfg, std::make_unique<HalfCodec>(counters, GetParam().location));
    EXPECT_EQ(counters->configured, 1);

    auto hot = m.storageStats(0);
    auto cold = m.storageStats(1);
    ASSERT_EQ(hot.size(), 1u);
    ASSERT_EQ(cold.size(), 1u);
    EXPECT_EQ(hot[0].page_bytes, 512);
    EXPECT_EQ(cold[0].page_bytes, 256); // the codec's fixed smaller size
    int64_t const gpuPages = hot[0].total;
    ASSERT_GE(gpuPages, 6);
    auto coldDescs = m.poolGroupDescs(1);
    ASSERT_EQ(coldDescs.size(), 1u);
    ASSERT_EQ(coldDescs[0].num_pools, 1u);
    EXPECT_EQ(coldDescs[0].pools[0].slot_bytes, 256);

    auto stream = m.createStream();
    KvWriter writer(m, cfg, stream, /*seed=*/11, /*zeroLow=*/true);

    // Request A: 16 tokens = 4 full blocks, written and committed.
    auto const a = tokenRange(1000, 16);
    {
        auto c = m.createKVCache(a);
        c.resume(stream);
        c.resize(16, 0);
        writer.write(c, a, 0, 16);
        c.resize(16, 16);
        c.commit(a, true);
        auto v = writer.verify(c, a, 0, 16);
        EXPECT_EQ(v.mismatches, 0);
        EXPECT_EQ(v.checked, 16 * 4);
    } // closed: A's blocks stay cached, evictable

    // Requests B and C fill the GPU: A's pages are encoded into the host tier.
    for (kvcm::Token first : {2000, 3000})
    {
        auto const t = tokenRange(first, static_cast<size_t>(gpuPages * 4));
        auto c = m.createKVCache(t);
        c.resume(stream);
        c.resize(static_cast<int64_t>(t.size()), 0);
        writer.write(c, t, 0, static_cast<int64_t>(t.size()));
        c.resize(static_cast<int64_t>(t.size()), static_cast<int64_t>(t.size()));
        c.close();
    }
    auto const offload = m.migrationStats(kvcm::MigrationPath::kGpuToHost);
    EXPECT_GE(offload.pages, 4);
    EXPECT_EQ(offload.bytes, offload.pages * 256); // cold blobs travel compressed
    EXPECT_GE(counters->encodedPages.load(), 4);
    EXPECT_GT(counters->encodeCalls.load(), 0);

    // A comes back: its 4 blocks are reused and decoded from the host tier.
    auto a2 = a;
    a2.push_back(77);
    EXPECT_EQ(m.probeReuse(a2), 16);
    auto c = m.createKVCache(a2);
    EXPECT_EQ(c.reusedTokens(), 16);
    c.resume(stream);
    auto const onboard = m.migrationStats(kvcm::MigrationPath::kHostToGpu);
    EXPECT_EQ(onboard.pages, 4);
    EXPECT_EQ(onboard.bytes, 4 * 256);
    EXPECT_EQ(counters->decodedPages.load(), 4);
    auto v = writer.verify(c, a2, 0, 16);
    EXPECT_EQ(v.checked, 16 * 4);
    EXPECT_EQ(v.mismatches, 0) << "decoded pages differ from what was written";
    c.close();
    EXPECT_EQ(counters->destroyed, 0);
    stream.destroy();
    m.destroy();
    EXPECT_EQ(counters->destroyed, 1);
}

INSTANTIATE_TEST_SUITE_P(Locations, CompressingCodec,
    ::testing::Values(CompressCase{kvcm::PageIndexLocation::kHost, "HostIndices"},
        CompressCase{kvcm::PageIndexLocation::kDevice, "DeviceIndices"}),
    [](auto const& param) { return std::string(param.param.name); });

TEST_F(CodecTest, CompressingCodecThroughDiskTier)
{
    // GPU and disk, no host tier: encode into the pinned staging ring, then
    // the blob goes to disk; decode reverses it.
    char dirTemplate[] = "/tmp/kvcm-cpp-disk-XXXXXX";
    char* dir = mkdtemp(dirTemplate);
    ASSERT_NE(dir, nullptr);
    auto counters = std::make_shared<CodecCounters>();
    auto cfg = smallConfig(8 * 512);
    cfg.cacheTiers.push_back(kvcm::DiskCacheTierConfig(32 * 256, dir));
    {
        kvcm::KVCacheManager m(cfg, std::make_unique<HalfCodec>(counters));
        EXPECT_EQ(m.storageStats(1).at(0).page_bytes, 256);
        EXPECT_EQ(m.storageStats(1).at(0).tier, KVCM_TIER_DISK);
        auto stream = m.createStream();
        KvWriter writer(m, cfg, stream, /*seed=*/3, /*zeroLow=*/true);
        auto const gpuPages = m.storageStats(0).at(0).total;
        auto const a = tokenRange(40, 16);
        {
            auto c = m.createKVCache(a);
            c.resume(stream);
            c.resize(16, 0);
            writer.write(c, a, 0, 16);
            c.resize(16, 16);
            c.commit(a, true);
        }
        {
            auto const t = tokenRange(900, static_cast<size_t>(gpuPages * 4));
            auto c = m.createKVCache(t);
            c.resume(stream);
            c.resize(static_cast<int64_t>(t.size()), 0);
        }
        auto const off = m.migrationStats(kvcm::MigrationPath::kGpuToDisk);
        EXPECT_GE(off.pages, 4);
        EXPECT_EQ(off.bytes, off.pages * 256);
        auto a2 = a;
        a2.push_back(1);
        auto c = m.createKVCache(a2);
        EXPECT_EQ(c.reusedTokens(), 16);
        c.resume(stream);
        EXPECT_EQ(m.migrationStats(kvcm::MigrationPath::kDiskToGpu).pages, 4);
        auto v = writer.verify(c, a2, 0, 16);
        EXPECT_EQ(v.checked, 64);
        EXPECT_EQ(v.mismatches, 0);
    }
    EXPECT_EQ(counters->destroyed, 1);
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
    EXPECT_FALSE(ec) << ec.message();
}

// A persistent disk tier needs a codec with an identity: a codec
// implemented in C++ has none, so the library names the tier's persistent.
TEST_F(CodecTest, PersistentDiskTierNeedsACodecIdentity)
{
    char dirTemplate[] = "/tmp/kvcm-cpp-persist-XXXXXX";
    char* dir = mkdtemp(dirTemplate);
    ASSERT_NE(dir, nullptr);
    auto cfg = smallConfig(8 * 512);
    cfg.cacheTiers.push_back(kvcm::DiskCacheTierConfig(32 * 256, dir, /*persistentTier=*/true));
    try
    {
        kvcm::KVCacheManager m(cfg, std::make_unique<HalfCodec>(std::make_shared<CodecCounters>()));
        ADD_FAILURE() << "a codec without an identity was accepted";
    }
    catch (kvcm::Error const& e)
    {
        EXPECT_EQ(e.code(), kvcm::StatusCode::kInvalidConfig) << e.what();
        EXPECT_NE(e.message().find("cache_tiers[1].persistent"), std::string::npos) << e.message();
    }
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
    EXPECT_FALSE(ec) << ec.message();
}

TEST_F(CodecTest, DefaultCodecRoundTripThroughHostTier)
{
    // The same round trip with the library's default codec (lossless for any
    // bytes, so zeroLow is off).
    auto cfg = smallConfig(8 * 512, 16 * 512);
    kvcm::KVCacheManager m(cfg); // no codec: the default
    auto stream = m.createStream();
    KvWriter writer(m, cfg, stream, /*seed=*/5);
    auto const gpuPages = m.storageStats(0).at(0).total;
    auto const a = tokenRange(1, 16);
    {
        auto c = m.createKVCache(a);
        c.resume(stream);
        c.resize(16, 0);
        writer.write(c, a, 0, 16);
        c.resize(16, 16);
        c.commit(a, true);
    }
    {
        auto const t = tokenRange(500, static_cast<size_t>(gpuPages * 4));
        auto c = m.createKVCache(t);
        c.resume(stream);
        c.resize(static_cast<int64_t>(t.size()), 0);
    }
    EXPECT_GE(m.migrationStats(kvcm::MigrationPath::kGpuToHost).pages, 4);
    auto a2 = a;
    a2.push_back(0);
    auto c = m.createKVCache(a2);
    EXPECT_EQ(c.reusedTokens(), 16);
    EXPECT_EQ(m.migrationStats(kvcm::MigrationPath::kHostToGpu).pages, 0);
    c.prefetch(kvcm::kGpuLevel); // SUSPENDED: brought up to the GPU without pinning
    EXPECT_EQ(m.migrationStats(kvcm::MigrationPath::kHostToGpu).pages, 4);
    c.resume(stream); // nothing left to move
    EXPECT_EQ(m.migrationStats(kvcm::MigrationPath::kHostToGpu).bytes, 4 * 512);
    auto v = writer.verify(c, a2, 0, 16);
    EXPECT_EQ(v.mismatches, 0);
    EXPECT_EQ(v.checked, 64);
}

} // namespace

// The built-in codecs: the default and auto codecs make a manager on every
// device (auto writes the default codec's cold pages, so its cold page is the
// hot page); the gather and FP8 codecs are CUDA only, refused on the emulated
// device with kCodecRejected, the codec consumed.
TEST_F(CodecTest, BuiltinCodecsNeedTheirDevice)
{
    for (auto kind : {kvcm::BuiltinCodec::kDefault, kvcm::BuiltinCodec::kAuto})
    {
        kvcm::KVCacheManager m(smallConfig(16 << 10, 16 << 10), kvcm::createBuiltinKvCacheColdPageCodec(kind));
        EXPECT_EQ(kvcm::liveHandleCount(), mHandlesBefore + 1) << kvcm::name(kind);
        auto cold = m.storageStats(1);
        ASSERT_EQ(cold.size(), 1u);
        EXPECT_EQ(cold[0].page_bytes, 512) << kvcm::name(kind);
    }
    KVCM_SKIP_UNLESS_EMU();
    for (auto kind : {kvcm::BuiltinCodec::kGather, kvcm::BuiltinCodec::kFp8})
    {
        EXPECT_KVCM_ERROR(kvcm::KVCacheManager(smallConfig(16 << 10, 16 << 10),
                              kvcm::createBuiltinKvCacheColdPageCodec(kind)),
            kvcm::StatusCode::kCodecRejected);
        EXPECT_EQ(kvcm::liveHandleCount(), mHandlesBefore) << kvcm::name(kind);
    }
}

// Bad built-in codec options throw kInvalidArgument and make nothing.
TEST_F(CodecTest, BuiltinCodecOptionsAreChecked)
{
    kvcm::BuiltinColdPageCodecOptions o;
    o.kind = kvcm::BuiltinCodec::kFp8;
    o.blockElems = 100;
    EXPECT_KVCM_ERROR((void)kvcm::createBuiltinKvCacheColdPageCodec(o), kvcm::StatusCode::kInvalidArgument);
    o.blockElems = 64;
    o.element = kvcm::ElementType::kBfloat16;
    auto codec = kvcm::createBuiltinKvCacheColdPageCodec(o);
    EXPECT_EQ(kvcm::liveHandleCount(), mHandlesBefore + 1);
    codec.reset();
    EXPECT_EQ(kvcm::liveHandleCount(), mHandlesBefore);
}
