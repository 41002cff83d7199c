// CP-aware index tests: the null, manager-backed and delegating indexes
// through CPIndex, a C++ index implementing only some methods (only those
// slots filled), exceptions and invalid answers contained, the manager
// notifying an attached index, and the index destroyed exactly once.
#include "test_support.hpp"

#include <atomic>
#include <cmath>
#include <limits>
#include <mutex>
#include <stdexcept>

using namespace kvcm_test;

namespace {

class CPTest : public ::testing::Test
{
protected:
    void TearDown() override { EXPECT_EQ(kvcm::liveHandleCount(), mHandlesBefore); }

    uint64_t mHandlesBefore = kvcm::liveHandleCount();
};

// Shared with the test while the library owns the index.
struct Log
{
    std::mutex mu;
    int predicts = 0;
    int allocCalls = 0;
    size_t allocKeys = 0;
    int freedCalls = 0;
    size_t freedKeys = 0;
    std::string lastId;
    std::atomic<int> destroyed{0};
};

// Implements only predictPrefixReuse and the two notifications.
class PartialIndex : public kvcm::ICPAwareKVManager
{
public:
    PartialIndex(std::shared_ptr<Log> log, double score)
        : mLog(std::move(log))
        , mScore(score)
    {
    }
    ~PartialIndex() override { mLog->destroyed++; }

