// The shared tier through the C++ bindings: its level, its counters and the
// bounded flush. The two-manager test needs a Redis Cluster
// (KVCM_REDIS_CLUSTER, as make test exports it) and skips without one.
#include "test_support.hpp"

#include <chrono>
#include <cstdlib>
#include <string>
#include <unistd.h>

using namespace kvcm_test;
using namespace std::chrono_literals;

namespace {

class SharedTierTest : public ::testing::Test
{
protected:
    void TearDown() override { EXPECT_EQ(kvcm::liveHandleCount(), mHandlesBefore); }

    uint64_t mHandlesBefore = kvcm::liveHandleCount();
};

kvcm::KVCacheManagerConfig sharedConfig(std::vector<std::string> addresses, std::string ns, kvcm::SharedWritePolicy policy)
{
    auto cfg = smallConfig(16 * 512, 32 * 512);
    kvcm::SharedCacheTierConfig st;
    st.addresses = std::move(addresses);
    st.ns = std::move(ns);
    st.dialTimeoutMs = 200;
    st.callTimeoutMs = 500;
    st.writePolicy = policy;
    cfg.sharedTier = st;
    return cfg;
}

std::vector<std::string> split(std::string const& s)
{
    std::vector<std::string> out;
    size_t start = 0;
    for (size_t comma; (comma = s.find(',', start)) != std::string::npos; start = comma + 1)
    {
        out.push_back(s.substr(start, comma - start));
    }
    out.push_back(s.substr(start));
    return out;
}

// Without a shared tier there is no shared level and no counters, and a
// flush is done at once.
TEST_F(SharedTierTest, NoSharedTier)
{
    kvcm::KVCacheManager m(smallConfig(16 * 512, 32 * 512));
    EXPECT_FALSE(m.sharedLevel().has_value());
    EXPECT_FALSE(m.sharedStats().has_value());
    EXPECT_TRUE(m.flushShared(1ms));
}

// The shared level follows the local levels; an unreachable cluster's
// counters are readable and count the lookups; a flush timeout that is not
// positive is an invalid argument.
TEST_F(SharedTierTest, LevelStatsAndFlushArguments)
{
    kvcm::KVCacheManager m(sharedConfig({"127.0.0.1:1"}, "ns", kvcm::SharedWritePolicy::kWriteBackOnEviction));
    ASSERT_TRUE(m.sharedLevel().has_value());
    EXPECT_EQ(*m.sharedLevel(), m.numLevels());
    auto const prompt = tokenRange(1, 8);
    (void) m.probeReuse(prompt.data(), prompt.size());
    auto const st = m.sharedStats();
    ASSERT_TRUE(st.has_value());
    EXPECT_EQ(st->lookup_blocks, 2);
    EXPECT_EQ(st->found_blocks, 0);
    EXPECT_TRUE(m.flushShared(1s));
    EXPECT_KVCM_ERROR(m.flushShared(0ms), kvcm::StatusCode::kInvalidArgument);
    EXPECT_KVCM_ERROR(m.flushShared(-5ms), kvcm::StatusCode::kInvalidArgument);
    // A timeout under a millisecond rounds up to one, so it is not refused as
    // 0 is (whether the flush finishes within it depends on the machine).
    EXPECT_NO_THROW((void) m.flushShared(100us)) << "a timeout under a millisecond rounds up";
}

// Two managers on one cluster: what the first writes through on commit is
// written once flushShared reports it, and the second reuses it whole,
// onboarded from the shared level.
TEST_F(SharedTierTest, SecondManagerReusesTheFirstsBlocks)
{
    char const* env = std::getenv("KVCM_REDIS_CLUSTER");
    if (env == nullptr || *env == '\0')
    {
        GTEST_SKIP() << "KVCM_REDIS_CLUSTER is not set (scripts/redis-cluster.sh start; make test sets it)";
    }
    auto const ns = "cpptest" + std::to_string(getpid()) + "-"
        + std::to_string(std::chrono::steady_clock::now().time_since_epoch().count());
    auto const prompt = tokenRange(100, 16);
    auto const cfg = sharedConfig(split(env), ns, kvcm::SharedWritePolicy::kWriteThroughOnCommit);

    kvcm::KVCacheManager a(cfg);
    auto stream = a.createStream();
    {
        auto c = a.createKVCache(prompt);
        c.resume(stream);
        c.resize(16, 16);
        c.commit(prompt.data(), prompt.size());
    }
    ASSERT_TRUE(a.flushShared(30s));
    auto const sa = a.sharedStats().value();
    EXPECT_EQ(sa.write_throughs, 4);
    EXPECT_EQ(sa.written + sa.present, 4);

    kvcm::KVCacheManager b(cfg);
    auto const level = b.sharedLevel().value();
    (void) b.drainBlockEvents();
    EXPECT_EQ(b.probeReuse(prompt.data(), prompt.size()), 16);
    {
        auto c = b.createKVCache(prompt);
        EXPECT_EQ(c.reusedTokens(), 16);
    }
    auto const sb = b.sharedStats().value();
    EXPECT_EQ(sb.onboarded_blocks, 4);
    EXPECT_EQ(sb.corrupt, 0);
    EXPECT_EQ(sb.failed_landings, 0);
    int onboarded = 0;
    for (auto const& e : b.drainBlockEvents())
    {
        if (e.oldLevel == level)
        {
            EXPECT_EQ(e.level, 1);
            ++onboarded;
        }
    }
    EXPECT_EQ(onboarded, 4);
}

} // namespace
