"""The public surface of TensorRT-LLM's KVCacheManagerV2 (KVCM2), name by
name: module names, errors, configuration, statistics, events, layout
queries (docs/trtllm.md)."""

from __future__ import annotations

import dataclasses
import json
import math


import pytest
from conftest import prefill, small_config

import kvcm
from kvcm import (
    AttentionLayerConfig,
    BatchDesc,
    BufferConfig,
    GpuCacheTierConfig,
    HostCacheTierConfig,
    KVCacheDesc,
    KVCacheEventManager,
    KVCacheManager,
    KVCacheManagerConfig,
    PageIndexMode,
    ReuseScope,
    UnsupportedError,
)
from kvcm.events import hash_v1_block_key

PROMPT = list(range(1000, 1013))  # 3 full blocks of 4 and one token


def test_module_constants_and_helpers_have_kvcm2s_values():
    """The constants are KVCM2's; exact_div refuses a remainder; a
    HalfOpenRange is empty (and false) when end <= beg."""
    assert (kvcm.GPU_LEVEL, kvcm.CACHE_LEVEL1, kvcm.DEFAULT_BEAM_INDEX, kvcm.BAD_PAGE_INDEX) == (0, 1, 0, -1)
    assert kvcm.TokenId(5) == 5 and kvcm.LayerGroupId is kvcm.LifeCycleId
    assert kvcm.exact_div(12, 4) == 3
    with pytest.raises(ValueError):
        kvcm.exact_div(13, 4)
    assert list(kvcm.typed_range(3)) == [0, 1, 2]
    r = kvcm.HalfOpenRange(2, 5)
    assert (r.beg, r.end, len(r), bool(r), 3 in r, 5 in r) == (2, 5, 3, True, True, False)
    assert not kvcm.HalfOpenRange(4, 4) and r == kvcm.HalfOpenRange(2, 5)
    assert [m.name for m in kvcm.PageStatus] == ["LOCKED", "HELD", "DROPPABLE"]
    assert (kvcm.PageIndexMode.SHARED, kvcm.PageIndexMode.PER_LAYER) == (0, 1)
    assert kvcm.KvCacheStatus is kvcm._KVCache.Status
    assert kvcm.IKvCacheColdPageCodec is kvcm.KVCacheColdPageCodec


def _shape(cls):
    return [(f.name, f.default) for f in dataclasses.fields(cls)]


_MISSING = dataclasses.MISSING
_ITER = ["alloc_total_blocks", "alloc_new_blocks", "reused_blocks", "full_reused_blocks", "partial_reused_blocks",
         "missed_blocks", "gen_alloc_blocks", "onboard_blocks", "onboard_bytes", "offload_blocks", "offload_bytes",
         "intra_device_copy_blocks", "intra_device_copy_bytes", "host_dropped_blocks", "host_dropped_bytes"]
_SSM = ["snapshot_lookups", "snapshot_hits", "snapshot_misses", "reused_tokens", "unreused_tokens",
        "aligned_snapshot_hits", "unaligned_snapshot_hits"]


def test_value_types_keep_their_names_fields_order_and_defaults():
    """The statistics and layout records (their fields generated from the ABI
    description) have KVCM2's names, fields in its order and defaults; the
    counters are mutable, the others frozen; CacheTier has KVCM2's members."""
    assert _shape(kvcm.KVCacheIterationStatsDelta) == [("iter_" + n, 0) for n in _ITER]
    assert _shape(kvcm.SsmSnapshotIterationStatsDelta) == [("iter_" + n, 0) for n in _SSM]
    assert _shape(kvcm.PoolGroupPeakBlockStats) == [(n, _MISSING) for n in ("available", "unavailable", "evictable")]
    assert _shape(kvcm.BufferLocation) == [
        (n, _MISSING) for n in ("layer_group", "pool", "pool_base", "scale", "offset", "bytes")]
    assert _shape(kvcm.PageIndexConverter) == [
        ("scale", _MISSING), ("expansion", _MISSING), ("layer_offset", _MISSING), ("scratch_pages_per_block", 1)]
    assert _shape(kvcm.PoolGroupStats) == [(n, _MISSING) for n in (
        "level", "tier", "index", "page_bytes", "total", "free", "evictable", "available")]
    d = kvcm.KVCacheIterationStatsDelta(iter_reused_blocks=3, iter_missed_blocks=1)
    d.add(d.copy())
    assert (d.iter_reused_blocks, d.iter_cache_hit_rate, d.empty) == (6, 0.75, False)
    with pytest.raises(dataclasses.FrozenInstanceError):
        kvcm.PoolGroupPeakBlockStats(1, 2, 3).available = 0
    assert [(t.name, int(t)) for t in kvcm.CacheTier] == [("GPU_MEM", 0), ("HOST_MEM", 1), ("DISK", 2), ("SHARED", 3)]
    assert kvcm.PoolGroupStats(0, kvcm.CacheTier.GPU_MEM, 0, 64, 10, 4, 1, 5).used == 6


def test_reuse_scope_is_a_named_tuple_where_none_is_not_zero():
    """ReuseScope(lora_id=None, salt=None) is a NamedTuple; no LoRA and LoRA
    0 are different scopes."""
    s = ReuseScope()
    assert s == (None, None) and s.lora_id is None and s.salt is None
    assert ReuseScope(lora_id=None) != ReuseScope(lora_id=0)
    assert ReuseScope(3, 7)._replace(salt=None) == ReuseScope(3)


def test_error_classes_keep_kvcm_hierarchy_under_kvcm2s():
    """OutOfPagesError derives from OutOfMemoryError; DeviceError is a
    CuError carrying the CUresult its message names; InternalError and
    PoisonedError are CorruptedErrors; all stay KVCacheErrors."""
    assert issubclass(kvcm.OutOfPagesError, kvcm.OutOfMemoryError)
    assert issubclass(kvcm.OutOfMemoryError, (kvcm.KVCacheError, MemoryError))
    assert issubclass(kvcm.DeviceError, kvcm.CuError)
    assert issubclass(kvcm.InternalError, kvcm.CorruptedError) and issubclass(kvcm.PoisonedError, kvcm.CorruptedError)
    from kvcm.errors import error_for_code

    e = error_for_code(11, "cuda: cuMemAlloc: CUDA_ERROR_OUT_OF_MEMORY [CUresult 2] (out of memory)")
    assert isinstance(e, kvcm.CuError) and e.error_code == 2
    assert error_for_code(11, "emu: unknown stream").error_code is None
    assert kvcm.poison_reason() is None and not kvcm.is_poisoned()


