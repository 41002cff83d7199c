// The C++ runner of the cross-language conformance vectors
// (tests/conformance/*.vec; the format and the page-byte writer are in
// tests/conformance/README.md). Go (tests/conformance/conformance_test.go)
// and Python run the same files and must meet the same expectations.
#include "test_support.hpp"

#include <dirent.h>

#include <algorithm>
#include <cstdlib>
#include <cctype>
#include <fstream>
#include <sstream>

#ifndef KVCM_CONFORMANCE_DIR
#error "KVCM_CONFORMANCE_DIR must name tests/conformance"
#endif

using namespace kvcm_test;

namespace {

// The vectors' directory: KVCM_CONFORMANCE_DIR from the environment (for a
// test binary run outside its source tree), else the build's.
std::string conformanceDir()
{
    char const* env = std::getenv("KVCM_CONFORMANCE_DIR");
    return env != nullptr && *env != '\0' ? env : KVCM_CONFORMANCE_DIR;
}

std::vector<std::string> vectorFiles()
{
    std::vector<std::string> out;
    if (DIR* d = opendir(conformanceDir().c_str()))
    {
        while (dirent* e = readdir(d))
        {
            std::string const name = e->d_name;
            if (name.size() > 4 && name.compare(name.size() - 4, 4, ".vec") == 0)
            {
                out.push_back(name);
            }
        }
        closedir(d);
    }
    std::sort(out.begin(), out.end());
    return out;
}

struct Line
{
    int no = 0;
    std::vector<std::string> f;

    [[nodiscard]] std::string text() const
    {
        std::string s;
        for (auto const& x : f)
        {
            s += (s.empty() ? "" : " ") + x;
        }
        return s;
    }
};

class Runner
{
public:
    explicit Runner(std::string path)
        : mPath(std::move(path))
    {
    }

    void run()
    {
        std::ifstream in(mPath);
        ASSERT_TRUE(in) << "cannot open " << mPath;
        std::vector<Line> steps;
        std::string text;
        int no = 0;
        bool header = false;
        while (std::getline(in, text))
        {
            ++no;
            if (auto h = text.find('#'); h != std::string::npos)
            {
                text.resize(h);
            }
            std::istringstream ss(text);
            Line l{no, {}};
            for (std::string w; ss >> w;)
            {
                l.f.push_back(w);
            }
            if (l.f.empty())
            {
                continue;
            }
            if (!header)
            {
                ASSERT_TRUE(l.f.size() == 2 && l.f[0] == "kvcm-conformance" && l.f[1] == "1")
                    << mPath << ":" << no << ": want header \"kvcm-conformance 1\"";
                header = true;
                continue;
            }
            steps.push_back(std::move(l));
        }
        ASSERT_TRUE(header) << mPath << ": empty vector";
        for (auto const& l : steps)
        {
            if (configure(l))
            {
                continue;
            }
            if (!mManager)
            {
                start();
            }
            step(l);
            if (::testing::Test::HasFatalFailure())
            {
                return;
            }
        }
        // Close what is still open, then the manager; both must succeed.
        for (auto& [name, c] : mCaches)
        {
            EXPECT_NO_THROW(c.close()) << "close " << name;
        }
        mCaches.clear();
        mWriter.reset();
        if (mManager)
        {
            EXPECT_NO_THROW(mStream.destroy());
            EXPECT_NO_THROW(mManager->destroy());
        }
    }

private:
    static int64_t num(Line const& l, size_t i)
    {
        if (i >= l.f.size())
        {
            throw std::runtime_error("line " + std::to_string(l.no) + ": missing field " + std::to_string(i));
        }
        size_t used = 0;
        int64_t const v = std::stoll(l.f[i], &used, 10);
        if (used != l.f[i].size())
        {
            throw std::runtime_error("line " + std::to_string(l.no) + ": " + l.f[i] + " is not an integer");
        }
        return v;
    }

    // The reuse scope of a LORA field: "-" has no LoRA adapter, an integer
    // is that adapter (0 included).
    kvcm::ReuseScope scope(Line const& l, size_t i) const
    {
        if (l.f.at(i) == "-")
        {
            return {};
        }
        return kvcm::ReuseScope{num(l, i), {}};
    }

