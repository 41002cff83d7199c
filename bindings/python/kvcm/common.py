"""The module-level names of TensorRT-LLM's ``kv_cache_manager_v2`` (KVCM2):
its type aliases, constants, small helpers, enums and :class:`ReuseScope`.

The aliases are ``typing.NewType``\\ s of ``int`` as in KVCM2 (calling one
returns its argument), so annotations written against KVCM2 type-check the
same way with kvcm.
"""

from __future__ import annotations

import enum
from typing import NamedTuple, NewType, Union

from ._native import ffi

__all__ = [
    "LifeCycleId", "LayerGroupId", "CacheLevel", "TokenId", "TokenIdExt", "LayerId", "CudaStream",
    "BeamIndex", "MemAddress", "Priority", "PoolGroupIndex", "PoolIndex", "SlidingWindowSize",
    "NDEBUG", "DEFAULT_BEAM_INDEX", "MAX_BEAM_WIDTH", "DEFAULT_PRIORITY", "BAD_PAGE_INDEX", "GPU_LEVEL", "CACHE_LEVEL1",
    "exact_div", "typed_range", "HalfOpenRange",
    "PageStatus", "PageIndexMode", "ReuseScope",
]

LifeCycleId = NewType("LifeCycleId", int)
"""A layer group: the layers sharing one attention-window shape."""
LayerGroupId = LifeCycleId
CacheLevel = NewType("CacheLevel", int)
"""A cache tier's position, hottest (the GPU, 0) first."""
TokenId = NewType("TokenId", int)
TokenIdExt = Union[TokenId, bytes, "MmItemContext"]  # kvcm.multimodal.MmItemContext
"""A token of a prompt: a text token id, or a multimodal item's 32-byte
digest as ``bytes`` or an ``MmItemContext`` (see :mod:`kvcm.multimodal`); a
text-only cache refuses digests with ``TypeError``."""
LayerId = NewType("LayerId", int)
CudaStream = NewType("CudaStream", int)
BeamIndex = NewType("BeamIndex", int)
MemAddress = NewType("MemAddress", int)
Priority = NewType("Priority", int)
PoolGroupIndex = NewType("PoolGroupIndex", int)
PoolIndex = NewType("PoolIndex", int)
SlidingWindowSize = Union[int, None]
"""A layer's attention window in tokens; ``None`` is full attention."""

NDEBUG: int = 1
"""1: the library is a release build (its invariants are checked regardless)."""
DEFAULT_BEAM_INDEX: BeamIndex = BeamIndex(ffi.KVCM_DEFAULT_BEAM_INDEX)
"""The beam the single-beam calls read: beam 0, which holds the committed tokens' KV."""
MAX_BEAM_WIDTH: int = ffi.KVCM_MAX_BEAM_WIDTH
"""The largest beam width a cache may have (a kvcm extension)."""
DEFAULT_PRIORITY: Priority = Priority(ffi.KVCM_DEFAULT_PRIORITY)
"""The eviction priority of a block allocated without a priority callback;
``KVCacheManager.set_block_priorities`` returns blocks to the common order
with it (a kvcm extension)."""
BAD_PAGE_INDEX: int = ffi.KVCM_BAD_PAGE_INDEX
"""A page index of a block without a page in a layer group."""
GPU_LEVEL: CacheLevel = CacheLevel(0)
CACHE_LEVEL1: CacheLevel = CacheLevel(1)


def exact_div(x: int, y: int) -> int:
    """x // y, raising ``ValueError`` unless y divides x."""
    q, r = divmod(x, y)
    if r:
        raise ValueError(f"exact_div: {x} is not a multiple of {y}")
    return q


def typed_range(*args: int) -> range:
    """``range(*args)`` (KVCM2 types its elements; Python ints need nothing)."""
    return range(*args)


class HalfOpenRange:
    """The integers in [beg, end); empty (and false) when end <= beg."""

    __slots__ = ("_beg", "_end")

    def __init__(self, beg: int, end: int) -> None:
        self._beg = beg
        self._end = end

    @property
    def beg(self) -> int:
        return self._beg

    @property
    def end(self) -> int:
        return self._end

    def __len__(self) -> int:
        return max(self._end - self._beg, 0)

    def __bool__(self) -> bool:
        return self._end > self._beg

    def __contains__(self, x: object) -> bool:
        return isinstance(x, int) and self._beg <= x < self._end

    def __iter__(self):
        return iter(range(self._beg, self._end))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, HalfOpenRange):
            return NotImplemented
        return (self._beg, self._end) == (other._beg, other._end)

    def __hash__(self) -> int:
        return hash((self._beg, self._end))

    def __repr__(self) -> str:
        return f"HalfOpenRange({self._beg}, {self._end})"


class PageStatus(enum.Enum):
    """A page's hold state: LOCKED (an ACTIVE cache uses it), HELD (a cache
    holds it), DROPPABLE (only the reuse tree keeps it: evictable)."""

    LOCKED = enum.auto()
    HELD = enum.auto()
    DROPPABLE = enum.auto()


class PageIndexMode(enum.IntEnum):
    """How kernel-facing page indices count: SHARED from the buffer's own
    base address (one index space per pool, scaled per buffer), PER_LAYER
    from the pool's base address, the buffer's offset included."""

    SHARED = 0
    PER_LAYER = 1


class ReuseScope(NamedTuple):
    """The reuse namespace of a request: blocks are shared only between
    requests with equal scopes. ``lora_id=None`` (no adapter) and
    ``lora_id=0`` are different scopes, as in KVCM2; ``salt`` (an int, or
    kvcm's bytes/str salt) isolates tenants."""

    lora_id: int | None = None
    salt: int | bytes | str | None = None
