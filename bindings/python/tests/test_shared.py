"""The shared tier's run-time queries: its level in the manager's level
list and in cache events, its counters, and the bounded flush. The
two-manager tests need a Redis Cluster (KVCM_REDIS_CLUSTER, as make test
exports it) and skip without one."""

from __future__ import annotations

import os
import time

import pytest
from conftest import prefill, small_config

import kvcm
from kvcm import (
    AttentionLayerConfig,
    BufferConfig,
    CacheTier,
    InvalidArgumentError,
    KVCacheEventManager,
    KVCacheManager,
    SharedCacheTierConfig,
    SharedStats,
    SharedWritePolicy,
)

LAYERS = [AttentionLayerConfig(i, [BufferConfig("key", 64), BufferConfig("value", 64)]) for i in range(2)]
PROMPT = list(range(100, 116))  # four blocks of one page (one layer group)


def _shared_config(addresses, namespace="ns", policy=SharedWritePolicy.WRITE_BACK_ON_EVICTION):
    cfg = small_config(gpu_quota=16 * 1024, host_quota=32 * 1024, layers=LAYERS)
    cfg.cache_tiers.append(SharedCacheTierConfig(addresses=addresses, namespace=namespace, dial_timeout_ms=200,
                                                 call_timeout_ms=500, write_policy=policy))
    return cfg


def test_without_a_shared_tier_there_is_no_shared_level_nor_stats(backend):
    """No shared tier: shared_level and get_shared_stats() are None, a flush is done at once."""
    with KVCacheManager(small_config(host_quota=32 * 1024), device="emu") as m:
        assert m.shared_level is None
        assert m.get_shared_stats() is None
        assert m.flush_shared(0.001) is True
        assert CacheTier.SHARED not in m.cache_tier_list


def test_the_shared_level_follows_the_local_levels(backend):
    """The shared level is num_cache_levels, listed as CacheTier.SHARED; the counters of an
    unreachable cluster are readable and count the lookups past the local tree."""
    with KVCacheManager(_shared_config(["127.0.0.1:1"]), device="emu") as m:
        assert m.num_cache_levels == 2
        assert m.shared_level == 2
        assert m.cache_tier_list == [CacheTier.GPU_MEM, CacheTier.HOST_MEM, CacheTier.SHARED]
        assert m.probe_reuse(None, PROMPT) == 0
        st = m.get_shared_stats()
        assert isinstance(st, SharedStats)
        assert (st.lookup_blocks, st.found_blocks, st.onboarded_blocks) == (4, 0, 0)
        assert m.flush_shared(1.0) is True


@pytest.mark.parametrize("timeout,error", [
    (0, InvalidArgumentError), (-1.5, InvalidArgumentError), (float("nan"), InvalidArgumentError),
    (float("inf"), InvalidArgumentError), (True, TypeError), (None, TypeError), ("1", TypeError),
])
def test_flush_shared_needs_a_positive_finite_timeout(backend, timeout, error):
    """flush_shared never waits unbounded: its timeout must be a positive finite number of seconds."""
    with KVCacheManager(_shared_config(["127.0.0.1:1"]), device="emu") as m:
        with pytest.raises(error, match="timeout"):
            m.flush_shared(timeout)


def test_shared_queries_on_a_closed_manager_raise(backend):
    """A closed manager refuses the shared tier's queries like any other."""
    m = KVCacheManager(_shared_config(["127.0.0.1:1"]), device="emu")
    m.close()
    with pytest.raises(kvcm.ClosedError):
        m.get_shared_stats()
    with pytest.raises(kvcm.ClosedError):
        m.flush_shared(1.0)


def _cluster() -> list[str]:
    addrs = os.environ.get("KVCM_REDIS_CLUSTER", "")
    if not addrs:
        pytest.skip("KVCM_REDIS_CLUSTER is not set (scripts/redis-cluster.sh start; make test sets it)")
    return addrs.split(",")


def test_a_second_manager_reuses_the_firsts_blocks(backend):
    """What one manager writes through on commit is written once flush_shared returns True;
    a second manager on the cluster reuses it whole, its stats count the onboarding and its
    events report the pages' move from the shared level to the host level."""
    addrs = _cluster()
    ns = f"pytest{os.getpid()}-{time.time_ns()}"
    cfg = _shared_config(addrs, ns, SharedWritePolicy.WRITE_THROUGH_ON_COMMIT)
    with KVCacheManager(cfg, device="emu") as a:
        cache = a.create_kv_cache(None, PROMPT)
        cache.resume(a.create_stream())
        prefill(cache, PROMPT)
        cache.close()
        assert a.flush_shared(30.0) is True
        st = a.get_shared_stats()
        assert st.write_throughs == 4
        assert st.written + st.present == 4
        assert st.write_errors == st.dropped == st.lost_writes == 0

    em = KVCacheEventManager(1000)
    with KVCacheManager(cfg, event_manager=em, device="emu") as b:
        assert b.probe_reuse(None, PROMPT) == len(PROMPT)
        cache = b.create_kv_cache(None, PROMPT)
        assert cache.reused_tokens == len(PROMPT)
        cache.close()
        st = b.get_shared_stats()
        assert (st.onboarded_blocks, st.onboarded_pages, st.corrupt, st.failed_landings) == (4, 4, 0, 0)
        assert st.bytes_read > 0
        em.flush_iteration_events()
        moves = [e.data.cache_level for e in em.get_latest_events(timeout_ms=0)
                 if isinstance(e.data, kvcm.KVCacheUpdatedData) and e.data.cache_level is not None]
        assert moves.count(kvcm.KVCacheEventDiff(b.shared_level, 1)) == 4
