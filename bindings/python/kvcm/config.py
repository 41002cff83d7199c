"""The manager configuration, with TensorRT-LLM kv_cache_manager_v2's names.

These classes are plain data. The library validates a configuration when a
:class:`~kvcm.KVCacheManager` is created and raises
:class:`~kvcm.InvalidConfigError` whose ``field`` names the offending field
with its path (``"layers[2].buffers[0].size"``), exactly as the Go core does;
the Python layer itself checks types, raising ``TypeError`` with the same
field paths, and the values the C ABI cannot carry (an explicit
``max_util_for_resume=0``, which the C struct reads as unset; a NUL byte in a
path or role, where the C string would end), raising
:class:`~kvcm.InvalidConfigError` naming the field.
"""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass, field
from typing import Sequence, Union

from .errors import InvalidConfigError

__all__ = [
    "CacheTier",
    "DataRole",
    "BufferConfig",
    "AttentionLayerConfig",
    "GpuCacheTierConfig",
    "HostCacheTierConfig",
    "DiskCacheTierConfig",
    "SharedWritePolicy",
    "SharedCacheTierConfig",
    "CacheTierConfig",
    "RequestDesc",
    "BatchDesc",
    "KVCacheManagerConfig",
]

DataRole = str
"""A buffer's role within its layer, such as ``"key"`` or ``"value"``."""


class CacheTier(enum.IntEnum):
    """A cache tier's kind (the C ABI's ``kvcm_tier_kind``)."""

    GPU_MEM = 0
    HOST_MEM = 1
    DISK = 2


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_int(path: str, v: object, *, optional: bool = False) -> None:
    if optional and v is None:
        return
    if not _is_int(v):
        raise TypeError(f"{path}: expected an int, got {type(v).__name__}")


@dataclass(slots=True)
class BufferConfig:
    """One per-layer buffer: its role and the bytes it needs per block."""

    role: DataRole
    size: int

    def _check_types(self, path: str) -> None:
        if not isinstance(self.role, str):
            raise TypeError(f"{path}.role: expected a str, got {type(self.role).__name__}")
        _check_int(f"{path}.size", self.size)


@dataclass(slots=True)
class AttentionLayerConfig:
    """One attention layer. ``sliding_window_size=None`` is full attention;
    ``num_sink_tokens`` are the leading tokens a windowed layer always keeps."""

    layer_id: int
    buffers: list[BufferConfig]
    sliding_window_size: int | None = None
    num_sink_tokens: int | None = None

    @property
    def window_size(self) -> int | None:
        return self.sliding_window_size

    def _check_types(self, path: str) -> None:
        _check_int(f"{path}.layer_id", self.layer_id)
        _check_int(f"{path}.sliding_window_size", self.sliding_window_size, optional=True)
        _check_int(f"{path}.num_sink_tokens", self.num_sink_tokens, optional=True)
        if isinstance(self.buffers, (str, bytes)) or not isinstance(self.buffers, Sequence):
            raise TypeError(f"{path}.buffers: expected a list of BufferConfig")
        for j, b in enumerate(self.buffers):
            if not isinstance(b, BufferConfig):
                raise TypeError(f"{path}.buffers[{j}]: expected a BufferConfig, got {type(b).__name__}")
            b._check_types(f"{path}.buffers[{j}]")


@dataclass(slots=True)
class GpuCacheTierConfig:
    """The GPU tier: ``quota`` bytes, growable by ``KVCacheManager.resize`` up
    to ``max_quota`` (default: ``quota``), reserved up front so pool base
    addresses never move."""

    quota: int
    max_quota: int | None = None

    @property
    def tier(self) -> CacheTier:
        return CacheTier.GPU_MEM


@dataclass(slots=True)
class HostCacheTierConfig:
    """A host tier of mapped pinned memory, ``quota`` bytes."""

    quota: int

    @property
    def tier(self) -> CacheTier:
        return CacheTier.HOST_MEM


@dataclass(slots=True)
class DiskCacheTierConfig:
    """A disk tier: one file per cold pool group under directory ``path``."""

    quota: int
    path: Union[str, "os.PathLike[str]"]

    @property
    def tier(self) -> CacheTier:
        return CacheTier.DISK


