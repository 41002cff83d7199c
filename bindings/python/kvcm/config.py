"""The manager configuration, with TensorRT-LLM kv_cache_manager_v2's names.

These classes are plain data: the fields of those that mirror a C struct
(buffers, layers, batches, the shared tier, the manager's configuration) and
their conversion to it are generated from the ABI description into
:mod:`kvcm._values` (``//kvcm:pyconfig``), and so are the tier classes, one
C struct split by kind, with their type checks (``//kvcm:pyvariant``); the
classes here derive from them and add the type checks, ``assert_valid`` and
TensorRT-LLM's aliases. The library validates a configuration when a
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

import math
import os
from dataclasses import dataclass
from typing import Sequence, Union

from . import _values
from ._values import _check_int
from ._ffi import BlockKey, CacheTier, SharedWritePolicy
from .errors import ConfigAssertionError, InvalidConfigError, SsmNeedsSnapshotError
from .scratch import SwaScratchReuseConfig

__all__ = [
    "CacheTier",
    "DataRole",
    "BufferConfig",
    "AttentionLayerConfig",
    "SsmLayerConfig",
    "GpuCacheTierConfig",
    "HostCacheTierConfig",
    "DiskCacheTierConfig",
    "SharedWritePolicy",
    "SharedCacheTierConfig",
    "CacheTierConfig",
    "KVCacheDesc",
    "RequestDesc",
    "BatchDesc",
    "KVCacheManagerConfig",
]

DataRole = str
"""A buffer's role within its layer, such as ``"key"`` or ``"value"``."""


def _is_int(v: object) -> bool:
    """Whether a field holds an integer (bool excluded): the constructor
    checks only such values, leaving a value of the wrong type to the
    manager's checks, which name its full path."""
    return hasattr(v, "__index__") and not isinstance(v, bool)