def test_cu_error_is_constructed_from_the_error_code_as_kvcm2s():
    """KVCM2's CuError(error_code): the code is kept as error_code and named
    in the message; kvcm's own (message, code) form stays."""
    e = kvcm.CuError(2)
    assert e.error_code == 2 and "CUDA driver error: 2" in str(e)
    with pytest.raises(kvcm.CuError) as info:
        raise kvcm.DeviceError(700)
    assert info.value.error_code == 700
    assert kvcm.CuError("driver failed [CUresult 4]", 11).error_code == 4


def test_attn_life_cycle_is_kvcm2s_value():
    """AttnLifeCycle.make rounds sink tokens up to blocks, and its stale
    range is the rule kvcm's sliding windows follow: the blocks past the
    sinks that the next input token no longer sees."""
    lc = kvcm.AttnLifeCycle.make(8, 5, 4)
    assert lc == kvcm.AttnLifeCycle(window_size=8, num_sink_blocks=2) and lc.window_size == 8
    assert kvcm.AttnLifeCycle.make(None, None, 4) == (None, 0)
    assert lc.get_stale_range(20, 4) == kvcm.HalfOpenRange(2, 3)
    assert not kvcm.AttnLifeCycle.make(None, 0, 4).get_stale_range(100, 4)
    assert lc.get_stale_range(3, 4) == kvcm.HalfOpenRange(1, 1)
    # the SSM layer group's, as KVCM2's SsmLifeCycle: every full block
    assert kvcm.manager.LifeCycle(3, None, 0, is_ssm=True).get_stale_range(10, 4) == kvcm.HalfOpenRange(0, 2)


@pytest.mark.parametrize("args, field", [
    ((8, None, 0), "tokens_per_block"), ((0, None, 4), "window_size"),
    ((8, -1, 4), "num_sink_tokens"), ((None, 4, 4), "num_sink_tokens"),
])
def test_attn_life_cycle_refuses_bad_shapes_naming_the_argument(args, field):
    with pytest.raises(kvcm.InvalidArgumentError, match=field):
        kvcm.AttnLifeCycle.make(*args)


def test_initial_pool_ratio_empty_or_wrong_length_is_a_value_error():
    """As in KVCM2: an empty list, a list of the wrong length, a value not
    positive, ratios not summing to 1.0 and a max_util_for_resume out of
    (0, 1] raise ValueError (InvalidConfigError) with KVCM2's wording."""
    for ratio in ([], [1.0], [1.0, 1.0, 1.0]):
        with pytest.raises(ValueError, match="initial_pool_ratio length"):
            KVCacheManager(small_config(initial_pool_ratio=ratio), device="emu")
    for ratio in ([0.0, 1.0], [-0.1, 1.1]):
        with pytest.raises(ValueError, match="initial_pool_ratio values must be positive"):
            KVCacheManager(small_config(initial_pool_ratio=ratio), device="emu")
    for ratio in ([0.4, 0.5], [1.0, 1.0]):
        with pytest.raises(ValueError, match="initial_pool_ratio values must sum to 1.0"):
            KVCacheManager(small_config(initial_pool_ratio=ratio), device="emu")
    for util in (0.0, -0.1, 1.1, float("nan")):
        with pytest.raises(ValueError, match="max_util_for_resume must be in"):
            KVCacheManager(small_config(max_util_for_resume=util), device="emu")
    with KVCacheManager(small_config(initial_pool_ratio=[0.5, 0.5]), device="emu"):
        pass


@pytest.mark.parametrize("field,value", [
    ("reuse_match_backoff", -1),
    ("rebalance_min_sampled_kv_caches", -1),
    ("rebalance_cooldown_secs", float("inf")),
    ("rebalance_target_ratio_update_interval", 0),
    ("rebalance_ratio_threshold", 1.0),
    ("rebalance_moving_average_decay", 1.0),
])
def test_new_config_fields_are_validated_naming_them(field, value):
    """reuse_match_backoff and the rebalance_* fields follow KVCM2's rules;
    a violation raises InvalidConfigError naming the field."""
    with pytest.raises(kvcm.InvalidConfigError) as e:
        KVCacheManager(small_config(**{field: value}), device="emu")
    assert e.value.field == field


def test_tier_configs_assert_valid():
    """assert_valid raises AssertionError for a quota that is not positive or
    a disk path that is not a directory."""
    GpuCacheTierConfig(1).assert_valid()
    with pytest.raises(AssertionError):
        HostCacheTierConfig(0).assert_valid()
    with pytest.raises(AssertionError):
        kvcm.DiskCacheTierConfig(1, "/nonexistent/kvcm").assert_valid()


def test_system_prompt_length_is_held_once_by_a_constraint():
    """A constraint batch whose requests share a system prompt needs its full
    blocks once: 4 requests of 400 tokens (100 blocks each) raise a 64 KiB
    GPU tier to 4 * 100 / 0.97 slots of full attention; with 396 shared
    tokens (99 + 4 * 1 blocks) the batch fits the quota as it is."""
    reqs = [KVCacheDesc(400, 0) for _ in range(4)]
    gpu = kvcm.GPU_LEVEL

    def sizing(cfg):
        with KVCacheManager(cfg, device="emu") as m:
            full = m.get_life_cycle_pool_group_indices(gpu)[0]
            return m.get_storage_statistics(gpu)[full].total, m.get_quota(gpu)

    slots, quota = sizing(small_config(constraints=[BatchDesc(reqs)]))
    assert slots == math.ceil(400 / 0.97) and quota > 64 * 1024
    slots, quota = sizing(small_config(constraints=[BatchDesc(reqs, system_prompt_length=396)]))
    assert slots >= math.ceil(103 / 0.97) and quota == 64 * 1024