    bool configure(Line const& l)
    {
        auto const& f = l.f;
        if (f[0] == "tokens_per_block")
        {
            mCfg.tokensPerBlock = static_cast<int32_t>(num(l, 1));
        }
        else if (f[0] == "tier")
        {
            if (f.at(1) == "gpu")
            {
                mCfg.cacheTiers.push_back(kvcm::GpuCacheTierConfig(num(l, 2)));
            }
            else if (f[1] == "host")
            {
                mCfg.cacheTiers.push_back(kvcm::HostCacheTierConfig(num(l, 2)));
            }
            else
            {
                throw std::runtime_error("line " + std::to_string(l.no) + ": tier " + f[1] + " not supported");
            }
        }
        else if (f[0] == "layer")
        {
            kvcm::AttentionLayerConfig layer;
            layer.layerId = static_cast<int32_t>(num(l, 1));
            layer.slidingWindowSize = static_cast<int32_t>(num(l, 2));
            layer.numSinkTokens = static_cast<int32_t>(num(l, 3));
            for (size_t i = 4; i + 1 < f.size(); i += 2)
            {
                layer.buffers.push_back(kvcm::BufferConfig{f[i], num(l, i + 1)});
            }
            mCfg.layers.push_back(std::move(layer));
        }
        else if (f[0] == "ssm_layer")
        {
            kvcm::SsmLayerConfig layer;
            layer.layerId = static_cast<int32_t>(num(l, 1));
            for (size_t i = 2; i + 1 < f.size(); i += 2)
            {
                layer.buffers.push_back(kvcm::BufferConfig{f[i], num(l, i + 1)});
            }
            mCfg.ssmLayers.push_back(std::move(layer));
            mCfg.commitMinSnapshot = true;
        }
        else if (f[0] == "partial_reuse")
        {
            mCfg.enablePartialReuse = f.at(1) == "on";
        }
        else if (f[0] == "reuse_match_backoff")
        {
            mCfg.reuseMatchBackoff = static_cast<int32_t>(num(l, 1));
        }
        else if (f[0] == "seed")
        {
            mSeed = std::stoull(f.at(1), nullptr, 10);
        }
        else if (f[0] == "seq")
        {
            std::vector<kvcm::Token> t;
            for (size_t i = 2; i < f.size(); ++i)
            {
                t.push_back(static_cast<kvcm::Token>(num(l, i)));
            }
            mSeqs[f.at(1)] = std::move(t);
        }
        else
        {
            return false;
        }
        return true;
    }

    void start()
    {
        mCfg.device = testDevice(); // the emulated device unless KVCM_TEST_DEVICE=cuda
        mManager = std::make_unique<kvcm::KVCacheManager>(mCfg); // every other option: its default
        mStream = mManager->createStream();
        mWriter = std::make_unique<KvWriter>(*mManager, mCfg, mStream, mSeed);
    }

    kvcm::KVCache& cache(Line const& l)
    {
        auto it = mCaches.find(l.f.at(1));
        if (it == mCaches.end())
        {
            throw std::runtime_error("line " + std::to_string(l.no) + ": no open cache " + l.f.at(1));
        }
        return it->second;
    }

    std::vector<kvcm::Token> const& seq(std::string const& name, Line const& l) const
    {
        auto it = mSeqs.find(name);
        if (it == mSeqs.end())
        {
            throw std::runtime_error("line " + std::to_string(l.no) + ": no sequence " + name);
        }
        return it->second;
    }

    void expect(Line const& l, size_t i, std::string const& got)
    {
        ASSERT_LT(i, l.f.size()) << mPath << ":" << l.no;
        EXPECT_EQ(l.f[i], got) << mPath << ":" << l.no << " (" << l.text() << ")";
    }

