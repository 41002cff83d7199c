"""KVCM2's statistics records.

:class:`KVCacheStatsDelta` and :class:`KVCacheIterationStatsDelta` are
mutable counters with ``add``, ``subtract``, ``copy``, ``clear`` and
``empty``, as in KVCM2, so engines that aggregate them keep working.

The fields of those that mirror a C struct are generated from the ABI
description into :mod:`kvcm._ffi` (``//kvcm:pyvalue``, with ``_from_c``);
the classes here derive from them and add the counters' behaviour.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from . import _ffi

__all__ = [
    "KVCacheStatsDelta", "KVCacheIterationStatsDelta", "ReusedBlocksByLevel", "PoolGroupPeakBlockStats",
    "StorageStatistics", "SsmSnapshotIterationStatsDelta",
]


class _Counters:
    """add/subtract/copy/clear/empty over every (int) field."""

    __slots__ = ()

    def add(self, other: "_Counters") -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def subtract(self, other: "_Counters") -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) - getattr(other, f.name))

    def copy(self):
        return replace(self)

    def clear(self) -> None:
        for f in fields(self):
            setattr(self, f.name, 0)

    @property
    def empty(self) -> bool:
        return all(getattr(self, f.name) == 0 for f in fields(self))


@dataclass(slots=True)
class KVCacheStatsDelta(_ffi.KVCacheStatsDelta, _Counters):
    """A cache's block counts, by KVCM2's rules (see
    ``_KVCache.commit_pending_stats``): allocations (a reused block is none),
    reused blocks, and the allocations made before the history reached the
    prompt (missed)."""


@dataclass(slots=True)
class KVCacheIterationStatsDelta(_ffi.KVCacheIterationStatsDelta, _Counters):
    """One layer group's counters over an iteration (see
    ``KVCacheManager.get_and_reset_iteration_stats``)."""

    @property
    def iter_cache_hit_rate(self) -> float:
        """Reused over looked-up (reused + missed) blocks; 0 when none."""
        n = self.iter_reused_blocks + self.iter_missed_blocks
        return self.iter_reused_blocks / n if n else 0.0


@dataclass(slots=True)
class SsmSnapshotIterationStatsDelta(_ffi.SsmSnapshotIterationStatsDelta, _Counters):
    """The SSM layer group's snapshot lookups over an iteration (see
    ``KVCacheManager.get_and_reset_ssm_snapshot_iteration_stats``): one
    lookup per cache created with input tokens, a hit when it reused a
    snapshot; aligned hits end on a block boundary, unaligned ones resumed
    from the state of a partial block published at close."""

    @property
    def iter_snapshot_hit_rate(self) -> float:
        """Hits over lookups; 0 when none."""
        n = self.iter_snapshot_lookups
        return self.iter_snapshot_hits / n if n else 0.0


@dataclass(slots=True)
class ReusedBlocksByLevel:
    """Reused pages by the cache level they were on (index: level)."""

    full: list[int]
    partial: list[int]


PoolGroupPeakBlockStats = _ffi.PoolGroupPeakBlockStats
"""The peaks of a pool group's available, unavailable and evictable slots
over an iteration (generated: ``//kvcm:pyvalue``)."""


@dataclass(slots=True, frozen=True)
class StorageStatistics:
    """One pool group's slot counts, with its pools' slot sizes."""

    slot_sizes: list[int]
    total: int
    free: int
    evictable: int

    @property
    def available(self) -> int:
        return self.free + self.evictable

    @property
    def unavailable(self) -> int:
        return self.total - self.available
