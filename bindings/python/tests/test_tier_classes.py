"""The public shape of the tier classes (GpuCacheTierConfig,
HostCacheTierConfig, DiskCacheTierConfig): TensorRT-LLM kv_cache_manager_v2's
names, fields, field order and defaults with kvcm's extensions, their repr,
equality and slots, the tier each names, and the errors naming a tier's
field. Whether the classes are typed by hand or generated, this is their
contract."""

from __future__ import annotations

import dataclasses
import os
import pathlib

import pytest
from conftest import small_config

import kvcm
from kvcm import (
    CacheTier,
    DiskCacheTierConfig,
    GpuCacheTierConfig,
    HostCacheTierConfig,
    InvalidConfigError,
    KVCacheManager,
)

REQUIRED = dataclasses.MISSING

SHAPES = {
    GpuCacheTierConfig: [("quota", REQUIRED), ("max_quota", None), ("pool_granularity", -1)],
    HostCacheTierConfig: [("quota", REQUIRED)],
    DiskCacheTierConfig: [("quota", REQUIRED), ("path", REQUIRED), ("persistent", False)],
}


@pytest.mark.parametrize("cls", list(SHAPES), ids=lambda c: c.__name__)
def test_fields_in_order_with_their_defaults(cls):
    """Each tier class is a dataclass of exactly these fields, in this order
    (positional arguments follow it), with these defaults."""
    fields = dataclasses.fields(cls)
    assert [(f.name, f.default) for f in fields] == SHAPES[cls]
    assert all(f.default_factory is dataclasses.MISSING for f in fields)
    assert cls.__match_args__ == tuple(name for name, _ in SHAPES[cls])


def test_positional_arguments_follow_the_field_order(tmp_path):
    assert GpuCacheTierConfig(1, 2, 3) == GpuCacheTierConfig(quota=1, max_quota=2, pool_granularity=3)
    assert HostCacheTierConfig(5) == HostCacheTierConfig(quota=5)
    assert DiskCacheTierConfig(7, tmp_path, True) == DiskCacheTierConfig(quota=7, path=tmp_path, persistent=True)


def test_required_fields_are_required():
    with pytest.raises(TypeError):
        GpuCacheTierConfig()
    with pytest.raises(TypeError):
        HostCacheTierConfig()
    with pytest.raises(TypeError):
        DiskCacheTierConfig(1)


def test_repr_names_the_class_and_every_field():
    assert repr(GpuCacheTierConfig(1 << 20)) == "GpuCacheTierConfig(quota=1048576, max_quota=None, pool_granularity=-1)"
    assert repr(HostCacheTierConfig(3)) == "HostCacheTierConfig(quota=3)"
    assert repr(DiskCacheTierConfig(3, "/tmp/x")) == "DiskCacheTierConfig(quota=3, path='/tmp/x', persistent=False)"


def test_equality_is_by_class_and_fields():
    assert GpuCacheTierConfig(1) == GpuCacheTierConfig(1)
    assert GpuCacheTierConfig(1) != GpuCacheTierConfig(1, max_quota=2)
    assert GpuCacheTierConfig(1) != HostCacheTierConfig(1)
    assert HostCacheTierConfig(1) != DiskCacheTierConfig(1, "/tmp")
    assert GpuCacheTierConfig.__hash__ is None, "mutable dataclasses are unhashable"


def test_instances_are_mutable_and_slotted():
    t = GpuCacheTierConfig(1)
    t.quota = 2
    assert t.quota == 2
    with pytest.raises(AttributeError):
        t.unknown = 1
    assert not hasattr(t, "__dict__")


def test_each_class_names_its_tier():
    assert GpuCacheTierConfig(1).tier is CacheTier.GPU_MEM
    assert HostCacheTierConfig(1).tier is CacheTier.HOST_MEM
    assert DiskCacheTierConfig(1, "/tmp").tier is CacheTier.DISK
    assert kvcm.CacheTierConfig.__args__[:3] == (GpuCacheTierConfig, HostCacheTierConfig, DiskCacheTierConfig)


def test_assert_valid_is_kv_cache_manager_v2s(tmp_path):
    GpuCacheTierConfig(1).assert_valid()
    GpuCacheTierConfig(1, max_quota=1).assert_valid()
    with pytest.raises(AssertionError, match="^Quota must be positive$"):
        GpuCacheTierConfig(0).assert_valid()
    with pytest.raises(AssertionError, match="^max_quota must be at least quota$"):
        GpuCacheTierConfig(2, max_quota=1).assert_valid()
    with pytest.raises(AssertionError, match="^Quota must be positive$"):
        HostCacheTierConfig(0).assert_valid()
    DiskCacheTierConfig(1, tmp_path).assert_valid()
    with pytest.raises(AssertionError, match="^Quota must be positive$"):
        DiskCacheTierConfig(0, tmp_path).assert_valid()
    missing = tmp_path / "missing"
    with pytest.raises(AssertionError) as ei:
        DiskCacheTierConfig(1, missing).assert_valid()
    assert str(ei.value) == f"Disk path {missing} does not exist or is not a directory"
    assert isinstance(ei.value, ValueError) and ei.value.field == "path"