def serve(m, tokens, scope=None, priority=None, commit_stats=False):
    s = m.create_stream()
    kw = {} if scope is None else {"lora_task_id": scope.lora_id, "salt": scope.salt}
    with m.create_kv_cache(input_tokens=tokens, custom_priority_callback=priority, **kw) as c:
        c.resume(s)
        prefill(c, tokens)
        if commit_stats:
            c.commit_pending_stats()
        c.suspend()
    s.close()


def test_iteration_stats_per_layer_group_and_their_arithmetic():
    """get_and_reset_iteration_stats returns a KVCacheIterationStatsDelta
    per layer group that counted something, and restarts them; the deltas
    add, subtract, copy and clear. KVCM2's rules: 8 tokens cached, a 13-token
    prompt reuses 2 full blocks (no allocation) and its prefill allocates
    blocks 2 and 3, both missed (the trailing partial block too); the
    committed counts sum the attention layer groups (the window of 8 holds
    both reused blocks at history 8: 2 + 2 reused), kvcm's own stats count
    each block once."""
    with KVCacheManager(small_config(), device="emu") as m:
        serve(m, PROMPT[:8], commit_stats=True)
        first = m.get_and_reset_iteration_stats()
        assert set(first) == {0, 1}
        assert first[0].iter_alloc_new_blocks == 2 and first[0].iter_missed_blocks == 2
        serve(m, PROMPT, commit_stats=True)  # 2 of its 3 full blocks are cached
        it = m.get_and_reset_iteration_stats()[0]
        assert (it.iter_full_reused_blocks, it.iter_reused_blocks, it.iter_missed_blocks) == (2, 2, 2)
        assert (it.iter_alloc_total_blocks, it.iter_alloc_new_blocks) == (2, 2)
        assert it.iter_cache_hit_rate == pytest.approx(2 / 4)
        assert m.get_and_reset_iteration_stats() == {}
        total = first[0].copy()
        total.add(it)
        assert total.iter_reused_blocks == 2 and total.iter_alloc_new_blocks == 2 + it.iter_alloc_new_blocks
        total.subtract(it)
        assert total == first[0]
        total.clear()
        assert total.empty and not it.empty
        committed = m.get_committed_stats()
        assert isinstance(committed, kvcm.KVCacheStatsDelta)
        assert committed.reused_blocks == 2 + 2 and m.stats.reused_blocks == 2
        serve(m, PROMPT)
        assert m.get_and_reset_iteration_stats() == {}, "closing discarded what no cache committed"
        assert m.get_committed_stats() == committed


def test_iteration_stats_wait_for_commit_pending_stats():
    """A cache's per-layer-group reuse and allocation counts reach
    get_and_reset_iteration_stats when it commits its pending statistics,
    once; discard_pending_stats drops them; page moves count at once. A
    fresh 13-token prompt's 4 prefill blocks are 4 allocations, all missed
    (KVCM2's rule: an allocation before the history reached the prompt)."""
    cfg = small_config(gpu_quota=16 * 1024, host_quota=64 * 1024)
    with KVCacheManager(cfg, device="emu") as m:
        s = m.create_stream()
        with m.create_kv_cache(input_tokens=PROMPT) as c:
            assert c.resume(s) and c.resize(16)
            assert m.get_and_reset_iteration_stats() == {}, "pending"
            c.commit_pending_stats()
            it = m.get_and_reset_iteration_stats()
            assert (it[0].iter_alloc_new_blocks, it[0].iter_missed_blocks) == (4, 4)
            c.commit_pending_stats()
            assert m.get_and_reset_iteration_stats() == {}, "committed once"
            assert c.resize(20)
            c.discard_pending_stats()
            c.commit_pending_stats()
            assert m.get_and_reset_iteration_stats() == {}, "discarded"
            c.suspend()
        s.close()


@pytest.mark.parametrize("kwargs, gen_blocks", [
    ({"input_tokens": PROMPT[:8]}, 1),                               # the prompt's length by default
    ({"input_tokens": PROMPT[:8], "expected_prompt_length": 4}, 2),  # the expected length over it
    ({"expected_prompt_length": 4}, 2),
    ({}, 0),                                                         # neither: nothing is generation
    ({"input_tokens": []}, 4),                                       # an empty prompt: all growth is
])
def test_expected_prompt_length_is_the_generation_boundary(kwargs, gen_blocks):
    """Growth counts as generation allocation (iter_gen_alloc_blocks) once
    the history has reached expected_prompt_length, by default the length
    of input_tokens."""
    with KVCacheManager(small_config(), device="emu") as m:
        s = m.create_stream()
        with m.create_kv_cache(**kwargs) as c:
            assert c.resume(s)
            for capacity, history in ((4, 0), (8, 4), (12, 8), (16, 8)):
                assert c.resize(capacity, history)
            assert c.history_length == 8
            c.commit_pending_stats()
            it = m.get_and_reset_iteration_stats()
            assert it[0].iter_gen_alloc_blocks == gen_blocks
            c.suspend()
        s.close()


def test_stats_off_report_nothing_through_kvcm2s_getters():
    """With enable_stats=False the KVCM2 iteration getters report nothing;
    kvcm's own stats keep counting."""
    with KVCacheManager(small_config(enable_stats=False), device="emu") as m:
        serve(m, PROMPT)
        assert m.get_and_reset_iteration_stats() == {}
        m.record_request_suspended()
        assert m.get_and_reset_iteration_suspend_resume_stats() == (0, 0)
        assert m.stats.alloc_new_blocks > 0