    double predictPrefixReuse(std::string_view id, kvcm::Token const*, size_t) override
    {
        std::lock_guard<std::mutex> g(mLog->mu);
        mLog->predicts++;
        mLog->lastId = std::string(id);
        if (id == "throw")
        {
            throw std::runtime_error("boom");
        }
        return mScore;
    }
    void notifyBlocksAllocated(std::string_view id, uint64_t const*, size_t n) override
    {
        std::lock_guard<std::mutex> g(mLog->mu);
        mLog->allocCalls++;
        mLog->allocKeys += n;
        mLog->lastId = std::string(id);
    }
    void notifyBlocksFreed(std::string_view id, uint64_t const*, size_t n) override
    {
        std::lock_guard<std::mutex> g(mLog->mu);
        mLog->freedCalls++;
        mLog->freedKeys += n;
        mLog->lastId = std::string(id);
    }

private:
    std::shared_ptr<Log> mLog;
    double mScore;
};

// Implements everything, badly.
class GarbageIndex : public kvcm::ICPAwareKVManager
{
public:
    double predictPrefixReuse(std::string_view, kvcm::Token const*, size_t) override
    {
        return std::numeric_limits<double>::quiet_NaN();
    }
    std::vector<uint64_t> getCpCachedBlocks(std::string_view id) override
    {
        if (id == "many")
        {
            return std::vector<uint64_t>(100, 7);
        }
        throw std::logic_error("no");
    }
    std::vector<std::string> getAllocationPriority(std::vector<std::string> const& ids) override
    {
        std::vector<std::string> out{"invented"};
        out.insert(out.end(), ids.rbegin(), ids.rend());
        out.push_back(ids.empty() ? "x" : ids.front()); // repeated
        return out;
    }
};

TEST(CPCapabilities, DetectedFromTheOverrides)
{
    EXPECT_EQ(kvcm::detail::cpOverridden<PartialIndex>(),
        kvcm::kCpPredictPrefixReuse | kvcm::kCpNotifyBlocksAllocated | kvcm::kCpNotifyBlocksFreed);
    EXPECT_EQ(kvcm::detail::cpOverridden<GarbageIndex>(),
        kvcm::kCpPredictPrefixReuse | kvcm::kCpGetCachedBlocks | kvcm::kCpGetAllocationPriority);
    EXPECT_EQ(kvcm::detail::cpOverridden<kvcm::ICPAwareKVManager>(), kvcm::kCpAllCapabilities);
}

TEST_F(CPTest, NullIndex)
{
    auto cp = kvcm::CPIndex::null();
    EXPECT_TRUE(cp);
    EXPECT_EQ(cp.predictPrefixReuse("a", tokenRange(0, 9)), 0.0);
    EXPECT_TRUE(cp.getCachedBlocks("a").empty());
    cp.notifyBlocksAllocated("a", {1, 2});
    cp.notifyBlocksFreed("a", {1, 2});
    EXPECT_EQ(cp.getAllocationPriority({"c", "a", "b"}), (std::vector<std::string>{"c", "a", "b"}));
    EXPECT_EQ(cp.faultCount(), 0u);
    kvcm_cp_index const h = cp.handle();
    cp.destroy();
    EXPECT_FALSE(cp);
    kvcm::detail::StatusPtr st(kvcm_cp_destroy(h));
    ASSERT_NE(st, nullptr) << "a stale handle is reported";
    EXPECT_EQ(kvcm_status_get_code(st.get()), KVCM_ERR_INVALID_HANDLE);
}

TEST_F(CPTest, PartialCppIndexFillsOnlyItsSlots)
{
    auto log = std::make_shared<Log>();
    {
        auto cp = kvcm::CPIndex::delegating(std::make_unique<PartialIndex>(log, 0.5));
        EXPECT_EQ(cp.predictPrefixReuse("req-7", tokenRange(0, 8)), 0.5);
        EXPECT_EQ(log->lastId, "req-7");
        EXPECT_TRUE(cp.getCachedBlocks("req-7").empty()) << "missing method: null behaviour";
        EXPECT_EQ(cp.getAllocationPriority({"x", "y", "z"}), (std::vector<std::string>{"x", "y", "z"}));
        cp.notifyBlocksAllocated("req-7", {1, 2, 3});
        cp.notifyBlocksFreed("req-7", {1, 2, 3});
        EXPECT_EQ(log->allocKeys, 3u);
        EXPECT_EQ(log->freedKeys, 3u);
        EXPECT_EQ(cp.predictPrefixReuse("throw", {}), 0.0) << "an exception is contained";
        EXPECT_EQ(cp.faultCount(), 1u);
        EXPECT_EQ(log->destroyed.load(), 0);
    }
    EXPECT_EQ(log->destroyed.load(), 1) << "destroyed exactly once with its CPIndex";
}

TEST_F(CPTest, GarbageAnswersAreRepaired)
{
    auto cp = kvcm::CPIndex::delegating(std::make_unique<GarbageIndex>());
    EXPECT_EQ(cp.predictPrefixReuse("a", tokenRange(0, 4)), 0.0) << "NaN becomes 0";
    EXPECT_EQ(cp.getCachedBlocks("many").size(), 100u);
    EXPECT_TRUE(cp.getCachedBlocks("other").empty());
    auto const order = cp.getAllocationPriority({"a", "b", "c"});
    EXPECT_EQ(order.size(), 3u);
    std::vector<std::string> sorted = order;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(sorted, (std::vector<std::string>{"a", "b", "c"})) << "always a permutation";
    EXPECT_EQ(cp.faultCount(), 3u);
}

// A manager-backed index scores the blocks of its reuse scope only; LoRA
// adapter 0 is a scope of its own, not the scope without an adapter (as for
// the manager's own reuse).
TEST_F(CPTest, ManagerBackedIndexScoresWithinItsScope)
{
    kvcm::KVCacheManager m(smallConfig(64 << 10));
    auto const none = kvcm::CPIndex::managerBacked(m, {1.0});
    auto const adapter0 = kvcm::CPIndex::managerBacked(m, {1.0}, kvcm::ReuseScope{0, {}});
    auto stream = m.createStream();
    auto const prompt = tokenRange(100, 16);
    {
        auto c = m.createKVCache(prompt);
        c.resume(stream);
        c.resize(16, 16);
        c.commit(prompt);
    }
    EXPECT_DOUBLE_EQ(none.predictPrefixReuse("q", prompt), 1.0);
    EXPECT_DOUBLE_EQ(adapter0.predictPrefixReuse("q", prompt), 0.0) << "adapter 0 is another scope";
}

TEST_F(CPTest, ManagerNotifiesAttachedIndexAndManagerBackedScores)
{
    auto log = std::make_shared<Log>();
    kvcm::KVCacheManager m(smallConfig(64 << 10));
    auto mb = kvcm::CPIndex::managerBacked(m, {1.0, 0.5});
    {
        auto ext = kvcm::CPIndex::delegating(std::make_unique<PartialIndex>(log, 0.25));
        m.attachCP(ext);
    } // the manager keeps the delegating index alive
    EXPECT_EQ(log->destroyed.load(), 0);

    auto stream = m.createStream();
    auto const prompt = tokenRange(100, 18);
    {
        auto c = m.createKVCacheForRequest("writer", prompt);
        c.resume(stream);
        c.resize(18, 18);
        c.commit(prompt);
        c.suspend();
        c.resume(stream);
        c.suspend();
        EXPECT_EQ(log->allocKeys, 4u);
        EXPECT_EQ(log->freedCalls, 0) << "suspend and resume free nothing";
    }
    EXPECT_EQ(log->freedCalls, 1);
    EXPECT_EQ(log->freedKeys, 4u);
    EXPECT_EQ(log->lastId, "writer");

    auto events = m.drainEvents();
    ASSERT_EQ(events.size(), 4u);
    EXPECT_NE(events[0].cacheId, 0u);

    auto q = tokenRange(100, 12);
    auto more = tokenRange(900, 4);
    q.insert(q.end(), more.begin(), more.end());
    EXPECT_DOUBLE_EQ(mb.predictPrefixReuse("q", q), 12.0 / 16);
    EXPECT_EQ(mb.getCachedBlocks("q").size(), 3u);
    EXPECT_EQ(mb.getAllocationPriority({"cold", "q"}), (std::vector<std::string>{"q", "cold"}));

    {
        auto plain = m.createKVCache(prompt); // no request id: not tracked
    }
    EXPECT_EQ(log->freedCalls, 1);
    m.detachCP();
    EXPECT_EQ(log->destroyed.load(), 1) << "the last user let go";
}

} // namespace
