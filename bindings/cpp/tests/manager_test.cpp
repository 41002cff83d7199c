// Manager and KV cache tests: RAII lifecycle, getters, page indices, error
// codes on bad arguments, stats, events, pool descriptors, quota and resize,
// the stream helper, and live handles back to zero.
#include "test_support.hpp"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <tuple>
#include <type_traits>

using namespace kvcm_test;

namespace {

class ManagerTest : public ::testing::Test
{
protected:
    void TearDown() override { EXPECT_EQ(kvcm::liveHandleCount(), mHandlesBefore); }

    uint64_t mHandlesBefore = kvcm::liveHandleCount();
};

// The tier constructors set the tier's kind and the fields they take, every
// other field its default; one-argument ones are explicit, the disk tier's
// (two required arguments) is not, and each is a CacheTierConfig.
TEST_F(ManagerTest, TierConstructorsSetKindAndFields)
{
    static_assert(!std::is_convertible_v<int64_t, kvcm::GpuCacheTierConfig>, "explicit");
    static_assert(!std::is_convertible_v<int64_t, kvcm::HostCacheTierConfig>, "explicit");
    static_assert(std::is_base_of_v<kvcm::CacheTierConfig, kvcm::DiskCacheTierConfig>);
    static_assert(!std::is_default_constructible_v<kvcm::GpuCacheTierConfig>);
    kvcm::CacheTierConfig const gpu = kvcm::GpuCacheTierConfig(10);
    EXPECT_EQ(gpu.kind, kvcm::TierKind::kGpu);
    EXPECT_EQ(gpu.quota, 10);
    EXPECT_EQ(gpu.maxQuota, 0);
    EXPECT_TRUE(gpu.path.empty());
    EXPECT_FALSE(gpu.persistent);
    EXPECT_EQ(kvcm::GpuCacheTierConfig(10, 20).maxQuota, 20);
    kvcm::CacheTierConfig const host = kvcm::HostCacheTierConfig(7);
    EXPECT_EQ(host.kind, kvcm::TierKind::kHost);
    EXPECT_EQ(host.quota, 7);
    EXPECT_EQ(host.maxQuota, 0);
    kvcm::DiskCacheTierConfig const disk = {5, "/tmp/kvcm-disk"};
    EXPECT_EQ(disk.kind, kvcm::TierKind::kDisk);
    EXPECT_EQ(disk.quota, 5);
    EXPECT_EQ(disk.path, "/tmp/kvcm-disk");
    EXPECT_FALSE(disk.persistent);
    EXPECT_TRUE(kvcm::DiskCacheTierConfig(5, "/d", true).persistent);
}

TEST_F(ManagerTest, LibraryInfo)
{
    EXPECT_EQ(kvcm::libraryVersion(), KVCM_VERSION_STRING);
    EXPECT_GE(kvcm::abiVersion(), kvcm::kAbiVersion);
    static_assert(KVCM_ABI_VERSION == 2u, "ABI version 2 appended to the first ABI");
    EXPECT_EQ(kvcm::abiVersion(), 2u);
    kvcm_api const* api = kvcm_get_api(KVCM_ABI_VERSION);
    ASSERT_NE(api, nullptr);
    EXPECT_EQ(api->struct_size, sizeof(kvcm_api));
    EXPECT_EQ(api->abi_version, 2u);
    EXPECT_EQ(api->kv_cache_create, &kvcm_kv_cache_create);
    EXPECT_EQ(api->manager_attach_cp, &kvcm_manager_attach_cp);
    EXPECT_EQ(kvcm_get_api(0), nullptr);
    EXPECT_EQ(kvcm_get_api(KVCM_ABI_VERSION + 1), nullptr);
    EXPECT_FALSE(kvcm::isPoisoned());
    EXPECT_STREQ(kvcm::statusCodeName(kvcm::StatusCode::kInvalidArgument), "KVCM_ERR_INVALID_ARGUMENT");
}

TEST_F(ManagerTest, DefaultCodecManagerBasics)
{
    auto cfg = smallConfig(64 << 10);
    kvcm::KVCacheManager m(cfg, kvcm::createDefaultKvCacheColdPageCodec());
    EXPECT_TRUE(m);
    EXPECT_NE(m.handle(), 0u);
    EXPECT_EQ(m.tokensPerBlock(), 4);
    EXPECT_EQ(m.numLayerGroups(), 1);
    EXPECT_EQ(m.numLevels(), 1);
    EXPECT_EQ(m.deviceKind(), testDevice());
    EXPECT_EQ(m.layerGroupOf(0), 0);
    EXPECT_EQ(m.layerGroupOf(1), 0);
    EXPECT_EQ(m.quota(0), 64 << 10);

    // Buffer locations: one pool of 4 buffers (2 layers x key, value).
    auto const k0 = m.bufferLocation(0, "key");
    auto const v1 = m.bufferLocation(1, "value");
    EXPECT_EQ(k0.layer_group, 0);
    EXPECT_EQ(k0.bytes, 128);
    EXPECT_EQ(k0.scale, 4);
    EXPECT_EQ(k0.pool_base, v1.pool_base);
    EXPECT_NE(k0.offset, v1.offset);

    // Pool descriptors of the GPU level: what the codec was configured with.
    auto const descs = m.poolGroupDescs();
    ASSERT_EQ(descs.size(), 1u);
    EXPECT_EQ(descs[0].index, 0);
    ASSERT_EQ(descs[0].num_life_cycles, 1u);
    EXPECT_EQ(descs[0].life_cycles[0], 0);
    ASSERT_EQ(descs[0].num_pools, 1u);
    EXPECT_EQ(descs[0].pools[0].base, k0.pool_base);
    EXPECT_EQ(descs[0].pools[0].slot_bytes, 512);
    EXPECT_EQ(descs[0].num_slots, (64 << 10) / 512);
    auto moved = std::move(const_cast<kvcm::PoolGroupDescs&>(descs));
    EXPECT_EQ(moved[0].pools[0].slot_bytes, 512); // pointers survive moves

    auto st = m.storageStats(0);
    ASSERT_EQ(st.size(), 1u);
    EXPECT_EQ(st[0].total, 128);
    EXPECT_EQ(st[0].free, 128);
    EXPECT_EQ(st[0].available, 128);
    EXPECT_EQ(st[0].tier, KVCM_TIER_GPU);
}

TEST_F(ManagerTest, KVCacheRaiiLifecycle)
{
    auto cfg = smallConfig(64 << 10);
    kvcm::KVCacheManager m(cfg);
    auto stream = m.createStream();
    auto const prompt = tokenRange(10, 10);

    uint64_t const withManager = kvcm::liveHandleCount();
    {
        kvcm::KVCache c = m.createKVCache(prompt);
        EXPECT_TRUE(c);
        EXPECT_EQ(kvcm::liveHandleCount(), withManager + 1);
        EXPECT_EQ(c.status(), kvcm::CacheStatus::kSuspended);
        EXPECT_EQ(c.reusedTokens(), 0);
        EXPECT_EQ(c.capacity(), 0);
        EXPECT_EQ(c.historyLength(), 0);
        EXPECT_EQ(c.numCommittedTokens(), 0);
        uint64_t const id = c.id();
        EXPECT_GT(id, 0u);

        // Resize needs an ACTIVE cache.
        EXPECT_KVCM_ERROR(c.resize(10, 0), kvcm::StatusCode::kInvalidState);
        c.resume(stream);
        EXPECT_EQ(c.status(), kvcm::CacheStatus::kActive);
        EXPECT_KVCM_ERROR(c.resume(stream), kvcm::StatusCode::kInvalidState);

        c.resize(10, 0);
        EXPECT_EQ(c.capacity(), 10);
        auto idx = c.basePageIndices(0);
        ASSERT_EQ(idx.size(), 3u); // ceil(10 / 4)
        for (int32_t i : idx)
        {
            EXPECT_GE(i, 0);
        }
        // Into a caller buffer.
        int32_t buf[8];
        EXPECT_EQ(c.basePageIndices(0, buf, 8), 3u);
        EXPECT_EQ(std::vector<int32_t>(buf, buf + 3), idx);
        EXPECT_KVCM_ERROR(c.basePageIndices(0, buf, 2), kvcm::StatusCode::kBufferTooSmall);

        c.resize(10, 8);
        EXPECT_EQ(c.historyLength(), 8);
        c.commit(prompt.data(), 8);
        EXPECT_EQ(c.numCommittedTokens(), 8);
        c.suspend();
        EXPECT_EQ(c.status(), kvcm::CacheStatus::kSuspended);
        c.resume(stream);

        // Moving keeps one owner.
        kvcm::KVCache moved = std::move(c);
        EXPECT_FALSE(c); // NOLINT(bugprone-use-after-move)
        EXPECT_EQ(moved.id(), id);
        EXPECT_EQ(kvcm::liveHandleCount(), withManager + 1);
        moved.close();
        EXPECT_FALSE(moved);
        moved.close(); // closing a closed cache does nothing
        EXPECT_EQ(kvcm::liveHandleCount(), withManager);
        // A closed object's calls are refused: its handle is gone.
        EXPECT_KVCM_ERROR(moved.resize(1, 0), kvcm::StatusCode::kInvalidHandle);
        EXPECT_KVCM_ERROR((void)moved.status(), kvcm::StatusCode::kInvalidHandle);
    }
    EXPECT_EQ(kvcm::liveHandleCount(), withManager);

    // The committed blocks are reused by a new cache; the destructor closes it.
    {
        auto c = m.createKVCache(prompt);
        EXPECT_EQ(c.reusedTokens(), 8);
        EXPECT_EQ(c.historyLength(), 8);
        EXPECT_EQ(c.numCommittedTokens(), 8);
        EXPECT_EQ(kvcm::liveHandleCount(), withManager + 1);
    }
    EXPECT_EQ(kvcm::liveHandleCount(), withManager);

    // stopCommitting refuses later commits.
    {
        auto c = m.createKVCache(prompt);
        c.resume(stream);
        c.resize(12, 12);
        c.stopCommitting();
        EXPECT_KVCM_ERROR(c.commit(prompt, false), kvcm::StatusCode::kInvalidState);
    }
}

// decodeSteps leaves a cache as the per-step resize and commit calls do
// (committed tokens, history, capacity, page indices) across block
// boundaries; a run whose new blocks the GPU cannot hold returns false and
// changes nothing; a cache not at its committed history throws.
TEST_F(ManagerTest, DecodeStepsEqualThePerStepCalls)
{
    auto const prompt = tokenRange(1, 9);
    auto const steps = tokenRange(100, 10);
    auto run = [&](bool batched) {
        kvcm::KVCacheManager m(smallConfig(64 << 10));
        auto stream = m.createStream();
        auto c = m.createKVCache(prompt);
        c.resume(stream);
        c.resize(9, 9);
        c.commit(prompt);
        if (batched)
        {
            EXPECT_TRUE(c.decodeSteps(steps.data(), 3));
            EXPECT_TRUE(c.decodeSteps(std::vector<kvcm::Token>(steps.begin() + 3, steps.end())));
        }
        else
        {
            for (size_t i = 0; i < steps.size(); ++i)
            {
                auto const n = static_cast<int64_t>(prompt.size() + i + 1);
                EXPECT_TRUE(c.resize(n, n));
                c.commit(&steps[i], 1);
            }
        }
        return std::make_tuple(c.committedTokens(), c.historyLength(), c.capacity(), c.basePageIndices(0));
    };
    auto const want = run(false);
    EXPECT_EQ(run(true), want);
    EXPECT_EQ(std::get<0>(want).size(), prompt.size() + steps.size());

    kvcm::KVCacheManager m(smallConfig(3 * 512));
    auto stream = m.createStream();
    auto c = m.createKVCache(prompt);
    c.resume(stream);
    c.resize(9, 9);
    c.commit(prompt);
    EXPECT_FALSE(c.decodeSteps(tokenRange(100, 4))); // the 4th step needs a 4th block
    EXPECT_EQ(c.numCommittedTokens(), 9);
    EXPECT_EQ(c.capacity(), 9);
    EXPECT_TRUE(c.decodeSteps({}));
    c.resize(10, 10);
    EXPECT_KVCM_ERROR(c.decodeSteps(tokenRange(100, 1)), kvcm::StatusCode::kInvalidState);
}

TEST_F(ManagerTest, DestroyingManagerFirstIsSafe)
{
    // Caches and streams outliving their manager: the manager closed them; the
    // C++ objects' destructors then find their handles gone and do nothing.
    kvcm::KVCache c;
    kvcm::Stream s;
    {
        kvcm::KVCacheManager m(smallConfig(64 << 10));
        s = m.createStream();
        c = m.createKVCache(tokenRange(0, 9));
        c.resume(s);
        c.resize(9, 0);
    }
    EXPECT_KVCM_ERROR((void)c.status(), kvcm::StatusCode::kInvalidHandle);
}

TEST_F(ManagerTest, ErrorCodesOnBadArguments)
{
    auto cfg = smallConfig(64 << 10);
    kvcm::KVCacheManager m(cfg);
    auto stream = m.createStream();

    EXPECT_KVCM_ERROR((void)m.layerGroupOf(99), kvcm::StatusCode::kInvalidArgument);
    EXPECT_KVCM_ERROR((void)m.bufferLocation(0, "query"), kvcm::StatusCode::kInvalidArgument);
    EXPECT_KVCM_ERROR((void)m.bufferLocation(0, std::string("key\0x", 5)), kvcm::StatusCode::kInvalidArgument); // not cut to "key"
    EXPECT_KVCM_ERROR((void)m.storageStats(3), kvcm::StatusCode::kInvalidArgument);
    EXPECT_KVCM_ERROR((void)m.quota(-1), kvcm::StatusCode::kInvalidArgument);
    EXPECT_KVCM_ERROR(m.resizeLevel(0, 0), kvcm::StatusCode::kInvalidArgument);
    EXPECT_KVCM_ERROR((void)m.allocMemory(kvcm::MemoryKind::kHostMapped, 0), kvcm::StatusCode::kInvalidArgument);

    auto c = m.createKVCache(tokenRange(0, 8));
    c.resume(stream);
    c.resize(8, 4);
    EXPECT_KVCM_ERROR(c.resize(8, 2), kvcm::StatusCode::kInvalidArgument);  // history must not decrease
    EXPECT_KVCM_ERROR(c.resize(4, 8), kvcm::StatusCode::kInvalidArgument);  // history beyond capacity
    EXPECT_FALSE(c.resize(1 << 20, -1)); // more pages than the GPU has: false, as KVCacheManagerV2
    EXPECT_EQ(c.capacity(), 8); // a failed call changes nothing
    EXPECT_KVCM_ERROR(c.prefetch(0), kvcm::StatusCode::kInvalidState);      // only SUSPENDED caches

    // Errors carry the library's message, naming the argument.
    try
    {
        (void)m.layerGroupOf(99);
        FAIL();
    }
    catch (kvcm::Error const& e)
    {
        EXPECT_NE(std::string(e.what()).find("KVCM_ERR_INVALID_ARGUMENT"), std::string::npos);
        EXPECT_NE(e.message().find("99"), std::string::npos) << e.message();
        EXPECT_STREQ(e.codeName(), "KVCM_ERR_INVALID_ARGUMENT");
    }

    // The C layer under the classes: bad handles and NULL outputs.
    int64_t v = 0;
    kvcm_cache_status st{};
    auto code = [](kvcm_status* s)
    {
        auto const result = kvcm_status_get_code(s);
        kvcm_status_free(s);
        return result;
    };
    EXPECT_EQ(code(kvcm_kv_cache_get_status(0, &st)), KVCM_ERR_INVALID_HANDLE);
    EXPECT_EQ(code(kvcm_kv_cache_get_capacity(0xdeadbeef, &v)), KVCM_ERR_INVALID_HANDLE);
    EXPECT_EQ(code(kvcm_kv_cache_get_capacity(c.handle(), nullptr)), KVCM_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(code(kvcm_manager_get_quota(c.handle(), 0, &v)), KVCM_ERR_INVALID_HANDLE); // a handle of another type
    EXPECT_EQ(code(kvcm_manager_create(nullptr, nullptr, nullptr)), KVCM_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(code(kvcm_kv_cache_resume(0xdeadbeef, 0)), KVCM_ERR_INVALID_HANDLE); // (stream 0 is the engine's default stream)
    EXPECT_EQ(kvcm_status_get_code(nullptr), KVCM_OK);
    EXPECT_STREQ(kvcm_status_get_message(nullptr), "");

    // A bad struct_size is refused.
    kvcm_kv_cache_options opts{};
    opts.struct_size = 4;
    opts.abi_version = KVCM_ABI_VERSION;
    kvcm_kv_cache out = 0;
    EXPECT_EQ(code(kvcm_kv_cache_create(m.handle(), &opts, &out)), KVCM_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(out, 0u);
}

// Bad input through the C ABI is KVCM_ERR_INVALID_ARGUMENT whose message
// names the C parameter or field (not a Go name, nor one the ABI does not
// have), and a refused call changes nothing: the manager's caches, handles
// and statistics, the cache's capacity, history, committed tokens and pages.
TEST_F(ManagerTest, ArgumentErrorsNameTheCArgumentAndChangeNothing)
{
    auto cfg = smallConfig(64 << 10);
    cfg.enableStats = true;
    kvcm::KVCacheManager m(cfg);
    auto stream = m.createStream();
    auto c = m.createKVCache(tokenRange(0, 8));
    c.resume(stream);
    c.resize(8, 4);

    auto const snapshot = [&]
    {
        auto const st = m.stats();
        return std::make_tuple(kvcm::liveHandleCount(), m.numOpenCaches(), st.alloc_total_blocks, st.missed_blocks,
            c.capacity(), c.historyLength(), c.numCommittedTokens(), c.basePageIndices(0));
    };
    auto const before = snapshot();
    auto const expectNaming = [&](kvcm_status* s, std::string const& needle)
    {
        EXPECT_EQ(kvcm_status_get_code(s), KVCM_ERR_INVALID_ARGUMENT) << kvcm_status_get_message(s);
        std::string const msg = kvcm_status_get_message(s);
        kvcm_status_free(s);
        EXPECT_NE(msg.find(needle), std::string::npos) << msg;
        EXPECT_EQ(snapshot(), before) << msg;
    };

    // The buffer queries name layer_id for an unknown layer, role for an
    // unknown buffer of a known one.
    kvcm_layer_group_id lg = -1;
    kvcm_buffer_location loc{};
    int64_t v = 0;
    expectNaming(kvcm_manager_get_layer_group_of(m.handle(), 99, &lg), "layer_id: unknown layer 99");
    expectNaming(kvcm_manager_get_buffer_location(m.handle(), 99, "key", &loc), "layer_id: unknown layer 99");
    expectNaming(kvcm_manager_get_buffer_location(m.handle(), 0, "query", &loc), "role: no buffer \"query\"");
    expectNaming(kvcm_manager_get_page_stride(m.handle(), 0, "query", &v), "role: ");
    expectNaming(kvcm_manager_get_page_index_upper_bound(m.handle(), -1, "key", &v), "layer_id: ");

    // Options fields by their C names.
    auto const initOptions = []
    {
        kvcm_kv_cache_options o{};
        o.struct_size = sizeof o;
        o.abi_version = KVCM_ABI_VERSION;
        return o;
    };
    kvcm_kv_cache_options opts = initOptions();
    auto const prompt = tokenRange(0, 8);
    opts.input_tokens = prompt.data();
    opts.num_input_tokens = prompt.size();
    opts.has_expected_prompt_length = true;
    opts.expected_prompt_length = -1;
    kvcm_kv_cache out = 0;
    expectNaming(kvcm_kv_cache_create(m.handle(), &opts, &out), "expected_prompt_length: -1 is negative");
    opts.has_expected_prompt_length = false;
    size_t pos[1] = {8};
    char const digest[32] = {};
    opts.input_digest_positions = pos;
    opts.num_input_digests = 1;
    opts.input_digest_bytes = digest;
    opts.input_digest_bytes_len = sizeof digest;
    expectNaming(kvcm_kv_cache_create(m.handle(), &opts, &out), "input_digest_positions[0]: position 8 outside the 8 tokens");
    EXPECT_EQ(out, 0u);

    // Digest positions of the calls are digest_positions[i].
    kvcm_token const toks[4] = {8, 9, 10, 11};
    pos[0] = 4;
    expectNaming(kvcm_kv_cache_commit_digests(c.handle(), toks, 4, pos, 1, digest, sizeof digest, false),
        "digest_positions[0]: position 4 outside the 4 tokens");
    kvcm_reuse_scope const scope{};
    expectNaming(kvcm_manager_probe_reuse_digests(m.handle(), &scope, false, toks, 4, pos, 1, digest, sizeof digest, &v),
        "digest_positions[0]: ");
    uint64_t keys[2];
    size_t needed = 0;
    expectNaming(kvcm_block_keys(KVCM_BLOCK_KEY_SHA256, &scope, false, 4, toks, 4, pos, 1, digest, sizeof digest, false,
                     keys, 2, &needed),
        "digest_positions[0]: ");

    // A count whose copy no memory holds (2^33 tokens: 32 GiB) is refused
    // before the copy, which would have aborted the process.
    expectNaming(kvcm_kv_cache_commit(c.handle(), toks, size_t{1} << 33, false), "tokens: 8589934592 is too large");
    expectNaming(kvcm_manager_probe_reuse(m.handle(), &scope, toks, size_t{1} << 33, &v), "tokens: ");
    opts = initOptions();
    opts.input_tokens = prompt.data();
    opts.num_input_tokens = size_t{1} << 33;
    expectNaming(kvcm_kv_cache_create(m.handle(), &opts, &out), "options.input_tokens: ");
    EXPECT_EQ(out, 0u);
}

// validateConfig checks a configuration as the constructor would, naming the
// field of the first problem, and creates nothing.
TEST_F(ManagerTest, ValidateConfigNamesTheField)
{
    auto cfg = smallConfig(64 << 10);
    EXPECT_NO_THROW(kvcm::validateConfig(cfg));

    cfg.layers[1].buffers[0].size = 0;
    EXPECT_CONFIG_ERROR(kvcm::validateConfig(cfg), "layers[1].buffers[0].size");
    cfg = smallConfig(64 << 10);
    cfg.initialPoolRatio = {1, 2};
    EXPECT_CONFIG_ERROR(kvcm::validateConfig(cfg), "initial_pool_ratio");
    cfg = smallConfig(64 << 10);
    cfg.cacheTiers.push_back(kvcm::DiskCacheTierConfig(1 << 20, "/nonexistent/kvcm"));
    EXPECT_CONFIG_ERROR(kvcm::validateConfig(cfg), "cache_tiers[1].path");
    EXPECT_EQ(kvcm::liveHandleCount(), mHandlesBefore) << "validation creates nothing";

    // A block too large for the manager's token chunks is an error, from the
    // constructor too (it ran out of memory in kvcm_manager_create).
    cfg = smallConfig(64 << 10);
    cfg.tokensPerBlock = INT32_MAX;
    EXPECT_CONFIG_ERROR(kvcm::validateConfig(cfg), "tokens_per_block");
    EXPECT_CONFIG_ERROR(kvcm::KVCacheManager{cfg}, "tokens_per_block");
    EXPECT_EQ(kvcm::liveHandleCount(), mHandlesBefore) << "a refused manager leaves no handle";
}

// A temporary directory, removed with its files at scope end.
class TempDir
{
public:
    TempDir()
    {
        char tmpl[] = "/tmp/kvcm-cpp-persist-XXXXXX";
        char* d = mkdtemp(tmpl);
        if (d == nullptr)
        {
            throw std::runtime_error("mkdtemp failed");
        }
        mPath = d;
    }

    ~TempDir()
    {
        std::error_code ec;
        std::filesystem::remove_all(mPath, ec);
    }

    TempDir(TempDir const&) = delete;
    TempDir& operator=(TempDir const&) = delete;

    [[nodiscard]] std::string const& path() const noexcept { return mPath; }

private:
    std::string mPath;
};

// A 4-page GPU tier over a 32-page disk tier in dir (512-byte pages).
kvcm::KVCacheManagerConfig persistentConfig(std::string const& dir, bool persistent = true)
{
    auto cfg = smallConfig(4 * 512);
    cfg.cacheTiers.push_back(kvcm::DiskCacheTierConfig(32 * 512, dir, persistent));
    return cfg;
}

// A persistent disk tier's committed blocks outlive the manager and the next
// manager on the directory reuses them; a tier that is not persistent leaves
// nothing.
TEST_F(ManagerTest, PersistentDiskTierIsReusedByTheNextManager)
{
    for (bool const persistent : {true, false})
    {
        TempDir dir;
        auto const cfg = persistentConfig(dir.path(), persistent);
        auto const first = tokenRange(100, 8);
        {
            kvcm::KVCacheManager m(cfg);
            auto stream = m.createStream();
            for (kvcm::Token i = 0; i < 8; ++i) // 2 blocks each through 4 GPU pages: the first go to disk
            {
                auto const t = tokenRange(100 + 100 * i, 8);
                auto c = m.createKVCache(t);
                c.resume(stream);
                c.resize(8, 8);
                c.commit(t, false);
            }
            stream.synchronize();
        }
        kvcm::KVCacheManager m(cfg);
        EXPECT_EQ(m.probeReuse(first), persistent ? 8 : 0) << "persistent " << persistent;
    }
}

// A persistent disk tier keeps the blocks' multimodal digest tokens: the
// next manager on the directory reuses an image prompt's blocks for the same
// item, and only the text block before it for another.
TEST_F(ManagerTest, PersistentDiskTierKeepsDigestKeyedBlocks)
{
    TempDir dir;
    auto const cfg = persistentConfig(dir.path());
    std::vector<kvcm::Token> const prompt{1, 2, 3, 4, 0, 1001, 1002, 1003, 9, 10, 11, 12};
    kvcm::DigestTokens img, other;
    img.add(4, kvcm::Digest{1, 2, 3});
    other.add(4, kvcm::Digest{9});
    {
        kvcm::KVCacheManager m(cfg);
        auto stream = m.createStream();
        {
            auto c = m.createKVCache(prompt, img);
            c.resume(stream);
            c.resize(12, 12);
            c.commit(prompt, img);
        }
        for (kvcm::Token i = 1; i < 8; ++i) // 4 GPU pages: the image prompt's blocks go to disk
        {
            auto const t = tokenRange(100 * i, 8);
            auto c = m.createKVCache(t);
            c.resume(stream);
            c.resize(8, 8);
            c.commit(t, false);
        }
        stream.synchronize();
    }
    kvcm::KVCacheManager m(cfg);
    EXPECT_EQ(m.probeReuse(prompt, img), 12);
    EXPECT_EQ(m.probeReuse(prompt, other), 4);
    auto c = m.createKVCache(prompt, img);
    EXPECT_EQ(c.reusedTokens(), 12);
    EXPECT_EQ(c.committedDigests().positions, img.positions);
}

// With partial reuse, a match ending in a partial block is usable where
// every layer group has the pages it needs at that endpoint: a window that
// moved on over the partial tokens needs no page of a block it left, though
// that page is missing at the block boundary (TensorRT-LLM's rewind
// endpoint).
TEST_F(ManagerTest, PartialMatchIsCheckedAtItsEndpoint)
{
    auto cfg = smallConfig(64 << 10);
    cfg.enablePartialReuse = true;
    cfg.layers[1].slidingWindowSize = 2;
    kvcm::KVCacheManager m(cfg);
    auto stream = m.createStream();
    auto const longer = tokenRange(0, 20);
    {
        auto a = m.createKVCache(longer);
        a.resume(stream);
        ASSERT_TRUE(a.resize(20, 20)); // history 20 at once: no window page of blocks 0-3
        a.commit(longer, false);
    }
    std::vector<kvcm::Token> const base(longer.begin(), longer.begin() + 10);
    {
        auto b = m.createKVCache(base);
        EXPECT_EQ(b.reusedTokens(), 0) << "at 8 tokens the window needs block 1's missing page";
        b.resume(stream);
        ASSERT_TRUE(b.resize(10, 10));
        b.commit(base, false);
    }
    auto rewind = base;
    rewind.push_back(99);
    EXPECT_EQ(m.probeReuse(rewind), 10);
    auto c = m.createKVCache(rewind);
    EXPECT_EQ(c.reusedTokens(), 10);
    c.resume(stream);
}

// A second live manager on a persistent disk tier's directory is refused with
// KVCM_ERR_INVALID_STATE; once the first is destroyed, it starts.
TEST_F(ManagerTest, SecondManagerOnPersistentDirIsRefused)
{
    TempDir dir;
    auto const cfg = persistentConfig(dir.path());
    {
        kvcm::KVCacheManager m(cfg);
        EXPECT_KVCM_ERROR(kvcm::KVCacheManager second(cfg), kvcm::StatusCode::kInvalidState);
        EXPECT_FALSE(kvcm::isPoisoned());
    }
    EXPECT_NO_THROW(kvcm::KVCacheManager again(cfg));
}

// persistent on a tier that is not the disk tier is rejected naming it.
TEST_F(ManagerTest, PersistentNeedsTheDiskTier)
{
    auto cfg = smallConfig(64 << 10, 64 << 10);
    cfg.cacheTiers[1].persistent = true;
    EXPECT_CONFIG_ERROR(kvcm::validateConfig(cfg), "cache_tiers[1].persistent");
    EXPECT_CONFIG_ERROR(kvcm::KVCacheManager m(cfg), "cache_tiers[1].persistent");
}

// What the C struct cannot carry as given is rejected naming the field, by
// validateConfig and the constructor alike: an explicit maxUtilForResume of 0
// (C reads 0 as unset, the default) and NUL bytes in paths and roles (where
// the C string would end). The default is 0.97 (KVCacheManagerV2's), not 0.
TEST_F(ManagerTest, ConfigValuesTheCAbiWouldChangeAreRejected)
{
    EXPECT_EQ(kvcm::KVCacheManagerConfig{}.maxUtilForResume, 0.97);

    auto cfg = smallConfig(64 << 10);
    cfg.maxUtilForResume = 0;
    EXPECT_CONFIG_ERROR(kvcm::validateConfig(cfg), "max_util_for_resume");
    EXPECT_CONFIG_ERROR(kvcm::KVCacheManager m(cfg), "max_util_for_resume");

    cfg = smallConfig(64 << 10);
    cfg.cacheTiers.push_back(kvcm::DiskCacheTierConfig(1 << 20, std::string("/tmp\0/elsewhere", 15)));
    EXPECT_CONFIG_ERROR(kvcm::validateConfig(cfg), "cache_tiers[1].path"); // not cut to "/tmp"
    EXPECT_CONFIG_ERROR(kvcm::KVCacheManager m(cfg), "cache_tiers[1].path");

    cfg = smallConfig(64 << 10);
    cfg.layers[0].buffers[1].role = std::string("value\0x", 7);
    EXPECT_CONFIG_ERROR(kvcm::validateConfig(cfg), "layers[0].buffers[1].role");
}

// The fields of ABI version 2 reach the library (a negative
// reuseMatchBackoff is refused naming it), and the per-layer-group iteration
// statistics count a request's fresh and missed blocks once the cache commits
// its pending statistics, then restart.
TEST_F(ManagerTest, Version2ConfigFieldsAndLayerGroupStats)
{
    auto cfg = smallConfig(64 << 10);
    cfg.reuseMatchBackoff = -1;
    EXPECT_CONFIG_ERROR(kvcm::validateConfig(cfg), "reuse_match_backoff");
    cfg = smallConfig(64 << 10);
    cfg.rebalanceRatioThreshold = 1.0;
    EXPECT_CONFIG_ERROR(kvcm::validateConfig(cfg), "rebalance_ratio_threshold");
    cfg = smallConfig(64 << 10);
    cfg.constraints.push_back(kvcm::BatchDesc{{{16, 0}}, -1});
    EXPECT_CONFIG_ERROR(kvcm::validateConfig(cfg), "constraints[0].system_prompt_length");

    kvcm::KVCacheManager m(smallConfig(64 << 10));
    auto stream = m.createStream();
    auto const prompt = tokenRange(100, 12);
    {
        auto c = m.createKVCache(prompt);
        c.resume(stream);
        c.resize(12, 12);
        c.commit(prompt, true);
        EXPECT_EQ(m.getAndResetLayerGroupIterationStats()[0].alloc_new_blocks, 0) << "pending until committed";
        c.commitPendingStats();
    }
    auto stats = m.getAndResetLayerGroupIterationStats();
    ASSERT_EQ(stats.size(), static_cast<size_t>(m.numLayerGroups()));
    EXPECT_EQ(stats[0].layer_group, 0);
    EXPECT_EQ(stats[0].alloc_new_blocks, 3);
    EXPECT_EQ(stats[0].missed_blocks, 3);
    EXPECT_EQ(m.getAndResetLayerGroupIterationStats()[0].alloc_new_blocks, 0);
    EXPECT_EQ(m.getAndResetIterationCachedTokensByLevel().size(), static_cast<size_t>(m.numLevels()));
    auto peaks = m.getAndResetIterationPoolGroupPeakBlockStats(kvcm::kGpuLevel);
    ASSERT_FALSE(peaks.empty());
    EXPECT_GE(peaks[0].unavailable, 3);
}

// A shared tier passes through to the library, which names its fields as
// cache_tiers[i] after the local tiers; a cluster that cannot be reached is
// no error.
TEST_F(ManagerTest, SharedTierConfigNamesTheField)
{
    auto cfg = smallConfig(64 << 10, 64 << 10);
    cfg.sharedTier = kvcm::SharedCacheTierConfig{{"127.0.0.1:7101", "127.0.0.1:7102"}, "ns", 60000};
    EXPECT_NO_THROW(kvcm::validateConfig(cfg));
    EXPECT_NO_THROW(kvcm::KVCacheManager m(cfg));

    auto const n = std::to_string(cfg.cacheTiers.size());
    auto bad = cfg;
    bad.sharedTier->ns = "a b";
    EXPECT_CONFIG_ERROR(kvcm::validateConfig(bad), "cache_tiers[" + n + "].namespace");
    bad = cfg;
    bad.sharedTier->addresses = {"127.0.0.1:1", "nohost"};
    EXPECT_CONFIG_ERROR(kvcm::validateConfig(bad), "cache_tiers[" + n + "].addresses[1]");
    bad = cfg;
    bad.sharedTier->addresses = {"a:1,b:2"};
    EXPECT_CONFIG_ERROR(kvcm::validateConfig(bad), "cache_tiers[" + n + "].addresses[0]");
    bad = cfg;
    bad.sharedTier->ttlMs = -1;
    EXPECT_CONFIG_ERROR(kvcm::validateConfig(bad), "cache_tiers[" + n + "].ttl");
    bad = cfg;
    bad.sharedTier->writePolicy = static_cast<kvcm::SharedWritePolicy>(9);
    EXPECT_CONFIG_ERROR(kvcm::validateConfig(bad), "cache_tiers[" + n + "].write_policy");
}

TEST_F(ManagerTest, StatsEventsAndPeaks)
{
    auto cfg = smallConfig(64 << 10);
    cfg.enableStats = true;
    kvcm::KVCacheManager m(cfg);
    auto stream = m.createStream();
    auto const prompt = tokenRange(100, 12);
    {
        auto c = m.createKVCache(prompt);
        c.resume(stream);
        c.resize(12, 12);
        c.commit(prompt, true);
    }
    auto s = m.stats();
    EXPECT_EQ(s.alloc_new_blocks, 3);
    EXPECT_EQ(s.missed_blocks, 3);
    EXPECT_EQ(s.reused_blocks, 0);

    auto events = m.drainEvents();
    ASSERT_EQ(events.size(), 3u);
    for (size_t i = 0; i < events.size(); ++i)
    {
        EXPECT_EQ(events[i].kind, kvcm::EventKind::kBlockStored);
        EXPECT_EQ(events[i].seq, i + 1);
        EXPECT_EQ(events[i].tokens, std::vector<kvcm::Token>(prompt.begin() + 4 * i, prompt.begin() + 4 * i + 4));
        if (i > 0)
        {
            EXPECT_EQ(events[i].parent, events[i - 1].key);
        }
    }
    EXPECT_TRUE(m.drainEvents().empty());

    {
        auto p2 = prompt;
        p2.push_back(1);
        auto c = m.createKVCache(p2);
        EXPECT_EQ(c.reusedTokens(), 12);
    }
    auto it = m.getAndResetIterationStats();
    EXPECT_EQ(it.reused_blocks, 3);
    EXPECT_EQ(it.alloc_new_blocks, 3);
    EXPECT_GT(it.hit_rate, 0.0);
    EXPECT_EQ(m.getAndResetIterationStats().reused_blocks, 0);

    auto peaks = m.getAndResetIterationPeakBlockStats(0);
    ASSERT_EQ(peaks.size(), 1u);
    EXPECT_GE(peaks[0].peak_used, 3);
    EXPECT_EQ(peaks[0].total, 128);

    auto mig = m.migrationStats();
    EXPECT_EQ(mig.size(), 8u);
    for (size_t i = 0; i < mig.size(); ++i)
    {
        EXPECT_EQ(mig[i].path, static_cast<kvcm_migration_path>(i));
    }
}

// Block events carry priorities: stored blocks at the default priority; a
// later block committed with a higher one raises its ancestors, reported as
// priority updates that drainEvents skips.
TEST_F(ManagerTest, BlockEventsCarryPriorities)
{
    auto cfg = smallConfig(64 << 10);
    cfg.eventQueueCapacity = 64;
    kvcm::KVCacheManager m(cfg);
    auto stream = m.createStream();
    auto const prompt = tokenRange(100, 12);
    {
        auto c = m.createKVCache(prompt.data(), 8);
        c.resume(stream);
        c.resize(8, 8);
        c.commit(prompt.data(), 8);
    }
    auto stored = m.drainBlockEvents();
    ASSERT_EQ(stored.size(), 2u);
    for (auto const& e : stored)
    {
        EXPECT_EQ(e.kind, kvcm::EventKind::kBlockStored);
        EXPECT_EQ(e.priority, 35) << "the default priority";
        EXPECT_EQ(e.oldPriority, 35);
        EXPECT_EQ(e.tokens.size(), 4u);
    }
    EXPECT_EQ(stored[1].parent, stored[0].key);
    {
        auto c = m.createKVCache(prompt, {}, [](int64_t, kvcm::LayerGroupId) { return 90; });
        c.resume(stream);
        c.resize(12, 12);
        c.commit(prompt.data() + 8, 4);
    }
    auto raised = m.drainBlockEvents();
    std::vector<kvcm::EventKind> kinds;
    for (auto const& e : raised)
    {
        kinds.push_back(e.kind);
        if (e.kind == kvcm::EventKind::kBlockPriorityUpdated)
        {
            EXPECT_EQ(e.oldPriority, 35);
            EXPECT_EQ(e.priority, 90);
        }
    }
    EXPECT_EQ(kinds,
        (std::vector<kvcm::EventKind>{kvcm::EventKind::kBlockPriorityUpdated, kvcm::EventKind::kBlockPriorityUpdated,
            kvcm::EventKind::kBlockStored}))
        << "both ancestors raised, then the new block stored";
    EXPECT_EQ(raised.back().priority, 90);
    EXPECT_EQ(raised.back().tokens, std::vector<kvcm::Token>(prompt.begin() + 8, prompt.end()));
    EXPECT_TRUE(m.drainEvents().empty()) << "both drains take from the one queue";
}

TEST_F(ManagerTest, QuotaAndResizeLevel)
{
    auto cfg = smallConfig(32 << 10, 32 << 10);
    cfg.cacheTiers[0].maxQuota = 64 << 10;
    kvcm::KVCacheManager m(cfg);
    EXPECT_EQ(m.numLevels(), 2);
    EXPECT_EQ(m.quota(0), 32 << 10);
    EXPECT_EQ(m.quota(1), 32 << 10);
    auto const base = m.poolGroupDescs()[0].pools[0].base;
    EXPECT_EQ(m.storageStats(0)[0].total, 64);

    m.resizeLevel(0, 64 << 10);
    EXPECT_EQ(m.quota(0), 64 << 10);
    EXPECT_EQ(m.storageStats(0)[0].total, 128);
    m.resizeLevel(0, 16 << 10);
    EXPECT_EQ(m.storageStats(0)[0].total, 32);
    EXPECT_EQ(m.poolGroupDescs()[0].pools[0].base, base); // base addresses never move
    EXPECT_KVCM_ERROR(m.resizeLevel(0, 128 << 10), kvcm::StatusCode::kInvalidArgument); // beyond max_quota

    m.resizeLevel(1, 8 << 10);
    EXPECT_EQ(m.quota(1), 8 << 10);
    auto const cold = m.poolGroupDescs(1);
    ASSERT_EQ(cold.size(), 1u);
    EXPECT_EQ(cold[0].pools[0].base, 0u); // cold storage is never exposed
}

TEST_F(ManagerTest, PriorityCallback)
{
    kvcm::KVCacheManager m(smallConfig(64 << 10));
    auto stream = m.createStream();
    std::vector<int64_t> asked;
    {
        auto const t = tokenRange(0, 12);
        auto c = m.createKVCache(t, {}, [&](int64_t block, kvcm::LayerGroupId layerGroup) {
            asked.push_back(block * 10 + layerGroup);
            return kvcm::kMaxPriority;
        });
        kvcm::KVCache moved = std::move(c); // the callback survives moves
        moved.resume(stream);
        moved.resize(12, 12);
        moved.commit(t, true);
    }
    // Once per layer group of every block: KVCacheManagerV2's (block_ordinal, life_cycle).
    EXPECT_EQ(asked, (std::vector<int64_t>{0, 10, 20}));
}

// A priority callback that throws fails the resize that allocates the pages
// (it is asked as they are allocated, as in KVCacheManagerV2), which changes
// nothing; the retry succeeds once the callback does.
TEST_F(ManagerTest, ThrowingPriorityCallbackChangesNothing)
{
    kvcm::KVCacheManager m(smallConfig(64 << 10));
    auto stream = m.createStream();
    bool fail = true;
    auto const t = tokenRange(0, 12);
    auto c = m.createKVCache(t, {}, [&](int64_t, kvcm::LayerGroupId) -> int32_t {
        if (fail)
        {
            throw std::runtime_error("no priority");
        }
        return kvcm::kMaxPriority;
    });
    c.resume(stream);
    EXPECT_KVCM_ERROR(c.resize(12, 12), kvcm::StatusCode::kInvalidArgument);
    EXPECT_EQ(c.capacity(), 0);
    fail = false;
    c.resize(12, 12);
    c.commit(t);
    EXPECT_EQ(c.numCommittedTokens(), 12);
}

TEST_F(ManagerTest, ReuseScopes)
{
    kvcm::KVCacheManager m(smallConfig(64 << 10));
    auto stream = m.createStream();
    auto const t = tokenRange(0, 9);
    kvcm::ReuseScope const tenant{7, std::string("ten\0ant", 7)};
    {
        auto c = m.createKVCache(t, tenant);
        c.resume(stream);
        c.resize(9, 8);
        c.commit(t.data(), 8);
    }
    EXPECT_EQ(m.probeReuse(t, tenant), 8);
    EXPECT_EQ(m.probeReuse(t), 0);
    EXPECT_EQ(m.probeReuse(t, {7, "ten"}), 0); // the salt may hold NULs
    EXPECT_EQ(m.probeReuse(t, {8, std::string("ten\0ant", 7)}), 0);
}

// blockKey = kXxh3 reuses prefixes as the default SHA-256 key does, under
// other keys; an unknown value is a config error naming block_key.
TEST_F(ManagerTest, Xxh3BlockKeyReusesPrefixesUnderOtherKeys)
{
    EXPECT_EQ(kvcm::KVCacheManagerConfig{}.blockKey, kvcm::BlockKey::kSha256);
    auto const prompt = tokenRange(100, 13);
    auto storedKeys = [&](kvcm::BlockKey key) {
        auto cfg = smallConfig(64 << 10);
        cfg.blockKey = key;
        kvcm::KVCacheManager m(cfg);
        auto stream = m.createStream();
        {
            auto c = m.createKVCache(prompt);
            c.resume(stream);
            c.resize(13, 13);
            c.commit(prompt, true);
        }
        EXPECT_EQ(m.probeReuse(prompt), 12);
        std::vector<uint64_t> keys;
        for (auto const& e : m.drainEvents())
        {
            if (e.kind == kvcm::EventKind::kBlockStored)
            {
                keys.push_back(e.key);
            }
        }
        return keys;
    };
    auto const xxh3 = storedKeys(kvcm::BlockKey::kXxh3);
    auto const sha = storedKeys(kvcm::BlockKey::kSha256);
    EXPECT_EQ(xxh3.size(), 3u);
    EXPECT_EQ(sha.size(), 3u);
    EXPECT_NE(xxh3, sha);

    auto cfg = smallConfig(64 << 10);
    cfg.blockKey = static_cast<kvcm::BlockKey>(2);
    EXPECT_CONFIG_ERROR(kvcm::validateConfig(cfg), "block_key");
}

// KVCacheManagerV2's rules through the C++ API: a prompt cached whole is
// reused whole, LoRA adapter 0 is a scope of its own, resize and resume answer
// false when out of pages, commit advances the history, shutdown refuses open
// caches.
TEST_F(ManagerTest, TrtllmReuseCommitAndLifecycle)
{
    kvcm::KVCacheManager m(smallConfig(64 << 10));
    auto stream = m.createStream();
    auto const t = tokenRange(0, 8);
    kvcm::ReuseScope const lora0{0, {}};
    {
        auto c = m.createKVCache(t, lora0);
        c.setStream(stream);
        EXPECT_TRUE(c.resume());
        EXPECT_FALSE(c.resize(1 << 20));
        EXPECT_TRUE(c.resize(8));
        c.commit(t);
        EXPECT_EQ(c.historyLength(), 8);
        EXPECT_EQ(c.committedTokens(), t);
        EXPECT_EQ(m.numOpenCaches(), 1u);
        EXPECT_KVCM_ERROR(m.clearReusableBlocks(), kvcm::StatusCode::kInvalidState);
    }
    EXPECT_EQ(m.probeReuse(t, lora0), 8);
    EXPECT_EQ(m.probeReuse(t), 0);
    EXPECT_FALSE(m.probeFirstNewBlockKey(t, lora0).has_value());
    EXPECT_TRUE(m.probeFirstNewBlockKey(tokenRange(0, 12), lora0).has_value());
    auto open = m.createKVCache(t, lora0);
    EXPECT_EQ(open.reusedTokens(), 8);
    EXPECT_KVCM_ERROR(m.shutdown(), kvcm::StatusCode::kInvalidState);
    open.close();
    m.clearReusableBlocks();
    EXPECT_EQ(m.probeReuse(t, lora0), 0);
    m.shutdown();
    EXPECT_FALSE(m);
}

// Beam search: forked beams read the prompt (the diverging partial block is
// copied), write their own KV, take over another beam's history at commit,
// and a committed block is published once; a refused call changes nothing.
TEST_F(ManagerTest, BeamSearchKeepsEveryBeamsKv)
{
    auto const cfg = smallConfig(64 << 10);
    kvcm::KVCacheManager m(cfg);
    auto stream = m.createStream();
    KvWriter writer(m, cfg, stream, /*seed=*/21);
    auto const prompt = tokenRange(100, 10); // tpb 4: two full blocks and 2 tokens
    auto c = m.createKVCache(prompt);
    EXPECT_EQ(c.beamWidth(), 1);
    EXPECT_KVCM_ERROR(c.setBeamWidth(2), kvcm::StatusCode::kInvalidState);
    c.resume(stream);
    ASSERT_TRUE(c.resize(10, 0));
    writer.write(c, prompt, 0, 10);
    c.commit(prompt);

    ASSERT_TRUE(c.setBeamWidth(3));
    EXPECT_EQ(c.beamWidth(), 3);
    EXPECT_KVCM_ERROR(c.setBeamWidth(0), kvcm::StatusCode::kInvalidArgument);
    EXPECT_KVCM_ERROR(c.setBeamWidth(kvcm::kMaxBeamWidth + 1), kvcm::StatusCode::kInvalidArgument);
    EXPECT_KVCM_ERROR((void)c.basePageIndices(0, 3), kvcm::StatusCode::kInvalidArgument);
    EXPECT_EQ(c.basePageIndices(0), c.basePageIndices(0, kvcm::kDefaultBeamIndex));
    std::vector<std::vector<kvcm::Token>> hyps(3, prompt);
    for (int32_t k = 0; k < 3; ++k)
    {
        auto const idx = c.basePageIndices(0, k);
        EXPECT_EQ(idx[0], c.basePageIndices(0)[0]) << "beam " << k << " shares the prefix";
        if (k > 0)
        {
            EXPECT_NE(idx[2], c.basePageIndices(0)[2]) << "beam " << k << " has its own diverging block";
        }
        EXPECT_EQ(writer.verify(c, hyps[k], 0, 10, k).mismatches, 0) << "beam " << k;
        // The caller-buffer form writes the same indices, and refuses a
        // buffer too small for them.
        int32_t buf[8] = {};
        ASSERT_EQ(c.basePageIndices(0, k, buf, 8), idx.size()) << "beam " << k;
        EXPECT_EQ(std::vector<int32_t>(buf, buf + idx.size()), idx) << "beam " << k;
        EXPECT_KVCM_ERROR(c.basePageIndices(0, k, buf, idx.size() - 1), kvcm::StatusCode::kBufferTooSmall);
    }
    EXPECT_KVCM_ERROR(c.basePageIndices(0, 3, static_cast<int32_t*>(nullptr), 0), kvcm::StatusCode::kInvalidArgument);
    // Two decode steps, a token of its own in every beam.
    for (int64_t pos = 10; pos < 12; ++pos)
    {
        ASSERT_TRUE(c.resize(pos + 1));
        for (int32_t k = 0; k < 3; ++k)
        {
            hyps[k].push_back(static_cast<kvcm::Token>(1000 + 10 * k + pos));
            writer.write(c, hyps[k], pos, pos + 1, k);
        }
        ASSERT_TRUE(c.resize(pos + 1, pos + 1));
    }
    EXPECT_KVCM_ERROR(c.commit({}, std::vector<int32_t>{0, 1}), kvcm::StatusCode::kInvalidArgument);
    EXPECT_EQ(c.beamWidth(), 3);

    // Beam 2's hypothesis won: every beam takes it over, and its two
    // decoded tokens complete block 2, committed once from beam 0.
    std::vector<kvcm::Token> const won = hyps[2];
    c.commit(std::vector<kvcm::Token>(won.begin() + 10, won.end()), std::vector<int32_t>{2, 2, 2});
    EXPECT_EQ(c.numCommittedTokens(), 12);
    for (int32_t k = 0; k < 3; ++k)
    {
        EXPECT_EQ(c.basePageIndices(0, k)[2], c.basePageIndices(0)[2]) << "block 2 committed: one page";
        EXPECT_EQ(writer.verify(c, won, 0, 12, k).mismatches, 0) << "beam " << k;
    }
    ASSERT_TRUE(c.setBeamWidth(1));
    c.close();
    EXPECT_EQ(m.probeReuse(won), 12);
}

TEST_F(ManagerTest, StreamHelper)
{
    kvcm::KVCacheManager m(smallConfig(64 << 10));
    auto s = m.createStream();
    EXPECT_TRUE(s);
    EXPECT_NE(s.cudaStream(), nullptr);
    EXPECT_EQ(kvcm::StreamView(s.cudaStream()).handle(), s.handle());

    auto a = m.allocMemory(kvcm::MemoryKind::kHostMapped, 4096);
    auto d = m.allocMemory(kvcm::MemoryKind::kDevice, 4096);
    auto b = m.allocMemory(kvcm::MemoryKind::kHostMapped, 4096);
    ASSERT_NE(a.hostData(), nullptr);
    EXPECT_EQ(d.hostData(), nullptr);
    std::memset(a.hostData(), 0xab, 4096);

    // Host functions run in stream order, after the copies enqueued before them.
    std::vector<int> order;
    s.batchCopy({{d.ptr(), a.ptr(), 4096}});
    s.enqueueHostFunc([&] { order.push_back(1); });
    s.batchCopy({{b.ptr(), d.ptr(), 4096}});
    s.enqueueHostFunc([&, p = static_cast<uint8_t*>(b.hostData())] {
        order.push_back(p[4095] == 0xab ? 2 : -2);
        return true;
    });
    uint8_t const pattern[3] = {1, 2, 3};
    s.copyFromHost(b.ptr() + 8, pattern, 3); // pageable source, consumed now
    s.synchronize();
    EXPECT_EQ(order, (std::vector<int>{1, 2}));
    EXPECT_EQ(static_cast<uint8_t*>(b.hostData())[9], 2);

    // A failing host function is an asynchronous failure of the stream.
    s.enqueueHostFunc([] { return 5; });
    EXPECT_KVCM_ERROR(s.synchronize(), kvcm::StatusCode::kDevice);
    s.enqueueHostFunc([]() -> void { throw std::runtime_error("boom"); });
    EXPECT_KVCM_ERROR(s.synchronize(), kvcm::StatusCode::kDevice);
    s.synchronize(); // the next interval is clean

    // A copy outside any allocation is refused synchronously.
    EXPECT_KVCM_ERROR(s.batchCopy({{a.ptr(), 0x10, 16}}), kvcm::StatusCode::kDevice);
    EXPECT_TRUE(s.tryBatchCopy(nullptr, 0)); // an empty batch is a no-op
    // On the emulated device, which knows every allocation, so is one near
    // the top of the address space, whose offset from the highest allocation
    // is beyond 2^63, and nothing is written. (CUDA reads a wild address as
    // the driver does: the caller's fault, as with cuMemcpyBatchAsync.)
    if (kvcm_test::testDevice() == kvcm::DeviceKind::kEmu) {
        kvcm::DevicePtr const top = ~kvcm::DevicePtr{0} - 4;
        EXPECT_KVCM_ERROR(s.batchCopy({{top, a.ptr(), 1}}), kvcm::StatusCode::kDevice);
        EXPECT_KVCM_ERROR(s.batchCopy({{a.ptr(), top, 1}}), kvcm::StatusCode::kDevice);
        EXPECT_KVCM_ERROR(s.copyFromHost(top, pattern, 1), kvcm::StatusCode::kDevice);
    }
    s.synchronize();
    EXPECT_EQ(static_cast<uint8_t*>(a.hostData())[0], 0xab);

    a.free();
    EXPECT_EQ(a.ptr(), 0u);
    s.destroy();
    EXPECT_FALSE(s);
}

// Destroying a stream an ACTIVE cache uses throws kInvalidState naming the
// cache; the stream stays alive and owned until the cache is suspended.
TEST_F(ManagerTest, StreamInUseIsNotDestroyed)
{
    kvcm::KVCacheManager m(smallConfig(64 << 10));
    auto s = m.createStream();
    auto c = m.createKVCache(tokenRange(0, 8));
    c.resume(s);
    try
    {
        s.destroy();
        FAIL() << "destroy succeeded under an ACTIVE cache";
    }
    catch (kvcm::Error const& e)
    {
        EXPECT_EQ(e.code(), kvcm::StatusCode::kInvalidState);
        EXPECT_NE(std::string(e.what()).find("ACTIVE cache " + std::to_string(c.id())), std::string::npos) << e.what();
    }
    EXPECT_TRUE(s);
    s.synchronize();
    c.suspend();
    s.destroy();
    EXPECT_FALSE(s);
}

TEST_F(ManagerTest, ManagerMoveAndExplicitDestroy)
{
    kvcm::KVCacheManager m(smallConfig(64 << 10));
    kvcm::KVCacheManager m2 = std::move(m);
    EXPECT_FALSE(m); // NOLINT(bugprone-use-after-move)
    EXPECT_TRUE(m2);
    EXPECT_EQ(m2.tokensPerBlock(), 4);
    m2.destroy();
    EXPECT_FALSE(m2);
    EXPECT_KVCM_ERROR((void)m2.tokensPerBlock(), kvcm::StatusCode::kInvalidHandle);
}

TEST_F(ManagerTest, ConcurrentCachesFromThreads)
{
    kvcm::KVCacheManager m(smallConfig(256 << 10));
    std::vector<std::thread> threads;
    std::atomic<int> failures{0};
    std::mutex mu;
    std::string firstError;
    for (int t = 0; t < 4; ++t)
    {
        threads.emplace_back(
            [&, t]
            {
                try
                {
                    auto s = m.createStream();
                    for (int i = 0; i < 20; ++i)
                    {
                        auto const toks = tokenRange(t * 1000 + (i % 3) * 100, 13);
                        auto c = m.createKVCache(toks);
                        c.resume(s);
                        c.resize(13, 13);
                        auto const done = static_cast<size_t>(c.numCommittedTokens()); // the reused prefix
                        c.commit(toks.data() + done, toks.size() - done);
                    }
                }
                catch (std::exception const& e)
                {
                    std::lock_guard<std::mutex> lock(mu);
                    if (failures++ == 0)
                    {
                        firstError = e.what();
                    }
                }
            });
    }
    for (auto& th : threads)
    {
        th.join();
    }
    EXPECT_EQ(failures, 0) << firstError;
}

// A callable whose copy and move constructors throw (as copying a lambda that
// captures a std::string or std::vector by value may throw std::bad_alloc).
struct ThrowingCopy
{
    std::atomic<int>* runs = nullptr;
    explicit ThrowingCopy(std::atomic<int>* r) : runs(r) {}
    ThrowingCopy(ThrowingCopy const&) { throw std::runtime_error("copy failed"); }
    ThrowingCopy(ThrowingCopy&& o) noexcept(false) : runs(o.runs) { throw std::runtime_error("move failed"); }
    ThrowingCopy& operator=(ThrowingCopy const&) = delete;
    void operator()() const { runs->fetch_add(1); }
};

// StreamView::tryEnqueueHostFunc is noexcept and reports every failure by
// returning false, a callable that cannot be copied too: it returns false, the
// callable never runs and the process goes on. Run in a re-executed child, as
// a failure terminates the process.
TEST(StreamDeathTest, TryEnqueueHostFuncReturnsFalseWhenTheCallableCannotBeCopied)
{
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    EXPECT_EXIT(
        {
            int rc = 0;
            {
                kvcm::KVCacheManager m(smallConfig(64 << 10));
                auto s = m.createStream();
                std::atomic<int> runs{0};
                ThrowingCopy f(&runs);
                bool const ok = s.tryEnqueueHostFunc(f); // lvalue: copied
                s.synchronize();
                if (ok || runs.load() != 0)
                {
                    rc = 1;
                }
            }
            std::_Exit(rc);
        },
        ::testing::ExitedWithCode(0), "");
}

// A Go panic inside the library becomes kvcm::Error(kInternal) and poisons it:
// every later call fails fast with kPoisoned. Run in a child process (a
// re-executed copy of this binary, never a bare fork of a process that loaded
// the Go runtime) since it poisons the library for good; under the ASan
// build this also proves the Go runtime's panic path works there.
TEST(PanicDeathTest, PanicPoisonsLibrary)
{
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    // Read by the Go runtime when the child loads the library.
    setenv("KVCM_ENABLE_DEBUG_PANIC", "1", 1);
    EXPECT_EXIT(
        {
            int rc = 0;
            try
            {
                kvcm::detail::check(kvcm_debug_panic("deliberate"));
                rc = 1; // did not throw
            }
            catch (kvcm::Error const& e)
            {
                if (e.code() != kvcm::StatusCode::kInternal || e.message().find("deliberate") == std::string::npos)
                {
                    rc = 2;
                }
            }
            if (rc == 0 && !kvcm::isPoisoned())
            {
                rc = 3;
            }
            if (rc == 0)
            {
                try
                {
                    kvcm::KVCacheManager m(smallConfig(16 << 10));
                    rc = 4;
                }
                catch (kvcm::Error const& e)
                {
                    rc = e.code() == kvcm::StatusCode::kPoisoned ? 0 : 5;
                }
            }
            std::fprintf(stderr, "child done rc=%d\n", rc);
            std::_Exit(rc);
        },
        ::testing::ExitedWithCode(0), "child done rc=0");
    unsetenv("KVCM_ENABLE_DEBUG_PANIC");
    EXPECT_FALSE(kvcm::isPoisoned()); // this process is untouched
}

} // namespace

// probeReusePages: per block of a content match, the page covering the most of
// it; a partial block committed beside a longer one covers its own tokens,
// and the match may end inside a block only with partial.
TEST_F(ManagerTest, ProbeReusePagesCoverBlocksWithTheWidestPage)
{
    auto cfg = smallConfig(64 << 10);
    cfg.enablePartialReuse = true;
    kvcm::KVCacheManager m(cfg);
    auto stream = m.createStream();
    auto serve = [&](std::vector<kvcm::Token> const& t)
    {
        auto c = m.createKVCache(t);
        c.setStream(stream);
        EXPECT_TRUE(c.resume());
        EXPECT_TRUE(c.resize(static_cast<int64_t>(t.size())));
        c.commit(std::vector<kvcm::Token>(t.begin() + c.numCommittedTokens(), t.end()));
    };
    auto base = tokenRange(0, 10);
    serve(base);
    auto longer = base;
    longer.push_back(500);
    serve(longer);
    auto rewind = base;
    rewind.push_back(999);
    auto const pages = m.probeReusePages(rewind, 0, true);
    ASSERT_EQ(pages.size(), 3u);
    EXPECT_EQ(pages[0].matched, 4);
    EXPECT_EQ(pages[0].covered, 4);
    EXPECT_EQ(pages[2].matched, 2);
    EXPECT_EQ(pages[2].covered, 3) << "the longer partial block's page";
    EXPECT_EQ(pages[2].level, 0);
    EXPECT_EQ(m.probeReusePages(rewind, 0, false).size(), 3u) << "the 2-token block is held whole";
    EXPECT_EQ(m.probeReusePages(tokenRange(0, 9), 0, false).size(), 2u);
    EXPECT_KVCM_ERROR((void)m.probeReusePages(rewind, 7, true), kvcm::StatusCode::kInvalidArgument);
}
