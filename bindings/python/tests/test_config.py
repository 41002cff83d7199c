"""Configuration errors name the offending field, from the library's validation."""

from __future__ import annotations

import pytest
from conftest import small_config

import kvcm
from kvcm import (
    AttentionLayerConfig,
    BatchDesc,
    BufferConfig,
    DiskCacheTierConfig,
    GpuCacheTierConfig,
    HostCacheTierConfig,
    InvalidConfigError,
    KVCacheManager,
    KVCacheManagerConfig,
    RequestDesc,
)


def expect_field(cfg, field: str, fragment: str = "") -> InvalidConfigError:
    with pytest.raises(InvalidConfigError) as ei:
        KVCacheManager(cfg, device="emu")
    e = ei.value
    assert e.field == field, str(e)
    assert field in str(e)
    assert fragment in str(e)
    assert isinstance(e, ValueError) and isinstance(e, kvcm.KVCacheError)
    assert e.code == 6
    return e


def test_tokens_per_block():
    expect_field(_with(tokens_per_block=0), "tokens_per_block", "positive")


def _with(**changes):
    cfg = small_config()
    for k, v in changes.items():
        setattr(cfg, k, v)
    return cfg


def test_buffer_size_names_nested_field():
    cfg = small_config()
    cfg.layers[1].buffers[0].size = 0
    expect_field(cfg, "layers[1].buffers[0].size", "positive")


def test_duplicate_role():
    cfg = small_config()
    cfg.layers[0].buffers[1].role = "key"
    expect_field(cfg, "layers[0].buffers[1].role", "duplicate")


def test_duplicate_layer_id():
    cfg = small_config()
    cfg.layers[2].layer_id = 0
    expect_field(cfg, "layers[2].layer_id")


def test_sink_tokens_need_window():
    cfg = small_config()
    cfg.layers[0].num_sink_tokens = 4
    expect_field(cfg, "layers[0].num_sink_tokens", "window")


def test_first_tier_must_be_gpu():
    expect_field(_with(cache_tiers=[HostCacheTierConfig(1 << 20)]), "cache_tiers[0].kind")


def test_tier_order():
    tiers = [GpuCacheTierConfig(1 << 20), HostCacheTierConfig(1 << 20), HostCacheTierConfig(1 << 20)]
    expect_field(_with(cache_tiers=tiers), "cache_tiers[2].kind")


def test_quota_positive():
    expect_field(_with(cache_tiers=[GpuCacheTierConfig(0)]), "cache_tiers[0].quota", "positive")


def test_max_quota_at_least_quota():
    expect_field(_with(cache_tiers=[GpuCacheTierConfig(1 << 20, max_quota=1 << 10)]), "cache_tiers[0].max_quota")


def test_disk_path_must_exist(tmp_path):
    tiers = [GpuCacheTierConfig(1 << 20), DiskCacheTierConfig(1 << 20, tmp_path / "missing")]
    expect_field(_with(cache_tiers=tiers), "cache_tiers[1].path")


def test_max_util_for_resume_range():
    expect_field(_with(max_util_for_resume=1.5), "max_util_for_resume")


@pytest.mark.parametrize("zero", [0, 0.0, -0.0])
def test_explicit_zero_max_util_for_resume_is_rejected(zero):
    # An explicit 0 is out of (0, 1]: the C ABI would read it as unset and
    # silently apply the default, so the binding rejects it naming the field.
    expect_field(_with(max_util_for_resume=zero), "max_util_for_resume", "(0, 1]")


def test_disk_path_with_nul_is_rejected(tmp_path):
    # A NUL byte would cut the C string (here to an existing directory):
    # rejected naming the field, not silently shortened.
    tiers = [GpuCacheTierConfig(1 << 20), DiskCacheTierConfig(1 << 20, str(tmp_path) + "\0/elsewhere")]
    expect_field(_with(cache_tiers=tiers), "cache_tiers[1].path", "NUL byte")


def test_role_with_nul_is_rejected():
    # A NUL byte would cut the role to another (here duplicate-free) name.
    cfg = small_config()
    cfg.layers[0].buffers[1].role = "value\0x"
    expect_field(cfg, "layers[0].buffers[1].role", "NUL byte")


def test_initial_pool_ratio_length():
    expect_field(_with(initial_pool_ratio=[1.0, 1.0, 1.0]), "initial_pool_ratio", "one per layer group")


def test_initial_pool_ratio_entries():
    expect_field(_with(initial_pool_ratio=[1.0, -1.0]), "initial_pool_ratio[1]")


def test_constraint_history_length():
    bad = BatchDesc([RequestDesc(capacity=8, history_length=16)])
    expect_field(_with(constraints=[BatchDesc([RequestDesc(4)]), bad]), "constraints[1].kv_caches[0].history_length")


def test_typical_step_capacity():
    expect_field(_with(typical_step=BatchDesc([RequestDesc(capacity=-1)])), "typical_step.kv_caches[0].capacity")


def test_no_layers():
    expect_field(_with(layers=[]), "layers", "at least one")


