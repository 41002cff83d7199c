"""SWA scratch reuse, planned drops and pool rebalancing through the
KVCacheManagerV2 API (issue 13 items 4 and 6), on both backends."""

from __future__ import annotations

import pytest

from conftest import small_config
from kvcm import (
    AttentionLayerConfig,
    BufferConfig,
    GpuCacheTierConfig,
    HalfOpenRange,
    InvalidStateError,
    KVCacheManager,
    KVCacheManagerConfig,
    PageIndexMode,
    PlannedDropHandle,
    ScratchDesc,
    SwaScratchReuseConfig,
)

KV = [BufferConfig("key", 64), BufferConfig("value", 64)]


def scratch_config(rewind: int = 0) -> KVCacheManagerConfig:
    """Full attention (layer group 0) and an 8-token window over four layers
    (layer group 1): a scratch slot holds four blocks of one layer."""
    layers = [AttentionLayerConfig(0, KV)] + [AttentionLayerConfig(i, KV, sliding_window_size=8) for i in range(1, 5)]
    return KVCacheManagerConfig(tokens_per_block=4, cache_tiers=[GpuCacheTierConfig(64 << 10, pool_granularity=0)], layers=layers,
                                swa_scratch_reuse=SwaScratchReuseConfig(rewind))


def prefill(m: KVCacheManager, n: int):
    c = m.create_kv_cache(None, list(range(n)))
    assert c.resume(m.create_stream())
    assert c.resize(n)
    return c