class SharedWritePolicy(enum.IntEnum):
    """When committed blocks reach the shared tier (``kvcm_shared_write_policy``);
    asynchronous either way, skipping blocks already there."""

    WRITE_BACK_ON_EVICTION = 0
    """Written when evicted from the last local level (the default)."""
    WRITE_THROUGH_ON_COMMIT = 1
    """Written when committed."""


@dataclass(slots=True)
class SharedCacheTierConfig:
    """A cold tier shared across nodes on a Redis Cluster, after every local
    tier: ``addresses`` are seed nodes (``"host:port"``), ``namespace``
    prefixes every key (1 to 64 bytes of printable ASCII without spaces,
    ``:`` or braces). It has no quota: the cluster's maxmemory with an
    evicting policy is its quota; ``ttl_ms`` (0: no expiry) bounds a blob's
    life. Timeouts and ``queue_bytes`` of 0 select the defaults (2000 ms,
    256 MiB). The manager does not use the shared tier yet: a manager with
    one behaves as without it, and contacts no server."""

    addresses: list[str]
    namespace: str
    ttl_ms: int = 0
    dial_timeout_ms: int = 0
    call_timeout_ms: int = 0
    queue_bytes: int = 0
    write_policy: SharedWritePolicy = SharedWritePolicy.WRITE_BACK_ON_EVICTION

    def _check_types(self, path: str) -> None:
        if isinstance(self.addresses, (str, bytes)) or not isinstance(self.addresses, Sequence):
            raise TypeError(f"{path}.addresses: expected a list of str")
        for j, a in enumerate(self.addresses):
            if not isinstance(a, str):
                raise TypeError(f"{path}.addresses[{j}]: expected a str, got {type(a).__name__}")
        if not isinstance(self.namespace, str):
            raise TypeError(f"{path}.namespace: expected a str, got {type(self.namespace).__name__}")
        for name in ("ttl_ms", "dial_timeout_ms", "call_timeout_ms", "queue_bytes"):
            _check_int(f"{path}.{name}", getattr(self, name))
        _check_int(f"{path}.write_policy", self.write_policy)

    def _check_c_values(self, path: str) -> None:
        """The C struct carries the addresses comma-separated and every
        string NUL-terminated."""
        for j, a in enumerate(self.addresses):
            if "," in a:
                raise InvalidConfigError(f"invalid config: {path}.addresses[{j}]: contains a comma",
                                         code=6, field=f"{path}.addresses[{j}]")
            if a == "":
                raise InvalidConfigError(f"invalid config: {path}.addresses[{j}]: is empty",
                                         code=6, field=f"{path}.addresses[{j}]")
            _check_no_nul(f"{path}.addresses[{j}]", a.encode())
        _check_no_nul(f"{path}.namespace", self.namespace.encode())


CacheTierConfig = Union[GpuCacheTierConfig, HostCacheTierConfig, DiskCacheTierConfig, SharedCacheTierConfig]


@dataclass(slots=True)
class RequestDesc:
    """One request of a batch: tokens with pages, and computed tokens."""

    capacity: int
    history_length: int = 0


@dataclass(slots=True)
class BatchDesc:
    """One batch step: its requests."""

    requests: list[RequestDesc]


def _check_batch(path: str, b: object) -> None:
    if not isinstance(b, BatchDesc):
        raise TypeError(f"{path}: expected a BatchDesc, got {type(b).__name__}")
    for i, r in enumerate(b.requests):
        if not isinstance(r, RequestDesc):
            raise TypeError(f"{path}.requests[{i}]: expected a RequestDesc, got {type(r).__name__}")
        _check_int(f"{path}.requests[{i}].capacity", r.capacity)
        _check_int(f"{path}.requests[{i}].history_length", r.history_length)