def test_reuse_by_level_storage_statistics_and_peaks():
    """Reuse from the host counts at level 1 in blocks and tokens; storage
    statistics and peaks come per pool group in KVCM2's fields."""
    cfg = small_config(gpu_quota=16 * 1024, host_quota=64 * 1024)
    with KVCacheManager(cfg, device="emu") as m:
        serve(m, PROMPT[:9])
        for i in range(6):  # push the first request's blocks to the host
            serve(m, list(range(5000 + 100 * i, 5000 + 100 * i + 40)))
        m.get_and_reset_iteration_reused_blocks_by_level()
        m.get_and_reset_iteration_cached_tokens_by_level()
        with m.create_kv_cache(input_tokens=PROMPT[:9]) as c:
            assert c.reused_tokens == 8
            by_level = m.get_and_reset_iteration_reused_blocks_by_level()
            assert by_level[0].full == [0, 2]
            assert m.get_and_reset_iteration_cached_tokens_by_level() == [0, 8]
        st = m.get_storage_statistics(kvcm.GPU_LEVEL)
        descs = m.pool_group_descs
        assert [s.slot_sizes for s in st] == [[p.slot_bytes for p in d.pools] for d in descs]
        assert all(s.available == s.free + s.evictable and s.unavailable == s.total - s.available for s in st)
        peaks = m.get_and_reset_iteration_peak_block_stats(kvcm.GPU_LEVEL)
        assert len(peaks) == len(st) and all(isinstance(p, kvcm.PoolGroupPeakBlockStats) for p in peaks)
        assert all(p.unavailable > 0 for p in peaks), "caches used every group this iteration"
        assert len(m.get_and_reset_iteration_peak_block_stats_by_level()) == 2
        assert m.get_and_reset_iteration_disk_prefetch_blocks() == 0


def test_cached_tokens_by_level_follow_the_caches_pages():
    """cached_tokens_by_level counts the cache's computed tokens on the level
    their block's pages are on: reused host blocks at level 1 until resume
    brings them to the GPU, new tokens on the GPU."""
    cfg = small_config(gpu_quota=16 * 1024, host_quota=64 * 1024)
    with KVCacheManager(cfg, device="emu") as m:
        serve(m, PROMPT[:9])
        for i in range(6):  # push the first request's blocks to the host
            serve(m, list(range(5000 + 100 * i, 5000 + 100 * i + 40)))
        s = m.create_stream()
        with m.create_kv_cache(input_tokens=PROMPT[:9]) as c:
            assert c.cached_tokens_by_level == [0, 8]
            assert c.resume(s)
            assert c.cached_tokens_by_level == [8, 0]
            assert c.resize(12, 10)
            assert c.cached_tokens_by_level == [10, 0], "capacity beyond the history holds no tokens"
        s.close()


def test_peaks_include_the_counts_at_the_call():
    """get_and_reset_iteration_peak_block_stats samples the storage before it
    answers (KVCM2's rule): a manager nothing has touched yet reports its
    storage statistics' counts, not zeros."""
    with KVCacheManager(small_config(), device="emu") as m:
        st = m.get_storage_statistics(kvcm.GPU_LEVEL)
        assert m.get_and_reset_iteration_peak_block_stats(kvcm.GPU_LEVEL) == [
            kvcm.PoolGroupPeakBlockStats(s.available, s.unavailable, s.evictable) for s in st]


def test_pending_stats_commit_into_the_committed_stats():
    """A cache's block counts are pending until commit_pending_stats, which
    adds them to get_committed_stats and returns them (with the manager's
    statistics on, whether or not the cache has enable_request_stats: KVCM2
    returns the request delta from manager statistics); each commit returns
    only what came since the last;
    discard_pending_stats and closing drop them; both clear the dirty mark.
    The counts are KVCM2's, summed over the attention layer groups (full
    attention and a window of 8): 8 tokens cached, a 13-token prompt reuses
    2 blocks in each group (4 reused, no allocation), then resize(16) at
    history 8 allocates blocks 2 and 3 in each (4 allocations, all missed:
    the prompt is not computed yet)."""
    with KVCacheManager(small_config(), device="emu") as m:
        serve(m, PROMPT[:8])  # publishes 2 blocks
        s = m.create_stream()
        with m.create_kv_cache(input_tokens=PROMPT, id=5, enable_request_stats=True) as c:
            assert m.get_dirty_stats_kv_cache_ids() == {5}, "the reuse at creation is pending"
            assert m.get_committed_stats().empty
            got = c.commit_pending_stats()
            assert got == kvcm.KVCacheStatsDelta(alloc_total_blocks=0, alloc_new_blocks=0, reused_blocks=4,
                                                 missed_blocks=0)
            assert m.get_committed_stats() == got and m.get_dirty_stats_kv_cache_ids() == set()
            assert c.resume(s) and c.resize(16)
            assert m.get_dirty_stats_kv_cache_ids() == {5}
            got = c.commit_pending_stats()
            assert got == kvcm.KVCacheStatsDelta(alloc_total_blocks=4, alloc_new_blocks=4, missed_blocks=4)
            assert m.get_committed_stats().alloc_total_blocks == 4
            assert c.resize(20)
            c.discard_pending_stats()
            assert c.commit_pending_stats().empty, "discarded"
            assert m.get_committed_stats().alloc_total_blocks == 4
            c.suspend()
        with m.create_kv_cache(input_tokens=PROMPT, id=6) as c:
            assert c.commit_pending_stats() == kvcm.KVCacheStatsDelta(reused_blocks=4), \
                "without enable_request_stats the counts are returned too"
            assert m.get_committed_stats().reused_blocks == 8, "and committed"
        with m.create_kv_cache(input_tokens=PROMPT, id=7, enable_request_stats=True) as c:
            m.mark_stats_excluded(7)
            assert c.commit_pending_stats().empty
        with m.create_kv_cache(input_tokens=PROMPT, id=8) as c:
            pass
        assert m.get_dirty_stats_kv_cache_ids() == set(), "closing discards"
        assert c.commit_pending_stats().empty
        assert m.get_committed_stats().reused_blocks == 8
        s.close()


FULL_ATTENTION = [
    AttentionLayerConfig(0, [BufferConfig("key", 64), BufferConfig("value", 64)]),
    AttentionLayerConfig(1, [BufferConfig("key", 64), BufferConfig("value", 64)]),
]


