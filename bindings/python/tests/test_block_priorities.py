"""Queue-aware eviction through Python: KVCacheManager.set_block_priorities
with the keys a CP index reports for a waiting request."""

from __future__ import annotations

import pytest
from conftest import prefill, small_config

import kvcm
from kvcm import InvalidArgumentError, KVCacheManager, ManagerBackedCPAwareKVManager

A = list(range(0, 8))  # 2 blocks, served first: LRU's victim
B = list(range(100, 108))  # 2 blocks


@pytest.fixture
def served(backend):
    """A manager of 4 GPU pages holding A and B (2 blocks each), a
    manager-backed CP index over it, and a stream."""
    layers = [kvcm.AttentionLayerConfig(0, [kvcm.BufferConfig("key", 64), kvcm.BufferConfig("value", 64)])]
    tiers = [kvcm.GpuCacheTierConfig(4 * 128, pool_granularity=0)]  # 4 pages, not KVCM2's granules
    with KVCacheManager(small_config(tiers=tiers, layers=layers), device="emu") as m:
        cp = ManagerBackedCPAwareKVManager(m, [1.0])
        s = m.create_stream()
        for p in (A, B):
            with m.create_kv_cache(input_tokens=p) as c:
                c.resume(s)
                prefill(c, p)
        yield m, cp, s
        cp.close()


def waiter_keys(cp, request_id, prompt):
    """The cached blocks a waiting request for prompt will reuse, as the CP index reports them."""
    cp.predict_prefix_reuse(request_id, prompt + [7])
    return cp.get_cp_cached_blocks(request_id)


def evict_two(m, s):
    """A new request takes 2 of the 4 pages, which evicts 2 blocks; returns how many tokens of A and B stay."""
    with m.create_kv_cache(input_tokens=list(range(500, 508))) as c:
        c.resume(s)
        c.resize(8)
        return m.probe_reuse(A + [1]), m.probe_reuse(B + [1])


def test_blocks_given_a_higher_priority_are_evicted_last(served):
    """A waiting request's blocks, raised, stay although they were released first; the others go."""
    m, cp, s = served
    keys = waiter_keys(cp, "waiter", A)
    assert len(keys) == 2
    assert m.set_block_priorities(keys, [80] * len(keys)) == 2
    assert evict_two(m, s) == (8, 0)


def test_default_priority_restores_the_common_order(served):
    """DEFAULT_PRIORITY returns blocks nobody waits for to LRU's order; keys
    are looked up in the scope given, and may be 8 little-endian bytes."""
    m, cp, s = served
    keys = waiter_keys(cp, "waiter", A)
    as_bytes = [k.to_bytes(8, "little") for k in keys]
    assert m.set_block_priorities(as_bytes, [80, 80]) == 2
    assert m.set_block_priorities(keys, [80, 80], scope=kvcm.ReuseScope(lora_id=0)) == 0, "adapter 0 is a scope"
    assert m.set_block_priorities(keys + [12345], [80, 80, 80]) == 2, "an uncached block ends the chain"
    assert m.set_block_priorities([], []) == 0
    assert m.set_block_priorities(keys, [kvcm.DEFAULT_PRIORITY] * 2) == 2
    assert evict_two(m, s) == (0, 8)


def test_bad_arguments_fail_naming_the_argument_and_change_nothing(served):
    """Keys and priorities of different lengths, or values out of their C
    types' range, raise naming the argument; nothing changes, so LRU still
    evicts A first."""
    m, cp, s = served
    keys = waiter_keys(cp, "waiter", A)
    with pytest.raises(InvalidArgumentError, match="priorities"):
        m.set_block_priorities(keys, [80])
    with pytest.raises(InvalidArgumentError, match="priorities"):
        m.set_block_priorities([], [80])
    with pytest.raises(InvalidArgumentError, match=r"priorities\[1\]"):
        m.set_block_priorities(keys, [80, 2**31])
    with pytest.raises(InvalidArgumentError, match=r"block_keys\[0\]"):
        m.set_block_priorities([-1, keys[1]], [80, 80])
    with pytest.raises(InvalidArgumentError, match=r"block_keys\[0\]: a block key is 8 bytes"):
        m.set_block_priorities([b"\x01"], [80])
    with pytest.raises(TypeError, match="reuse_scope"):
        m.set_block_priorities(keys, [80, 80], scope=7)
    assert evict_two(m, s) == (0, 8)
