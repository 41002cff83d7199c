// A manager with a custom C++ codec: CountingCodec decorates the library's
// default codec and counts the pages it moves. Built by ctest against the
// installed CMake package (find_package(kvcm CONFIG), target kvcm::kvcm).
#include <kvcm/kvcm.hpp>

#include <cstdio>
#include <memory>
#include <vector>

namespace {

class CountingCodec final : public kvcm::IKvCacheColdPageCodec
{
public:
    bool configure(kvcm::PoolGroupDesc const* d, kvcm::PoolGroupIndex n) noexcept override
    {
        return mInner->configure(d, n);
    }
    size_t queryColdPageBytes(kvcm::LayerGroupId lg) const noexcept override { return mInner->queryColdPageBytes(lg); }
    kvcm::PageIndexLocation queryPageIndexLocation(kvcm::LayerGroupId lg) const noexcept override
    {
        return mInner->queryPageIndexLocation(lg);
    }
    bool encode(kvcm::LayerGroupId lg, void* dst, kvcm::PageIndexPair const* idx, size_t n,
        kvcm::cudaStream_t stream) noexcept override
    {
        std::printf("encode %zu pages of layer group %d\n", n, lg);
        return mInner->encode(lg, dst, idx, n, stream);
    }
    bool decode(kvcm::LayerGroupId lg, void const* src, kvcm::PageIndexPair const* idx, size_t n,
        kvcm::cudaStream_t stream) noexcept override
    {
        std::printf("decode %zu pages of layer group %d\n", n, lg);
        return mInner->decode(lg, src, idx, n, stream);
    }

private:
    std::unique_ptr<kvcm::IKvCacheColdPageCodec> mInner = kvcm::createDefaultKvCacheColdPageCodec();
};

} // namespace

int main()
{
    try
    {
        kvcm::KVCacheManagerConfig cfg;
        cfg.tokensPerBlock = 16;
        cfg.device = kvcm::DeviceKind::kEmu;
        cfg.cacheTiers = {kvcm::GpuCacheTierConfig(8 * 8192), kvcm::HostCacheTierConfig(64 * 8192)};
        cfg.layers = {{0, {{"key", 4096}, {"value", 4096}}}};
        kvcm::KVCacheManager manager(cfg, std::make_unique<CountingCodec>());
        auto stream = manager.createStream();

        std::vector<kvcm::Token> prompt(64);
        for (size_t i = 0; i < prompt.size(); ++i)
        {
            prompt[i] = static_cast<kvcm::Token>(i);
        }
        {
            auto cache = manager.createKVCache(prompt);
            cache.resume(stream);
            cache.resize(64, 64); // the engine computes the KV into cache.basePageIndices(0)
            cache.commit(prompt, true);
        }
        {
            std::vector<kvcm::Token> other(128, 7);
            auto cache = manager.createKVCache(other); // needs the whole GPU: the prompt is offloaded
            cache.resume(stream);
            cache.resize(128, 0);
        }
        prompt.push_back(99);
        auto again = manager.createKVCache(prompt);
        again.resume(stream); // decoded back from the host tier
        std::printf("kvcm %s: reused %lld tokens, %lld pages offloaded\n", kvcm::libraryVersion().c_str(),
            static_cast<long long>(again.reusedTokens()),
            static_cast<long long>(manager.migrationStats(kvcm::MigrationPath::kGpuToHost).pages));
        return again.reusedTokens() == 64 ? 0 : 1;
    }
    catch (kvcm::Error const& e)
    {
        std::fprintf(stderr, "kvcm error: %s\n", e.what());
        return 1;
    }
}