def test_partial_reuse_counts_a_copy_as_one_allocation():
    """KVCM2's rule for a partial reuse: the reused blocks count as reused
    only, the partial block's private copy as one allocation (not missed:
    its source is cached) and one intra-device copy. tokens_per_block 4, a
    12-token prompt cached; a new cache reuses 9 tokens (2 full blocks and 1
    token of the third, copied), then resize(10) needs no new block:
    alloc_total 1, alloc_new 1, reused 3, missed 0; intra-device copy 1."""
    with KVCacheManager(small_config(layers=FULL_ATTENTION, enable_partial_reuse=True), device="emu") as m:
        serve(m, PROMPT[:12])
        m.get_and_reset_iteration_stats()
        s = m.create_stream()
        with m.create_kv_cache(input_tokens=PROMPT[:9]) as c:
            assert c.reused_tokens == 9
            assert c.resume(s) and c.resize(10)
            assert c.commit_pending_stats() == kvcm.KVCacheStatsDelta(alloc_total_blocks=1, alloc_new_blocks=1,
                                                                      reused_blocks=3, missed_blocks=0)
            it = m.get_and_reset_iteration_stats()[0]
            assert (it.iter_alloc_total_blocks, it.iter_alloc_new_blocks, it.iter_reused_blocks,
                    it.iter_full_reused_blocks, it.iter_partial_reused_blocks, it.iter_missed_blocks) == (1, 1, 3, 2, 1, 0)
            page_bytes = sum(p.slot_bytes for p in m.pool_group_descs[0].pools)
            assert (it.iter_intra_device_copy_blocks, it.iter_intra_device_copy_bytes) == (1, page_bytes)
            c.suspend()
        s.close()


def test_prefill_allocations_are_missed_and_decode_growth_is_generation():
    """KVCM2's rule for a fresh prompt: every block its prefill allocates is
    missed, a trailing partial block too, and growth after the prompt is
    generation-phase allocation. tokens_per_block 4, a 10-token prompt:
    resize(10) allocates 3 blocks (3 missed; the V1 rule counted the 2 full
    ones), resize(13) after the prefill 1 generation block."""
    with KVCacheManager(small_config(layers=FULL_ATTENTION), device="emu") as m:
        s = m.create_stream()
        with m.create_kv_cache(input_tokens=PROMPT[:10]) as c:
            assert c.resume(s)
            prefill(c, PROMPT[:10])
            assert c.commit_pending_stats() == kvcm.KVCacheStatsDelta(alloc_total_blocks=3, alloc_new_blocks=3,
                                                                      missed_blocks=3)
            assert c.resize(13)
            assert c.commit_pending_stats() == kvcm.KVCacheStatsDelta(alloc_total_blocks=1, alloc_new_blocks=1)
            it = m.get_and_reset_iteration_stats()[0]
            assert (it.iter_alloc_new_blocks, it.iter_missed_blocks, it.iter_gen_alloc_blocks) == (4, 3, 1)
            c.suspend()
        s.close()


def test_a_step_reverted_before_the_commit_counts_nothing():
    """KVCM2's rule for a shrink: resize takes back the pending allocations
    of the blocks it releases. tokens_per_block 4, an 8-token prompt
    prefilled and committed (2 missed); resize(12) takes a generation block,
    resize(8) reverts it: nothing is pending, nothing reaches the iteration
    statistics."""
    with KVCacheManager(small_config(layers=FULL_ATTENTION), device="emu") as m:
        s = m.create_stream()
        with m.create_kv_cache(input_tokens=PROMPT[:8]) as c:
            assert c.resume(s)
            prefill(c, PROMPT[:8])
            assert c.commit_pending_stats() == kvcm.KVCacheStatsDelta(alloc_total_blocks=2, alloc_new_blocks=2,
                                                                      missed_blocks=2)
            m.get_and_reset_iteration_stats()
            assert c.resize(12) and c.resize(8)
            assert c.commit_pending_stats().empty
            assert m.get_and_reset_iteration_stats() == {}
            c.suspend()
        s.close()


def test_pending_stats_with_stats_disabled_are_request_only():
    """With enable_stats=False a cache created with enable_request_stats
    still records its counts (dirty mark, commit_pending_stats returns them:
    KVCM2's request-only accounting) but they reach neither the committed
    nor the iteration statistics; a cache without it records nothing. A
    fresh prompt has nothing pending at creation (KVCM2 counts no miss
    there); resize(8) allocates 2 blocks in each attention layer group,
    missed."""
    with KVCacheManager(small_config(enable_stats=False), device="emu") as m:
        s = m.create_stream()
        with m.create_kv_cache(input_tokens=PROMPT, id=1, enable_request_stats=True) as c:
            assert m.get_dirty_stats_kv_cache_ids() == set(), "nothing pending at creation"
            assert c.commit_pending_stats().empty
            assert c.resume(s) and c.resize(8)
            assert m.get_dirty_stats_kv_cache_ids() == {1}
            assert c.commit_pending_stats() == kvcm.KVCacheStatsDelta(alloc_total_blocks=4, alloc_new_blocks=4,
                                                                      missed_blocks=4)
            assert c.commit_pending_stats().empty, "each commit returns what came since the last"
            m.mark_stats_excluded(1)
            assert c.resize(12)
            assert c.commit_pending_stats().empty, "an excluded id discards"
            c.suspend()
        with m.create_kv_cache(input_tokens=PROMPT, id=2) as c:
            assert m.get_dirty_stats_kv_cache_ids() == set()
            assert c.commit_pending_stats().empty
        assert m.get_committed_stats().empty
        assert m.get_and_reset_iteration_stats() == {}
        s.close()


def test_caches_count_their_suspensions_and_recoveries():
    """A cache's suspend counts a suspension and each resume after its first
    a recovery (the first is its admission), as KVCacheManagerV2's cache
    counts them itself; an excluded id and disabled statistics count
    nothing."""
    for stats in (True, False):
        with KVCacheManager(small_config(enable_stats=stats), device="emu") as m:
            s = m.create_stream()
            with m.create_kv_cache(input_tokens=PROMPT, id=3) as c:
                assert c.resume(s)
                assert m.get_and_reset_iteration_suspend_resume_stats() == (0, 0), "admission"
                c.suspend()
                assert c.resume()
                c.suspend()
                assert m.get_and_reset_iteration_suspend_resume_stats() == ((2, 1) if stats else (0, 0))
                m.mark_stats_excluded(3)
                assert c.resume()
                c.suspend()
                assert m.get_and_reset_iteration_suspend_resume_stats() == (0, 0), "excluded"
            s.close()