def test_huge_quota_names_the_field():
    # Slots x bytes is checked arithmetic: 2^63-1 is refused naming the field,
    # not overflowed into a negative size.
    expect_field(_with(cache_tiers=[GpuCacheTierConfig((1 << 63) - 1)]), "cache_tiers[0].quota",
                 "more than the 2147483647 a pool group can index")
    expect_field(_with(cache_tiers=[GpuCacheTierConfig(1 << 20, max_quota=(1 << 63) - 1)]),
                 "cache_tiers[0].max_quota")


def test_quota_below_the_floors_is_raised_to_them():
    """As in KVCM2, a GPU quota below the pools' floors (a window's worth of
    slots per layer group: 8-token window, 4-token blocks: (8 + 2) // 4 + 1 = 3
    slots, the full-attention group too) is raised to them."""
    with KVCacheManager(_with(cache_tiers=[GpuCacheTierConfig(16, pool_granularity=0)]), device="emu") as m:
        stats = m.get_storage_statistics(0)
        assert [s.total for s in stats] == [3] * len(stats)
        assert m.get_quota(0) == sum(3 * sum(s.slot_sizes) for s in stats)


@pytest.mark.parametrize(
    "mutate, field",
    [
        (lambda c: setattr(c, "tokens_per_block", "4"), "tokens_per_block"),
        (lambda c: c.layers.append("layer"), "layers[3]"),
        (lambda c: c.layers[0].buffers.append(("key", 1)), "layers[0].buffers[2]"),
        (lambda c: setattr(c.layers[1].buffers[0], "size", 1.5), "layers[1].buffers[0].size"),
        (lambda c: c.cache_tiers.append(object()), "cache_tiers[1]"),
        (lambda c: setattr(c, "constraints", [BatchDesc([RequestDesc("8")])]), "constraints[0].kv_caches[0].capacity"),
    ],
)
def test_type_errors_name_the_field(mutate, field):
    cfg = small_config()
    mutate(cfg)
    with pytest.raises(TypeError) as ei:
        KVCacheManager(cfg, device="emu")
    assert str(ei.value).startswith(field + ":"), str(ei.value)


def test_valid_config_with_every_tier(tmp_path):
    cfg = small_config(
        tiers=[GpuCacheTierConfig(64 << 10, max_quota=128 << 10, pool_granularity=0), HostCacheTierConfig(64 << 10),
               DiskCacheTierConfig(64 << 10, str(tmp_path))],
        initial_pool_ratio=[0.75, 0.25],
        constraints=[BatchDesc([RequestDesc(16, 8)])],
        enable_partial_reuse=True,
        enable_stats=True,
    )
    with KVCacheManager(cfg, device="emu") as m:
        assert m.num_cache_levels == 3
        assert m.cache_tier_list == [kvcm.CacheTier.GPU_MEM, kvcm.CacheTier.HOST_MEM, kvcm.CacheTier.DISK]
        assert m.get_quota(0) == 64 << 10
        assert m.enable_partial_match


def test_trtllm_defaults():
    layer = AttentionLayerConfig(layer_id=3, buffers=[BufferConfig(role="key", size=64)])
    assert layer.sliding_window_size is None and layer.num_sink_tokens is None and layer.window_size is None
    cfg = KVCacheManagerConfig(tokens_per_block=4, cache_tiers=[GpuCacheTierConfig(1 << 20)], layers=[layer])
    assert cfg.max_util_for_resume == 0.97
    assert cfg.enable_partial_reuse is True and cfg.enable_stats is True
    assert (cfg.reuse_match_backoff, cfg.text_only, cfg.commit_min_snapshot, cfg.swa_scratch_reuse) == (0, False, False, None)
    assert (cfg.rebalance_min_sampled_kv_caches, cfg.rebalance_cooldown_secs, cfg.rebalance_target_ratio_update_interval,
            cfg.rebalance_ratio_threshold, cfg.rebalance_moving_average_decay) == (2000, 120.0, 100, 1.25, 0.9999)
    assert GpuCacheTierConfig(10).max_quota is None
    assert GpuCacheTierConfig(10).tier == kvcm.CacheTier.GPU_MEM


def test_xxh3_block_key_reuses_prefixes_under_other_keys():
    """block_key=BlockKey.XXH3 reuses prefixes as SHA-256 does, under keys
    that differ from the default (SHA-256) keys of the same blocks."""
    prompt = list(range(100, 113))
    full_attention = [AttentionLayerConfig(0, [BufferConfig("key", 64), BufferConfig("value", 64)])]

    def stored_keys(block_key):
        with KVCacheManager(small_config(layers=full_attention, block_key=block_key), device="emu") as m:
            s = m.create_stream()
            with m.create_kv_cache(input_tokens=prompt) as c:
                c.resume(s)
                c.resize(len(prompt), len(prompt))
                c.commit(prompt)
            assert m.probe_reuse(prompt) == 12
            return [e.key for e in m.drain_events() if e.kind == kvcm.EventKind.BLOCK_STORED]

    assert small_config().block_key == kvcm.BlockKey.SHA256
    xxh3, sha = stored_keys(kvcm.BlockKey.XXH3), stored_keys(kvcm.BlockKey.SHA256)
    assert len(xxh3) == len(sha) == 3
    assert xxh3 != sha