def test_prefill_blocks_out_of_the_window_use_scratch_slots(backend):
    """A step's blocks out of the window by its end have no page: they share
    scratch slots (four blocks a slot), and SHARED indices are off while the
    cache holds them."""
    with KVCacheManager(scratch_config(), device="emu") as m:
        assert m.enable_swa_scratch_reuse and m.init_config.enable_swa_scratch_reuse
        assert m.supports_index_mode(PageIndexMode.SHARED) is None
        c = prefill(m, 64)
        assert c.enable_swa_scratch_reuse
        d = c.get_scratch_desc(1)
        assert isinstance(d, ScratchDesc) and d
        assert d.range == HalfOpenRange(0, 14) and len(d.slot_ids) == 4
        assert c.get_scratch_desc(0) is None, "full attention never uses scratch"
        assert c.has_scratch_slots
        assert not c.supports_index_mode(PageIndexMode.SHARED) and c.supports_index_mode(PageIndexMode.PER_LAYER)
        base = c.get_base_page_indices(1)
        assert [b != -1 for b in base] == [i >= 14 for i in range(16)]
        for layer in range(1, 5):
            seen = set()
            for role in ("key", "value"):
                conv = m.get_page_index_converter(layer, role)
                assert conv.scratch_pages_per_block == 2
                idx = conv(base, PageIndexMode.PER_LAYER, d)
                assert all(i // conv.scale in d.slot_ids for i in idx[:14])
                seen.update(idx[:14])
            assert len(seen) == 2 * 14, f"layer {layer}: every block and buffer has its own sub-page"
        with pytest.raises(ValueError, match="PER_LAYER"):
            m.get_page_index_converter(1, "key")(base, PageIndexMode.SHARED, d)
        with pytest.raises(ValueError, match="index_mode"):
            m.get_mem_pool_base_address(1, "key")
        c.commit(list(range(64)))
        assert c.get_scratch_desc(1) is None and not c.has_scratch_slots
        c.close()


def test_max_rewind_len_keeps_the_tail_in_pages(backend):
    """swa_scratch_reuse.max_rewind_len protects the step's last tokens: their
    blocks keep pages."""
    with KVCacheManager(scratch_config(rewind=8), device="emu") as m:
        c = prefill(m, 64)
        assert c.get_scratch_desc(1).range == HalfOpenRange(0, 12)
        c.close()


def test_scratch_reuse_switches_only_between_steps(backend):
    """A cache turns scratch reuse off or on only while its step needs no
    scratch blocks (refused with a ScratchInUseError, both an
    InvalidStateError and KVCacheManagerV2's ValueError); on needs the
    manager's configuration."""
    with KVCacheManager(scratch_config(), device="emu") as m:
        c = prefill(m, 64)
        with pytest.raises(InvalidStateError):
            c.enable_swa_scratch_reuse = False
        with pytest.raises(ValueError, match="scratch blocks are needed"):
            c.enable_swa_scratch_reuse = False
        assert c.enable_swa_scratch_reuse
        c.commit(list(range(64)))
        c.enable_swa_scratch_reuse = False
        assert not c.enable_swa_scratch_reuse
        c.close()
    with KVCacheManager(small_config(), device="emu") as m:
        assert not m.enable_swa_scratch_reuse
        c = prefill(m, 64)
        with pytest.raises(ValueError):
            c.enable_swa_scratch_reuse = True
        assert c.get_scratch_desc(1) is None
        c.close()


def test_swa_scratch_reuse_must_be_its_config():
    with pytest.raises(TypeError, match="swa_scratch_reuse"):
        KVCacheManager(small_config(swa_scratch_reuse=8), device="emu")
    with pytest.raises(ValueError, match="max_rewind_len"):
        KVCacheManager(small_config(swa_scratch_reuse=SwaScratchReuseConfig(-1)), device="emu")


def test_planned_drop_handle(backend):
    """KVCacheManagerV2's conversation drops: a turn's plan drops its window's
    committed pages when carried out, pages other plans or turns still need
    stay, and a plan is carried out once."""
    layers = [AttentionLayerConfig(0, KV), AttentionLayerConfig(1, KV, sliding_window_size=8)]
    cfg = KVCacheManagerConfig(tokens_per_block=8, cache_tiers=[GpuCacheTierConfig(64 << 10, pool_granularity=0)], layers=layers)
    with KVCacheManager(cfg, device="emu") as m:
        long_tokens = list(range(24))
        short_tokens = long_tokens[:8]

        def plan_drop(tokens):
            c = m.create_kv_cache(None, tokens)
            assert c.resume(m.create_stream())
            assert c.resize(len(tokens))
            with pytest.raises(InvalidStateError, match="stop_committing"):
                c.plan_committed_block_drop()
            c.commit(tokens[c.num_committed_tokens:])
            c.stop_committing()
            handle = c.plan_committed_block_drop()
            assert isinstance(handle, PlannedDropHandle)
            c.close()
            return handle

        long_handle = plan_drop(long_tokens)
        short_handle = plan_drop(short_tokens)
        assert m.probe_reuse(None, short_tokens) == len(short_tokens)
        short_handle.drop()
        assert m.probe_reuse(None, short_tokens) == 0
        assert m.probe_reuse(None, long_tokens) == len(long_tokens)
        long_handle.drop()
        assert m.probe_reuse(None, long_tokens) == len(long_tokens) - 8
        with pytest.raises(ValueError, match="already been dropped"):
            long_handle.drop()  # an InvalidStateError too
        short_handle.close()
        long_handle.close()


def test_adjust_rebalances_pools_to_the_sampled_demand(backend):
    """Closed caches sample request lengths; once enough were sampled,
    need_adjustment turns true and adjust() splits the GPU quota by the
    demand (more full-attention slots, fewer window slots)."""
    layers = [AttentionLayerConfig(0, KV), AttentionLayerConfig(1, [BufferConfig("key", 32)], sliding_window_size=64)]
    cfg = KVCacheManagerConfig(tokens_per_block=4, cache_tiers=[GpuCacheTierConfig(64 << 10, max_quota=256 << 10, pool_granularity=0)],
                               layers=layers, rebalance_min_sampled_kv_caches=3, rebalance_cooldown_secs=0,
                               rebalance_target_ratio_update_interval=1)
    with KVCacheManager(cfg, device="emu") as m:
        before = [g.total for g in m.get_storage_stats()]
        assert not m.need_adjustment
        s = m.create_stream()
        for i in range(3):
            c = m.create_kv_cache()
            assert c.resume(s)
            assert c.resize(800, 800)
            c.close()
            assert m.need_adjustment == (i == 2)
        m.adjust()
        after = [g.total for g in m.get_storage_stats()]
        assert after[0] > before[0] and after[1] < before[1]
        assert not m.need_adjustment