def test_suspend_resume_counters_and_stats_marks():
    """The engine's suspend/resume reports are counted per iteration; dirty
    and excluded marks are sets of cache ids (exclusion clears dirtiness)."""
    with KVCacheManager(small_config(), device="emu") as m:
        m.record_request_suspended()
        m.record_request_suspended()
        m.record_request_resumed()
        assert m.get_and_reset_iteration_suspend_resume_stats() == (2, 1)
        assert m.get_and_reset_iteration_suspend_resume_stats() == (0, 0)
        m.mark_stats_dirty(7)
        m.mark_stats_dirty(None)
        assert m.get_dirty_stats_kv_cache_ids() == {7}
        m.mark_stats_excluded(7)
        assert m.is_stats_excluded(7) and m.get_dirty_stats_kv_cache_ids() == set()
        m.clear_stats_excluded(7)
        assert not m.is_stats_excluded(7) and not m.is_stats_excluded(None)


def test_events_carry_v1_block_hashes_a_router_recomputes():
    """With the v1 hash (hash_algo "auto"), stored blocks carry TensorRT-LLM's
    v1 block hashes chained from the prompt, the scope's LoRA id and salt;
    a chain committed in one iteration is one stored event per layer group;
    events appear at flush."""
    em = KVCacheEventManager(100, hash_algo="auto", window_size=64)
    with KVCacheManager(small_config(), em, device="emu") as m:
        created = em.get_latest_events(timeout_ms=0)
        assert created == [], "published at the first flush"
        em.flush_iteration_events()
        created = em.get_latest_events(timeout_ms=0)
        assert [e.layer_group_id for e in created] == [0, 1]
        assert all(isinstance(e.data, kvcm.KVCacheCreatedData) for e in created)
        assert created[0].data.num_blocks_per_cache_level == [m.pool_group_descs[0].num_slots]
        assert created[1].window_size == 8 and created[0].window_size == 64

        serve(m, PROMPT[:12], scope=ReuseScope(lora_id=5, salt="tenant"))
        em.flush_iteration_events()
        events = em.get_latest_events(timeout_ms=0)
        stored = [e for e in events if isinstance(e.data, kvcm.KVCacheStoredData) and e.layer_group_id == 0]
        assert len(stored) == 1 and stored[0].hash_algo == "v1_block_key"
        blocks = stored[0].data.blocks
        from kvcm.events import cache_salt_id

        h0 = hash_v1_block_key(PROMPT[0:4], 0, 5, cache_salt_id("tenant"))
        h1 = hash_v1_block_key(PROMPT[4:8], h0, 5)
        h2 = hash_v1_block_key(PROMPT[8:12], h1, 5)
        assert [b.block_hash for b in blocks] == [h0, h1, h2]
        assert stored[0].data.parent_hash is None
        assert [t.token_id for t in blocks[0].tokens] == PROMPT[0:4]
        assert (blocks[0].cache_level, blocks[0].priority) == (0, 35)
        assert hash_v1_block_key(PROMPT[0:4], 0, 5, cache_salt_id("other")) != h0
        # The serializer dispatches on the data classes' names and reads
        # plain fields: every event is JSON as a tree of dataclasses.
        assert {type(e.data).__name__ for e in events} <= {"KVCacheStoredData", "KVCacheRemovedData",
                                                          "KVCacheUpdatedData", "KVCacheCreatedData"}
        json.dumps([dataclasses.asdict(e) for e in created + events])


def test_events_report_level_moves_priorities_and_removals():
    """A block offloaded to the host is an updated event with the cache level
    diff; a descendant committed with a higher priority raises its
    ancestors' (priority diff); a block leaving the cache is removed."""
    em = KVCacheEventManager(1000, hash_algo="v2_sha256_64")
    cfg = small_config(gpu_quota=16 * 1024, host_quota=16 * 1024)
    with KVCacheManager(cfg, event_manager=em, device="emu") as m:
        serve(m, PROMPT[:8])
        serve(m, PROMPT[:13], priority=lambda block, _id: 80)
        for i in range(12):
            serve(m, list(range(5000 + 100 * i, 5000 + 100 * i + 40)))
        em.flush_iteration_events()
        events = em.get_latest_events()
        updated = [e.data for e in events if isinstance(e.data, kvcm.KVCacheUpdatedData)]
        prio = [d.priority for d in updated if d.priority is not None]
        assert kvcm.KVCacheEventDiff(35, 80) in prio
        levels = [d.cache_level for d in updated if d.cache_level is not None]
        assert kvcm.KVCacheEventDiff(0, 1) in levels
        removed = [h for e in events if isinstance(e.data, kvcm.KVCacheRemovedData) for h in e.data.block_hashes]
        stored = [b.block_hash for e in events if isinstance(e.data, kvcm.KVCacheStoredData) for b in e.data.blocks]
        assert removed and set(removed) <= set(stored)
        assert all(isinstance(h, int) for h in stored)


def test_event_manager_takes_raw_block_keys_of_stored_blocks_only():
    """add_removed_event, add_removed_life_cycle_event and add_updated_event
    take a block's raw key (bytes: sequence_to_blockchain_keys' keys): a
    block the manager reported stored is reported by its event hash (removed
    per layer group it was stored for) and forgotten; unknown raw keys change
    nothing (KVCM2's rule); event hashes (str, int) pass as they are."""
    em = KVCacheEventManager(100, window_size=64)
    with KVCacheManager(small_config(), em, device="emu") as m:
        serve(m, PROMPT[:8])
        em.flush_iteration_events()
        stored = {e.layer_group_id: [b.block_hash for b in e.data.blocks] for e in em.get_latest_events(0)
                  if isinstance(e.data, kvcm.KVCacheStoredData)}
        keys = [k for _, k in kvcm.sequence_to_blockchain_keys(4, ReuseScope(), PROMPT[:8])][1:]
        assert stored == {0: [keys[0].hex(), keys[1].hex()], 1: [keys[0].hex(), keys[1].hex()]}
        h0, h1 = stored[0]

        em.add_removed_event([b"short", b"\0" * 8])
        em.add_removed_life_cycle_event(b"\0" * 8, 0)
        em.add_updated_event(b"\0" * 8, cache_level=kvcm.KVCacheEventDiff(0, 1))
        em.flush_iteration_events()
        assert em.get_latest_events(0) == [], "unknown raw keys are no-ops"

        em.add_updated_event(keys[1], priority=kvcm.KVCacheEventDiff(35, 50), layer_group_id=1)
        em.add_removed_life_cycle_event(keys[1], 1)
        em.add_removed_life_cycle_event(keys[1], 1)
        em.add_removed_event(keys[0])
        em.add_removed_event(keys[0])
        em.add_removed_event("foreign")
        em.flush_iteration_events()
        got = [(e.layer_group_id, e.data) for e in em.get_latest_events(0)]
        assert got == [
            (1, kvcm.KVCacheUpdatedData(h1, None, kvcm.KVCacheEventDiff(35, 50))),
            (1, kvcm.KVCacheRemovedData([h1, h0])),
            (0, kvcm.KVCacheRemovedData([h0])),
            (None, kvcm.KVCacheRemovedData(["foreign"])),
        ]
        em.add_removed_event(keys[1])
        em.flush_iteration_events()
        assert [(e.layer_group_id, e.data) for e in em.get_latest_events(0)] == [
            (0, kvcm.KVCacheRemovedData([h1]))], "layer group 1's page was removed already"


