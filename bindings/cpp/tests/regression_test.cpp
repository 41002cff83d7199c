// Regression tests for defects found in a review of the C++ bindings
// (bindings/cpp/include/kvcm/kvcm.hpp). Each test fails on the code it was
// written against.
#include "test_support.hpp"

#include <kvcm/kvcm.hpp>

#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <new>
#include <stdexcept>

using kvcm_test::smallConfig;

namespace {

// A callable whose copy constructor throws (as copying a lambda that captures
// a std::string or std::vector by value may throw std::bad_alloc).
struct ThrowingCopy
{
    std::atomic<int>* runs = nullptr;
    explicit ThrowingCopy(std::atomic<int>* r) : runs(r) {}
    ThrowingCopy(ThrowingCopy const&) { throw std::runtime_error("copy failed"); }
    ThrowingCopy(ThrowingCopy&& o) noexcept(false) : runs(o.runs) { throw std::runtime_error("move failed"); }
    ThrowingCopy& operator=(ThrowingCopy const&) = delete;
    void operator()() const { runs->fetch_add(1); }
};

} // namespace

// StreamView::tryEnqueueHostFunc is noexcept and documented to report every
// failure by returning false, but it copies/moves the callable with
// `new (std::nothrow) Fn(std::forward<F>(fn))`: nothrow only covers the
// allocation, so an exception from Fn's constructor escapes the noexcept
// function and calls std::terminate. Run in a re-executed child so that the
// abort does not take the test binary down.
TEST(RegressionDeathTest, TryEnqueueHostFuncDoesNotTerminateWhenCallableCopyThrows)
{
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    EXPECT_EXIT(
        {
            int rc = 0;
            {
                kvcm::KVCacheManager m(smallConfig(64 << 10));
                auto s = m.createStream();
                std::atomic<int> runs{0};
                ThrowingCopy f(&runs);
                bool const ok = s.tryEnqueueHostFunc(f); // lvalue: copied
                s.synchronize();
                if (ok || runs.load() != 0)
                {
                    rc = 1;
                }
            }
            std::_Exit(rc);
        },
        ::testing::ExitedWithCode(0), "");
}
