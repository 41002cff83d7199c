// SWA scratch reuse, planned drops and pool rebalancing through the C++ API
// (issue 13 items 4 and 6).
#include "test_support.hpp"

#include <set>

using namespace kvcm_test;

namespace {

// Full attention (layer 0, layer group 0) and an 8-token window over four
// layers (layer group 1): a scratch slot holds four blocks of one layer.
kvcm::KVCacheManagerConfig scratchConfig()
{
    kvcm::KVCacheManagerConfig cfg = smallConfig(256 << 10);
    cfg.layers.resize(1);
    for (int32_t layer = 1; layer <= 4; ++layer)
    {
        cfg.layers.push_back(kvcm::AttentionLayerConfig{layer, {{"key", 128}, {"value", 128}}, 8, 0});
    }
    cfg.swaScratchReuse = kvcm::SwaScratchReuseConfig{0};
    return cfg;
}

// A prefill's blocks out of the window by the end of the step have no page
// and share scratch slots; committing the step releases them.
TEST(ScratchTest, PrefillBlocksOutOfTheWindowUseScratchSlots)
{
    kvcm::KVCacheManager m(scratchConfig());
    auto stream = m.createStream();
    auto const prompt = tokenRange(0, 64);
    kvcm::KVCache c = m.createKVCache(prompt);
    EXPECT_TRUE(c.swaScratchReuse());
    c.resume(stream);
    ASSERT_TRUE(c.resize(64));
    kvcm::ScratchDesc const d = c.scratchDesc(1);
    ASSERT_TRUE(d);
    EXPECT_EQ(d.begin, 0);
    EXPECT_EQ(d.end, 14);
    EXPECT_EQ(d.slots.size(), 4u);
    EXPECT_TRUE(c.hasScratchSlots());
    EXPECT_FALSE(c.scratchDesc(0)) << "full attention never uses scratch";
    auto const idx = c.basePageIndices(1);
    for (size_t b = 0; b < idx.size(); ++b)
    {
        EXPECT_EQ(b >= 14, idx[b] != kvcm::kBadPageIndex) << "block " << b;
    }
    for (int32_t layer = 1; layer <= 4; ++layer)
    {
        std::set<int64_t> seen;
        for (std::string role : {"key", "value"})
        {
            auto const loc = m.bufferLocation(layer, role);
            int64_t const ppb = m.scratchPagesPerBlock(layer, role);
            EXPECT_EQ(ppb, 2);
            for (int64_t b = d.begin; b < d.end; ++b)
            {
                int64_t const i = kvcm::scratchPageIndex(loc, ppb, d, b);
                EXPECT_TRUE(seen.insert(i).second) << "layer " << layer << " " << role << " block " << b;
            }
        }
    }
    EXPECT_KVCM_ERROR(c.setSwaScratchReuse(false), kvcm::StatusCode::kInvalidState);
    c.commit(prompt);
    EXPECT_FALSE(c.hasScratchSlots());
    EXPECT_FALSE(c.scratchDesc(1));
    c.setSwaScratchReuse(false);
    EXPECT_FALSE(c.swaScratchReuse());
}

// A planned drop drops the turn's window pages once; a second drop throws.
TEST(ScratchTest, PlannedDropDropsTheTurnsWindowOnce)
{
    auto cfg = smallConfig(64 << 10);
    cfg.layers[1].slidingWindowSize = 8;
    kvcm::KVCacheManager m(cfg);
    auto stream = m.createStream();
    auto const tokens = tokenRange(0, 24);
    kvcm::PlannedDrop plan;
    {
        kvcm::KVCache c = m.createKVCache(tokens);
        c.resume(stream);
        ASSERT_TRUE(c.resize(24));
        EXPECT_KVCM_ERROR((void)c.planCommittedBlockDrop(), kvcm::StatusCode::kInvalidState);
        c.commit(tokens);
        c.stopCommitting();
        plan = c.planCommittedBlockDrop();
        ASSERT_TRUE(plan);
    }
    EXPECT_EQ(m.probeReuse(tokens), 24);
    plan.drop();
    EXPECT_EQ(m.probeReuse(tokens), 16) << "the window's pages are dropped";
    EXPECT_KVCM_ERROR(plan.drop(), kvcm::StatusCode::kInvalidState);
}

// Closed caches sample request lengths; adjust() rebalances the GPU pool
// groups to the demand within the quota.
TEST(ScratchTest, AdjustRebalancesPoolGroupsToTheSampledDemand)
{
    auto cfg = smallConfig(64 << 10);
    cfg.cacheTiers[0] = kvcm::GpuCacheTierConfig(64 << 10, 256 << 10);
    cfg.layers[1] = kvcm::AttentionLayerConfig{1, {{"key", 32}}, 64, 0};
    cfg.rebalanceMinSampledKvCaches = 2;
    cfg.rebalanceCooldownSecs = 0;
    cfg.rebalanceTargetRatioUpdateInterval = 1;
    kvcm::KVCacheManager m(cfg);
    auto stream = m.createStream();
    auto const before = m.storageStats(0);
    ASSERT_EQ(before.size(), 2u);
    EXPECT_FALSE(m.needAdjustment());
    for (int i = 0; i < 4; ++i)
    {
        kvcm::KVCache c = m.createKVCache(std::vector<kvcm::Token>{});
        c.resume(stream);
        ASSERT_TRUE(c.resize(800, 800));
    }
    EXPECT_TRUE(m.needAdjustment());
    m.adjust();
    auto const after = m.storageStats(0);
    EXPECT_GT(after[0].total, before[0].total);
    EXPECT_LT(after[1].total, before[1].total);
    EXPECT_FALSE(m.needAdjustment());
}

// The clamped length is the longest that fits next to batchSize - 1
// one-token requests: it can be allocated, one block more cannot.
TEST(ScratchTest, ClampedSequenceLengthFitsAndOneBlockMoreDoesNot)
{
    kvcm::KVCacheManagerConfig cfg = smallConfig(16 << 10);
    cfg.maxUtilForResume = 1.0;
    kvcm::KVCacheManager m(cfg);
    auto stream = m.createStream();
    int64_t const n = m.clampMaxSeqLenForMem(1, 1 << 20);
    ASSERT_GT(n, 0);
    EXPECT_EQ(m.clampMaxSeqLenForMem(1, 5), 5);
    EXPECT_KVCM_ERROR((void)m.clampMaxSeqLenForMem(0, 5), kvcm::StatusCode::kInvalidArgument);
    kvcm::KVCache c = m.createKVCache(std::vector<kvcm::Token>{});
    c.resume(stream);
    EXPECT_TRUE(c.resize(n, n));
    EXPECT_FALSE(c.resize(n + 4, n + 4));
}

} // namespace