@pytest.mark.parametrize("algo", ["v2_sha256", "v2_sha256_64"])
def test_v2_event_hashes_are_kvcm2s_forms_of_the_raw_keys(algo):
    """Under the v2 algorithms a stored block's hash is what KVCM2 makes of
    its raw key (the bytes probe_first_new_block_key and
    sequence_to_blockchain_keys give): the key's hex, or its 8 bytes read
    big-endian (truncate_sha256_hash_to_int64); the hex form turns back into
    the raw key with bytes.fromhex."""
    em = KVCacheEventManager(100, window_size=64, hash_algo=algo)
    form = (lambda raw: raw.hex()) if algo == "v2_sha256" else (lambda raw: int.from_bytes(raw[:8], "big"))
    with KVCacheManager(small_config(), em, device="emu") as m:
        first = m.probe_first_new_block_key(ReuseScope(), PROMPT[:12])
        serve(m, PROMPT[:12])
        em.flush_iteration_events()
        stored = [b.block_hash for e in em.get_latest_events(0) if isinstance(e.data, kvcm.KVCacheStoredData)
                  and e.layer_group_id == 0 for b in e.data.blocks]
        keys = [k for _, k in kvcm.sequence_to_blockchain_keys(4, ReuseScope(), PROMPT[:12])][1:]
        assert stored == [form(k) for k in keys]
        assert stored[0] == form(first)
        if algo == "v2_sha256":
            em.add_updated_event(bytes.fromhex(stored[0]), cache_level=kvcm.KVCacheEventDiff(0, 1), layer_group_id=0)
            em.flush_iteration_events()
            assert [e.data.block_hash for e in em.get_latest_events(0)] == [stored[0]]


def test_events_gathered_over_attention_dp_ranks_publish_on_rank_0():
    """With attention_dp_gather, flush hands the local events to the gather
    function and rank 0 publishes every rank's."""
    seen = []

    def gather(local):
        seen.append(len(local))
        return [local, local]

    em = KVCacheEventManager(10, attention_dp_rank=0, attention_dp_gather=gather)
    with KVCacheManager(small_config(), em, device="emu"):
        em.flush_iteration_events()
    assert seen == [2] and len(em.get_latest_events(0)) == 4
    with pytest.raises(ValueError, match="hash_algo: Unsupported V2 KV cache event hash algorithm"):
        KVCacheEventManager(10, hash_algo="md5")  # names the argument, in KVCM2's words


def test_layout_queries_agree_on_every_page_address():
    """Pool group descs carry KVCM2's fields and slot layouts; for every
    buffer, SHARED and PER_LAYER indices from the converter address the same
    bytes as kvcm's BufferLocation, below the page index upper bound."""
    with KVCacheManager(small_config(), device="emu") as m:
        descs = m.pool_group_descs
        assert [d.pool_group_index for d in descs] == list(range(len(descs)))
        lg_to_pg = m.get_life_cycle_pool_group_indices()
        for d in descs:
            assert [p.pool_index for p in d.pools] == list(range(len(d.pools)))
            for v in d.slot_desc.variants:
                assert lg_to_pg[v.layer_group_id] == d.pool_group_index
                assert v.slot_size_list == [p.slot_bytes for p in d.pools]
        assert sorted(m.all_buffer_ids) == sorted(kvcm.BufferId(i, r) for i in (0, 1, 2) for r in ("key", "value"))
        s = m.create_stream()
        with m.create_kv_cache(input_tokens=PROMPT) as c:
            c.resume(s)
            c.resize(len(PROMPT))
            for bid in m.all_buffer_ids:
                loc = m.get_buffer_location(*bid)
                conv = m.get_page_index_converter(*bid)
                assert (conv.scale, conv.expansion, conv.layer_offset) == (m.get_page_index_scale(*bid), 1, loc.offset)
                base = list(c.get_page_indices(loc.layer_group))
                stride = m.get_page_stride(*bid)
                bound = m.get_page_index_upper_bound(*bid)
                for mode in (None, PageIndexMode.SHARED, PageIndexMode.PER_LAYER):
                    addr = m.get_mem_pool_base_address(*bid, mode)
                    for b, i in zip(base, conv(base, mode)):
                        if b >= 0:
                            assert addr + i * stride == loc.page_address(b)
                            assert 0 <= i < bound + (loc.offset if mode == PageIndexMode.PER_LAYER else 0)
            c.suspend()
        assert m.supports_index_mode(PageIndexMode.PER_LAYER) and m.supports_index_mode(PageIndexMode.SHARED)