    void step(Line const& l)
    {
        SCOPED_TRACE(mPath + ":" + std::to_string(l.no) + ": " + l.text());
        auto const& f = l.f;
        auto const& op = f[0];
        try
        {
            if (op == "probe")
            {
                auto const n = mManager->probeReuse(seq(f.at(1), l), scope(l, 2));
                expect(l, 3, std::to_string(n));
            }
            else if (op == "create")
            {
                auto const& s = seq(f.at(2), l);
                auto c = mManager->createKVCache(s, scope(l, 3));
                ASSERT_EQ(c.numCommittedTokens(), c.historyLength()) << "committed != history after create";
                expect(l, 4, std::to_string(c.historyLength()));
                mCacheSeq[f[1]] = s;
                mCaches[f[1]] = std::move(c);
            }
            else if (op == "resume")
            {
                if (!cache(l).resume(mStream))
                {
                    throw std::runtime_error("line " + std::to_string(l.no) + ": resume refused");
                }
            }
            else if (op == "suspend")
            {
                cache(l).suspend();
            }
            else if (op == "close")
            {
                cache(l).close();
                mCaches.erase(f[1]);
            }
            else if (op == "resize")
            {
                if (!cache(l).resize(num(l, 2), num(l, 3)))
                {
                    throw std::runtime_error("line " + std::to_string(l.no) + ": resize out of pages");
                }
            }
            else if (op == "write")
            {
                mWriter->write(cache(l), mCacheSeq.at(f[1]), num(l, 2), num(l, 3));
            }
            else if (op == "commit")
            {
                auto& c = cache(l);
                auto const& s = mCacheSeq.at(f[1]);
                int64_t const from = num(l, 2), to = num(l, 3);
                ASSERT_EQ(from, c.numCommittedTokens()) << "commit must start at the committed count";
                ASSERT_LE(to, static_cast<int64_t>(s.size()));
                c.commit(s.data() + from, static_cast<size_t>(to - from), f.at(4) == "end");
            }
            else if (op == "pages")
            {
                auto const lg = mManager->layerGroupOf(static_cast<int32_t>(num(l, 2)));
                auto const idx = cache(l).basePageIndices(lg);
                auto const valid = std::count_if(idx.begin(), idx.end(), [](int32_t x) { return x != kvcm::kBadPageIndex; });
                expect(l, 3, std::to_string(idx.size()));
                expect(l, 4, std::to_string(valid));
            }
            else if (op == "verify")
            {
                auto const v = mWriter->verify(cache(l), mCacheSeq.at(f[1]), num(l, 2), num(l, 3));
                EXPECT_EQ(v.mismatches, 0) << "page bytes differ from the writer";
                expect(l, 4, v.digest);
            }
            else if (op == "state")
            {
                auto const v = mWriter->verifyState(cache(l), mCacheSeq.at(f[1]), num(l, 2));
                EXPECT_EQ(v.mismatches, 0) << "the SSM state differs from the writer's";
                expect(l, 3, v.digest);
            }
            else if (op == "used")
            {
                int64_t used = 0;
                for (auto const& g : mManager->storageStats(static_cast<kvcm::CacheLevel>(num(l, 1))))
                {
                    used += g.total - g.free;
                }
                expect(l, 2, std::to_string(used));
            }
            else
            {
                FAIL() << "unknown step " << op;
            }
        }
        catch (kvcm::Error const& e)
        {
            FAIL() << e.what();
        }
        catch (std::exception const& e)
        {
            FAIL() << e.what();
        }
    }

    std::string mPath;
    kvcm::KVCacheManagerConfig mCfg;
    uint64_t mSeed = 0;
    std::map<std::string, std::vector<kvcm::Token>> mSeqs;
    std::unique_ptr<kvcm::KVCacheManager> mManager;
    kvcm::Stream mStream;
    std::unique_ptr<KvWriter> mWriter;
    std::map<std::string, kvcm::KVCache> mCaches;
    std::map<std::string, std::vector<kvcm::Token>> mCacheSeq;
};

class Conformance : public ::testing::TestWithParam<std::string>
{
};

TEST_P(Conformance, Vector)
{
    uint64_t const before = kvcm::liveHandleCount();
    Runner(conformanceDir() + "/" + GetParam()).run();
    EXPECT_EQ(kvcm::liveHandleCount(), before);
}

INSTANTIATE_TEST_SUITE_P(Vectors, Conformance, ::testing::ValuesIn(vectorFiles()),
    [](auto const& param)
    {
        std::string n = param.param.substr(0, param.param.size() - 4);
        for (char& ch : n)
        {
            if (!std::isalnum(static_cast<unsigned char>(ch)))
            {
                ch = '_';
            }
        }
        return n;
    });

TEST(ConformanceFiles, Present)
{
    EXPECT_FALSE(vectorFiles().empty()) << "no *.vec under " << conformanceDir();
}

// The writer's building blocks: FNV-1a's published values, the prefix chain,
// and the low-byte mask.
TEST(ConformanceWriter, KnownValues)
{
    EXPECT_EQ(fnv1a("", 0), 0xcbf29ce484222325ULL);
    EXPECT_EQ(fnv1a("a", 1), 0xaf63dc4c8601ec8cULL);
    EXPECT_EQ(mix64(0), 0u);
    // Same chain as internal/testkit/fakeengine: changing a token changes every later prefix.
    auto const p1 = prefixHashes(7, {1, 2, 3}, 3);
    auto const p2 = prefixHashes(7, {1, 9, 3}, 3);
    EXPECT_EQ(p1[0], p2[0]);
    EXPECT_NE(p1[1], p2[1]);
    EXPECT_NE(p1[2], p2[2]);
    uint8_t a[13], b[13];
    fillToken(a, 13, p1[2], 2, bufferSalt(0, "key"));
    fillToken(b, 13, p1[2], 2, bufferSalt(0, "key"), /*zeroLow=*/true);
    for (int i = 0; i < 13; ++i)
    {
        EXPECT_EQ(b[i], i % 2 == 0 ? 0 : a[i]) << i;
    }
}

} // namespace
