from __future__ import annotations

import gc
import os
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent.parent

# Run against the in-tree package unless told otherwise (KVCM_TEST_INSTALLED=1
# tests whatever `import kvcm` finds, e.g. a pip-installed wheel).
if os.environ.get("KVCM_TEST_INSTALLED") != "1":
    sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import kvcm  # noqa: E402
from kvcm import (  # noqa: E402
    AttentionLayerConfig,
    BufferConfig,
    GpuCacheTierConfig,
    HostCacheTierConfig,
    KVCacheManager,
    KVCacheManagerConfig,
)

CONFORMANCE_DIR = REPO / "tests" / "conformance"


def small_config(gpu_quota: int = 64 * 1024, host_quota: int | None = None, tiers=None, **kw) -> KVCacheManagerConfig:
    """Two full-attention layers and one sliding-window layer, 4 tokens per block."""
    if tiers is None:
        tiers = [GpuCacheTierConfig(gpu_quota, pool_granularity=0)]
        if host_quota:
            tiers.append(HostCacheTierConfig(host_quota))
    layers = [
        AttentionLayerConfig(0, [BufferConfig("key", 64), BufferConfig("value", 64)]),
        AttentionLayerConfig(1, [BufferConfig("key", 64), BufferConfig("value", 64)]),
        AttentionLayerConfig(2, [BufferConfig("key", 32), BufferConfig("value", 32)], sliding_window_size=8),
    ]
    kw.setdefault("layers", layers)
    # The tests of full-block reuse count whole blocks: partial reuse (on by
    # default, as in KVCacheManagerV2) only where a test asks for it.
    kw.setdefault("enable_partial_reuse", False)
    return KVCacheManagerConfig(tokens_per_block=4, cache_tiers=tiers, **kw)


@pytest.fixture(params=["extension", "ctypes"])
def backend(request):
    """Runs the test once through the compiled extension and once through
    the ctypes path (kvcm._native.use_backend). Without the extension its
    run is skipped, and fails under KVCM_REQUIRE_EXTENSION=1 (make py-test)."""
    from kvcm import _native

    if request.param == "extension" and _native._ext is None:
        if os.environ.get("KVCM_REQUIRE_EXTENSION") == "1":
            pytest.fail("kvcm._kvcm_ext is not built (make py-ext)")
        pytest.skip("kvcm._kvcm_ext is not built")
    before = _native.backend()
    _native.use_backend(request.param)
    yield request.param
    _native.use_backend(before)


@pytest.fixture
def config() -> KVCacheManagerConfig:
    return small_config()


@pytest.fixture
def manager(config):
    with KVCacheManager(config, device="emu") as m:
        yield m


@pytest.fixture(autouse=True)
def no_leaked_handles():
    """Every test leaves the library's live-handle count as it found it."""
    gc.collect()
    before = kvcm.live_handle_count()
    yield
    gc.collect()
    after = kvcm.live_handle_count()
    assert after == before, f"live handles: {before} before the test, {after} after"


def prefill(cache, tokens, is_end: bool = False) -> None:
    """Compute and commit tokens block by block (no page data), so that a
    sliding-window layer's blocks are published before the window drops them."""
    n = len(tokens)
    tpb = cache.tokens_per_block
    cache.resize(n)
    for start in range(cache.num_committed_tokens, n, tpb):
        end = min(start + tpb, n)
        cache.resize(n, end)
        cache.commit(tokens[start:end], is_end=is_end and end == n)
