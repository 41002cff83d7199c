"""``tensorrt_llm.runtime.kv_cache_manager_v2`` as a program that imports it
sees it, with kvcm in its place: every public name is kvcm's own object.

The private modules TensorRT-LLM's tests import names from
(``_common``, ``_utils``, ``_exceptions``, ...) are here too. Their public
names are kvcm's where kvcm has them; the test harness helpers of
``_utils`` (streams, ``init_cuda_once``, small integer helpers) run on the
manager's device; KVCacheManagerV2's internal classes (its radix tree
hasher, slot allocator, storage manager, copy engine) have no kvcm
counterpart and raise :class:`KVCM2InternalError` when used.
"""

from __future__ import annotations

import weakref

import kvcm
from kvcm import *  # noqa: F401,F403 - the drop-in: kvcm's names are the package's names
from kvcm import _KVCache  # noqa: F401

from . import _introspection  # noqa: F401

# The device helpers of the test harness (_utils streams, the emulated
# kernels) work on the newest manager: TensorRT-LLM's streams are the
# process's, kvcm's belong to a manager.
_managers: "list[weakref.ref[kvcm.KVCacheManager]]" = []

if not getattr(kvcm.KVCacheManager.__init__, "_trtllm_shim", False):
    _init = kvcm.KVCacheManager.__init__

    def _tracked_init(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        _init(self, *args, **kwargs)
        _managers.append(weakref.ref(self))

    _tracked_init._trtllm_shim = True  # type: ignore[attr-defined]
    kvcm.KVCacheManager.__init__ = _tracked_init  # type: ignore[method-assign]


def newest_manager() -> "kvcm.KVCacheManager":
    """The most recently created manager that is still open."""
    for ref in reversed(_managers):
        m = ref()
        if m is not None and not m.closed:
            return m
    raise RuntimeError("the test harness needs a stream, but no kvcm manager is open")


class _HarnessStorage:
    """What TensorRT-LLM's FakeEngine reads of KVCacheManagerV2's private
    storage object: the layer -> layer group map (kvcm's
    ``get_layer_group_id``)."""

    def __init__(self, manager: "kvcm.KVCacheManager") -> None:
        self._layer_to_life_cycle_ids = {lid: manager.get_layer_group_id(lid) for lid in manager.layer_ids}


_harness_storage: "weakref.WeakKeyDictionary[kvcm.KVCacheManager, _HarnessStorage]" = weakref.WeakKeyDictionary()


def _storage_of(manager: "kvcm.KVCacheManager") -> _HarnessStorage:
    st = _harness_storage.get(manager)
    if st is None:
        st = _harness_storage[manager] = _HarnessStorage(manager)
    return st


if not hasattr(kvcm.KVCacheManager, "_storage"):
    kvcm.KVCacheManager._storage = property(_storage_of)  # type: ignore[attr-defined]