def _is_real(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _assert_config(field: str, rule: str) -> None:
    raise ConfigAssertionError(f"invalid config: {field}: {rule}", code=6, field=field)


def _assert_distinct_roles(buffers: object) -> None:
    """KVCacheManagerV2's layer constructors assert that a layer's buffer
    roles are distinct."""
    if isinstance(buffers, Sequence) and not isinstance(buffers, (str, bytes)):
        seen: dict[str, int] = {}
        for j, b in enumerate(buffers):
            role = getattr(b, "role", None)
            if isinstance(role, str):
                if role in seen:
                    _assert_config(f"buffers[{j}].role", f"duplicate buffer role {role!r} (also buffers[{seen[role]}])")
                seen[role] = j


def _check_quota(quota: int) -> None:
    """A tier's assert_valid check of its quota, in KVCacheManagerV2's words."""
    if not quota > 0:
        raise ConfigAssertionError("Quota must be positive", field="quota")


@dataclass(slots=True)
class BufferConfig(_values.BufferConfig):
    """One per-layer buffer: its role and the bytes it needs per block.
    ``tokens_per_block_override`` other than None gives the buffer pages of
    its own: it divides ``tokens_per_block``, ``size`` holds that many
    tokens, and each block holds ``tokens_per_block //
    tokens_per_block_override`` of the buffer's pages (the expansion of
    :class:`PageIndexConverter` and :class:`ExpandedBuffer`)."""

    def _check_types(self, path: str) -> None:
        if not isinstance(self.role, str):
            raise TypeError(f"{path}.role: expected a str, got {type(self.role).__name__}")
        _check_int(f"{path}.size", self.size)
        o = self.tokens_per_block_override
        if o is not None:
            _check_int(f"{path}.tokens_per_block_override", o)
            if o <= 0:  # 0 is "none" in the C ABI: refuse it here
                name = f"{path}.tokens_per_block_override"
                raise InvalidConfigError(f"invalid config: {name}: must be positive, got {o}", code=6, field=name)


@dataclass(slots=True)
class AttentionLayerConfig(_values.AttentionLayerConfig):
    """One attention layer. ``sliding_window_size=None`` is full attention;
    ``num_sink_tokens`` are the leading tokens a windowed layer always keeps."""

    @property
    def window_size(self) -> int | None:
        return self.sliding_window_size

    def __post_init__(self) -> None:
        _assert_distinct_roles(self.buffers)

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
class SsmLayerConfig(_values.SsmLayerConfig):
    """One state-space (Mamba) layer (KVCM2's ``SsmLayerConfig``): its
    buffers hold one fixed-size state per request, so a buffer's ``size`` is
    the bytes of the whole state. Every SSM layer belongs to the one SSM
    layer group, after the attention ones; it needs
    ``KVCacheManagerConfig.commit_min_snapshot``. Its buffers take no
    ``tokens_per_block_override``."""

    def __post_init__(self) -> None:
        _assert_distinct_roles(self.buffers)
        if isinstance(self.buffers, Sequence):
            for j, b in enumerate(self.buffers):
                o = getattr(b, "tokens_per_block_override", None)
                if o is not None:
                    _assert_config(f"buffers[{j}].tokens_per_block_override",
                                   f"must be None for an SSM layer's state, got {o!r}")

    def _check_types(self, path: str) -> None:
        _check_int(f"{path}.layer_id", self.layer_id)
        if isinstance(self.buffers, (str, bytes)) or not isinstance(self.buffers, Sequence):
            raise TypeError(f"{path}.buffers: expected a list of BufferConfig")
        for j, b in enumerate(self.buffers):
            if not isinstance(b, BufferConfig):
                raise TypeError(f"{path}.buffers[{j}]: expected a BufferConfig, got {type(b).__name__}")
            b._check_types(f"{path}.buffers[{j}]")
            if b.tokens_per_block_override is not None:  # a state is not a block of tokens
                name = f"{path}.buffers[{j}].tokens_per_block_override"
                raise InvalidConfigError(f"invalid config: {name}: must be None for an SSM layer's state, "
                                         f"got {b.tokens_per_block_override}", code=6, field=name)


@dataclass(slots=True)
class GpuCacheTierConfig(_values.GpuCacheTierConfig):
    """The GPU tier: ``quota`` bytes, growable by ``KVCacheManager.resize`` up
    to ``max_quota`` (default: ``quota``), reserved up front so pool base
    addresses never move.

    ``pool_granularity`` (a kvcm extension) is the size unit of the GPU
    pools: -1 (the default) takes KVCacheManagerV2's granule for the quota
    (2 MiB, doubled for every doubling of the quota from 1 GiB on, at most
    32 MiB), so every pool is whole granules and a pool group gets every slot
    they hold, as in KVCacheManagerV2 (the quota is rounded up to the
    granule); 0 sizes the pools to the byte (the Go, C and C++ default); a
    positive value is a granule of that many bytes."""

    def assert_valid(self) -> None:
        """Raise ConfigAssertionError (an AssertionError and a ValueError)
        unless quota (and max_quota) are valid."""
        _check_quota(self.quota)
        if not (self.max_quota is None or self.max_quota >= self.quota):
            raise ConfigAssertionError("max_quota must be at least quota", field="max_quota")


@dataclass(slots=True)
class HostCacheTierConfig(_values.HostCacheTierConfig):
    """A host tier of mapped pinned memory, ``quota`` bytes."""

    def assert_valid(self) -> None:
        """Raise ConfigAssertionError (an AssertionError and a ValueError)
        unless the quota is positive."""
        _check_quota(self.quota)


@dataclass(slots=True)
class DiskCacheTierConfig(_values.DiskCacheTierConfig):
    """A disk tier: one file per cold pool group under directory ``path``
    (a str or an ``os.PathLike``).

    ``persistent`` keeps the files when the manager closes: a later manager
    on ``path`` with the same layout fingerprint (blob size, each
    lifecycle's buffers in order, tokens per block, window, codec identity)
    reuses the committed blocks there, also after the process was killed. It
    needs the built-in codec (a codec without an identity raises
    :class:`~kvcm.InvalidConfigError` naming ``cache_tiers[i].persistent``);
    a second live manager on ``path`` raises :class:`~kvcm.InvalidStateError`.
    Without it the files are removed at close and those a killed manager
    left are reclaimed at start."""

    def assert_valid(self) -> None:
        """Raise ConfigAssertionError (an AssertionError and a ValueError)
        unless the quota is positive and path is a directory."""
        _check_quota(self.quota)
        if not os.path.isdir(self.path):
            raise ConfigAssertionError(f"Disk path {self.path} does not exist or is not a directory", field="path")


@dataclass(slots=True)
class SharedCacheTierConfig(_values.SharedCacheTierConfig):
    """A cold tier shared across nodes on a Redis Cluster, after every local
    tier: ``addresses`` are seed nodes (``"host:port"``), ``namespace``
    prefixes every key (1 to 64 bytes of printable ASCII without spaces,
    ``:`` or braces). It has no quota: the cluster's maxmemory with an
    evicting policy is its quota; ``ttl_ms`` (0: no expiry) bounds a blob's
    life. Timeouts and ``queue_bytes`` of 0 select the defaults (2000 ms,
    256 MiB). It needs a host or disk tier before it: its blocks are
    onboarded through it. ``create_kv_cache`` and ``probe_reuse`` continue
    the prefix match into the shared tier; blocks reach it on eviction from
    the last local level (write-back, the default) or on commit
    (write-through). An unreachable cluster costs misses, never errors.
    ``write_policy`` is a :class:`SharedWritePolicy` (the C ABI's
    ``kvcm_shared_write_policy``)."""

    @property
    def tier(self) -> CacheTier:
        return CacheTier.SHARED

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


CacheTierConfig = Union[GpuCacheTierConfig, HostCacheTierConfig, DiskCacheTierConfig, SharedCacheTierConfig]


@dataclass(slots=True)
class KVCacheDesc(_values.KVCacheDesc):
    """One request of a batch: tokens with pages, and computed tokens."""


@dataclass(slots=True)
class RequestDesc(KVCacheDesc):
    """kvcm's name of :class:`KVCacheDesc`, whose history_length defaults
    to 0."""

    history_length: int = 0


@dataclass(slots=True)
class BatchDesc(_values.BatchDesc):
    """One batch step: its requests (``kv_caches``), whose first
    ``system_prompt_length`` tokens are one prompt they all share: its full
    blocks are held once for the batch."""

    @property
    def requests(self) -> list[KVCacheDesc]:
        """kvcm's former name of ``kv_caches``."""
        return self.kv_caches


def _check_batch(path: str, b: object) -> None:
    if not isinstance(b, BatchDesc):
        raise TypeError(f"{path}: expected a BatchDesc, got {type(b).__name__}")
    _check_int(f"{path}.system_prompt_length", b.system_prompt_length)
    for i, r in enumerate(b.kv_caches):
        if not isinstance(r, KVCacheDesc):
            raise TypeError(f"{path}.kv_caches[{i}]: expected a KVCacheDesc, got {type(r).__name__}")
        _check_int(f"{path}.kv_caches[{i}].capacity", r.capacity)
        _check_int(f"{path}.kv_caches[{i}].history_length", r.history_length)


@dataclass(slots=True)
class KVCacheManagerConfig(_values.KVCacheManagerConfig):
    """The manager's configuration (TensorRT-LLM's ``KVCacheManagerConfig``,
    its fields in its order, with its defaults).

    ``cache_tiers`` are hottest first: one GPU tier, then at most one host
    tier, then at most one disk tier, then at most one shared tier. ``max_util_for_resume``, in (0, 1]
    (default 0.97, the library's default), refuses ``resume`` while the GPU
    tier is busier; 0 is rejected rather than read as the default, as the C
    ABI would. ``reuse_match_backoff`` tokens are trimmed off every prefix
    match. ``initial_pool_ratio`` has one hot-tier byte ratio per layer
    group, positive and summing to 1.0 (an empty list, a wrong length or
    another sum is a ValueError); without it
    ``typical_step`` decides, else ``constraints``, else every layer group
    gets the same number of slots. ``constraints`` are batches the GPU tier
    must always hold: with each layer group's floor of a window's worth of
    slots they set floors on the GPU pools (with room for
    ``max_util_for_resume``), and a ``quota`` below the floors is raised to
    them, as in KVCacheManagerV2. ``enable_stats`` off makes the KVCM2 statistics
    getters report nothing (kvcm counts regardless; ``stats`` stays).
    ``text_only`` changes nothing (kvcm's tokens are text only).
    ``layers`` may hold :class:`SsmLayerConfig` entries beside the attention
    layers; they need ``commit_min_snapshot`` (the constructor raises
    :class:`SsmNeedsSnapshotError` without it), with which a commit that ends
    on a block boundary snapshots the SSM state for reuse (the library names
    an SSM layer's fields ``ssm_layers[i]``, counting SSM layers only).
    ``max_ssm_slots`` (a kvcm extension, 0: no cap) caps the SSM layer
    group's GPU slots. The ``rebalance_*`` fields tune pool rebalancing
    (``KVCacheManager.need_adjustment``, ``adjust()``). ``swa_scratch_reuse``
    (a :class:`SwaScratchReuseConfig`, or None for off) enables SWA scratch
    reuse (see :mod:`kvcm.scratch`). ``block_key`` selects how
    committed blocks are keyed: ``BlockKey.SHA256`` (the default) is the
    specified key every binding and other processes compute; ``BlockKey.XXH3``
    is several times cheaper but matches no other process's keys, so use it
    only where block keys never leave the manager (the CP-aware index refuses
    it).
    """

    def __post_init__(self) -> None:
        # KVCacheManagerV2 asserts these in its config's constructor; the
        # library checks them again at manager creation (a field set later).
        tiers, layers, tpb = self.cache_tiers, self.layers, self.tokens_per_block
        if isinstance(tiers, Sequence) and not isinstance(tiers, (str, bytes)):
            if not tiers:
                _assert_config("cache_tiers", "the first cache tier must be GPU memory, got none")
            if getattr(tiers[0], "tier", CacheTier.GPU_MEM) != CacheTier.GPU_MEM:
                _assert_config("cache_tiers[0]", f"the first cache tier must be GPU memory, got {tiers[0].tier.name}")
        if isinstance(layers, Sequence) and not isinstance(layers, (str, bytes)):
            seen: dict[int, int] = {}
            for i, layer in enumerate(layers):
                lid = getattr(layer, "layer_id", None)
                if _is_int(lid):
                    if int(lid) in seen:
                        _assert_config(f"layers[{i}].layer_id", f"duplicate layer id {int(lid)} (also layers[{seen[int(lid)]}])")
                    seen[int(lid)] = i
                if not isinstance(layer, AttentionLayerConfig) or not _is_int(tpb) or not isinstance(layer.buffers, Sequence):
                    continue
                for j, b in enumerate(layer.buffers):
                    o = getattr(b, "tokens_per_block_override", None)
                    if _is_int(o) and int(o) > 0 and int(tpb) % int(o):
                        _assert_config(f"layers[{i}].buffers[{j}].tokens_per_block_override",
                                       f"must divide tokens_per_block ({int(tpb)}), got {int(o)}")
            if not self.commit_min_snapshot and any(isinstance(layer, SsmLayerConfig) for layer in layers):
                raise SsmNeedsSnapshotError(
                    "invalid config: commit_min_snapshot: must be true when SSM layers are present",
                    code=6, field="commit_min_snapshot")
        self._assert_rebalance()

    def _assert_rebalance(self) -> None:
        """KVCacheManagerV2's constructor rules for the rebalance_* fields."""
        v = self.rebalance_min_sampled_kv_caches
        if _is_int(v) and int(v) < 0:
            _assert_config("rebalance_min_sampled_kv_caches", f"must be non-negative, got {v}")
        v = self.rebalance_cooldown_secs
        if _is_real(v) and not (math.isfinite(v) and v >= 0):
            _assert_config("rebalance_cooldown_secs", f"must be finite and non-negative, got {v}")
        v = self.rebalance_target_ratio_update_interval
        if _is_int(v) and int(v) <= 0:
            _assert_config("rebalance_target_ratio_update_interval", f"must be positive, got {v}")
        v = self.rebalance_ratio_threshold
        if _is_real(v) and not (math.isfinite(v) and v > 1.0):
            _assert_config("rebalance_ratio_threshold", f"must be finite and > 1.0, got {v}")
        v = self.rebalance_moving_average_decay
        if _is_real(v) and not 0.0 < v < 1.0:
            _assert_config("rebalance_moving_average_decay", f"must be in (0, 1), got {v}")

    @property
    def enable_swa_scratch_reuse(self) -> bool:
        return self.swa_scratch_reuse is not None

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
            t._check_types(f"cache_tiers[{i}]")
        for i, layer in enumerate(self.layers):
            if not isinstance(layer, (AttentionLayerConfig, SsmLayerConfig)):
                raise TypeError(f"layers[{i}]: expected an AttentionLayerConfig or SsmLayerConfig, "
                                f"got {type(layer).__name__}")
            layer._check_types(f"layers[{i}]")
        _check_int("max_ssm_slots", self.max_ssm_slots)
        if not isinstance(self.max_util_for_resume, (int, float)) or isinstance(self.max_util_for_resume, bool):
            raise TypeError("max_util_for_resume: expected a float")
        _check_int("reuse_match_backoff", self.reuse_match_backoff)
        _check_int("rebalance_min_sampled_kv_caches", self.rebalance_min_sampled_kv_caches)
        _check_int("rebalance_target_ratio_update_interval", self.rebalance_target_ratio_update_interval)
        for name in ("rebalance_cooldown_secs", "rebalance_ratio_threshold", "rebalance_moving_average_decay"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool):
                raise TypeError(f"{name}: expected a float, got {type(v).__name__}")
        if self.swa_scratch_reuse is not None:
            if not isinstance(self.swa_scratch_reuse, SwaScratchReuseConfig):
                raise TypeError(f"swa_scratch_reuse: expected a SwaScratchReuseConfig or None, "
                                f"got {type(self.swa_scratch_reuse).__name__}")
            _check_int("swa_scratch_reuse.max_rewind_len", self.swa_scratch_reuse.max_rewind_len)
        if self.initial_pool_ratio is not None:
            for i, r in enumerate(self.initial_pool_ratio):
                if not isinstance(r, (int, float)) or isinstance(r, bool):
                    raise TypeError(f"initial_pool_ratio[{i}]: expected a float, got {type(r).__name__}")
        if not isinstance(self.block_key, BlockKey):
            raise TypeError(f"block_key: expected a BlockKey, got {type(self.block_key).__name__}")
        if self.typical_step is not None:
            _check_batch("typical_step", self.typical_step)
        for i, b in enumerate(self.constraints or ()):
            _check_batch(f"constraints[{i}]", b)

    def _check_c_values(self) -> None:
        """Rejects (after _check_types) the values the C struct cannot carry
        as given: the library would read them differently."""
        if self.max_util_for_resume == 0:
            raise InvalidConfigError(
                "invalid config: max_util_for_resume: max_util_for_resume must be in (0, 1], got 0 "
                "(the C ABI reads 0 as unset; omit the field for the default 0.97)",
                code=6, field="max_util_for_resume")
        # 0 is a valid value of these in no language, but the C ABI reads it
        # as unset (the default): rejected here rather than replaced.
        for name, rule in (("rebalance_target_ratio_update_interval", "must be positive"),
                           ("rebalance_ratio_threshold", "must be finite and above 1"),
                           ("rebalance_moving_average_decay", "must be in (0, 1)")):
            if getattr(self, name) == 0:
                raise InvalidConfigError(f"invalid config: {name}: {rule}, got 0", code=6, field=name)
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
