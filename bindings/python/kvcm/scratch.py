"""SWA scratch reuse and planned drops (KVCacheManagerV2's
SwaScratchReuseConfig, ScratchDesc and PlannedDropHandle).

With ``KVCacheManagerConfig.swa_scratch_reuse`` set, a step's blocks of a
sliding-window layer group that are out of the window by the end of the
step get no page (their base page index is -1): they share a few scratch
slots of the cache, described by ``_KVCache.get_scratch_desc``, and
``PageIndexConverter(..., PageIndexMode.PER_LAYER, scratch)`` maps them into
those slots one layer at a time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from . import _native
from ._managed import Managed
from .common import HalfOpenRange
from .errors import InvalidStateError

__all__ = ["SwaScratchReuseConfig", "ScratchDesc", "PlannedDropHandle", "AlreadyDroppedError"]


class AlreadyDroppedError(InvalidStateError, ValueError):
    """A planned drop carried out a second time: an InvalidStateError, and a
    ValueError as KVCacheManagerV2 raises."""


@dataclass(slots=True)
class SwaScratchReuseConfig:
    """The last ``max_rewind_len`` tokens of a step may be rewound (rejected
    draft tokens) and survive as history, so their blocks always get pages.
    Not negative."""

    max_rewind_len: int = 0


@dataclass(slots=True, frozen=True)
class ScratchDesc:
    """The scratch blocks of a layer group in a cache's current step
    (``range``, block ordinals) and the cache's scratch slots of it
    (``slot_ids``, GPU slots of the layer group's pool group). False when
    the range is empty. Valid until the cache's next resize, commit,
    suspend or close."""

    range: HalfOpenRange
    slot_ids: Sequence[int]

    def __bool__(self) -> bool:
        return bool(self.range)


class PlannedDropHandle(Managed):
    """A plan to drop a finished turn's committed sliding-window pages
    (``_KVCache.plan_committed_block_drop``). ``drop()`` carries it out
    once (a second call raises AlreadyDroppedError); when the handle goes
    (``close()``, garbage collection) without a drop, the plan is carried
    out then, as KVCacheManagerV2's handle does."""

    _what = "planned drop"

    def __init__(self, handle: int) -> None:
        super().__init__()
        self._adopt(handle)

    def _release(self, handle: int) -> None:
        _native.call("kvcm_planned_drop_destroy", handle)

    def drop(self) -> None:
        """Drop every planned page no other plan names, unless a cache uses
        it now."""
        try:
            _native.call("kvcm_planned_drop_drop", self._native())
        except InvalidStateError as e:
            raise AlreadyDroppedError(str(e)) from None
