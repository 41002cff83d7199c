// The disaggregated transfer layout: aggregated pages, aggregated page
// indices, page index converters and tokens_per_block overrides.
#include "test_support.hpp"

using namespace kvcm_test;

namespace {

class TransferLayoutTest : public ::testing::Test
{
protected:
    void TearDown() override { EXPECT_EQ(kvcm::liveHandleCount(), mHandlesBefore); }

    uint64_t mHandlesBefore = kvcm::liveHandleCount();
};

// Buffers adjacent in a slot merge into one run whatever order they are
// given in; a gap splits the run; members name their position in the list.
TEST_F(TransferLayoutTest, AggregatedPagesMergeContiguousBuffers)
{
    kvcm::KVCacheManager m(smallConfig(64 << 10));
    auto const v0 = m.bufferLocation(0, "value");
    // One pool: 0/key, 0/value, 1/key, 1/value (128 bytes each).
    auto const runs = m.aggregatedPages({{1, "key"}, {0, "value"}, {1, "value"}});
    ASSERT_EQ(runs.size(), 1u);
    EXPECT_EQ(runs[0].base, v0.pool_base + 128);
    EXPECT_EQ(runs[0].size, 384);
    EXPECT_EQ(runs[0].stride, 512);
    EXPECT_EQ(runs[0].layerGroup, 0);
    ASSERT_EQ(runs[0].buffers.size(), 3u);
    EXPECT_EQ(runs[0].buffers[0].buffer, 1u); // {0, "value"}
    EXPECT_EQ(runs[0].buffers[1].buffer, 0u); // {1, "key"}
    EXPECT_EQ(runs[0].buffers[2].buffer, 2u);
    EXPECT_EQ(runs[0].buffers[0].expansion, 1);

    auto const split = m.aggregatedPages({{1, "value"}, {0, "key"}});
    ASSERT_EQ(split.size(), 2u);
    EXPECT_EQ(split[0].base, v0.pool_base);
    EXPECT_EQ(split[1].base, v0.pool_base + 384);
    EXPECT_TRUE(m.aggregatedPages({}).empty());

    EXPECT_KVCM_ERROR((void)m.aggregatedPages({{0, "key"}, {0, "query"}}), kvcm::StatusCode::kInvalidArgument);
    EXPECT_KVCM_ERROR((void)m.aggregatedPages({{0, "key"}, {0, "key"}}), kvcm::StatusCode::kInvalidArgument);
    EXPECT_KVCM_ERROR((void)m.aggregatedPages({{0, std::string("key\0x", 5)}}), kvcm::StatusCode::kInvalidArgument);
}

// Aggregated page indices are the blocks' slots in the beam asked for;
// valid_only drops blocks without a page; a beam outside the width is
// refused.
TEST_F(TransferLayoutTest, AggregatedPageIndices)
{
    auto cfg = smallConfig(64 << 10);
    cfg.layers[1].slidingWindowSize = 4;
    kvcm::KVCacheManager m(cfg);
    auto stream = m.createStream();
    auto c = m.createKVCache(tokenRange(0, 16));
    c.resume(stream);
    c.resize(16, 16);
    auto const swa = m.layerGroupOf(1);
    auto const all = c.aggregatedPageIndices(swa);
    EXPECT_EQ(all, c.basePageIndices(swa));
    ASSERT_EQ(all.size(), 4u);
    EXPECT_EQ(all[0], kvcm::kBadPageIndex);
    auto const valid = c.aggregatedPageIndices(swa, 0, true);
    EXPECT_EQ(valid, std::vector<int32_t>(all.begin() + 3, all.end()));
    EXPECT_KVCM_ERROR((void)c.aggregatedPageIndices(swa, 1), kvcm::StatusCode::kInvalidArgument);
    ASSERT_TRUE(c.setBeamWidth(2));
    ASSERT_TRUE(c.resize(20)); // a new block: a page per beam
    for (int32_t beam = 0; beam < 2; ++beam)
    {
        EXPECT_EQ(c.aggregatedPageIndices(0, beam), c.basePageIndices(0, beam)) << "beam " << beam;
    }
    EXPECT_NE(c.aggregatedPageIndices(0, 1), c.aggregatedPageIndices(0, 0)) << "beam 1's new block is its own";
}

// A tokens_per_block override expands the buffer's pages: the converter's
// expansion, the stride of one sub-page and the upper bound in sub-pages.
TEST_F(TransferLayoutTest, TokensPerBlockOverrideAndConverter)
{
    auto cfg = smallConfig(64 << 10);
    cfg.layers[0].buffers.push_back(kvcm::BufferConfig{"index", 16, 2});
    kvcm::KVCacheManager m(cfg);
    auto const loc = m.bufferLocation(0, "index");
    EXPECT_EQ(loc.bytes, 32);
    EXPECT_EQ(m.pageStride(0, "index"), 16);
    EXPECT_EQ(m.pageStride(0, "key"), 128);
    auto const conv = m.pageIndexConverter(0, "index");
    EXPECT_EQ(conv.scale, loc.scale);
    EXPECT_EQ(conv.expansion, 2);
    EXPECT_EQ(conv.layer_offset, loc.offset);
    EXPECT_EQ(kvcm::convertPageIndices(conv, {3, kvcm::kBadPageIndex}),
        (std::vector<int64_t>{3 * loc.scale * 2, 3 * loc.scale * 2 + 1, -1, -1}));
    EXPECT_EQ(kvcm::convertPageIndices(conv, {3}, true),
        (std::vector<int64_t>{(3 * loc.scale + loc.offset) * 2, (3 * loc.scale + loc.offset) * 2 + 1}));
    auto const descs = m.poolGroupDescs();
    int64_t const slots = descs[0].num_slots;
    EXPECT_EQ(m.pageIndexUpperBound(0, "index"), (loc.scale * slots - loc.offset) * 2);
    auto const runs = m.aggregatedPages({{0, "index"}});
    ASSERT_EQ(runs.size(), 1u);
    EXPECT_EQ(runs[0].buffers[0].expansion, 2);

    cfg.layers[0].buffers.back().tokensPerBlockOverride = 3;
    EXPECT_KVCM_ERROR(kvcm::KVCacheManager{cfg}, kvcm::StatusCode::kInvalidConfig);
}

} // namespace