def test_manager_constructor_takes_the_event_manager_second():
    """KVCacheManager(config, event_manager, cold_page_codec): a codec passed
    second is consumed and refused; the keyword keeps working; init_config
    is a copy; num_live_managers counts open managers."""
    codec = kvcm.create_default_kv_cache_cold_page_codec()
    with pytest.raises(TypeError, match="cold_page_codec="):
        KVCacheManager(small_config(), codec, device="emu")
    with pytest.raises(kvcm.ConsumedError):
        KVCacheManager(small_config(), cold_page_codec=codec, device="emu")
    before = kvcm.num_live_managers()
    cfg = small_config()
    with KVCacheManager(cfg, cold_page_codec=kvcm.create_default_kv_cache_cold_page_codec(), device="emu") as m:
        assert kvcm.num_live_managers() == before + 1
        assert m.init_config == cfg and m.init_config is not cfg
        assert m.event_manager is None and m.allow_seq_rebasing is False and not m.need_adjustment
        assert (m.commit_min_snapshot, m.text_only) == (False, False)
    assert kvcm.num_live_managers() == before
    assert kvcm.take_poison() is None



def _two_group_config(window, quota, size=2 << 20, **kw):
    """A sliding-window and a full-attention layer of one buffer of size
    bytes each (one shared pool group), 32 tokens a block."""
    layers = [AttentionLayerConfig(layer_id=0, buffers=[BufferConfig(role="key", size=size)],
                                   sliding_window_size=window, num_sink_tokens=0),
              AttentionLayerConfig(layer_id=1, buffers=[BufferConfig(role="key", size=size)])]
    return KVCacheManagerConfig(tokens_per_block=32, cache_tiers=[GpuCacheTierConfig(quota=quota, pool_granularity=0)],
                                layers=layers, **kw)


def test_gpu_pools_hold_a_window_per_layer_group_above_the_quota():
    """As in KVCM2, the GPU pools hold at least a window's worth of slots per
    layer group (sinks + (window + tpb - 2) // tpb + 1 for a sliding window,
    the largest of those for full attention): a 4 MiB quota for two 2 MiB
    layer groups with a 32-token window gets 4 slots, so one sequence of 96
    tokens fits (3 full-attention blocks and the window's one) and two fit 32
    tokens."""
    with KVCacheManager(_two_group_config(32, 4 << 20), device="emu") as m:
        (st,) = m.get_storage_statistics(kvcm.GPU_LEVEL)
        assert st.total == 4 and m.get_quota(0) == 4 * (2 << 20)
        assert m.clamp_max_seq_len_for_mem(batch_size=1, token_num_upper_bound=96) == 96
        assert m.clamp_max_seq_len_for_mem(batch_size=2, token_num_upper_bound=96) == 32


def test_constraints_beyond_the_quota_raise_it_with_resume_headroom():
    """As in KVCM2, constraints are feasibility floors: a quota of exactly the
    pages of 32 one-token requests is raised so that each pool group holds
    them under max_util_for_resume (32 / 0.95, rounded up: 34 slots), and the
    whole batch resumes."""
    cfg = _two_group_config(64, 32 * 2 * 4096, size=4096, max_util_for_resume=0.95,
                            constraints=[BatchDesc(kv_caches=[KVCacheDesc(capacity=1, history_length=0)] * 32)])
    with KVCacheManager(cfg, device="emu") as m:
        (st,) = m.get_storage_statistics(kvcm.GPU_LEVEL)
        assert st.total == 2 * 34, "one shared pool group: 34 slots per layer group"
        s = m.create_stream()
        caches = [m.create_kv_cache() for _ in range(32)]
        for c in caches:
            assert c.resume(s)
            c.capacity = 1
        for c in caches:
            c.suspend()
            c.close()


@pytest.mark.parametrize("batch_size", [1, 3])
def test_clamped_sequence_length_fits_and_one_block_more_does_not(batch_size):
    """clamp_max_seq_len_for_mem gives the longest sequence that fits next to
    batch_size - 1 one-token requests: allocating it succeeds, one block
    more runs out of pages."""
    with KVCacheManager(small_config(gpu_quota=16 * 1024, max_util_for_resume=1.0), device="emu") as m:
        n = m.clamp_max_seq_len_for_mem(batch_size, 1 << 20)
        assert 0 < n < 1 << 20 and n % 4 == 0
        assert m.clamp_max_seq_len_for_mem(batch_size, 5) == 5
        s = m.create_stream()
        others = [m.create_kv_cache() for _ in range(batch_size - 1)]
        for c in others:
            c.resume(s)
            c.resize(1)
        big = m.create_kv_cache()
        big.resume(s)
        big.resize(n, n)  # computed: windowed layer groups keep their window only
        assert not big.resize(n + 4, n + 4), "one block more: out of pages (resize returns False)"
        for c in [*others, big]:
            c.suspend()
            c.close()


def test_gpu_pools_are_kvcm2_granules_by_default():
    """GpuCacheTierConfig's default pool_granularity is KVCacheManagerV2's
    2 MiB granule: five granules for slots of a granule less a byte and of a
    granule give them 2 and 3 slots; pool_granularity=0 sizes the pools to
    the byte."""
    grain = 2 << 20

    def config(**tier):
        return kvcm.KVCacheManagerConfig(
            tokens_per_block=4, cache_tiers=[kvcm.GpuCacheTierConfig(5 * grain, **tier)],
            layers=[kvcm.AttentionLayerConfig(0, [kvcm.BufferConfig("key", grain - 1)], sliding_window_size=4),
                    kvcm.AttentionLayerConfig(1, [kvcm.BufferConfig("key", grain)])],
            constraints=[kvcm.BatchDesc([kvcm.KVCacheDesc(capacity=4, history_length=0)])])

    with kvcm.KVCacheManager(config(), device="emu") as m:
        assert [s.total for s in m.get_storage_statistics(kvcm.GPU_LEVEL)] == [2, 3]
        assert m.get_quota(kvcm.GPU_LEVEL) == 5 * grain
    with kvcm.KVCacheManager(config(pool_granularity=0), device="emu") as m:
        assert [s.total for s in m.get_storage_statistics(kvcm.GPU_LEVEL)] == [2, 2]


def test_pool_granularity_is_validated():
    """A pool_granularity below -1 is an InvalidConfigError naming it."""
    cfg = small_config(tiers=[GpuCacheTierConfig(1 << 20, pool_granularity=-2)])
    with pytest.raises(kvcm.InvalidConfigError) as ei:
        kvcm.KVCacheManager(cfg, device="emu")
    assert ei.value.field == "cache_tiers[0].pool_granularity"
