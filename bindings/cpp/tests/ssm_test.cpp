// SSM layers: one state per request in a layer group of its own, snapshots
// where a commit ends on a block boundary and at a partial last block
// published at close, reuse ending at the last snapshot, the snapshot lookup
// statistics and the SSM slot cap.
#include "test_support.hpp"

using namespace kvcm_test;

namespace {

kvcm::KVCacheManagerConfig ssmConfig()
{
    auto cfg = smallConfig(64 << 10);
    cfg.ssmLayers.push_back(kvcm::SsmLayerConfig{2, {{"ssm_state", 256}, {"conv_state", 64}}});
    cfg.commitMinSnapshot = true;
    return cfg;
}

class SsmTest : public ::testing::Test
{
protected:
    void TearDown() override { EXPECT_EQ(kvcm::liveHandleCount(), mHandlesBefore); }

    uint64_t mHandlesBefore = kvcm::liveHandleCount();
};

// SSM layers need commitMinSnapshot: the error names the field.
TEST_F(SsmTest, SsmLayersNeedCommitMinSnapshot)
{
    auto cfg = ssmConfig();
    cfg.commitMinSnapshot = false;
    try
    {
        kvcm::KVCacheManager m(cfg);
        FAIL() << "created without commit_min_snapshot";
    }
    catch (kvcm::Error const& e)
    {
        EXPECT_EQ(e.code(), kvcm::StatusCode::kInvalidConfig);
        EXPECT_NE(std::string(e.what()).find("commit_min_snapshot"), std::string::npos) << e.what();
    }
}

// An ACTIVE cache has one SSM state in the last layer group; a later prompt
// reuses up to the last snapshot and counts one hit.
TEST_F(SsmTest, StateSnapshotReuseAndStats)
{
    kvcm::KVCacheManager m(ssmConfig());
    ASSERT_EQ(m.numLayerGroups(), 2);
    kvcm::LayerGroupId const ssm = m.layerGroupOf(2);
    EXPECT_EQ(ssm, 1);
    auto stream = m.createStream();
    auto const prompt = tokenRange(0, 16);
    {
        kvcm::KVCache a = m.createKVCache(prompt);
        EXPECT_TRUE(m.getAndResetSsmSnapshotIterationStats().empty()) << "the lookup is pending in the cache";
        a.commitPendingStats();
        a.resume(stream);
        a.resize(12, 0);
        EXPECT_NE(a.ssmBlockBaseIndex(ssm), kvcm::kBadPageIndex);
        EXPECT_EQ(a.ssmBlockBaseIndex(0), kvcm::kBadPageIndex);
        for (int32_t i : a.basePageIndices(ssm))
        {
            EXPECT_EQ(i, kvcm::kBadPageIndex) << "no page per block";
        }
        a.commit(prompt.data(), 8); // ends on a block boundary: a snapshot at 8
        a.commit(prompt.data() + 8, 2);
    }
    auto first = m.getAndResetSsmSnapshotIterationStats();
    ASSERT_EQ(first.size(), 1u);
    EXPECT_EQ(first[0].snapshot_misses, 1);
    {
        kvcm::KVCache b = m.createKVCache(prompt);
        EXPECT_EQ(b.reusedTokens(), 8);
        auto const diag = b.reuseDiagnostics();
        EXPECT_EQ(diag.content_tokens, 8) << "the 10-token commit stored two full blocks";
        EXPECT_EQ(diag.attention_tokens, 8);
        b.resume(stream);
        EXPECT_NE(b.ssmBlockBaseIndex(ssm), kvcm::kBadPageIndex);
        b.commitPendingStats();
    }
    auto got = m.getAndResetSsmSnapshotIterationStats();
    ASSERT_EQ(got.size(), 1u);
    EXPECT_EQ(got[0].layer_group, ssm);
    EXPECT_EQ(got[0].snapshot_lookups, 1);
    EXPECT_EQ(got[0].snapshot_hits, 1);
    EXPECT_EQ(got[0].reused_tokens, 8);
    EXPECT_EQ(got[0].unreused_tokens, 8);
    EXPECT_EQ(got[0].aligned_snapshot_hits, 1);
    EXPECT_EQ(got[0].unaligned_snapshot_hits, 0);
    EXPECT_TRUE(m.getAndResetSsmSnapshotIterationStats().empty());
}

// A cache closing with its commits ending mid-block publishes that block
// with the SSM state at its end: a prompt holding the whole block reuses up
// to there (an unaligned hit), KV and state byte for byte; one ending inside
// it falls back to the last full block with a snapshot.
TEST_F(SsmTest, PartialBlockIsPublishedWithItsStateAtClose)
{
    auto cfg = ssmConfig();
    cfg.enablePartialReuse = true;
    kvcm::KVCacheManager m(cfg);
    auto stream = m.createStream();
    KvWriter writer(m, cfg, stream, /*seed=*/5);
    auto const prompt = tokenRange(0, 16);
    {
        kvcm::KVCache a = m.createKVCache(prompt);
        a.resume(stream);
        ASSERT_TRUE(a.resize(10, 0));
        writer.write(a, prompt, 0, 8);
        a.commit(prompt.data(), 8);
        writer.write(a, prompt, 8, 10);
        a.commit(prompt.data() + 8, 2);
    }
    (void)m.getAndResetSsmSnapshotIterationStats();
    auto fork = tokenRange(0, 9);
    fork.push_back(99);
    EXPECT_EQ(m.probeReuse(fork), 8) << "the state is at 10, not 9";
    {
        kvcm::KVCache b = m.createKVCache(std::vector<kvcm::Token>(prompt.begin(), prompt.begin() + 14));
        EXPECT_EQ(b.reusedTokens(), 10);
        b.resume(stream);
        EXPECT_EQ(writer.verify(b, prompt, 0, 10).mismatches, 0);
        EXPECT_EQ(writer.verifyState(b, prompt, 10).mismatches, 0);
        b.commitPendingStats();
    }
    auto got = m.getAndResetSsmSnapshotIterationStats();
    ASSERT_EQ(got.size(), 1u);
    EXPECT_EQ(got[0].snapshot_hits, 1);
    EXPECT_EQ(got[0].reused_tokens, 10);
    EXPECT_EQ(got[0].aligned_snapshot_hits, 0);
    EXPECT_EQ(got[0].unaligned_snapshot_hits, 1);
}

// While live states hold every GPU SSM slot, a block-boundary snapshot is
// taken on the host level; a later prompt resumes from it, KV and state byte
// for byte.
TEST_F(SsmTest, SnapshotWithoutAGpuSlotIsTakenOnTheHost)
{
    auto cfg = ssmConfig();
    cfg.cacheTiers.push_back(kvcm::HostCacheTierConfig(64 << 10));
    cfg.maxSsmSlots = 2;
    kvcm::KVCacheManager m(cfg);
    auto stream = m.createStream();
    KvWriter writer(m, cfg, stream, /*seed=*/6);
    auto const prompt = tokenRange(0, 16);
    {
        kvcm::KVCache holder = m.createKVCache(tokenRange(500, 2));
        holder.resume(stream); // one GPU SSM slot
        kvcm::KVCache a = m.createKVCache(prompt);
        a.resume(stream); // the other
        ASSERT_TRUE(a.resize(8, 0));
        writer.write(a, prompt, 0, 8);
        a.commit(prompt.data(), 8);
        auto const host = m.storageStats(1);
        ASSERT_EQ(host.size(), 2u);
        EXPECT_EQ(host[1].total - host[1].free, 1) << "the snapshot is on the host level";
    }
    EXPECT_EQ(m.probeReuse(std::vector<kvcm::Token>(prompt.begin(), prompt.begin() + 12)), 8);
    kvcm::KVCache b = m.createKVCache(std::vector<kvcm::Token>(prompt.begin(), prompt.begin() + 12));
    EXPECT_EQ(b.reusedTokens(), 8);
    b.resume(stream);
    EXPECT_EQ(writer.verify(b, prompt, 0, 8).mismatches, 0);
    EXPECT_EQ(writer.verifyState(b, prompt, 8).mismatches, 0);
}

// maxSsmSlots caps the SSM pool group's GPU slots.
TEST_F(SsmTest, MaxSsmSlotsCapsTheSsmPoolGroup)
{
    auto cfg = ssmConfig();
    cfg.maxSsmSlots = 3;
    kvcm::KVCacheManager m(cfg);
    auto const descs = m.poolGroupDescs();
    ASSERT_EQ(descs.size(), 2u);
    EXPECT_EQ(descs[1].num_slots, 3);
}

} // namespace
