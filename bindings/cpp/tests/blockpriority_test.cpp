// Queue-aware eviction through the C++ API: KVCacheManager::setBlockPriorities
// with the keys a CP index reports for a waiting request.
#include "test_support.hpp"

using namespace kvcm_test;

namespace {

// Checks, after the fixture's members are gone, that the test left no handle.
struct NoLeakedHandles
{
    ~NoLeakedHandles() { EXPECT_EQ(kvcm::liveHandleCount(), before); }

    uint64_t before = kvcm::liveHandleCount();
};

// A manager of 4 GPU pages (2 layers x key/value x 128 bytes a page) holding
// two served prompts of 2 blocks each: a, released first (LRU's victim), and
// b; cp is a manager-backed index over it.
class BlockPriorityTest : public ::testing::Test, NoLeakedHandles
{
protected:
    void SetUp() override
    {
        for (auto const& p : {a, b})
        {
            auto c = m.createKVCache(p);
            c.resume(stream);
            ASSERT_TRUE(c.resize(static_cast<int64_t>(p.size())));
            c.commit(p);
        }
        (void) m.drainBlockEvents();
    }

    // The cached blocks a waiting request for prompt will reuse, as the CP
    // index reports them.
    std::vector<uint64_t> waiterKeys(std::string const& id, std::vector<kvcm::Token> prompt)
    {
        prompt.push_back(7);
        (void) cp.predictPrefixReuse(id, prompt);
        return cp.getCachedBlocks(id);
    }

    // A new request takes 2 of the 4 pages, which evicts 2 blocks; returns
    // how many tokens of a and of b are still reusable.
    std::pair<int64_t, int64_t> evictTwo()
    {
        auto c = m.createKVCache(tokenRange(500, 8));
        c.resume(stream);
        EXPECT_TRUE(c.resize(8));
        auto ap = a, bp = b;
        ap.push_back(1);
        bp.push_back(1);
        return {m.probeReuse(ap), m.probeReuse(bp)};
    }

    kvcm::KVCacheManager m{smallConfig(4 * 512)};
    kvcm::CPIndex cp = kvcm::CPIndex::managerBacked(m, {1.0});
    kvcm::Stream stream = m.createStream();
    std::vector<kvcm::Token> const a = tokenRange(0, 8);
    std::vector<kvcm::Token> const b = tokenRange(100, 8);
};

// Blocks a waiting request will reuse, given a higher priority, are evicted
// last although they were released first; each change is a priority update.
TEST_F(BlockPriorityTest, BlocksGivenAHigherPriorityAreEvictedLast)
{
    auto const keys = waiterKeys("waiter", a);
    ASSERT_EQ(keys.size(), 2u);
    EXPECT_EQ(m.setBlockPriorities(keys, std::vector<int32_t>(keys.size(), 80)), 2u);
    auto const events = m.drainBlockEvents();
    ASSERT_EQ(events.size(), 2u);
    for (auto const& e : events)
    {
        EXPECT_EQ(e.kind, kvcm::EventKind::kBlockPriorityUpdated);
        EXPECT_EQ(e.priority, 80);
        EXPECT_EQ(e.oldPriority, kvcm::kDefaultPriority);
    }
    auto const [ra, rb] = evictTwo();
    EXPECT_EQ(ra, 8) << "the waiter's blocks stay";
    EXPECT_EQ(rb, 0) << "the blocks nobody waits for went first";
}

// kDefaultPriority returns blocks nobody waits for any more to LRU's order;
// keys are looked up in the scope given.
TEST_F(BlockPriorityTest, DefaultPriorityRestoresTheCommonOrder)
{
    auto const keys = waiterKeys("waiter", a);
    EXPECT_EQ(m.setBlockPriorities(keys, {80, 80}), 2u);
    EXPECT_EQ(m.setBlockPriorities(keys, {80, 80}, kvcm::ReuseScope{0, {}}), 0u) << "LoRA adapter 0 is another scope";
    EXPECT_EQ(m.setBlockPriorities(keys, {kvcm::kDefaultPriority, kvcm::kDefaultPriority}), 2u);
    auto const [ra, rb] = evictTwo();
    EXPECT_EQ(ra, 0) << "released first, evicted first again";
    EXPECT_EQ(rb, 8);
}

// Keys and priorities of different lengths throw Error(kInvalidArgument)
// naming priorities, and change nothing.
TEST_F(BlockPriorityTest, BadArgumentsFailNamingTheArgumentAndChangeNothing)
{
    auto const keys = waiterKeys("waiter", a);
    try
    {
        (void) m.setBlockPriorities(keys, {80});
        ADD_FAILURE() << "setBlockPriorities did not throw";
    }
    catch (kvcm::Error const& e)
    {
        EXPECT_EQ(e.code(), kvcm::StatusCode::kInvalidArgument);
        EXPECT_NE(e.message().find("priorities"), std::string::npos) << e.message();
    }
    EXPECT_KVCM_ERROR((void) m.setBlockPriorities({}, {80}), kvcm::StatusCode::kInvalidArgument);
    EXPECT_TRUE(m.drainBlockEvents().empty()) << "no priority changed";
    auto const [ra, rb] = evictTwo();
    EXPECT_EQ(ra, 0) << "a is still LRU's victim";
    EXPECT_EQ(rb, 8);
}

} // namespace
