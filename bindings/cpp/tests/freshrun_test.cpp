// The fresh run through the C++ API (kvcm::FreshRun, KVCache::freshRange):
// the contract of core/freshrun_test.go, with the engine's bytes checked
// through the pool base addresses on the emulated device.
#include "test_support.hpp"

using namespace kvcm_test;

namespace {

// Checks, after the fixture's members are gone, that the test left no handle.
struct NoLeakedHandles
{
    ~NoLeakedHandles() { EXPECT_EQ(kvcm::liveHandleCount(), before); }

    uint64_t before = kvcm::liveHandleCount();
};

// A manager of 4 GPU pages and 8 host pages (2 layers x key/value x 128
// bytes a page, 4 tokens a block) where prompt's 4 blocks were computed by
// the engine of seed 1 and pushed to host by another prompt.
class FreshRunTest : public ::testing::Test, NoLeakedHandles
{
protected:
    void SetUp() override
    {
        KVCM_SKIP_UNLESS_EMU();
        compute(prompt, first);
        compute(tokenRange(500, 16), first);
        auto const host = m.storageStats(1);
        ASSERT_EQ(host.size(), 1u);
        ASSERT_EQ(host[0].evictable, 4) << "the prompt's 4 blocks went to host";
    }

    void compute(std::vector<kvcm::Token> const& tokens, KvWriter& engine)
    {
        auto c = m.createKVCache(tokens);
        ASSERT_TRUE(c.resume(stream));
        ASSERT_TRUE(c.resize(static_cast<int64_t>(tokens.size())));
        engine.write(c, tokens, 0, static_cast<int64_t>(tokens.size()));
        c.commit(tokens);
    }

    int64_t onboardedFromHost() const { return m.migrationStats(kvcm::MigrationPath::kHostToGpu).pages; }

