// Multimodal digest tokens: block keys (the cross-language vectors of
// tests/conformance/blockkeys.keys), reuse by item, committed digests and
// text-only caches.
#include "test_support.hpp"

#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>

#ifndef KVCM_CONFORMANCE_DIR
#error "KVCM_CONFORMANCE_DIR must name tests/conformance"
#endif

using namespace kvcm_test;

namespace {

class MultimodalTest : public ::testing::Test
{
protected:
    void TearDown() override { EXPECT_EQ(kvcm::liveHandleCount(), mHandlesBefore); }

    uint64_t mHandlesBefore = kvcm::liveHandleCount();
};

kvcm::Digest digestFromHex(std::string const& hex)
{
    kvcm::Digest d{};
    EXPECT_EQ(hex.size(), 64u);
    for (size_t i = 0; i < d.size() && 2 * i + 1 < hex.size(); ++i)
    {
        d[i] = static_cast<uint8_t>(std::stoul(hex.substr(2 * i, 2), nullptr, 16));
    }
    return d;
}

// Every line of blockkeys.keys through kvcm::blockKeys.
TEST_F(MultimodalTest, BlockKeyVectors)
{
    char const* env = std::getenv("KVCM_CONFORMANCE_DIR");
    std::string const dir = env != nullptr && *env != '\0' ? env : KVCM_CONFORMANCE_DIR;
    std::ifstream in(dir + "/blockkeys.keys");
    ASSERT_TRUE(in) << dir << "/blockkeys.keys";
    std::map<std::string, kvcm::Digest> digests;
    std::string line;
    int lines = 0;
    for (int no = 1; std::getline(in, line); ++no)
    {
        line = line.substr(0, line.find('#'));
        std::istringstream ls(line);
        std::string kind;
        if (!(ls >> kind) || kind == "kvcm-blockkeys")
        {
            continue;
        }
        if (kind == "digest")
        {
            std::string name, hex;
            ls >> name >> hex;
            digests[name] = digestFromHex(hex);
            continue;
        }
        ASSERT_EQ(kind, "keys") << "line " << no;
        ++lines;
        int32_t tpb = 0;
        std::string lora, salt, mode, colon;
        ls >> tpb >> lora >> salt >> mode >> colon;
        kvcm::ReuseScope scope;
        if (lora != "-")
        {
            scope.loraId = std::stoll(lora);
        }
        if (salt != "-")
        {
            scope.salt = salt;
        }
        std::vector<kvcm::Token> tokens;
        kvcm::DigestTokens dt;
        std::string tok;
        while (ls >> tok && tok != "=")
        {
            if (tok[0] == '@')
            {
                ASSERT_TRUE(digests.count(tok.substr(1))) << "line " << no;
                dt.add(tokens.size(), digests[tok.substr(1)]);
                tokens.push_back(0);
            }
            else
            {
                tokens.push_back(static_cast<kvcm::Token>(std::stol(tok)));
            }
        }
        std::vector<uint64_t> want;
        while (ls >> tok)
        {
            want.push_back(std::stoull(tok, nullptr, 16));
        }
        EXPECT_EQ(kvcm::blockKeys(tpb, tokens, dt, scope, mode == "partial"), want) << "line " << no;
    }
    EXPECT_GT(lines, 0);
}

// The same item at the same place reuses all of the prompt; another item
// only the text before it; committed digests come back at their positions.
TEST_F(MultimodalTest, ReuseFollowsTheItem)
{
    kvcm::KVCacheManager m(smallConfig(64 << 10));
    auto stream = m.createStream();
    std::vector<kvcm::Token> const prompt{1, 2, 3, 4, 0, 1001, 1002, 1003, 9, 10, 11, 12};
    kvcm::DigestTokens img, other;
    img.add(4, kvcm::Digest{1, 2, 3});
    other.add(4, kvcm::Digest{9});
    {
        auto c = m.createKVCache(prompt, img);
        c.resume(stream);
        c.resize(12, 12);
        c.commit(prompt, img);
        auto const back = c.committedDigests();
        EXPECT_EQ(back.positions, img.positions);
        EXPECT_EQ(back.bytes, img.bytes);
    }
    EXPECT_EQ(m.probeReuse(prompt, img), 12);
    EXPECT_EQ(m.probeReuse(prompt, other), 4);
    EXPECT_EQ(m.probeReuse(prompt), 4); // token 0 is not the item
    auto const keys = kvcm::blockKeys(4, prompt, other, {}, false);
    EXPECT_EQ(m.probeFirstNewBlockKey(prompt, other), std::optional<uint64_t>(keys[1]));
    auto c = m.createKVCache(prompt, img);
    EXPECT_EQ(c.reusedTokens(), 12);
}

// A text-only cache refuses digest tokens, changing nothing; a misplaced
// digest is refused.
TEST_F(MultimodalTest, TextOnlyAndMisplacedDigestsAreRefused)
{
    kvcm::KVCacheManager m(smallConfig(64 << 10));
    auto stream = m.createStream();
    std::vector<kvcm::Token> const prompt{1, 2, 3, 4};
    kvcm::DigestTokens d;
    d.add(1, kvcm::Digest{7});
    EXPECT_KVCM_ERROR((void)m.createKVCache(prompt, d, {}, nullptr, true), kvcm::StatusCode::kInvalidArgument);
    auto c = m.createKVCache(prompt, kvcm::DigestTokens{}, {}, nullptr, true);
    c.resume(stream);
    c.resize(4, 4);
    EXPECT_KVCM_ERROR(c.commit(prompt, d), kvcm::StatusCode::kInvalidArgument);
    EXPECT_EQ(c.numCommittedTokens(), 0);
    kvcm::DigestTokens bad;
    bad.add(4, kvcm::Digest{});
    EXPECT_KVCM_ERROR((void)m.probeReuse(prompt, bad), kvcm::StatusCode::kInvalidArgument);
}

} // namespace