def test_block_key_must_be_a_block_key():
    with pytest.raises(TypeError, match="^block_key: expected a BlockKey"):
        KVCacheManager(_with(block_key=1), device="emu")


def _shared(**changes):
    s = kvcm.SharedCacheTierConfig(addresses=["127.0.0.1:7101", "127.0.0.1:7102"], namespace="ns", ttl_ms=60000)
    for k, v in changes.items():
        setattr(s, k, v)
    return s


def test_shared_tier_is_accepted_and_needs_no_server():
    """A shared tier after the local tiers is accepted; a cluster that cannot be reached is no error."""
    cfg = small_config(host_quota=64 * 1024)
    cfg.cache_tiers.append(_shared())
    with KVCacheManager(cfg, device="emu"):
        pass


@pytest.mark.parametrize("changes,field", [
    ({"namespace": "a b"}, "namespace"),
    ({"addresses": []}, "addresses"),
    ({"addresses": ["127.0.0.1:1", "nohost"]}, "addresses[1]"),
    ({"addresses": ["a:1,b:2"]}, "addresses[0]"),
    ({"ttl_ms": -1}, "ttl"),
    ({"call_timeout_ms": -5}, "call_timeout"),
    ({"write_policy": 9}, "write_policy"),
])
def test_shared_tier_errors_name_the_field(changes, field):
    cfg = small_config()
    n = len(cfg.cache_tiers)
    cfg.cache_tiers.append(_shared(**changes))
    expect_field(cfg, f"cache_tiers[{n}].{field}")


def test_shared_tier_must_be_last():
    cfg = small_config()
    cfg.cache_tiers = [cfg.cache_tiers[0], _shared(), HostCacheTierConfig(quota=1 << 20)]
    expect_field(cfg, "cache_tiers[2].kind", "last")


def test_shared_tier_field_types():
    cfg = small_config()
    cfg.cache_tiers.append(_shared(addresses="127.0.0.1:1"))
    with pytest.raises(TypeError, match=r"cache_tiers\[\d\]\.addresses"):
        KVCacheManager(cfg, device="emu")


def _layers():
    return [AttentionLayerConfig(0, [BufferConfig("key", 64)]), AttentionLayerConfig(1, [BufferConfig("key", 64)])]


@pytest.mark.parametrize("make, field", [
    (lambda: KVCacheManagerConfig(4, [HostCacheTierConfig(1 << 20)], _layers()), "cache_tiers[0]"),
    (lambda: KVCacheManagerConfig(4, [], _layers()), "cache_tiers"),
    (lambda: KVCacheManagerConfig(4, [GpuCacheTierConfig(1 << 20)], _layers() + _layers()[:1]), "layers[2].layer_id"),
    (lambda: KVCacheManagerConfig(4, [GpuCacheTierConfig(1 << 20)],
                                  [AttentionLayerConfig(0, [BufferConfig("key", 64, tokens_per_block_override=3)])]),
     "layers[0].buffers[0].tokens_per_block_override"),
    (lambda: AttentionLayerConfig(0, [BufferConfig("key", 64), BufferConfig("key", 64)]), "buffers[1].role"),
    (lambda: small_config(rebalance_min_sampled_kv_caches=-1), "rebalance_min_sampled_kv_caches"),
    (lambda: small_config(rebalance_cooldown_secs=float("nan")), "rebalance_cooldown_secs"),
    (lambda: small_config(rebalance_target_ratio_update_interval=0), "rebalance_target_ratio_update_interval"),
    (lambda: small_config(rebalance_ratio_threshold=1.0), "rebalance_ratio_threshold"),
    (lambda: small_config(rebalance_moving_average_decay=0.0), "rebalance_moving_average_decay"),
])
def test_constructors_assert_kvcm2s_construction_rules(make, field):
    """What KVCacheManagerV2's config constructors assert (the first tier is
    the GPU, layer ids and a layer's buffer roles are distinct, overrides
    divide tokens_per_block, the rebalance_* ranges) is refused where the
    value is made, by an error that is an AssertionError (its pure-Python
    backend) and an InvalidConfigError, a ValueError (its C++ backend),
    naming the field."""
    with pytest.raises(AssertionError) as e:
        make()
    assert isinstance(e.value, InvalidConfigError) and isinstance(e.value, ValueError)
    assert e.value.field == field and field in str(e.value)


def test_constructors_leave_values_of_other_types_to_the_manager():
    """A value of the wrong type is not judged by the constructor: the
    manager's checks name its full path."""
    cfg = KVCacheManagerConfig(4, [GpuCacheTierConfig(1 << 20)], _layers(), rebalance_ratio_threshold="2")
    with pytest.raises(TypeError, match="rebalance_ratio_threshold"):
        KVCacheManager(cfg, device="emu")