    kvcm::KVCacheManagerConfig const cfg = smallConfig(4 * 512, 8 * 512);
    kvcm::KVCacheManager m{cfg};
    kvcm::Stream stream = m.createStream();
    KvWriter first{m, cfg, stream, 1, false, 64 << 10};
    KvWriter second{m, cfg, stream, 2, false, 64 << 10};
    std::vector<kvcm::Token> const prompt = tokenRange(0, 16);
};

std::vector<kvcm::Token> slice(std::vector<kvcm::Token> const& t, size_t from, size_t to)
{
    return std::vector<kvcm::Token>(t.begin() + static_cast<std::ptrdiff_t>(from),
        t.begin() + static_cast<std::ptrdiff_t>(to));
}

// A cache created with a fresh run of the first 2 blocks reuses the whole
// prefix (its history), gets fresh GPU pages for the run and onboards only
// the 2 blocks after it, which hold the first engine's bytes. Nothing is
// committed until the run is; the engine writes the run's KV and commits
// exactly its tokens, the commit completing it joining the tail. The next
// cache reuses all 4 blocks from the GPU: the run's blocks hold the bytes
// the engine computed, the tail the first engine's. The tail is read after
// waitFreshTail (resume orders the stream after the run's pages only);
// waitFreshTail is idempotent and refused on a SUSPENDED cache.
TEST_F(FreshRunTest, TheRunIsComputedWhileTheTailIsOnboarded)
{
    int64_t const onboarded = onboardedFromHost();
    auto c = m.createKVCache(prompt, kvcm::FreshRun{2});
    EXPECT_EQ(c.freshRange(), (std::pair<int64_t, int64_t>{0, 8}));
    EXPECT_EQ(c.reusedTokens(), 16) << "reused: the whole matched prefix, the run included";
    EXPECT_EQ(c.historyLength(), 16);
    EXPECT_EQ(c.numCommittedTokens(), 0) << "nothing committed until the run is";
    EXPECT_KVCM_ERROR(c.waitFreshTail(stream), kvcm::StatusCode::kInvalidState);
    ASSERT_TRUE(c.resume(stream));
    EXPECT_EQ(onboardedFromHost() - onboarded, 2) << "only the tail's 2 blocks come up (one layer group)";
    c.waitFreshTail(); // resume left the tail's onboarding to it
    c.waitFreshTail(); // idempotent
    auto const tail = first.verify(c, prompt, 8, 16);
    EXPECT_EQ(tail.checked, 8 * 4);
    EXPECT_EQ(tail.mismatches, 0) << "the tail holds the first engine's bytes";

    second.write(c, prompt, 0, 8);
    EXPECT_KVCM_ERROR(c.commit(slice(prompt, 0, 12)), kvcm::StatusCode::kInvalidArgument);
    EXPECT_EQ(c.numCommittedTokens(), 0) << "a commit past the run changes nothing";
    c.commit(slice(prompt, 0, 4));
    EXPECT_EQ(c.numCommittedTokens(), 4);
    c.commit(slice(prompt, 4, 8));
    EXPECT_EQ(c.numCommittedTokens(), 16) << "the run's commit joins the tail";
    EXPECT_EQ(c.committedTokens(), prompt);
    c.close();

    auto d = m.createKVCache(prompt);
    EXPECT_EQ(d.reusedTokens(), 16);
    EXPECT_EQ(d.freshRange(), (std::pair<int64_t, int64_t>{0, 0})) << "no run asked: none";
    int64_t const mid = onboardedFromHost();
    ASSERT_TRUE(d.resume(stream));
    EXPECT_EQ(onboardedFromHost(), mid) << "reused from the GPU, nothing onboarded";
    auto const run = second.verify(d, prompt, 0, 8);
    EXPECT_EQ(run.checked, 8 * 4);
    EXPECT_EQ(run.mismatches, 0) << "the run the engine computed";
    auto const again = first.verify(d, prompt, 8, 16);
    EXPECT_EQ(again.mismatches, 0) << "the tail as first computed";
}

// A run in the middle (from block 1) keeps the block before it reused and
// committed; the run's commit follows it.
TEST_F(FreshRunTest, ARunInTheMiddleKeepsTheBlockBeforeIt)
{
    auto c = m.createKVCacheForRequest("mid", prompt, kvcm::FreshRun{2, 1});
    EXPECT_EQ(c.freshRange(), (std::pair<int64_t, int64_t>{4, 12}));
    EXPECT_EQ(c.numCommittedTokens(), 4) << "the block before the run is committed";
    ASSERT_TRUE(c.resume(stream));
    second.write(c, prompt, 4, 12);
    c.commit(slice(prompt, 4, 12));
    EXPECT_EQ(c.numCommittedTokens(), 16);
    c.close();

    auto d = m.createKVCache(prompt);
    ASSERT_TRUE(d.resume(stream));
    EXPECT_EQ(first.verify(d, prompt, 0, 4).mismatches, 0);
    EXPECT_EQ(second.verify(d, prompt, 4, 12).mismatches, 0);
    EXPECT_EQ(first.verify(d, prompt, 12, 16).mismatches, 0);
}

// Bad runs are refused naming the field, and create nothing: negative
// counts, and a start without a run.
TEST_F(FreshRunTest, BadRunsAreRefusedNamingTheField)
{
    uint64_t const handles = kvcm::liveHandleCount();
    EXPECT_ARGUMENT_ERROR((void) m.createKVCache(prompt, kvcm::FreshRun{-1}), "fresh_blocks");
    EXPECT_ARGUMENT_ERROR((void) m.createKVCache(prompt, kvcm::FreshRun{1, -1}), "fresh_from_block");
    EXPECT_ARGUMENT_ERROR((void) m.createKVCacheForRequest("r", prompt, kvcm::FreshRun{0, 1}), "fresh_from_block");
    EXPECT_EQ(kvcm::liveHandleCount(), handles) << "no cache was created";
}

} // namespace