@dataclass(slots=True)
class KVCacheManagerConfig:
    """The manager's configuration (TensorRT-LLM's ``KVCacheManagerConfig``).

    ``cache_tiers`` are hottest first: one GPU tier, then at most one host
    tier, then at most one disk tier, then at most one shared tier. ``max_util_for_resume``, in (0, 1]
    (default 0.95), refuses ``resume`` while the GPU tier is busier; 0 is
    rejected rather than read as the default, as the C ABI would. ``initial_pool_ratio``
    has one hot-tier byte ratio per layer group; without it ``typical_step``
    decides, else ``constraints``, else every layer group gets the same
    number of slots. ``constraints`` are batches the GPU tier must always
    hold.
    """

    tokens_per_block: int
    cache_tiers: list[CacheTierConfig]
    layers: list[AttentionLayerConfig]
    max_util_for_resume: float = 0.95
    enable_partial_reuse: bool = False
    initial_pool_ratio: list[float] | None = None
    typical_step: BatchDesc | None = None
    constraints: list[BatchDesc] = field(default_factory=list)
    enable_stats: bool = False

    def _check_types(self) -> None:
        _check_int("tokens_per_block", self.tokens_per_block)
        for name in ("cache_tiers", "layers"):
            v = getattr(self, name)
            if isinstance(v, (str, bytes)) or not isinstance(v, Sequence):
                raise TypeError(f"{name}: expected a list, got {type(v).__name__}")
        for i, t in enumerate(self.cache_tiers):
            if not isinstance(t, (GpuCacheTierConfig, HostCacheTierConfig, DiskCacheTierConfig,
                                  SharedCacheTierConfig)):
                raise TypeError(
                    f"cache_tiers[{i}]: expected GpuCacheTierConfig, HostCacheTierConfig, "
                    f"DiskCacheTierConfig or SharedCacheTierConfig, got {type(t).__name__}"
                )
            if isinstance(t, SharedCacheTierConfig):
                t._check_types(f"cache_tiers[{i}]")
                continue
            _check_int(f"cache_tiers[{i}].quota", t.quota)
            if isinstance(t, GpuCacheTierConfig):
                _check_int(f"cache_tiers[{i}].max_quota", t.max_quota, optional=True)
            if isinstance(t, DiskCacheTierConfig) and not isinstance(t.path, (str, os.PathLike)):
                raise TypeError(f"cache_tiers[{i}].path: expected a str or path, got {type(t.path).__name__}")
        for i, layer in enumerate(self.layers):
            if not isinstance(layer, AttentionLayerConfig):
                raise TypeError(f"layers[{i}]: expected an AttentionLayerConfig, got {type(layer).__name__}")
            layer._check_types(f"layers[{i}]")
        if not isinstance(self.max_util_for_resume, (int, float)) or isinstance(self.max_util_for_resume, bool):
            raise TypeError("max_util_for_resume: expected a float")
        if self.initial_pool_ratio is not None:
            for i, r in enumerate(self.initial_pool_ratio):
                if not isinstance(r, (int, float)) or isinstance(r, bool):
                    raise TypeError(f"initial_pool_ratio[{i}]: expected a float, got {type(r).__name__}")
        if self.typical_step is not None:
            _check_batch("typical_step", self.typical_step)
        for i, b in enumerate(self.constraints or ()):
            _check_batch(f"constraints[{i}]", b)

    def _check_c_values(self) -> None:
        """Rejects (after _check_types) the values the C struct cannot carry
        as given: the library would read them differently."""
        if self.max_util_for_resume == 0:
            raise InvalidConfigError(
                "invalid config: max_util_for_resume: must be in (0, 1], got 0 "
                "(the C ABI reads 0 as unset; omit the field for the default 0.95)",
                code=6, field="max_util_for_resume")
        for i, t in enumerate(self.cache_tiers):
            if isinstance(t, DiskCacheTierConfig):
                _check_no_nul(f"cache_tiers[{i}].path", os.fsencode(t.path))
            if isinstance(t, SharedCacheTierConfig):
                # The C struct passes it apart from cache_tiers, after them.
                if i != len(self.cache_tiers) - 1:
                    raise InvalidConfigError(
                        f"invalid config: cache_tiers[{i + 1}].kind: the shared tier must be the last tier",
                        code=6, field=f"cache_tiers[{i + 1}].kind")
                t._check_c_values(f"cache_tiers[{i}]")
        for i, layer in enumerate(self.layers):
            for j, b in enumerate(layer.buffers):
                _check_no_nul(f"layers[{i}].buffers[{j}].role", b.role.encode())


def _check_no_nul(path: str, s: bytes) -> None:
    """A NUL byte would silently end the C string: reject it."""
    at = s.find(b"\0")
    if at >= 0:
        raise InvalidConfigError(f"invalid config: {path}: contains a NUL byte at offset {at}", code=6, field=path)
