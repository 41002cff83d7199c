"""KVCacheManagerV2's ``_introspection``: white-box hooks its tests use to
look inside the manager (page states, pool ratios, tree pages). The hooks
whose answer is public data of a kvcm manager are computed from kvcm's public
API (the pool groups' sizes and slot counts, the layer groups of the
configured layers, the pages of a reuse match with the tokens they cover,
the pool group of a layer group, whether a cache takes commits); a test
calling any other fails with KVCM2InternalError naming it."""

from __future__ import annotations

from typing import Any, NoReturn

import kvcm

from ._internal import KVCM2InternalError


def storage_statistics(manager: Any, cache_level: int = 0) -> list[Any]:
    """The pool groups' slot counts at a level: ``get_storage_statistics``."""
    return list(manager.get_storage_statistics(cache_level))


def storage_utilization(manager: Any, cache_level: int = 0) -> list[float]:
    """Per pool group, the slots neither free nor evictable over its slots."""
    return [s.unavailable / s.total for s in manager.get_storage_statistics(cache_level)]


def current_gpu_ratio(manager: Any) -> list[float]:
    """Per GPU pool group, its share of the GPU pools' bytes."""
    sizes = [sum(s.slot_sizes) * s.total for s in manager.get_storage_statistics(kvcm.GPU_LEVEL)]
    total = sum(sizes)
    return [b / total for b in sizes]


def _layer_groups(manager: Any, want: Any) -> list[int]:
    ids: set[int] = set()
    for layer in manager.init_config.layers:
        if want(layer):
            ids.add(int(manager.get_layer_group_id(layer.layer_id)))
    return sorted(ids)


def attention_life_cycle_ids(manager: Any) -> list[int]:
    """The layer groups of the attention layers, in order."""
    return _layer_groups(manager, lambda layer: not isinstance(layer, kvcm.SsmLayerConfig))


def swa_life_cycle_ids(manager: Any) -> list[int]:
    """The layer groups of the sliding-window attention layers, in order."""
    return _layer_groups(manager, lambda layer: not isinstance(layer, kvcm.SsmLayerConfig)
                         and layer.sliding_window_size is not None)


def ssm_life_cycle_id(manager: Any) -> int | None:
    """The SSM layer group, None without SSM layers."""
    ids = _layer_groups(manager, lambda layer: isinstance(layer, kvcm.SsmLayerConfig))
    return ids[0] if ids else None


def reuse_match_pages(manager: Any, reuse_scope: Any, tokens: Any, lc_id: int,
                      enable_partial: bool = False) -> tuple[int, list[tuple[int, int] | None]]:
    """The tokens matched and, per block, ``(slot, covered tokens)`` of the
    layer group's page covering the most of it, None without one:
    ``probe_reuse_pages``."""
    n, pages = manager.probe_reuse_pages(reuse_scope, list(tokens), lc_id, enable_partial)
    return n, [None if p is None else (p.slot, p.covered) for p in pages]


def pool_group_index(manager: Any, lc_id: int, cache_level: int = 0) -> int:
    """The pool group of a layer group at a level:
    ``get_life_cycle_pool_group_indices``."""
    return manager.get_life_cycle_pool_group_indices(cache_level)[lc_id]


def is_commit_allowed(kv_cache: Any) -> bool:
    """Whether the cache still takes commits: kvcm's ``is_commit_allowed``."""
    return kv_cache.is_commit_allowed


def __getattr__(name: str) -> NoReturn:
    if name.startswith("__"):
        raise AttributeError(name)

    def fail(*_args: Any, **_kwargs: Any) -> NoReturn:
        raise KVCM2InternalError(f"_introspection.{name} is internal to KVCacheManagerV2; kvcm has none")

    return fail  # type: ignore[return-value]