def test_assert_valid_failures_are_also_value_errors_naming_the_field():
    """KVCacheManagerV2's C++ backend raises ValueError from assert_valid,
    its Python backend AssertionError: kvcm's ConfigAssertionError is both, an
    InvalidConfigError naming the field."""
    for bad, field in ((GpuCacheTierConfig(0), "quota"), (GpuCacheTierConfig(2, max_quota=1), "max_quota"),
                       (HostCacheTierConfig(-1), "quota")):
        with pytest.raises(ValueError) as ei:
            bad.assert_valid()
        assert isinstance(ei.value, AssertionError) and isinstance(ei.value, kvcm.InvalidConfigError)
        assert ei.value.field == field


@pytest.mark.parametrize(
    "tiers, message",
    [
        (lambda d: [GpuCacheTierConfig("1")], "cache_tiers[0].quota: expected an int, got str"),
        (lambda d: [GpuCacheTierConfig(1 << 20, max_quota=1.5)], "cache_tiers[0].max_quota: expected an int, got float"),
        (lambda d: [GpuCacheTierConfig(1 << 20, pool_granularity=True)],
         "cache_tiers[0].pool_granularity: expected an int, got bool"),
        (lambda d: [GpuCacheTierConfig(1 << 20), HostCacheTierConfig(None)], "cache_tiers[1].quota: expected an int, got NoneType"),
        (lambda d: [GpuCacheTierConfig(1 << 20), DiskCacheTierConfig(True, d)], "cache_tiers[1].quota: expected an int, got bool"),
        (lambda d: [GpuCacheTierConfig(1 << 20), DiskCacheTierConfig(1 << 20, 3)],
         "cache_tiers[1].path: expected a str or path, got int"),
        (lambda d: [GpuCacheTierConfig(1 << 20), DiskCacheTierConfig(1 << 20, os.fsencode(d))],
         "cache_tiers[1].path: expected a str or path, got bytes"),
        (lambda d: [GpuCacheTierConfig(1 << 20), DiskCacheTierConfig(1 << 20, d, persistent=1)],
         "cache_tiers[1].persistent: expected a bool, got int"),
        (lambda d: [GpuCacheTierConfig(1 << 20, max_quota="2", pool_granularity="x")],
         "cache_tiers[0].max_quota: expected an int, got str"),
    ],
)
def test_type_errors_name_the_tier_field(tmp_path, tiers, message):
    """A field of the wrong type is a TypeError naming the field's path
    (the first wrong field in field order), before any C call."""
    with pytest.raises(TypeError) as ei:
        KVCacheManager(small_config(tiers=tiers(tmp_path)), device="emu")
    assert str(ei.value) == message


def test_value_errors_name_the_tier_field(tmp_path):
    """Values the C ABI cannot carry or the library refuses are
    InvalidConfigError naming the field."""
    cases = [
        ([GpuCacheTierConfig(1 << 20, pool_granularity=-2)], "cache_tiers[0].pool_granularity"),
        ([GpuCacheTierConfig(1 << 20), DiskCacheTierConfig(1 << 20, str(tmp_path) + "\0x")], "cache_tiers[1].path"),
        ([GpuCacheTierConfig(1 << 20), HostCacheTierConfig(-1)], "cache_tiers[1].quota"),
    ]
    for tiers, field in cases:
        with pytest.raises(InvalidConfigError) as ei:
            KVCacheManager(small_config(tiers=tiers), device="emu")
        assert ei.value.field == field, str(ei.value)


def test_path_takes_a_str_or_a_path_object(tmp_path):
    """A disk tier's path is a str or an os.PathLike; both open the same
    directory, and persistent reaches the library (kvcm_manager_config's
    disk_persistent)."""
    for name, as_path, persistent in (("str", str, True), ("pathlike", pathlib.Path, True), ("temporary", str, False)):
        d = tmp_path / name
        d.mkdir()
        tiers = [GpuCacheTierConfig(4 * 128, pool_granularity=0), DiskCacheTierConfig(32 * 128, as_path(d), persistent=persistent)]
        with KVCacheManager(small_config(tiers=tiers), device="emu") as m:
            assert m.cache_tier_list == [CacheTier.GPU_MEM, CacheTier.DISK]
        assert any(d.iterdir()) == persistent, f"{name}: a persistent tier keeps its files, another removes them"


def test_max_quota_none_is_quota_and_a_value_reserves_room():
    """max_quota None is the quota (no room to grow, so resize beyond it is
    False); a max_quota reserves room up to it."""
    with KVCacheManager(small_config(tiers=[GpuCacheTierConfig(64 << 10, pool_granularity=0)]), device="emu") as m:
        assert m.resize(0, 128 << 10) is False
        assert m.get_quota(0) == 64 << 10
    cfg = small_config(tiers=[GpuCacheTierConfig(64 << 10, max_quota=128 << 10, pool_granularity=0)])
    with KVCacheManager(cfg, device="emu") as m:
        assert m.resize(0, 128 << 10) is True
        assert m.get_quota(0) == 128 << 10


def test_copies_and_pickles_are_equal(tmp_path):
    """KVCacheManager.init_config is a copy: a tier copies and pickles to an
    equal value of its class."""
    import copy
    import pickle

    for t in (GpuCacheTierConfig(1, 2, 0), HostCacheTierConfig(3), DiskCacheTierConfig(4, str(tmp_path), True)):
        for c in (copy.copy(t), copy.deepcopy(t), pickle.loads(pickle.dumps(t))):
            assert c == t and type(c) is type(t)
