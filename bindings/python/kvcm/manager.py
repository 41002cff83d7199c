"""KVCacheManager and its KV caches."""

from __future__ import annotations

import array
import copy
import ctypes
import math
import sys
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, NamedTuple, Sequence

from . import _convert, _native, multimodal
from ._convert import set_field
from ._managed import Managed, callback_guard
from ._native import bind, ffi
from .codec import KVCacheColdPageCodec, create_builtin_kv_cache_cold_page_codec
from .common import DEFAULT_BEAM_INDEX, GPU_LEVEL, HalfOpenRange, PageIndexMode
from .events import KVCacheEventManager
from .lifecycle import stale_range
from .stats import (
    KVCacheIterationStatsDelta,
    KVCacheStatsDelta,
    PoolGroupPeakBlockStats,
    ReusedBlocksByLevel,
    SsmSnapshotIterationStatsDelta,
    StorageStatistics,
)
from .config import (
    CacheTier,
    KVCacheManagerConfig,
    SharedCacheTierConfig,
    SsmLayerConfig,
)
from .device import DeviceMemory, MemoryKind, Stream
from .scratch import PlannedDropHandle, ScratchDesc
from .errors import (
    BufferTooSmallError,
    InvalidArgumentError,
    SsmCommitOffHistoryError,
    InvalidStateError,
    ScratchInUseError,
    KVCacheError,
    OutOfPagesError,
    ResumeRefusedError,
    TextOnlyConflictError,
    UnsupportedError,
)

__all__ = [
    "KVCacheManager",
    "SharedStats",
    "_KVCache",
    "CacheStatus",
    "DeviceKind",
    "EventKind",
    "MigrationPath",
    "BufferLocation",
    "PoolDesc",
    "PoolGroupDesc",
    "BufferId",
    "CoalescedBuffer",
    "SlotDescVariant",
    "SlotDesc",
    "PageIndexConverter",
    "ExpandedBuffer",
    "AggregatedPageDesc",
    "num_live_managers",
    "BlockStats",
    "PoolGroupStats",
    "PeakBlockStats",
    "MigrationStats",
    "CacheEvent",
    "BAD_PAGE_INDEX",
]

BAD_PAGE_INDEX = ffi.KVCM_BAD_PAGE_INDEX
"""A page index of a block without a page in a layer group."""


# The generated layer's enums (values are the C ABI's).
CacheStatus = ffi.CacheStatus
DeviceKind = ffi.DeviceKind
EventKind = ffi.EventKind
MigrationPath = ffi.MigrationPath


@dataclass(frozen=True, slots=True)
class BufferLocation(ffi.BufferLocation):
    """Where a (layer, role) buffer lives in the GPU layout: block ``b``
    with base page index ``i`` is at ``pool_base + (i*scale + offset) * bytes``
    (the fields are generated: ``//kvcm:pyvalue``)."""

    def page_index(self, base: int) -> int:
        return -1 if base < 0 else base * self.scale + self.offset

    def page_address(self, base: int) -> int:
        return self.pool_base + self.page_index(base) * self.bytes


class ReusePage(NamedTuple):
    """One block of a reuse match in a layer group (``probe_reuse_pages``):
    the page covering the most of the block, where it lives and how many of
    the block's tokens it holds the KV of (KVCacheManagerV2's
    partial-coverage page)."""

    level: int
    slot: int
    covered: int


class BufferId(NamedTuple):
    """One buffer: a layer and a role."""

    layer_id: int
    role: str


@dataclass(frozen=True, slots=True)
class CoalescedBuffer:
    """Buffers of one size side by side in a pool's slot, in slot order."""

    single_buffer_size: int
    buffer_ids: tuple[BufferId, ...]

    @property
    def size(self) -> int:
        return self.single_buffer_size * len(self.buffer_ids)

    @property
    def num_buffers(self) -> int:
        return len(self.buffer_ids)


@dataclass(frozen=True, slots=True)
class SlotDescVariant:
    """What one layer group keeps in a pool group's slot: per pool, its
    coalesced buffers."""

    layer_group_id: int
    coalesced_buffers: tuple[CoalescedBuffer, ...]

    @property
    def slot_size_list(self) -> list[int]:
        return [c.size for c in self.coalesced_buffers]


@dataclass(frozen=True, slots=True)
class SlotDesc:
    """A pool group's slot: one variant per layer group it serves."""

    variants: tuple[SlotDescVariant, ...]

    @property
    def slot_size_list(self) -> list[int]:
        return self.variants[0].slot_size_list if self.variants else []


@dataclass(frozen=True, slots=True)
class PoolDesc:
    """One pool of a pool group: its index, base address and slot bytes."""

    pool_index: int
    base_address: int
    slot_bytes: int


@dataclass(frozen=True, slots=True)
class PoolGroupDesc:
    """KVCM2's PoolGroupDesc, plus kvcm's ``layer_groups`` (the layer groups
    the group serves; on the GPU level the variants of ``slot_desc``, which
    cold levels do not describe: their pools hold encoded pages)."""

    pool_group_index: int
    num_slots: int
    slot_desc: SlotDesc | None
    pools: tuple[PoolDesc, ...]
    layer_groups: tuple[int, ...] = ()

    @property
    def page_bytes(self) -> int:
        return sum(p.slot_bytes for p in self.pools)


@dataclass(frozen=True, slots=True)
class PageIndexConverter(ffi.PageIndexConverter):
    """Converts base page indices (``get_base_page_indices``) into the
    indices a kernel uses for one buffer: base ``b`` becomes, for ``k`` in
    ``range(expansion)``, ``(b * scale + offset) * expansion + k``, where
    offset is 0 for indices from ``get_mem_pool_base_address(layer, role)``
    (SHARED) and ``layer_offset`` for indices from the pool's base address
    (PER_LAYER); -1 stays -1. ``expansion`` is the buffer's pages per block
    (1, or tokens_per_block over its ``tokens_per_block_override``).

    With a ``scratch`` descriptor (``_KVCache.get_scratch_desc``; PER_LAYER
    only) the blocks of its range map into its scratch slots instead: one
    slot holds ``scale // scratch_pages_per_block`` blocks of the layer,
    block ``i`` of the range at sub-page ``(i % that) *
    scratch_pages_per_block + layer_offset``, modulo ``scale``, of slot
    ``slot_ids[i // that]`` (then expanded as above). The fields but
    ``scratch_pages_per_block`` are generated (``//kvcm:pyvalue``)."""

    scratch_pages_per_block: int = 1

    def __call__(self, base_indices: Sequence[int], index_mode: PageIndexMode | None = None,
                 scratch: Any = None) -> list[int]:
        if scratch and index_mode != PageIndexMode.PER_LAYER:
            raise InvalidArgumentError("index_mode: scratch blocks need PageIndexMode.PER_LAYER")
        offset = self.layer_offset if index_mode == PageIndexMode.PER_LAYER else 0
        bad, e = ffi.KVCM_BAD_PAGE_INDEX, self.expansion
        out = [bad if b == bad else b * self.scale + offset for b in base_indices]
        if scratch:
            per_slot = self.scale // self.scratch_pages_per_block
            beg = scratch.range.beg
            for b in range(beg, min(scratch.range.end, len(out))):
                i = b - beg
                sub = (i % per_slot) * self.scratch_pages_per_block + offset
                out[b] = scratch.slot_ids[i // per_slot] * self.scale + sub % self.scale
        if e == 1:
            return out
        return [bad if p == bad else p * e + k for p in out for k in range(e)]


@dataclass(frozen=True, slots=True)
class ExpandedBuffer:
    """One buffer of an aggregated page and its expansion (its pages per
    block)."""

    id: BufferId
    expansion: int


@dataclass(frozen=True, slots=True)
class AggregatedPageDesc:
    """A run of buffers side by side in every GPU slot of one pool: for each
    index ``i`` of ``get_aggregated_page_indices(layer_group_id)`` the run's
    bytes are ``[base + stride * i, base + stride * i + size)``."""

    base: int
    size: int
    stride: int
    layer_group_id: int
    buffers: tuple[ExpandedBuffer, ...]


_live_managers: "weakref.WeakSet[KVCacheManager]" = weakref.WeakSet()


def num_live_managers() -> int:
    """The managers of this process constructed and not yet closed."""
    return sum(1 for m in list(_live_managers) if not m.closed)


# The statistics and event value types are generated (//kvcm:pyvalue in
# gen/abi).
BlockStats = ffi.BlockStats
PeakBlockStats = ffi.PeakBlockStats
MigrationStats = ffi.MigrationStats
SharedStats = ffi.SharedStats
CacheEvent = ffi.CacheEvent


@dataclass(frozen=True, slots=True)
class PoolGroupStats(ffi.PoolGroupStats):
    """The state of one pool group of one level, in slots (the fields are
    generated: ``//kvcm:pyvalue``)."""

    @property
    def used(self) -> int:
        return self.total - self.free




# The library functions, bound once (see _native.bind: every integer argument
# is checked against its C type; the keywords give the Python API's names).
_manager_create = bind("kvcm_manager_create")
_probe_reuse = bind("kvcm_manager_probe_reuse_v2", tokens="input_tokens")
_probe_first_new = bind("kvcm_manager_probe_first_new_block_key", tokens="input_tokens")
_set_block_priorities = bind("kvcm_manager_set_block_priorities", keys="block_keys")
_resize_level = bind("kvcm_manager_resize_level", level="cache_level")
_get_quota = bind("kvcm_manager_get_quota", level="cache_level")
_layer_group_of = bind("kvcm_manager_get_layer_group_of")
_buffer_location = bind("kvcm_manager_get_buffer_location")
_aggregated_pages = bind("kvcm_manager_get_aggregated_pages")
_page_index_converter = bind("kvcm_manager_get_page_index_converter")
_page_stride = bind("kvcm_manager_get_page_stride")
_page_index_upper_bound = bind("kvcm_manager_get_page_index_upper_bound")
_cache_aggregated_indices = bind("kvcm_kv_cache_get_aggregated_page_indices", layer_group="layer_group_id",
                                 beam="beam_id")
_pool_group_descs = bind("kvcm_manager_get_pool_group_descs")
_drain_events = bind("kvcm_manager_drain_events", events_cap="max_events")
_drain_block_events = bind("kvcm_manager_drain_block_events_digests")
_alloc_memory = bind("kvcm_manager_alloc_memory")
_cache_create = bind("kvcm_kv_cache_create")
_cache_close = bind("kvcm_kv_cache_close")
_cache_resume = bind("kvcm_kv_cache_resume", stream="cuda_stream")
_cache_set_stream = bind("kvcm_kv_cache_set_stream", stream="cuda_stream")
_cache_wait_fresh_tail = bind("kvcm_kv_cache_wait_fresh_tail", stream="cuda_stream")
_cache_committed_tokens = bind("kvcm_kv_cache_get_committed_tokens")
_cache_cached_tokens = bind("kvcm_kv_cache_get_cached_tokens_by_level")
_cache_pending_stats = bind("kvcm_kv_cache_get_pending_stats")
_cache_ssm_index = bind("kvcm_kv_cache_get_ssm_block_base_index", layer_group="layer_group_id")
_cache_reuse_diag = bind("kvcm_kv_cache_get_reuse_diagnostics")
_cache_commit_pending = bind("kvcm_kv_cache_commit_pending_stats")
_cache_discard_pending = bind("kvcm_kv_cache_discard_pending_stats")
_cache_suspend = bind("kvcm_kv_cache_suspend")
_cache_resize = bind("kvcm_kv_cache_resize")
_cache_commit = bind("kvcm_kv_cache_commit")
_cache_decode_steps = bind("kvcm_kv_cache_decode_steps")
_cache_commit_digests = bind("kvcm_kv_cache_commit_digests", tokens="accepted_input_tokens")
_cache_committed_digests = bind("kvcm_kv_cache_get_committed_digests")
_probe_reuse_digests = bind("kvcm_manager_probe_reuse_digests", tokens="input_tokens")
_probe_first_new_digests = bind("kvcm_manager_probe_first_new_block_key_digests", tokens="input_tokens")
_cache_prefetch = bind("kvcm_kv_cache_prefetch")
_cache_page_indices = bind("kvcm_kv_cache_get_base_page_indices", layer_group="layer_group_id")
_cache_beam_page_indices = bind("kvcm_kv_cache_get_beam_base_page_indices", layer_group="layer_group_id",
                                beam="beam_id")
_cache_commit_beams = bind("kvcm_kv_cache_commit_beam_search", tokens="accepted_input_tokens")
_cache_beam_width = bind("kvcm_kv_cache_get_beam_width")
_cache_set_beam_width = bind("kvcm_kv_cache_set_beam_width")
_cache_committed = bind("kvcm_kv_cache_get_num_committed_tokens")
_cache_history = bind("kvcm_kv_cache_get_history_length")
_cache_capacity = bind("kvcm_kv_cache_get_capacity")
_cache_fresh_range = bind("kvcm_kv_cache_get_fresh_range")
_cache_scratch_desc = bind("kvcm_kv_cache_get_scratch_desc", layer_group="layer_group_id")
_cache_plan_drop = bind("kvcm_kv_cache_plan_committed_block_drop")
_scratch_pages_per_block = bind("kvcm_manager_get_scratch_pages_per_block")
_need_adjustment = bind("kvcm_manager_need_adjustment")
_adjust = bind("kvcm_manager_adjust")
_clamp_max_seq_len = bind("kvcm_manager_clamp_max_seq_len_for_mem")
_I64 = ctypes.c_int64
_U64 = (1 << 64) - 1
_OPTS = ffi.kvcm_kv_cache_options
_OPTS_SIZE = ctypes.sizeof(_OPTS)
# The options of a plain create (struct_size, abi_version, the input tokens'
# address and count, has_expected_prompt_length, expected_prompt_length,
# text_only) in one pack: bytes the extension passes as the structure (the
# ctypes path copies them into one). The expected prompt length goes as its
# 64 bits, as a ctypes field stores any int.
_OPTS_PACK = _convert.packer(_OPTS, struct_size="I", abi_version="I", input_tokens="P", num_input_tokens="N",
                             has_expected_prompt_length="?", expected_prompt_length="Q", text_only="?").pack
# The extension's decode step type (gen/pyext/step.c), or None.
_STEP = getattr(_native._ext, "CacheStep", None)
_byref = ctypes.byref
_TOKEN_PTR = ctypes.POINTER(ffi.kvcm_token)
_NO_SCOPE = ffi.kvcm_reuse_scope()  # read only: the default scope

_PRIORITY_RESULT = "custom_priority_callback's result"


class LifeCycle:
    """The layer group a priority callback is asked about, as
    KVCacheManagerV2 passes its life cycle object (not an int): the group's
    ``window_size`` (None for full attention and the SSM layer group),
    ``num_sink_blocks`` and ``get_stale_range``; ``is_ssm`` tells the SSM
    layer group (KVCM2's SsmLifeCycle) apart. As a kvcm extension it
    carries its ``layer_group_id``: ``int(lc)`` (and indexing with it) gives
    the id, and it compares equal to it."""

    __slots__ = ("layer_group_id", "window_size", "num_sink_blocks", "is_ssm")

    layer_group_id: int
    window_size: int | None
    num_sink_blocks: int
    is_ssm: bool

    def __init__(self, layer_group_id: int, window_size: int | None, num_sink_blocks: int,
                 is_ssm: bool = False) -> None:
        self.layer_group_id, self.window_size = int(layer_group_id), window_size
        self.num_sink_blocks, self.is_ssm = num_sink_blocks, is_ssm

    def __index__(self) -> int:
        return self.layer_group_id

    __int__ = __index__

    def __eq__(self, other: object) -> bool:
        if isinstance(other, LifeCycle):
            return (self.layer_group_id, self.window_size, self.num_sink_blocks, self.is_ssm) == (
                other.layer_group_id, other.window_size, other.num_sink_blocks, other.is_ssm)
        if isinstance(other, int) and not isinstance(other, bool):
            return self.layer_group_id == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.layer_group_id)

    def __repr__(self) -> str:
        if self.is_ssm:
            return f"LifeCycle({self.layer_group_id}, ssm)"
        return f"LifeCycle({self.layer_group_id}, window_size={self.window_size}, num_sink_blocks={self.num_sink_blocks})"

    def get_stale_range(self, history_length: int, tokens_per_block: int) -> HalfOpenRange:
        """KVCacheManagerV2's stale range: for attention
        :func:`kvcm.lifecycle.stale_range`; for the SSM layer group every
        full block (its one state is the history's)."""
        if self.is_ssm:
            return HalfOpenRange(0, history_length // tokens_per_block)
        return stale_range(self.window_size, self.num_sink_blocks, history_length, tokens_per_block)


def _priority_trampoline(stash: Any, life_cycles: list[LifeCycle], fn: Callable[[int, LifeCycle], int]) -> Any:
    """The C per-layer-group priority callback calling fn(block_ordinal,
    life_cycle): its result (an int, clamped into [0, 100]) on success; an
    exception (a result that is not an int included) is stashed and
    reported as the callback's failure, which fails the commit."""
    lo, hi, ctname = _convert.RANGES[ctypes.c_int64]

    def trampoline(_user: Any, block_index: int, layer_group: int, out: Any) -> int:
        try:
            v = fn(block_index, life_cycles[layer_group])
            if type(v) is not int:
                v = _convert.integer(v, lo, hi, ctname, _PRIORITY_RESULT)
            out[0] = min(max(v, ffi.KVCM_MIN_PRIORITY), ffi.KVCM_MAX_PRIORITY)
            return 0
        except BaseException as e:  # noqa: BLE001 - no exception may cross into C
            stash.put(e)
            return 1

    # Runs with the manager's lock held: finalizers there defer.
    return ffi.kvcm_layer_group_priority_func(callback_guard(trampoline))


def _scope_fields(reuse_scope: Any, lora_task_id: Any, salt: Any) -> tuple[int | None, Any]:
    """(lora_id, salt) of a reuse scope: any object with ``lora_id`` and
    ``salt`` attributes (KVCacheManagerV2's ReuseScope: lora_id None and 0
    differ) or None, or kvcm's older ``lora_task_id``/``salt`` keywords (not
    both), where lora_task_id 0 is no adapter as it always was."""
    if reuse_scope is None:
        if lora_task_id is not None:
            lora_task_id = _convert.check(lora_task_id, ctypes.c_int64, "lora_task_id") or None
        return lora_task_id, salt
    if lora_task_id is not None or salt is not None:
        raise TypeError("reuse_scope: give either reuse_scope or lora_task_id/salt, not both")
    if not (hasattr(reuse_scope, "lora_id") and hasattr(reuse_scope, "salt")):
        raise TypeError("reuse_scope: expected a ReuseScope (an object with lora_id and salt) or None, "
                        f"got {type(reuse_scope).__name__}")
    return reuse_scope.lora_id, reuse_scope.salt


def _block_key(value: Any, name: str) -> int:
    """A block key as the C ABI's uint64: an int, or the key's 8
    little-endian bytes."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        b = bytes(value)
        if len(b) != 8:
            raise InvalidArgumentError(f"{name}: a block key is 8 bytes, got {len(b)}")
        return int.from_bytes(b, "little")
    return _convert.check(value, ctypes.c_uint64, name)


def _is_scope(value: Any) -> bool:
    return value is None or (hasattr(value, "lora_id") and hasattr(value, "salt"))


def _tokens(value: Any, name: str, text_only: bool = False) -> tuple[Any, int, Any, Any]:
    """(tokens, n, keep, digests) of a token argument: text token ids take
    _convert.tokens' fast path and have digests None; a sequence with
    multimodal digest tokens (bytes, MmItemContext) has digests
    (positions, count, bytes, length) for the C ABI, unless text_only, which
    refuses them."""
    try:
        toks, n, keep = _convert.tokens(value, name)
        return toks, n, keep, None
    except TypeError as e:
        # A bytes-like argument is a buffer of token ids, never digests.
        if isinstance(value, (bytes, bytearray, memoryview, str, array.array)) or not any(
                f"got {k}" in str(e) for k in ("bytes", "bytearray", "MmItemContext")):
            raise
        if text_only:
            raise TypeError(f"{e}: a text-only cache takes text token ids only") from None
    toks, n, pos, nd, blob, blen, keep = multimodal.split(list(value), name)
    return toks, n, keep, (pos, nd, blob, blen)


def _stream_handle(stream: Any) -> Any:
    """The native handle of a stream argument: a kvcm Stream's, a
    torch.cuda.Stream's (anything with ``cuda_stream``), or an int as is."""
    if isinstance(stream, Stream):
        return stream.handle
    handle = getattr(stream, "cuda_stream", None)
    return stream if handle is None else handle


def _salt_bytes(salt: Any) -> bytes | None:
    """A salt's bytes: str (UTF-8) and bytes as they are, an int (KVCacheManagerV2's
    ReuseScope salt) as its 8 little-endian unsigned bytes, so 0 differs from None."""
    if salt is None:
        return None
    if isinstance(salt, str):
        return salt.encode()
    if isinstance(salt, (bytes, bytearray, memoryview)):
        return bytes(salt)
    if isinstance(salt, int) and not isinstance(salt, bool):
        if not 0 <= salt < 1 << 64:
            raise ValueError(f"salt: an int salt must be in [0, 2**64), got {salt}")
        return salt.to_bytes(8, "little")
    raise TypeError(f"salt: expected an int, str, bytes or None, got {type(salt).__name__}")


def _build_c_config(config: KVCacheManagerConfig, device: DeviceKind, device_ordinal: int,
                    event_queue_capacity: int) -> tuple[Any, list[Any]]:
    """The kvcm_manager_config for config, and the objects it points into
    (keep them alive for the call). The fields the C struct shares with the
    configuration's classes are written by their generated ``_to_c``
    (:mod:`kvcm._values`); this adds what the C struct carries elsewhere: the
    tiers by class (the shared one apart), the SSM layers apart from the
    attention layers, the buffers' overrides, the batches' system prompt
    lengths and SWA scratch reuse."""
    if not isinstance(config, KVCacheManagerConfig):
        raise TypeError(f"config: expected a KVCacheManagerConfig, got {type(config).__name__}")
    config._check_types()
    config._check_c_values()
    keep: list[Any] = []
    c = _native.versioned(ffi.kvcm_manager_config)
    config._to_c(c, "", keep)
    c.device = int(device)
    set_field(c, "device_ordinal", device_ordinal)
    set_field(c, "event_queue_capacity", event_queue_capacity)

    local = [t for t in config.cache_tiers if not isinstance(t, SharedCacheTierConfig)]
    tiers = (ffi.kvcm_cache_tier_config * max(len(local), 1))()
    for i, t in enumerate(local):
        # The generated _to_c (//kvcm:pyvariant) also sets the tier's fields
        # the manager's struct carries: gpu_pool_granularity and
        # disk_persistent (the C flag applies to the last local tier, which
        # the library's order check makes the disk tier).
        t._to_c(tiers[i], c, f"cache_tiers[{i}]", keep)
    keep.append(tiers)
    c.cache_tiers = tiers if local else None
    c.num_cache_tiers = len(local)
    if len(local) < len(config.cache_tiers):  # _check_c_values: the last tier
        st, path = config.cache_tiers[-1], f"cache_tiers[{len(local)}]"
        sc = ffi.kvcm_shared_tier_config()
        st._to_c(sc, path, keep)
        addrs = ",".join(st.addresses).encode()
        keep += [addrs, sc]
        sc.addresses = addrs
        c.shared_tier = ctypes.pointer(sc)

    attention = [layer for layer in config.layers if not isinstance(layer, SsmLayerConfig)]
    layers = (ffi.kvcm_attention_layer_config * max(len(attention), 1))()
    for i, layer in enumerate(attention):
        layer._to_c(layers[i], f"layers[{i}]", keep)
    keep.append(layers)
    c.layers = layers if attention else None
    c.num_layers = len(attention)
    overrides = [b.tokens_per_block_override or 0 for layer in attention for b in layer.buffers]
    if any(overrides):
        ov = (ctypes.c_int32 * len(overrides))()
        for k, (i, j) in enumerate((i, j) for i, layer in enumerate(attention) for j in range(len(layer.buffers))):
            ov[k] = _convert.check(overrides[k], ctypes.c_int32, f"layers[{i}].buffers[{j}].tokens_per_block_override")
        keep.append(ov)
        c.buffer_tokens_per_block_overrides = ov
        c.num_buffer_tokens_per_block_overrides = len(overrides)
    ssm = [layer for layer in config.layers if isinstance(layer, SsmLayerConfig)]
    ssm_layers = (ffi.kvcm_ssm_layer_config * max(len(ssm), 1))()
    for i, layer in enumerate(ssm):
        layer._to_c(ssm_layers[i], f"ssm_layers[{i}]", keep)
    keep.append(ssm_layers)
    c.ssm_layers = ssm_layers if ssm else None
    c.num_ssm_layers = len(ssm)

    if config.swa_scratch_reuse is not None:
        c.swa_scratch_reuse = True
        set_field(c, "swa_scratch_max_rewind_len", config.swa_scratch_reuse.max_rewind_len,
                  "swa_scratch_reuse.max_rewind_len")
    if config.typical_step is not None:
        set_field(c, "typical_step_system_prompt_length", config.typical_step.system_prompt_length,
                  "typical_step.system_prompt_length")
    if config.constraints:
        lens = (ctypes.c_int64 * len(config.constraints))()
        for i, b in enumerate(config.constraints):
            lens[i] = _convert.check(b.system_prompt_length, ctypes.c_int64, f"constraints[{i}].system_prompt_length")
        keep.append(lens)
        c.constraint_system_prompt_lengths = lens
        c.num_constraint_system_prompt_lengths = len(config.constraints)
    return c, keep


class KVCacheManager(Managed):
    """A paged KV-cache manager (``kvcm_manager``), KVCM2's
    ``KVCacheManager(config, event_manager=None, cold_page_codec=None)``.

    ``KVCacheManager(config)`` uses the default lossless codec.
    ``KVCacheManager(config, cold_page_codec=codec)`` (the codec is the
    third parameter, as in KVCM2) consumes ``codec`` before the C call,
    whether construction succeeds or fails: never use it again. A built-in
    codec may also be named (``cold_page_codec="gather"``, ``"fp8"``,
    ``"auto"``, ``"default"``, or a :class:`~kvcm.codec.BuiltinCodec`: see
    :mod:`kvcm.codec`). A codec
    passed second, where the event manager goes, is consumed too and
    refused with ``TypeError``. ``event_manager`` (a
    :class:`~kvcm.KVCacheEventManager`) receives the manager's block events.
    The configuration is copied (``init_config``). ``device`` selects
    ``"auto"`` (CUDA where available, else the emulated device), ``"emu"``
    or ``"cuda"``.

    Closing the manager (``close()``, ``with``, or garbage collection)
    closes every cache (ACTIVE or SUSPENDED), stream and memory it still
    owns: the rule of ``kvcm_manager_destroy`` and of Go's
    ``Manager.Close``.

    Not fork-safe: see the package docstring.
    """

    _what = "KVCacheManager"

    def __init__(
        self,
        config: KVCacheManagerConfig,
        event_manager: KVCacheEventManager | None = None,
        cold_page_codec: KVCacheColdPageCodec | str | ffi.BuiltinCodec | None = None,
        *,
        device: str | DeviceKind = DeviceKind.AUTO,
        device_ordinal: int = 0,
        event_queue_capacity: int = 0,
    ) -> None:
        super().__init__()
        self._children: "weakref.WeakSet[Managed]" = weakref.WeakSet()
        # The open caches, by id(): a cache enters at creation and leaves
        # when it is closed (its finalizer closes it), so no weak reference
        # needs a callback (_own_cache).
        self._caches: dict[int, weakref.ref[_KVCache]] = {}
        self._event_manager = None
        if isinstance(event_manager, KVCacheColdPageCodec):
            if cold_page_codec is None:
                # Consumed by this attempt, as any codec handed to it.
                struct = event_manager._consume("KVCacheManager()")
                _native.check(_native.lib.kvcm_cold_page_codec_destroy(ctypes.byref(struct)))
            raise TypeError("event_manager: got a cold-page codec; pass it as cold_page_codec= "
                            "(the third parameter, as in KVCacheManagerV2); it has been consumed")
        if event_manager is not None and not isinstance(event_manager, KVCacheEventManager):
            raise TypeError(f"event_manager: expected a KVCacheEventManager, got {type(event_manager).__name__}")
        codec_struct = None
        if isinstance(cold_page_codec, (str, ffi.BuiltinCodec)):
            cold_page_codec = create_builtin_kv_cache_cold_page_codec(cold_page_codec)
        if cold_page_codec is not None:
            if type(cold_page_codec) is not KVCacheColdPageCodec:
                raise TypeError(
                    "cold_page_codec: expected a native codec (kvcm.codec.Default(), Gather(), Fp8(), "
                    "Auto(), KVCacheColdPageCodec.from_factory()) or a built-in codec's name; "
                    "Python codec implementations are not "
                    f"supported (got {type(cold_page_codec).__name__})"
                )
            # Consumed first: from here on the codec belongs to this call,
            # whatever happens.
            codec_struct = cold_page_codec._consume("KVCacheManager()")
        try:
            if isinstance(device, str):
                try:
                    device = DeviceKind[device.upper()]
                except KeyError:
                    raise ValueError(f"device: expected 'auto', 'emu' or 'cuda', got {device!r}") from None
            c, keep = _build_c_config(config, DeviceKind(device), device_ordinal, event_queue_capacity)
        except BaseException:
            if codec_struct is not None:
                # The C call will not happen: destroy the codec here, as it
                # would have.
                _native.check(_native.lib.kvcm_cold_page_codec_destroy(ctypes.byref(codec_struct)))
            raise
        out = ffi.kvcm_manager()
        codec_arg = ctypes.byref(codec_struct) if codec_struct is not None else None
        _manager_create(ctypes.byref(c), codec_arg, ctypes.byref(out))
        del keep
        self._adopt(int(out.value))
        self._config = copy.deepcopy(config)
        self._has_ssm = any(isinstance(layer, SsmLayerConfig) for layer in self._config.layers)
        self._tokens_per_block = self._get_i32("kvcm_manager_get_tokens_per_block")
        self._num_levels = self._get_i32("kvcm_manager_get_num_levels")
        self._num_layer_groups = self._get_i32("kvcm_manager_get_num_layer_groups")
        shared = self._get_i32("kvcm_manager_get_shared_level")
        self._shared_level = None if shared == ffi.KVCM_NO_SHARED_LEVEL else shared
        self._stats_on = bool(config.enable_stats)
        self._dirty_stats: set[int] = set()
        # What caches' commit_pending_stats committed (KVCM2's committed
        # statistics); the core's own counters count at once.
        self._committed_stats = KVCacheStatsDelta()
        self._excluded_stats: set[int] = set()
        self._iter_suspended = self._iter_resumed = 0
        self._disk_prefetched = self._disk_pages()
        self._scopes: dict[int, tuple[Any, Any]] = {}  # cache id -> (lora, salt), while events may need it
        self._closed_scopes: list[int] = []
        _live_managers.add(self)
        if event_manager is not None:
            self._attach_events(event_manager)

    # -- lifetime -------------------------------------------------------
    def _handle_or_none(self) -> int | None:
        return self._resource if self._state == "open" else None

    def _release(self, handle: int) -> None:
        children = list(self._children)
        children += [c for r in list(self._caches.values()) if (c := r()) is not None]
        failed: KVCacheError | None = None
        for child in children:
            st = getattr(child, "_st", None)
            if st is not None and st.pending and not child.closed:
                # The manager closes its caches: their deferred commits
                # first (with partial reuse the partial block is published
                # at close). As a cache's close, closing goes on and the
                # first error is raised at the end.
                try:
                    st.flush()
                except KVCacheError as err:
                    failed = failed or err
        for child in children:
            child._mark_closed()  # the manager frees them
        self._caches.clear()
        if self._event_manager is not None:
            self._event_manager._detach(self)
        _native.call("kvcm_manager_destroy", handle)
        if failed is not None:
            raise failed

    def _own(self, child: Managed) -> None:
        self._children.add(child)

    def _own_cache(self, cache: _KVCache) -> None:
        """Own an open cache until it is closed (see _caches)."""
        self._caches[id(cache)] = weakref.ref(cache)

    # -- small getters ----------------------------------------------------
    def _get_i32(self, fn: str, *args: Any) -> int:
        out = ctypes.c_int32()
        _native.call(fn, self._native(), *args, ctypes.byref(out))
        return out.value

    @property
    def tokens_per_block(self) -> int:
        return self._tokens_per_block

    @property
    def num_layer_groups(self) -> int:
        return self._num_layer_groups

    @property
    def num_cache_levels(self) -> int:
        return self._num_levels

    @property
    def cache_tier_list(self) -> list[CacheTier]:
        """The tiers by level: the local ones (``num_cache_levels``), then
        ``CacheTier.SHARED`` at :attr:`shared_level` when there is a shared
        tier."""
        return [t.tier for t in self._config.cache_tiers]

    @property
    def shared_level(self) -> int | None:
        """The shared tier's level: ``num_cache_levels``, after every local
        level (no level query takes it; cache events name it as the
        ``old_level`` of a page onboarded from the shared tier). None without
        a shared tier."""
        return self._shared_level

    @property
    def enable_partial_match(self) -> bool:
        return bool(self._config.enable_partial_reuse)

    @property
    def layer_ids(self) -> Iterator[int]:
        return (layer.layer_id for layer in self._config.layers)

    @property
    def num_layers(self) -> int:
        return len(self._config.layers)

    @property
    def init_config(self) -> KVCacheManagerConfig:
        """The configuration the manager was created with (a copy)."""
        return self._config

    @property
    def allow_seq_rebasing(self) -> bool:
        """False: a commit whose block is already cached follows the cached
        block but keeps its own pages (it does not move onto the cached
        ones)."""
        return False

    @property
    def commit_min_snapshot(self) -> bool:
        return bool(self._config.commit_min_snapshot)

    @property
    def text_only(self) -> bool:
        return bool(self._config.text_only)

    @property
    def enable_swa_scratch_reuse(self) -> bool:
        return self._config.enable_swa_scratch_reuse

    def clamp_max_seq_len_for_mem(self, batch_size: int, token_num_upper_bound: int) -> int:
        """The longest sequence, at most ``token_num_upper_bound`` tokens,
        that fits the GPU level's slots next to ``batch_size - 1`` requests
        of one token each (0 when not even one token does). A layer group
        needs, for n computed tokens, its sink blocks and the blocks of its
        window, as in :meth:`create_kv_cache`'s caches; the SSM layer group
        one state per request."""
        out = _I64()
        _clamp_max_seq_len(self._native(), batch_size, max(token_num_upper_bound, 0), _byref(out))
        return out.value

    @property
    def need_adjustment(self) -> bool:
        """Whether :meth:`adjust` would rebalance some level's pool groups
        now: at least ``rebalance_min_sampled_kv_caches`` closed caches were
        sampled, ``rebalance_cooldown_secs`` passed since the last adjustment
        (or the creation) and a level's split among its pool groups is off
        the sampled demand by ``rebalance_ratio_threshold``. The GPU level
        rebalances within the room ``GpuCacheTierConfig.max_quota`` reserved."""
        out = ctypes.c_bool()
        _need_adjustment(self._native(), _byref(out))
        return out.value

    def adjust(self) -> None:
        """Resize the pool groups of every level that is off its sampled
        demand to it, keeping the level's quota: pages in slots that go move
        with their bytes into slots that stay (what does not fit is evicted
        to colder levels, never a page a cache holds), and ACTIVE caches'
        page indices stay valid. A level that cannot be adjusted (an ACTIVE
        cache's page in a slot that would go: InvalidStateError) is left as
        it was; its error is raised after the other levels were adjusted."""
        _adjust(self._native())

    @property
    def device_kind(self) -> DeviceKind:
        return DeviceKind(self._get_i32("kvcm_manager_get_device_kind"))

    def get_layer_group_id(self, layer_id: int) -> int:
        out = ctypes.c_int32()
        _layer_group_of(self._native(), layer_id, ctypes.byref(out))
        return out.value

    @property
    def layer_grouping(self) -> list[list[int]]:
        groups: list[list[int]] = [[] for _ in range(self._num_layer_groups)]
        for lid in self.layer_ids:
            groups[self.get_layer_group_id(lid)].append(lid)
        return groups

    def get_buffer_location(self, layer_id: int, role: str) -> BufferLocation:
        out = ffi.kvcm_buffer_location()
        if not isinstance(role, str):
            raise TypeError(f"role: expected a str, got {type(role).__name__}")
        name = role.encode()
        at = name.find(b"\0")
        if at >= 0:  # the C string would end there
            raise InvalidArgumentError(f"role: contains a NUL byte at offset {at}")
        _buffer_location(self._native(), layer_id, name, ctypes.byref(out))
        return BufferLocation._from_c(out)

    def get_mem_pool_base_address(self, layer_id: int, data_role: str,
                                  index_mode: PageIndexMode | None = None) -> int:
        """The base address page indices of (layer_id, data_role) count from:
        with SHARED (None), the buffer's own base (the pool's base plus the
        layer's offset), for indices ``base * scale``; with PER_LAYER the
        pool's base, for indices that include the layer offset (see
        :meth:`get_page_index_converter`)."""
        if index_mode is None and self.enable_swa_scratch_reuse:
            raise InvalidArgumentError("index_mode: must be given when SWA scratch reuse is enabled")
        loc = self.get_buffer_location(layer_id, data_role)
        if index_mode == PageIndexMode.PER_LAYER:
            return loc.pool_base
        return loc.pool_base + loc.offset * loc.bytes

    def _role_arg(self, role: Any) -> bytes:
        if not isinstance(role, str):
            raise TypeError(f"role: expected a str, got {type(role).__name__}")
        name = role.encode()
        at = name.find(b"\0")
        if at >= 0:  # the C string would end there
            raise InvalidArgumentError(f"role: contains a NUL byte at offset {at}")
        return name

    def get_page_stride(self, layer_id: int, data_role: str) -> int:
        """Bytes between consecutive kernel page indices of the buffer: its
        bytes per block over its expansion."""
        out = ctypes.c_int64()
        _page_stride(self._native(), layer_id, self._role_arg(data_role), ctypes.byref(out))
        return out.value

    def get_page_index_scale(self, layer_id: int, data_role: str) -> int:
        """The multiplier from base page indices to the buffer's indices."""
        return self.get_buffer_location(layer_id, data_role).scale

    def get_page_index_converter(self, layer_id: int, data_role: str) -> PageIndexConverter:
        out = ffi.kvcm_page_index_converter()
        _page_index_converter(self._native(), layer_id, self._role_arg(data_role), ctypes.byref(out))
        return PageIndexConverter(out.scale, out.expansion, out.layer_offset,
                                  self._scratch_pages_per_block(layer_id, data_role))

    def _scratch_pages_per_block(self, layer_id: int, data_role: str) -> int:
        out = _I64()
        _scratch_pages_per_block(self._native(), layer_id, data_role.encode(), _byref(out))
        return out.value

    def get_page_index_upper_bound(self, layer_id: int, data_role: str) -> int:
        """One past the largest SHARED kernel page index of the buffer: its
        pool viewed from the buffer's base as an array of its pages."""
        out = ctypes.c_int64()
        _page_index_upper_bound(self._native(), layer_id, self._role_arg(data_role), ctypes.byref(out))
        return out.value

    def supports_index_mode(self, mode: PageIndexMode) -> bool | None:
        """PER_LAYER: True. SHARED: True, or None (ask each cache) with SWA
        scratch reuse, whose scratch blocks need PER_LAYER indices."""
        mode = PageIndexMode(mode)
        if mode == PageIndexMode.SHARED and self.enable_swa_scratch_reuse:
            return None
        return mode in (PageIndexMode.SHARED, PageIndexMode.PER_LAYER)

    @property
    def all_buffer_ids(self) -> Iterator[BufferId]:
        return (BufferId(layer.layer_id, b.role) for layer in self._config.layers for b in layer.buffers)

    def get_aggregated_pages(self, buffers: Iterable[BufferId]) -> Iterator[AggregatedPageDesc]:
        """Merge buffers (``BufferId`` or ``(layer_id, role)`` pairs, in any
        order) into the fewest runs of contiguous bytes for bulk transfer:
        grouped by layer group and pool, in the order each first appears,
        sorted by their place in the slot, adjacent ones merged. An unknown or
        repeated buffer raises InvalidArgumentError naming its position."""
        ids = [BufferId(*b) for b in buffers]
        n = len(ids)
        arr = (ffi.kvcm_buffer_id * max(n, 1))()
        keep = []
        for i, b in enumerate(ids):
            set_field(arr[i], "layer_id", b.layer_id, f"buffers[{i}].layer_id")
            try:
                role = self._role_arg(b.role)
            except (TypeError, InvalidArgumentError) as e:
                raise type(e)(f"buffers[{i}].{e}") from None
            keep.append(role)
            arr[i].role = role
        descs = (ffi.kvcm_aggregated_page_desc * max(n, 1))()
        members = (ffi.kvcm_expanded_buffer * max(n, 1))()
        num = ctypes.c_size_t()
        _aggregated_pages(self._native(), arr if n else None, n, descs if n else None, n,
                          members if n else None, n, ctypes.byref(num))
        base = ctypes.addressof(members)
        size = ctypes.sizeof(ffi.kvcm_expanded_buffer)
        out = []
        for d in descs[:num.value]:
            first = (ctypes.cast(d.buffers, ctypes.c_void_p).value - base) // size
            bufs = tuple(ExpandedBuffer(ids[m.buffer], m.expansion) for m in members[first:first + d.num_buffers])
            out.append(AggregatedPageDesc(int(d.base), d.size, d.stride, d.layer_group, bufs))
        return iter(out)

    def get_life_cycle_pool_group_indices(self, cache_level: int = GPU_LEVEL) -> list[int]:
        """The pool group of every layer group at a level, by layer group."""
        out = [0] * self._num_layer_groups
        for d in self.get_pool_group_descs(cache_level):
            for lg in d.layer_groups:
                out[lg] = d.pool_group_index
        return out

    @property
    def pool_group_descs(self) -> list[PoolGroupDesc]:
        """The GPU level's pool groups, with their slot layouts."""
        return self.get_pool_group_descs(GPU_LEVEL)

    def _slot_desc(self, layer_groups: Sequence[int], num_pools: int) -> SlotDesc:
        by_lg: dict[int, list[list[tuple[int, BufferId, int]]]] = {lg: [[] for _ in range(num_pools)] for lg in layer_groups}
        for bid in self.all_buffer_ids:
            loc = self.get_buffer_location(bid.layer_id, bid.role)
            if loc.layer_group in by_lg:
                by_lg[loc.layer_group][loc.pool].append((loc.offset, bid, loc.bytes))
        variants = []
        for lg in layer_groups:
            pools = []
            for entries in by_lg[lg]:
                entries.sort()
                size = entries[0][2] if entries else 0
                pools.append(CoalescedBuffer(size, tuple(e[1] for e in entries)))
            variants.append(SlotDescVariant(lg, tuple(pools)))
        return SlotDesc(tuple(variants))

    def get_pool_group_descs(self, level: int = 0) -> list[PoolGroupDesc]:
        """The pool groups of a level, in that level's order (GPU: the
        descriptors a codec is configured with, with their slot layouts;
        cold levels hold encoded pages and have no ``slot_desc``)."""
        h = self._native()
        nd, nl, npl = ctypes.c_size_t(), ctypes.c_size_t(), ctypes.c_size_t()
        while True:
            cd, cl, cp = nd.value, nl.value, npl.value
            descs = (ffi.kvcm_pool_group_desc * max(cd, 1))()
            lcs = (ffi.kvcm_layer_group_id * max(cl, 1))()
            pools = (ffi.kvcm_pool_desc * max(cp, 1))()
            try:
                _pool_group_descs(h, level,
                             descs if cd else None, cd, lcs if cl else None, cl, pools if cp else None, cp,
                             ctypes.byref(nd), ctypes.byref(nl), ctypes.byref(npl))
            except BufferTooSmallError:
                continue
            if nd.value <= cd and nl.value <= cl and npl.value <= cp:
                break
        out = []
        for i in range(nd.value):
            d = descs[i]
            lgs = tuple(d.life_cycles[k] for k in range(d.num_life_cycles))
            out.append(PoolGroupDesc(
                d.index, d.num_slots,
                self._slot_desc(lgs, d.num_pools) if level == GPU_LEVEL else None,
                tuple(PoolDesc(k, int(d.pools[k].base), d.pools[k].slot_bytes) for k in range(d.num_pools)),
                lgs,
            ))
        return out

    # -- quota ------------------------------------------------------------
    def get_quota(self, cache_level: int) -> int:
        out = _I64()
        _get_quota(self._native(), cache_level, _byref(out))
        return out.value

    def resize(self, cache_level: int, quota: int, best_efforts: bool = False) -> bool:
        """Change a level's byte quota (evicting / defragmenting to shrink),
        as KVCacheManagerV2's ``resize``: True on success, False when the
        quota cannot be had (OutOfPagesError, InvalidStateError or
        InvalidArgumentError from the library; nothing changed then). With
        ``best_efforts`` it settles for the largest quota not above
        ``quota`` that it can reach (between the current quota and
        ``quota`` when growing; a shrink it cannot do is False), and is
        False only when the quota could not change at all. KVCacheManagerV2
        wants every cache suspended first; kvcm also resizes with ACTIVE
        caches (GPU pools resize in place) and refuses only a shrink that
        would move their pages. A cache level or quota that is no level or
        quota at all (out of range, not positive) raises InvalidArgumentError."""
        cache_level = _convert.check(cache_level, ctypes.c_int32, "cache_level")
        quota = _convert.check(quota, ctypes.c_int64, "quota")
        if not 0 <= cache_level < self._num_levels:
            raise InvalidArgumentError(f"cache_level: {cache_level} out of [0, {self._num_levels})")
        if quota <= 0:
            raise InvalidArgumentError(f"quota: must be positive, got {quota}")

        def attempt(q: int) -> bool:
            try:
                _resize_level(self._native(), cache_level, q)
            except (OutOfPagesError, InvalidStateError, InvalidArgumentError):
                return False
            return True

        if attempt(quota):
            return True
        if not best_efforts:
            return False
        lo, hi = self.get_quota(cache_level), quota  # lo is where it is, hi is out of reach
        if hi <= lo:
            return False  # a shrink it cannot do
        grew = False
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if attempt(mid):
                lo, grew = mid, True
            else:
                hi = mid
        return grew

    # -- reuse and caches ---------------------------------------------------
    @staticmethod
    def _scope(lora_id: int | None, salt: Any) -> tuple[Any, bool, Any]:
        """(kvcm_reuse_scope, has_lora_id, keep) for a scope's fields."""
        s = ffi.kvcm_reuse_scope()
        if lora_id is not None:
            set_field(s, "lora_id", lora_id, "reuse_scope.lora_id")
        keep = None
        data = _salt_bytes(salt)
        if data:
            s.salt, keep = _native.byte_buffer(data)
            s.salt_len = len(data)
        elif data is not None:
            raise ValueError("salt: an empty salt is no salt; pass None")
        return s, lora_id is not None, keep

    def probe_reuse(self, reuse_scope: Any = None, input_tokens: Sequence[int] | None = None, *,
                    lora_task_id: int | None = None, salt: bytes | str | int | None = None) -> int:
        """How many tokens of input_tokens a new cache in reuse_scope would
        reuse now: all of them when all of them are cached, less the
        configuration's ``reuse_match_backoff`` (KVCacheManagerV2's rule;
        leave the last prompt token out to have it computed). ``reuse_scope``
        is a ReuseScope (any object with ``lora_id`` and ``salt``) or None;
        ``lora_task_id``/``salt`` are kvcm's older spelling of it. It changes
        nothing. kvcm's older ``probe_reuse(input_tokens, lora_task_id=...,
        salt=...)`` still works: a first argument that is not a scope is the
        tokens."""
        if input_tokens is None and not _is_scope(reuse_scope):
            reuse_scope, input_tokens = None, reuse_scope
        lora_id, salt = _scope_fields(reuse_scope, lora_task_id, salt)
        if lora_id is None and salt is None:
            scope, has_lora, _keep = _NO_SCOPE, False, None
        else:
            scope, has_lora, _keep = self._scope(lora_id, salt)
        toks, n, _keep_tokens, dig = _tokens(input_tokens, "input_tokens", bool(self._config.text_only))
        out = _I64()
        h = self._resource if self._state == "open" else self._native()
        if dig is None:
            _probe_reuse(h, _byref(scope), has_lora, toks, n, _byref(out))
        else:
            _probe_reuse_digests(h, _byref(scope), has_lora, toks, n, *dig, _byref(out))
        return out.value

    def probe_reuse_pages(self, reuse_scope: Any, input_tokens: Sequence[int], layer_group_id: int,
                          enable_partial: bool = False) -> tuple[int, list[ReusePage | None]]:
        """Match ``input_tokens`` against the committed blocks by content
        (whatever their pages): the tokens matched and, per block of the
        match, the page of ``layer_group_id`` covering the most of it (None
        where no page holds the block's matched tokens). A block's own page
        covers its tokens; a block position also has the pages of the partial
        blocks committed beside it whose tokens the block starts with, each
        covering its own tokens (KVCacheManagerV2's partial-coverage pages).
        The match ends with the matching head of one more block: with
        ``enable_partial`` as far as a block there agrees with the input,
        else only at a partial block the input holds whole. Text tokens only."""
        lora_id, salt = _scope_fields(reuse_scope, None, None)
        c_scope, has_lora, _keep = self._scope(lora_id, salt)
        toks, n, _keep_tokens, _ = _tokens(input_tokens, "input_tokens", True)
        rows = self._array_query("kvcm_manager_probe_reuse_pages", ffi.kvcm_reuse_page, _byref(c_scope), has_lora,
                                 toks, n, layer_group_id, bool(enable_partial), layer_group="layer_group_id",
                                 tokens="input_tokens")
        pages = [ReusePage(r.level, r.slot, r.covered) if r.covered else None for r in rows]
        return sum(r.matched for r in rows), pages

    def probe_first_new_block_key(self, reuse_scope: Any = None,
                                  input_tokens: Sequence[int] | None = None) -> bytes | None:
        """The key of the first full block of ``input_tokens`` past the prefix
        a new cache in ``reuse_scope`` (a ReuseScope or None) would reuse (the
        block it would commit first), or None when no full block lies past it
        (no tokens: None). The parameters are KVCacheManagerV2's, names and
        defaults. kvcm's keys are 64-bit chained hashes: the key is their 8
        little-endian bytes (the ``key`` of the block's cache events)."""
        lora_id, salt = _scope_fields(reuse_scope, None, None)
        c_scope, has_lora, _keep = self._scope(lora_id, salt)
        toks, n, _keep_tokens, dig = _tokens(input_tokens, "input_tokens", bool(self._config.text_only))
        key, found = ctypes.c_uint64(), ctypes.c_bool()
        if dig is None:
            _probe_first_new(self._native(), _byref(c_scope), has_lora, toks, n, _byref(key), _byref(found))
        else:
            _probe_first_new_digests(self._native(), _byref(c_scope), has_lora, toks, n, *dig, _byref(key), _byref(found))
        return key.value.to_bytes(8, "little") if found.value else None

    def set_block_priorities(self, block_keys: Sequence[int | bytes], priorities: Sequence[int],
                             scope: Any = None) -> int:
        """Set the eviction priority of the cached blocks along a chain of
        block keys in ``scope`` (a ReuseScope or None), first block first:
        ``block_keys[i]`` gets ``priorities[i]``, as far as the manager holds
        the chain, and blocks given a higher priority are evicted after those
        of lower priority. It is for a scheduler: the keys of a waiting
        request are what its CP index's ``get_cp_cached_blocks`` returns
        (ints); a key may also be the 8 little-endian bytes of
        ``probe_first_new_block_key`` and the cache events. ``DEFAULT_PRIORITY``
        returns blocks nobody waits for to the common order. Priorities are
        clamped into [0, 100], and a block never ranks below the blocks after
        it. Returns how many blocks were set. Raises InvalidArgumentError
        naming ``priorities``, changing nothing, unless the two are as long;
        a key or priority out of its C type's range raises naming it."""
        lora_id, salt = _scope_fields(scope, None, None)
        c_scope, has_lora, _keep = self._scope(lora_id, salt)
        keys = [_block_key(k, f"block_keys[{i}]") for i, k in enumerate(block_keys)]
        prs = [_convert.check(p, ctypes.c_int32, f"priorities[{i}]") for i, p in enumerate(priorities)]
        out = ctypes.c_size_t()
        c_keys = (ctypes.c_uint64 * len(keys))(*keys) if keys else None
        c_prs = (ctypes.c_int32 * len(prs))(*prs) if prs else None
        _set_block_priorities(self._native(), _byref(c_scope), has_lora, c_keys, len(keys), c_prs, len(prs),
                              _byref(out))
        return out.value

    def clear_reusable_blocks(self) -> None:
        """Drop every committed block from every level. Raises
        InvalidStateError, changing nothing, while caches are open
        (KVCacheManagerV2's rule and message)."""
        n = self.num_open_caches()
        if n:
            raise InvalidStateError(f"clear_reusable_blocks() with {n} KV cache(s) still open; close them first")
        _native.call("kvcm_manager_clear_reusable_blocks", self._native())

    def num_open_caches(self) -> int:
        """How many caches of the manager are open (not closed)."""
        out = ctypes.c_size_t()
        _native.call("kvcm_manager_get_num_open_caches", self._native(), _byref(out))
        return out.value

    def shutdown(self) -> None:
        """Release the manager, as KVCacheManagerV2's ``shutdown``: raises
        InvalidStateError, changing nothing, while caches are open (close
        them first). ``close()`` instead closes the caches it still owns. A
        closed manager shuts down as a no-op."""
        if self.closed:
            return
        n = self.num_open_caches()
        if n:
            raise InvalidStateError(f"shutdown() with {n} KV cache(s) still open; close them first")
        self.close()

    def _decode_step_windows(self) -> tuple[int, ...] | None:
        """The sliding window sizes a cache's deferred decode steps check
        (see _KVCache.__init__), or None where decode steps do not defer
        (SWA scratch reuse)."""
        ws = getattr(self, "_step_windows", False)
        if ws is False:
            cfg = self._config
            if cfg.enable_swa_scratch_reuse:
                ws = None
            else:
                ws = tuple(sorted({lc.window_size for lc in self._life_cycles() if lc.window_size}))
            self._step_windows = ws
        return ws

    def _life_cycles(self) -> list[LifeCycle]:
        """Every layer group as a LifeCycle (window and sink blocks from the
        configuration)."""
        lcs = getattr(self, "_lc_cache", None)
        if lcs is None:
            tpb = self._tokens_per_block
            by_group: dict[int, LifeCycle] = {}
            for layer in self._config.layers:
                g = self.get_layer_group_id(layer.layer_id)
                if isinstance(layer, SsmLayerConfig):
                    by_group.setdefault(g, LifeCycle(g, None, 0, is_ssm=True))
                    continue
                sinks = -(-(layer.num_sink_tokens or 0) // tpb)
                by_group.setdefault(g, LifeCycle(g, layer.sliding_window_size or None, sinks))
            lcs = self._lc_cache = [by_group[g] for g in range(self._num_layer_groups)]
        return lcs

    def create_kv_cache(
        self,
        reuse_scope: Any = None,
        input_tokens: Sequence[int] | None = None,
        id: Any = None,
        custom_priority_callback: Callable[[int, LifeCycle], int] | None = None,
        expected_prompt_length: int | None = None,
        text_only: bool | None = None,
        enable_request_stats: bool = False,
        *,
        lora_task_id: int | None = None,
        salt: bytes | str | int | None = None,
        request_id: str | bytes | None = None,
        fresh_blocks: int = 0,
        fresh_from_block: int = 0,
    ) -> "_KVCache":
        """A SUSPENDED cache holding the longest reusable cached prefix of
        input_tokens (all of it when all of it is cached, less
        ``reuse_match_backoff``; see :meth:`probe_reuse`). ``reuse_scope`` is
        a ReuseScope (``lora_id`` and ``salt``; lora_id None and 0 are
        different scopes) or None; ``lora_task_id``/``salt`` are kvcm's older
        spelling. ``custom_priority_callback(block_ordinal, life_cycle)``
        gives each layer group's page of a block its eviction priority, an
        int clamped into [0, 100]; ``life_cycle`` is a :class:`LifeCycle`
        (the layer group id, with ``window_size`` and ``num_sink_blocks``).
        As in KVCacheManagerV2 it is asked when ``resize`` allocates the page
        (the page ranks by it while private and keeps it when committed); a
        block whose page came otherwise (a partial-reuse copy) is asked at its
        commit. It runs with the manager's lock held and must not call into
        the manager. An exception it raises (a result that is not an int
        included) fails the resize or commit, which then changes nothing, and
        is re-raised by it; at close, where a trailing partial block is
        published, the block gets the default priority and close re-raises
        it. ``expected_prompt_length`` is the prefill/generation boundary of
        the statistics: once the history has reached it, capacity growth
        counts as generation-phase allocation (``iter_gen_alloc_blocks``); it
        defaults to ``len(input_tokens)`` (with no input tokens, no growth
        counts as generation) and is kept as the cache's attribute.
        ``input_tokens`` may hold multimodal digest tokens (32-byte ``bytes``
        or :class:`MmItemContext`; see :mod:`kvcm.multimodal`) unless the
        cache is text-only: ``text_only`` True, or None with the
        configuration's ``text_only``, refuses them with TypeError (and takes
        the text-only path). With ``enable_request_stats`` the cache's
        ``commit_pending_stats`` returns its block counts also when the
        configuration's ``enable_stats`` is off.
        ``request_id`` names the request for the CP index attached with
        :meth:`attach_cp`, which is then notified about the cache's blocks.
        ``fresh_blocks`` and ``fresh_from_block`` (kvcm extensions) ask for a
        fresh run: the cache reuses the matched prefix but its
        ``fresh_blocks`` blocks from block ``fresh_from_block`` on, which get
        fresh GPU pages for the engine to compute while the reused blocks
        after them come up from host or disk (see the cache's
        :attr:`~_KVCache.fresh_range`); negative counts, a
        ``fresh_from_block`` without ``fresh_blocks``, SSM layers, sliding
        windows and digest tokens raise InvalidArgumentError naming the
        argument. kvcm's older positional ``create_kv_cache(lora_task_id,
        ...)`` still works: an int first argument is the lora_task_id."""
        if reuse_scope is None and lora_task_id is None:
            lora_id = None  # no scope: what _scope_fields returns
        else:
            if isinstance(reuse_scope, int) and not isinstance(reuse_scope, bool) and lora_task_id is None:
                reuse_scope, lora_task_id = None, reuse_scope
            lora_id, salt = _scope_fields(reuse_scope, lora_task_id, salt)
        if expected_prompt_length is not None and (type(expected_prompt_length) is not int
                                                   or expected_prompt_length < 0):
            raise ValueError(f"expected_prompt_length: expected a non-negative int or None, got {expected_prompt_length!r}")
        if text_only not in (None, True, False):
            raise TypeError(f"text_only: expected a bool or None, got {text_only!r}")
        if text_only is None:
            text_only = bool(self._config.text_only)
        elif not text_only and self._config.text_only:
            raise TextOnlyConflictError("text_only: False is not allowed when the manager is configured "
                                        "text_only=True (a cache may only tighten it)")
        cache = _KVCache(self, lora_id, input_tokens, id, custom_priority_callback, salt, request_id,
                         expected_prompt_length, text_only, fresh_blocks, fresh_from_block)
        # The cache's class holds what these start with.
        if reuse_scope is not None:
            cache._reuse_scope = reuse_scope
        if enable_request_stats:
            cache.enable_request_stats = True
            cache._update_fast()
        if id is not None:
            cache._note_pending_stats()
        return cache

    # -- CP index -----------------------------------------------------------------
    def attach_cp(self, cp: Any) -> None:
        """Make the manager notify ``cp`` (a :class:`~kvcm.CPAwareKVManager`)
        about caches created with a ``request_id``: reused blocks at creation
        and completed blocks at each commit as allocated, all of them as freed
        once when the cache closes; suspend, resume and level moves notify
        nothing. Replaces the index attached before (caches keep the one they
        were created with). The manager keeps the native index alive while it
        uses it, also after ``cp.close()``."""
        from .cp import CPAwareKVManager

        if not isinstance(cp, CPAwareKVManager):
            raise TypeError(f"cp: expected a kvcm CP index, got {type(cp).__name__}")
        _native.call("kvcm_manager_attach_cp", self._native(), cp._handle())

    def detach_cp(self) -> None:
        """Caches created from now on notify nothing."""
        _native.call("kvcm_manager_detach_cp", self._native())

    # -- statistics -----------------------------------------------------------
    @staticmethod
    def _block_stats(s: Any) -> BlockStats:
        return BlockStats._from_c(s)

    @property
    def stats(self) -> BlockStats:
        """Cumulative block statistics (blocks counted once per cache,
        whatever the number of layer groups)."""
        out = ffi.kvcm_block_stats()
        _native.call("kvcm_manager_get_stats", self._native(), ctypes.byref(out))
        return self._block_stats(out)

    def get_shared_stats(self) -> SharedStats | None:
        """The shared tier's cumulative counters (:class:`SharedStats`: the
        manager's blocks looked up, onboarded, written back or through, and
        its cluster client's keys, errors and write queue); None without a
        shared tier."""
        if self._shared_level is None:
            self._native()  # a closed manager raises
            return None
        out = ffi.kvcm_shared_stats()
        _native.call("kvcm_manager_get_shared_stats", self._native(), ctypes.byref(out))
        return SharedStats._from_c(out)

    def flush_shared(self, timeout: float) -> bool:
        """Wait at most ``timeout`` seconds (positive; rounded up to whole
        milliseconds) until the shared tier's writes handed over so far are
        written to the cluster or failed. True when they were in time, False
        when the timeout ran out first (the writes go on). Without a shared
        tier it returns True at once. A timeout that is not a positive finite
        number raises :class:`InvalidArgumentError` (a bool, str or None
        ``TypeError``)."""
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
            raise TypeError(f"timeout: expected seconds as a number, got {type(timeout).__name__}")
        if not (math.isfinite(timeout) and timeout > 0):
            raise InvalidArgumentError(f"timeout: {timeout!r} is not a positive finite number of seconds")
        ms = min(math.ceil(timeout * 1000), _convert.RANGES[ctypes.c_int64][1])
        out = ctypes.c_bool()
        _native.call("kvcm_manager_flush_shared", self._native(), ms, ctypes.byref(out))
        return bool(out.value)

    def get_and_reset_iteration_block_stats(self) -> BlockStats:
        """:attr:`stats` of the iteration since the previous call (kvcm's
        aggregate; see :meth:`get_and_reset_iteration_stats`)."""
        out = ffi.kvcm_block_stats()
        _native.call("kvcm_manager_get_and_reset_iteration_stats", self._native(), ctypes.byref(out))
        return self._block_stats(out)

    def get_committed_stats(self) -> KVCacheStatsDelta:
        """KVCM2's committed statistics: the sum of what the caches'
        ``commit_pending_stats`` committed (a cache's counts are pending until
        then; ``discard_pending_stats`` and closing drop them). :attr:`stats`
        counts every block at once."""
        return self._committed_stats.copy()

    def get_and_reset_iteration_stats(self) -> dict[int, KVCacheIterationStatsDelta]:
        """Every layer group's counters since the previous call, for the
        layer groups where something was counted; restarts them. A cache's
        reuse, miss and allocation counts are there once it committed them
        (``commit_pending_stats``); page movements count when they happen."""
        out: dict[int, KVCacheIterationStatsDelta] = {}
        for s in self._array_query("kvcm_manager_get_and_reset_layer_group_iteration_stats",
                                   ffi.kvcm_layer_group_iteration_stats):
            d = KVCacheIterationStatsDelta._from_c(s)
            if self._stats_on and not d.empty:
                out[s.layer_group] = d
        return out

    def get_and_reset_iteration_reused_blocks_by_level(self) -> dict[int, ReusedBlocksByLevel]:
        """Per layer group that reused something since the previous call,
        its reused pages by the level each was on; restarts the counts."""
        out: dict[int, ReusedBlocksByLevel] = {}
        for r in self._array_query("kvcm_manager_get_and_reset_iteration_reused_blocks_by_level",
                                   ffi.kvcm_reused_blocks_at_level):
            e = out.setdefault(r.layer_group, ReusedBlocksByLevel([0] * self._num_levels, [0] * self._num_levels))
            e.full[r.level], e.partial[r.level] = r.full_blocks, r.partial_blocks
        return {lg: e for lg, e in out.items() if self._stats_on and (any(e.full) or any(e.partial))}

    def get_and_reset_iteration_cached_tokens_by_level(self) -> list[int]:
        """Tokens new caches reused since the previous call, by the level
        their data was on; restarts the counts."""
        got = [int(n) for n in self._array_query("kvcm_manager_get_and_reset_iteration_cached_tokens_by_level",
                                                 ctypes.c_int64)]
        return got if self._stats_on else [0] * len(got)

    def get_and_reset_ssm_snapshot_iteration_stats(self) -> dict[int, SsmSnapshotIterationStatsDelta]:
        """The SSM layer group's snapshot lookups since the previous call
        (one per cache created with input tokens; a hit when it reused a
        snapshot), keyed by layer group; empty without SSM layers or
        lookups. Restarts them."""
        out: dict[int, SsmSnapshotIterationStatsDelta] = {}
        for s in self._array_query("kvcm_manager_get_and_reset_ssm_snapshot_iteration_stats",
                                   ffi.kvcm_ssm_snapshot_iteration_stats):
            d = SsmSnapshotIterationStatsDelta._from_c(s)
            if self._stats_on and not d.empty:
                out[s.layer_group] = d
        return out

    def record_request_suspended(self) -> None:
        """Count one ACTIVE to SUSPENDED transition of a request. A cache's
        suspend counts itself (as in KVCM2); this is for transitions the
        manager does not see."""
        if self._stats_on:
            self._iter_suspended += 1

    def record_request_resumed(self) -> None:
        """Count one resumption of a request suspended before. A cache's
        resume after its first counts itself (as in KVCM2)."""
        if self._stats_on:
            self._iter_resumed += 1

    def get_and_reset_iteration_suspend_resume_stats(self) -> tuple[int, int]:
        out = (self._iter_suspended, self._iter_resumed)
        self._iter_suspended = self._iter_resumed = 0
        return out

    def _disk_pages(self) -> int:
        m = self.get_migration_stats()
        return sum(m[p].pages for p in (MigrationPath.DISK_TO_HOST, MigrationPath.DISK_TO_GPU) if p in m)

    def get_and_reset_iteration_disk_prefetch_blocks(self) -> int:
        """Pages read back from the disk level since the previous call."""
        now = self._disk_pages()
        n, self._disk_prefetched = now - self._disk_prefetched, now
        return n if self._stats_on else 0

    def mark_stats_dirty(self, kv_cache_id: int | None) -> None:
        if kv_cache_id is not None:
            self._dirty_stats.add(kv_cache_id)

    def clear_stats_dirty(self, kv_cache_id: int | None) -> None:
        if kv_cache_id is not None:
            self._dirty_stats.discard(kv_cache_id)

    def get_dirty_stats_kv_cache_ids(self) -> set[int]:
        return set(self._dirty_stats)

    def mark_stats_excluded(self, kv_cache_id: int | None) -> None:
        if kv_cache_id is not None:
            self._excluded_stats.add(kv_cache_id)
            self._dirty_stats.discard(kv_cache_id)

    def clear_stats_excluded(self, kv_cache_id: int | None) -> None:
        if kv_cache_id is not None:
            self._excluded_stats.discard(kv_cache_id)

    def is_stats_excluded(self, kv_cache_id: int | None) -> bool:
        return kv_cache_id is not None and kv_cache_id in self._excluded_stats

    def _array_query(self, fn: str, elem: Any, *args: Any, **names: str) -> list[Any]:
        h = self._native()
        f = bind(fn, **names)
        needed = ctypes.c_size_t()
        cap = 0
        while True:
            buf = (elem * max(cap, 1))()
            try:
                f(h, *args, buf if cap else None, cap, ctypes.byref(needed))
            except BufferTooSmallError:
                cap = needed.value
                continue
            if needed.value <= cap:
                return [buf[i] for i in range(needed.value)]
            cap = needed.value

    def get_storage_stats(self, cache_level: int = 0) -> list[PoolGroupStats]:
        """The state of every pool group of a level, in slots."""
        return [
            PoolGroupStats._from_c(s)
            for s in self._array_query("kvcm_manager_get_storage_stats", ffi.kvcm_pool_group_stats,
                                       cache_level, level="cache_level")
        ]

    def get_storage_statistics(self, cache_level: int = GPU_LEVEL) -> list[StorageStatistics]:
        """The slot counts of every pool group of a level, with its pools'
        slot sizes."""
        descs = self.get_pool_group_descs(cache_level)
        return [StorageStatistics([p.slot_bytes for p in d.pools], s.total, s.free, s.evictable)
                for d, s in zip(descs, self.get_storage_stats(cache_level))]

    def get_and_reset_iteration_peak_used_blocks(self, cache_level: int = 0) -> list[PeakBlockStats]:
        """kvcm's peak of used slots per pool group since the last reset
        (shares its iteration with
        :meth:`get_and_reset_iteration_peak_block_stats`)."""
        return [
            PeakBlockStats._from_c(s)
            for s in self._array_query("kvcm_manager_get_and_reset_iteration_peak_block_stats",
                                       ffi.kvcm_peak_block_stats, cache_level, level="cache_level")
        ]

    def get_and_reset_iteration_peak_block_stats(self, cache_level: int = GPU_LEVEL) -> list[PoolGroupPeakBlockStats]:
        """Per pool group of a level, the peaks of available, unavailable and
        evictable slots since the last reset (sampled at the end of every
        operation); restarts them."""
        return [
            PoolGroupPeakBlockStats._from_c(s)
            for s in self._array_query("kvcm_manager_get_and_reset_iteration_pool_group_peak_block_stats",
                                       ffi.kvcm_pool_group_peak_block_stats, cache_level, level="cache_level")
        ]

    def get_and_reset_iteration_peak_block_stats_by_level(self) -> list[list[PoolGroupPeakBlockStats]]:
        return [self.get_and_reset_iteration_peak_block_stats(level) for level in range(self._num_levels)]

    def get_migration_stats(self) -> dict[MigrationPath, MigrationStats]:
        out = {}
        for s in self._array_query("kvcm_manager_get_migration_stats", ffi.kvcm_migration_stats):
            st = MigrationStats._from_c(s)
            out[st.path] = st
        return out

    # -- events -----------------------------------------------------------------
    @property
    def event_manager(self) -> KVCacheEventManager | None:
        return self._event_manager

    def _attach_events(self, em: KVCacheEventManager) -> None:
        self._event_manager = em
        em._attach(self)
        if not em._window_given:
            windows = {}
            for layer in self._config.layers:
                if getattr(layer, "sliding_window_size", None):  # SSM layers have no window
                    windows[self.get_layer_group_id(layer.layer_id)] = layer.sliding_window_size
            if windows:
                em.set_layer_group_window_sizes(windows)
        pg = [self.get_life_cycle_pool_group_indices(level) for level in range(self._num_levels)]
        slots = [[d.num_slots for d in self.get_pool_group_descs(level)] for level in range(self._num_levels)]
        for lg in range(self._num_layer_groups):
            em.add_created_event([slots[level][pg[level][lg]] for level in range(self._num_levels)], [lg])

    def _note_scope(self, cache_id: int, lora: Any, salt: Any) -> None:
        if self._event_manager is not None:
            self._scopes[cache_id] = (lora, salt)

    def _forget_scope(self, cache_id: int) -> None:
        if self._event_manager is not None:
            self._closed_scopes.append(cache_id)

    def _collect_events(self, em: KVCacheEventManager) -> None:
        """Hand the library's pending block events to em (at its flush)."""
        if self.closed:
            return
        h = self._native()
        cap = 256
        events = (ffi.kvcm_block_event * cap)()
        tok_cap = cap * max(self._tokens_per_block, 1)
        tokens = (ffi.kvcm_token * tok_cap)()
        positions = (ctypes.c_size_t * tok_cap)()
        raw = (ctypes.c_uint8 * (32 * tok_cap))()
        base = ctypes.addressof(tokens)
        ne, nt, nd, dropped = ctypes.c_size_t(), ctypes.c_size_t(), ctypes.c_size_t(), ctypes.c_uint64()
        groups = range(self._num_layer_groups)
        while True:
            _drain_block_events(h, events, cap, tokens, tok_cap, positions, raw, ctypes.byref(ne), ctypes.byref(nt),
                                ctypes.byref(nd), ctypes.byref(dropped))
            self._events_dropped = getattr(self, "_events_dropped", 0) + dropped.value
            # Digest tokens by their place in the tokens buffer.
            digests = {positions[j]: bytes(raw[32 * j:32 * (j + 1)]) for j in range(nd.value)}
            for i in range(ne.value):
                e = events[i]
                kind = EventKind(e.kind)
                if kind == EventKind.BLOCK_STORED:
                    toks = [e.tokens[k] for k in range(e.num_tokens)]
                    dg = None
                    if digests and e.num_tokens:
                        at = (ctypes.cast(e.tokens, ctypes.c_void_p).value - base) // ctypes.sizeof(ffi.kvcm_token)
                        dg = {k: digests[at + k] for k in range(e.num_tokens) if at + k in digests} or None
                    em._on_stored(e.key, e.parent, toks, e.level, e.priority, self._scopes.get(e.cache_id), groups, dg)
                elif kind == EventKind.BLOCK_REMOVED:
                    em._on_removed(e.key)
                elif kind == EventKind.BLOCK_UPDATED:
                    em._on_page(e.key, e.layer_group, e.old_level, e.level, e.priority)
                else:
                    em._on_priority(e.key, e.old_priority, e.priority)
            if ne.value == 0:
                break
        for cid in self._closed_scopes:
            self._scopes.pop(cid, None)
        self._closed_scopes.clear()

    def drain_events(self, max_events: int = 1024) -> list[CacheEvent]:
        """Remove and return every queued cache event, oldest first (kvcm's
        own records; an event manager given to the constructor takes them
        from the same queue at its flush). ``events_dropped`` counts events
        lost to a full queue."""
        h = self._native()
        out: list[CacheEvent] = []
        max_events = _convert.check(max_events, ctypes.c_int32, "max_events")
        if max_events < 1:
            raise InvalidArgumentError(f"max_events: must be at least 1, got {max_events}")
        events = (ffi.kvcm_cache_event * max_events)()
        tok_cap = max_events * max(self._tokens_per_block, 1)
        tokens = (ffi.kvcm_token * tok_cap)()
        ne, nt, dropped = ctypes.c_size_t(), ctypes.c_size_t(), ctypes.c_uint64()
        while True:
            _drain_events(h, events, max_events, tokens, tok_cap,
                         ctypes.byref(ne), ctypes.byref(nt), ctypes.byref(dropped))
            self._events_dropped = getattr(self, "_events_dropped", 0) + dropped.value
            for i in range(ne.value):
                out.append(CacheEvent._from_c(events[i]))
            if ne.value == 0:
                return out

    @property
    def events_dropped(self) -> int:
        """Events lost to a full queue, over every drain so far."""
        return getattr(self, "_events_dropped", 0)

    # -- device helpers ---------------------------------------------------------
    def create_stream(self) -> Stream:
        """A new stream on the manager's device (closed with the manager)."""
        out = ffi.kvcm_stream()
        _native.call("kvcm_manager_create_stream", self._native(), ctypes.byref(out))
        s = Stream(self, out.value)
        self._own(s)
        return s

    def alloc_memory(self, size: int, kind: MemoryKind = MemoryKind.HOST_MAPPED) -> DeviceMemory:
        """Memory on the manager's device (freed with the manager)."""
        out = ffi.kvcm_device_ptr()
        size = _convert.check(size, ctypes.c_uint64, "size")
        _alloc_memory(self._native(), int(MemoryKind(kind)), size, ctypes.byref(out))
        m = DeviceMemory(self, out.value, size, MemoryKind(kind))
        self._own(m)
        return m

    def __repr__(self) -> str:
        return f"<kvcm.KVCacheManager {'closed' if self.closed else 'open'}>"


class _PyStep:
    """The decode step's state of a cache on the ctypes path: the attributes,
    defer, flush and tokens of the extension's ``kvcm._kvcm_ext.CacheStep``
    (see gen/pyext/step.c), whose resize and commit the cache installs on
    the extension path; here the cache's own methods run the step."""

    __slots__ = ("handle", "committed", "history", "capacity", "limit", "fast", "mark", "key", "windows", "_tokens",
                 "_nsteps", "_rpend", "_tpb")

    def __init__(self, handle: int, tokens_per_block: int) -> None:
        self.handle = handle
        self.committed = self.history = self.capacity = self.limit = -1
        self.fast = False
        self.mark = self.key = self.windows = None
        self._tokens: list[int] = []
        self._nsteps = 0  # the last _nsteps tokens are decode steps'
        self._rpend = False  # a deferred decode step's resize waits for its commit
        self._tpb = tokens_per_block

    @property
    def pending(self) -> int:
        return len(self._tokens) + self._rpend

    @property
    def steps(self) -> int:
        return self._nsteps + self._rpend

    def defer_resize(self, capacity: int, history: int) -> bool:
        """Defer resize(c + 1, c + 1) of a decode step (see CacheStep):
        c the committed tokens, the history and the capacity, inside a
        block, no window's first kept block moving."""
        c, tpb, windows = self.committed, self._tpb, self.windows
        if (windows is None or self.limit < 0 or self._rpend or c <= 0 or self.history != c or self.capacity != c
                or capacity != c + 1 or history != c + 1 or c % tpb == 0):
            return False
        for w in windows:
            if c + 2 > w and (c + 2 - w) % tpb == 0:
                return False  # the first kept block moves at c + 1
        self.history = self.capacity = c + 1
        self._rpend = True
        return True

    def defer_step(self, tokens: list[int] | tuple[int, ...]) -> bool:
        """Defer the commit of the decode step whose resize waits: one int32
        int; flushed at once when it fills the block."""
        if not self._rpend or len(tokens) != 1 or self.committed + 1 != self.history:
            return False
        x = tokens[0]
        if x.__class__ is not int or not -0x80000000 <= x <= 0x7FFFFFFF:
            return False
        self._tokens.append(x)
        self._nsteps += 1
        self._rpend = False
        self.committed += 1
        if self.committed % self._tpb == 0:
            self.flush()
            self.limit = self.committed + self._tpb - 1  # the next block's
        return True

    def tokens(self) -> list[int]:
        return list(self._tokens)

    def defer(self, tokens: list[int] | tuple[int, ...]) -> bool:
        """Defer the commit of tokens (a list or tuple) when they are int32
        ints within the limit and the history and no decode step waits:
        True when deferred, False for a commit to make now (CacheStep's
        defer, the same rule)."""
        n = len(tokens)
        c = self.committed + n
        if not n or c > self.limit or c > self.history or self.steps:
            return False
        for x in tokens:
            if x.__class__ is not int or not -0x80000000 <= x <= 0x7FFFFFFF:
                return False
        self._tokens += tokens
        self.committed = c
        return True

    def flush(self) -> None:
        """The deferred commits in one commit, the decode steps in one
        kvcm_kv_cache_decode_steps, the resize waiting for its commit; what
        a failed call would have passed stays deferred."""
        plain = len(self._tokens) - self._nsteps
        if plain:
            toks, n, keep = _convert.tokens(self._tokens[:plain], "accepted_input_tokens")
            _cache_commit(self.handle, toks, n, False)
            del keep
            del self._tokens[:plain]
        if self._nsteps:
            toks, n, keep = _convert.tokens(self._tokens, "tokens")
            _cache_decode_steps(self.handle, toks, n)
            del keep
            self._tokens, self._nsteps = [], 0
        if self._rpend:
            _cache_resize(self.handle, self.capacity, self.history)
            self._rpend = False


class _KVCache(Managed):
    """One request's KV cache (``kvcm_kv_cache``): SUSPENDED → ACTIVE ⇄
    SUSPENDED → CLOSED, with committed ≤ history_length ≤ capacity."""

    _what = "KV cache"
    Status = CacheStatus

    # What a cache starts with, as class attributes: __init__ writes an
    # instance attribute only where a cache starts otherwise, and each is
    # replaced, never changed in place.
    #
    # Collects what a priority callback raises; only a cache with one has
    # it.
    _stash: _native.Stash | None = None
    _priority_cb: Any = None
    _stream: Any = None
    _reuse_scope: Any = None
    _lora_id: int | None = None
    _salt: Any = None
    enable_request_stats = False
    # Whether the cache was created text-only: the library keeps that.
    _created_text_only = False
    # Whether the cache was ACTIVE once: a later resume is a preemption
    # recovery, counted (see _counts_preemption).
    _resumed_before = False
    # KVCM2 holds a cache's SSM snapshot lookup (one per cache created with
    # input tokens) among its pending statistics until they are committed
    # or discarded; kvcm counts the lookup at once, and keeps only its
    # dirty mark pending.
    _ssm_lookup_pending = False
    # The decode step's deferred commits. A commit of text tokens that
    # stays inside the block being filled and inside the history changes
    # only the committed count and the block's partial tokens, which
    # nothing but this cache's own queries read (no page, event, statistic
    # or published block; with SSM layers a commit's place is checked
    # against the history, so they never defer). Such commits wait in the
    # step state _st (its tokens(); pending is their number) and reach the
    # library in one commit when anything else crosses into it for this
    # cache (_native: every query and call but resize; close; the manager's
    # close), before that call. What decides it is what the library last
    # reported or accepted: _st.committed (the committed tokens, the
    # waiting ones included) and _st.history (the history length), -1
    # while unknown; _active (ACTIVE since a resume) and _stopped (commits
    # stopped). _st.limit is the committed count the waiting tokens may
    # reach (the last before the block being filled completes), -1 unless
    # all of those are known and allow waiting; _defers is False where
    # commits never wait (SSM layers, a priority callback). Anything the
    # library would refuse is not deferred: it takes the library's path,
    # which reports it. On the extension path _st is a
    # kvcm._kvcm_ext.CacheStep whose resize and commit are this object's
    # (instance attributes): the decode step in C, falling back to the
    # methods below for every other case; _st.fast says when resize needs
    # nothing around the library call (_update_fast).
    #
    # Whole decode steps wait too: a resize(c + 1, c + 1) with c the
    # committed tokens, the history and the capacity (_st.capacity, -1
    # while unknown), inside a block (no page to take) and moving no
    # sliding window's first kept block (_st.windows, the manager's window
    # sizes: None with several beams or SWA scratch reuse, where steps
    # never wait), followed by the commit of one token. Such a step changes
    # nothing but the cache's own counts (and its demand sample, which only
    # its close reads). The waiting steps reach the library in one
    # kvcm_kv_cache_decode_steps, after the waiting commits, when a step
    # fills its block (its block is published in that call), when a resize
    # does not wait, and whenever the waiting commits would; a resize
    # waiting for its commit reaches it then as the resize it is (_st.steps
    # counts them, that resize included). The capacity getter reads
    # _st.capacity while steps wait.
    _st: Any = None  # None until __init__ made it
    _active = False
    _stopped = False
    _defers = True
    # The end of the fresh run while it is owed (see fresh_range), else 0:
    # its commits are not deferred, and the commit completing it jumps the
    # committed count to the prefix's end, which the mirror reads back from
    # the library.
    _run_to = 0
    _one_beam = True  # decode steps defer with one beam only

    def __init__(self, manager: KVCacheManager, lora_id: int | None, input_tokens: Sequence[int] | None,
                 id: Any, custom_priority_callback: Callable[[int, LifeCycle], int] | None,
                 salt: bytes | str | int | None, request_id: str | bytes | None = None,
                 expected_prompt_length: int | None = None, text_only: bool = False,
                 fresh_blocks: int = 0, fresh_from_block: int = 0) -> None:
        super().__init__()
        self._manager = manager
        self._id = id
        # Page indices by layer group: the views get_base_page_indices hands
        # out and the caller's buffers set_base_page_index_buf registered,
        # refreshed after every call that can change them.
        # Keyed by (beam, layer group).
        self._views: dict[tuple[int, int], array.array] = {}
        self._bufs: dict[tuple[int, int], memoryview] = {}
        if manager._has_ssm or custom_priority_callback is not None:
            self._defers = False
        self._tpb = manager._tokens_per_block
        scope = salt_keep = rid_keep = None
        if lora_id is not None or salt is not None:
            self._lora_id, self._salt = lora_id, salt
            scope, has_lora, salt_keep = KVCacheManager._scope(lora_id, salt)
        self._text_only = text_only
        if text_only:
            self._created_text_only = True
        toks, n, toks_keep, dig = _tokens(input_tokens, "input_tokens", text_only)
        self._num_input_tokens = n
        if n and manager._has_ssm:
            self._ssm_lookup_pending = True
        # KVCM2's default boundary: the prompt's length, when there is one.
        if expected_prompt_length is None and input_tokens is not None:
            expected_prompt_length = n
        self.expected_prompt_length = expected_prompt_length
        has_epl = expected_prompt_length is not None
        # The options a plain create sets, packed at once (see _OPTS_PACK).
        opts: Any = _OPTS_PACK(_OPTS_SIZE, ffi.KVCM_ABI_VERSION, toks if toks.__class__ is int else 0, n, has_epl,
                               expected_prompt_length & _U64 if has_epl else 0, text_only)
        fresh = (fresh_blocks.__class__ is not int or fresh_from_block.__class__ is not int
                 or fresh_blocks != 0 or fresh_from_block != 0)
        if (scope is not None or (n and toks.__class__ is not int) or fresh or dig is not None
                or custom_priority_callback is not None or request_id is not None
                or _native._backend != "extension"):
            # Fields a plain create leaves zero, or the ctypes path (which
            # takes a structure, not bytes): the structure.
            opts = _OPTS.from_buffer_copy(opts)
            if scope is not None:
                opts.scope = scope
                opts.scope_has_lora_id = has_lora
            if n and toks.__class__ is not int:
                opts.input_tokens = ctypes.cast(toks, _TOKEN_PTR)
            if fresh:
                set_field(opts, "fresh_blocks", fresh_blocks)
                set_field(opts, "fresh_from_block", fresh_from_block)
            if dig is not None:
                pos, nd, blob, blen = dig
                opts.input_digest_positions = ctypes.cast(pos, ctypes.POINTER(ctypes.c_size_t))
                opts.num_input_digests = nd
                opts.input_digest_bytes = blob
                opts.input_digest_bytes_len = blen
            if custom_priority_callback is not None:
                if not callable(custom_priority_callback):
                    raise TypeError("custom_priority_callback: expected a callable(block_ordinal, life_cycle) -> int")
                self._stash = _native.Stash()
                self._priority_cb = _priority_trampoline(self._stash, manager._life_cycles(),
                                                         custom_priority_callback)
                opts.layer_group_priority = self._priority_cb
            if request_id is not None:
                from .cp import _id_bytes

                rid = _id_bytes(request_id)
                opts.request_id, rid_keep = _native.byte_buffer(rid)
                opts.request_id_len = len(rid)
        out = ffi.kvcm_kv_cache()
        _cache_create(manager._native(), opts, out)
        del salt_keep, toks_keep, rid_keep
        h = out.value
        self._adopt(h)
        if fresh:
            frm, to = _I64(), _I64()
            _cache_fresh_range(h, _byref(frm), _byref(to))
            if frm.value < to.value:
                self._run_to = to.value
        cls = type(self)
        if _native._backend == "extension" and _STEP is not None:
            st = self._st = _STEP(h, self._tpb, self, cls.resize, cls.commit)
            # The decode step in C, unless a subclass has its own methods.
            if cls.resize is _KVCache.resize:
                self.resize = st.resize
            if cls.commit is _KVCache.commit:
                self.commit = st.commit
        else:
            self._st = _PyStep(h, self._tpb)
        self._update_fast()
        manager._own_cache(self)
        if manager._event_manager is not None:
            manager._note_scope(self.cache_id, lora_id, salt)

    @property
    def manager(self) -> KVCacheManager:
        return self._manager

    @property
    def id(self) -> Any:
        """The request's id (KVCacheManagerV2's): the key of the manager's
        stats dirty marks."""
        return self._id

    @id.setter
    def id(self, value: Any) -> None:
        self._id = value
        self._update_fast()

    @property
    def _pending(self) -> list[int]:
        """The tokens of the deferred commits (see __init__)."""
        return self._st.tokens()

    def _native(self) -> Any:
        """The handle (ClosedError and the like otherwise), after the
        deferred commits reached the library: every call but the decode
        step's observes them. On failure (the cache's data lost, or the
        manager gone) they stay deferred, so that nothing is lost, and the
        error is raised."""
        h = Managed._native(self)
        if self._st.pending:
            self._st.flush()
        return h

    def _update_limit(self) -> None:
        """Recompute the limit of the deferred commits (see __init__)."""
        st = self._st
        c = st.committed
        if c < 0 or not self._active or self._stopped or not self._defers or self._run_to or self._state != "open":
            st.limit = -1
        else:
            st.limit = c - c % self._tpb + self._tpb - 1

    def _update_fast(self) -> None:
        """Whether resize needs nothing but the library call (no callback to
        re-raise from, no page index views to refresh, no stats dirty mark
        to note, or only one already noted: the id in mark): the C decode
        step's resize then skips the method. What it reads changes only
        where it is called (the state, the callback, the views and
        buffers, the id, the beams)."""
        st = self._st
        if st is not None:
            m = self._manager
            if self._state == "open" and self._priority_cb is None and not self._bufs and not self._views:
                if self._id is not None and self._records_stats():
                    st.fast, st.mark, st.key = False, m._dirty_stats, self._id
                else:
                    st.fast, st.mark, st.key = True, None, None
            else:
                st.fast, st.mark, st.key = False, None, None
            st.windows = m._decode_step_windows() if self._one_beam and self._defers else None

    def _mark_closed(self) -> None:
        if self._st is not None:
            self._st.limit, self._st.fast, self._st.mark = -1, False, None
        super()._mark_closed()

    def _release(self, handle: int) -> None:
        self._active = False
        st = self._st  # None when __init__ failed making it
        try:
            if st is not None:
                st.limit, st.fast, st.mark = -1, False, None
                if st.pending:
                    st.flush()  # partial reuse publishes them at close
        finally:
            m = self._manager
            m._caches.pop(id(self), None)
            self._stream = None
            if self._id is not None:
                m.clear_stats_dirty(self._id)  # closing discards the pending statistics
            if m._event_manager is not None:
                m._forget_scope(self._get_id(handle))
            self._bufs.clear()
            self._views.clear()
            if self._priority_cb is None:
                _cache_close(handle)
            else:
                _native.call_with_stash(self._stash, lambda: _cache_close(handle))

    def _get(self, fn: str, ctype: Any = ctypes.c_int64) -> int:
        out = ctype()
        _native.call(fn, self._native(), ctypes.byref(out))
        return out.value

    # -- state ---------------------------------------------------------------
    @property
    def status(self) -> CacheStatus:
        if self.closed:
            return CacheStatus.CLOSED
        return CacheStatus(self._get("kvcm_kv_cache_get_status", ctypes.c_int32))

    @property
    def is_active(self) -> bool:
        return self.status == CacheStatus.ACTIVE

    @property
    def is_commit_allowed(self) -> bool:
        """True while the cache takes commits: until :meth:`stop_committing`,
        a commit with ``is_end`` or :meth:`close` (a kvcm extension;
        KVCacheManagerV2 answers it in ``_introspection.is_commit_allowed``)."""
        return not self._stopped and not self.closed

    @property
    def cache_id(self) -> int:
        """The library's id of the cache, unique within its manager."""
        return self._get("kvcm_kv_cache_get_id", ctypes.c_uint64)

    @staticmethod
    def _get_id(handle: int) -> int:
        out = ctypes.c_uint64()
        _native.call("kvcm_kv_cache_get_id", handle, ctypes.byref(out))
        return out.value

    def supports_index_mode(self, mode: PageIndexMode) -> bool:
        """PER_LAYER always; SHARED while the cache holds no scratch slots."""
        if PageIndexMode(mode) == PageIndexMode.SHARED:
            return not self.has_scratch_slots
        return True

    # -- SWA scratch reuse and planned drops ------------------------------------
    def get_scratch_desc(self, layer_group_id: int) -> ScratchDesc | None:
        """The scratch blocks and slots of a layer group in the ACTIVE cache's
        current step, or None when it has none (see :mod:`kvcm.scratch`)."""
        h = self._native()
        beg, end, needed = _I64(), _I64(), ctypes.c_size_t()
        cap = 0
        while True:
            slots = (ctypes.c_int32 * max(cap, 1))()
            try:
                _cache_scratch_desc(h, layer_group_id, _byref(beg), _byref(end), slots if cap else None, cap,
                                    _byref(needed))
            except BufferTooSmallError:
                cap = needed.value
                continue
            if needed.value <= cap:
                break
            cap = needed.value
        if end.value <= beg.value:
            return None
        return ScratchDesc(HalfOpenRange(beg.value, end.value), tuple(slots[:needed.value]))

    @property
    def has_scratch_slots(self) -> bool:
        """Whether the cache holds scratch slots now."""
        return bool(self._get("kvcm_kv_cache_has_scratch_slots", ctypes.c_bool))

    @property
    def enable_swa_scratch_reuse(self) -> bool:
        """Whether the cache uses scratch slots (at first as the manager's
        configuration says). Setting it needs the configuration to turn it on
        (InvalidArgumentError, a ValueError) and, either way, a current step
        that needs no scratch blocks (ScratchInUseError: an InvalidStateError
        and, as KVCacheManagerV2 reports it, a ValueError)."""
        return bool(self._get("kvcm_kv_cache_get_swa_scratch_reuse", ctypes.c_bool))

    @enable_swa_scratch_reuse.setter
    def enable_swa_scratch_reuse(self, enable: bool) -> None:
        try:
            _native.call("kvcm_kv_cache_set_swa_scratch_reuse", self._native(), bool(enable))
        except InvalidStateError as e:
            if self.closed:
                raise
            raise ScratchInUseError(e.message, code=e.code) from None

    def plan_committed_block_drop(self) -> PlannedDropHandle | None:
        """Plan dropping the committed pages of this turn's full blocks in the
        window of every sliding-window layer group (past its sinks): only
        the next turn of the conversation would reuse them; full-attention
        and sink blocks stay. Needs :meth:`stop_committing` first
        (InvalidStateError). None when nothing can be planned (no full block
        committed, or a page is no longer cached)."""
        out = ffi.kvcm_planned_drop()
        _cache_plan_drop(self._native(), _byref(out))
        return PlannedDropHandle(out.value) if out.value else None

    @property
    def num_committed_tokens(self) -> int:
        if self._state != "open":
            self._native()  # raises
        c = self._st.committed
        if c < 0:
            out = _I64()
            _cache_committed(self._resource, out)
            c = self._st.committed = out.value
            self._update_limit()
        return c

    @property
    def history_length(self) -> int:
        if self._state != "open":
            self._native()  # raises
        h = self._st.history
        if h < 0:
            out = _I64()
            _cache_history(self._resource, out)
            h = self._st.history = out.value
        return h

    @property
    def capacity(self) -> int:
        if self._st.steps and self._state == "open":
            return self._st.capacity  # what the deferred decode steps make it
        out = _I64()
        _cache_capacity(self._resource if self._state == "open" else self._native(), out)
        return out.value

    @capacity.setter
    def capacity(self, capacity: int) -> None:
        """Reserve pages for ``capacity`` tokens (KVCacheManagerV2's setter):
        raises OutOfPagesError when the GPU cannot hold them."""
        if not self.resize(capacity, None):
            raise OutOfPagesError(f"capacity: not enough GPU pages for {capacity} tokens")

    @history_length.setter
    def history_length(self, history_length: int) -> None:
        """Advance the history length (it never decreases); a sliding window
        releases the pages it no longer needs."""
        if not self.resize(None, history_length):
            raise OutOfPagesError(f"history_length: not enough GPU pages for {history_length} tokens")

    @property
    def reused_tokens(self) -> int:
        return self._get("kvcm_kv_cache_get_reused_tokens")

    @property
    def fresh_range(self) -> tuple[int, int]:
        """The tokens ``(from, to)`` of the fresh run the cache was created
        with (kvcm extension: ``create_kv_cache(..., fresh_blocks=k,
        fresh_from_block=f)``), from == to for none: the engine computes
        their KV into the run's pages (``get_base_page_indices``) and commits
        exactly these tokens, in order, before any other commit; the commit
        completing the run moves ``num_committed_tokens`` to the matched
        prefix's end (``history_length`` is that end from creation on). A run
        the GPU had no room for leaves the whole prefix reused (no run); one
        reaching the match's end is a cut there (no run, the prefix reused up
        to its start)."""
        frm, to = _I64(), _I64()
        _cache_fresh_range(self._native(), _byref(frm), _byref(to))
        return frm.value, to.value

    def wait_fresh_tail(self, cuda_stream: Stream | int | None = None) -> None:
        """Make ``cuda_stream`` (None: the cache's stream; the stream
        conventions of :meth:`resume`) wait until the fresh run's tail (the
        blocks after the run) is ready (kvcm extension): while the run is
        owed, resume makes the stream wait only for the pages the run's
        compute uses, so the run's prefill overlaps the tail's onboarding.
        Call it before any work that reads past the run (resume, compute the
        run, commit it, wait_fresh_tail, attend past the run). Idempotent; a
        no-op without a run; raises InvalidStateError unless the cache is
        ACTIVE."""
        if cuda_stream is None:
            cuda_stream = self._stream
            if cuda_stream is None:
                raise InvalidStateError("wait_fresh_tail: the cache was never resumed")
        _cache_wait_fresh_tail(self._native(), _stream_handle(cuda_stream))

    @property
    def committed_tokens(self) -> list[Any]:
        """A copy of the committed tokens: text token ids, and each
        multimodal digest token as its 32 digest bytes."""
        n = self.num_committed_tokens
        while True:
            buf = (ffi.kvcm_token * max(n, 1))()
            needed = ctypes.c_size_t()
            try:
                _cache_committed_tokens(self._native(), buf, n, _byref(needed))
            except BufferTooSmallError:
                n = needed.value
                continue
            out: list[Any] = list(buf[:needed.value])
            break
        if self._text_only:
            return out
        nd = ctypes.c_size_t()
        while True:
            cap = nd.value
            pos = (ctypes.c_size_t * max(cap, 1))()
            raw = (ctypes.c_uint8 * max(32 * cap, 1))()
            try:
                _cache_committed_digests(self._native(), pos if cap else None, raw if cap else None, cap, _byref(nd))
            except BufferTooSmallError:
                continue
            if nd.value > cap:
                continue
            for i in range(nd.value):
                out[pos[i]] = bytes(raw[32 * i:32 * (i + 1)])
            return out

    @property
    def text_only(self) -> bool:
        """Whether the cache takes text token ids only (create_kv_cache's
        ``text_only``, or the configuration's, or what was set here)."""
        return self._text_only

    @text_only.setter
    def text_only(self, text_only: bool) -> None:
        """Make the cache text-only (its later commits refuse digest tokens
        with TypeError), or take that back. False on a manager configured
        ``text_only=True`` raises TextOnlyConflictError (a cache may only
        tighten it, as in KVCacheManagerV2), and on a cache created
        text-only UnsupportedError (the library keeps its text-only path);
        either changes nothing."""
        if text_only not in (True, False):
            raise TypeError(f"text_only: expected a bool, got {text_only!r}")
        self._native()
        if not text_only:
            if self._manager._config.text_only:
                raise TextOnlyConflictError("text_only: False is not allowed when the manager is configured "
                                            "text_only=True (a cache may only tighten it)")
            if self._created_text_only:
                raise UnsupportedError("text_only: a cache created text-only stays text-only")
        self._text_only = bool(text_only)

    @property
    def cached_tokens_by_level(self) -> list[int]:
        """Per cache level, how many of the cache's tokens with computed KV
        (its history) are held there: a block's tokens at the coldest level of
        its pages; blocks a sliding window released count nowhere."""
        h = self._native()
        n = self._manager.num_cache_levels
        while True:
            buf = (ctypes.c_int64 * max(n, 1))()
            needed = ctypes.c_size_t()
            try:
                _cache_cached_tokens(h, buf, n, _byref(needed))
            except BufferTooSmallError:
                n = needed.value
                continue
            return [int(v) for v in buf[:needed.value]]

    # -- per-request statistics (KVCM2's pending stats) -----------------------

    def _records_stats(self) -> bool:
        """Whether the cache's block counts are recorded as pending
        statistics (dirty-marked, returned by commit_pending_stats): with the
        manager's statistics on, or with the cache's enable_request_stats
        (KVCM2's request-only accounting, for a manager whose statistics
        are off)."""
        return self._manager._stats_on or self.enable_request_stats

    def _note_pending_stats(self) -> None:
        """Mark the cache's id dirty while it has pending statistics (block
        counts, or its SSM snapshot lookup), as KVCM2 does when it records
        them. An id already marked stays so without asking the library
        (a decode step's resize of a cache with an id)."""
        m = self._manager
        i = self._id
        if i is not None and self._records_stats() and i not in m._dirty_stats and not m.is_stats_excluded(i) \
                and (self._ssm_lookup_pending or not self._pending_stats().empty):
            m.mark_stats_dirty(i)

    def _pending_stats(self) -> KVCacheStatsDelta:
        """The cache's pending block counts, as the library counts them by
        KVCM2's rules (kvcm_kv_cache_get_pending_stats)."""
        out = ffi.kvcm_kv_cache_stats_delta()
        _cache_pending_stats(self._native(), _byref(out))
        return KVCacheStatsDelta._from_c(out)

    def commit_pending_stats(self) -> KVCacheStatsDelta:
        """Commit the block counts since the previous commit or discard (by
        KVCM2's rules, per attention layer group, summed: the blocks reused
        at creation; the pages allocated for the cache, the partial block's
        private copy included, missed while the history is short of the
        prompt) into the
        manager's :meth:`~KVCacheManager.get_committed_stats`, and the
        cache's per-layer-group counts into its
        :meth:`~KVCacheManager.get_and_reset_iteration_stats`, and return
        them (KVCacheManagerV2's rule). With the manager's statistics
        disabled the counts reach neither; they are still returned when the
        cache was created with ``enable_request_stats`` (request-only
        accounting), else discarded (an empty delta). The cache's id marked
        excluded discards them either way. The cache's dirty mark is
        cleared; a closed cache has nothing pending."""
        m = self._manager
        self._ssm_lookup_pending = False
        if self.closed:
            m.clear_stats_dirty(self.id)
            return KVCacheStatsDelta()
        if not self._records_stats() or m.is_stats_excluded(self.id):
            self.discard_pending_stats()
            return KVCacheStatsDelta()
        delta = self._pending_stats()
        if m._stats_on:
            _cache_commit_pending(self._native())
            m._committed_stats.add(delta)
        else:
            _cache_discard_pending(self._native())
        m.clear_stats_dirty(self.id)
        return delta

    def discard_pending_stats(self) -> None:
        """Drop the block counts since the previous commit or discard: they
        never reach the committed or the iteration statistics. Clears the
        dirty mark."""
        self._ssm_lookup_pending = False
        if not self.closed:
            _cache_discard_pending(self._native())
        self._manager.clear_stats_dirty(self.id)

    @property
    def reuse_scope(self) -> Any:
        """The scope the cache was created in: the ReuseScope passed to
        create_kv_cache; for None (or kvcm's lora_task_id/salt), a
        ``kvcm.ReuseScope`` when the package defines one, else None."""
        if self._reuse_scope is None:
            cls = getattr(sys.modules[__package__], "ReuseScope", None)
            if cls is not None:
                return cls(self._lora_id, self._salt)
        return self._reuse_scope

    @property
    def tokens_per_block(self) -> int:
        return self._manager.tokens_per_block

    @property
    def num_blocks(self) -> int:
        tpb = self.tokens_per_block
        return (self.capacity + tpb - 1) // tpb

    @property
    def cuda_stream(self) -> Any:
        """The stream the cache runs on (None before it was first given one):
        what ``resume`` or the setter got."""
        return self._stream

    @cuda_stream.setter
    def cuda_stream(self, cuda_stream: Stream | int) -> None:
        """Move the cache to ``cuda_stream``: an ACTIVE cache's work continues
        there, after everything enqueued on the old stream so far (an event
        orders them); a SUSPENDED one resumes there."""
        if cuda_stream is None:
            raise TypeError("cuda_stream: expected a stream, got None")
        _cache_set_stream(self._native(), _stream_handle(cuda_stream))
        self._stream = cuda_stream

    # -- transitions -------------------------------------------------------------
    def resume(self, cuda_stream: Stream | int | None = None) -> bool:
        """Make the cache ACTIVE on ``cuda_stream`` (None: the stream it last
        had, from ``cuda_stream`` or an earlier resume): a :class:`Stream` of
        the manager, or any stream the engine owns, as its handle (an int) or
        an object with a ``cuda_stream`` handle (a ``torch.cuda.Stream``): on
        CUDA a CUstream of the manager's device (0 for the legacy default
        stream); on the emulated
        device any int names an emulated stream of its own, made on first
        use, so a program written for CUDA runs unchanged. Pages on colder
        levels come back to the GPU and the stream waits for them. Returns
        False, leaving the cache SUSPENDED, while the GPU is busier than
        ``max_util_for_resume`` or cannot take the pages back; raises
        CodecFailedError (the codec failed to decode some pages: they are
        dropped) or DataLostError (close the cache then). A failure of the
        asynchronous decode not known yet reaches the stream and makes the
        next call raise DataLostError."""
        if cuda_stream is None:
            cuda_stream = self._stream
            if cuda_stream is None:
                raise InvalidArgumentError("cuda_stream: the cache never had a stream; pass one")
        try:
            _cache_resume(self._native(), _stream_handle(cuda_stream))
        except (ResumeRefusedError, OutOfPagesError):
            return False
        self._active = True
        self._update_limit()
        self._stream = cuda_stream
        if self._bufs or self._views:
            self._refresh_indices()
        if not self._resumed_before:
            self._resumed_before = True  # the admission, not a recovery
        elif self._counts_preemption():
            self._manager._iter_resumed += 1
        return True

    def _counts_preemption(self) -> bool:
        """Whether the cache's suspensions and later resumptions count in the
        manager's get_and_reset_iteration_suspend_resume_stats, as
        KVCacheManagerV2's cache counts them itself: with statistics on and
        the cache's id not excluded."""
        m = self._manager
        return m._stats_on and not m.is_stats_excluded(self._id)

    def suspend(self) -> None:
        """Make the cache SUSPENDED; buffers given to set_base_page_index_buf
        are let go (as KVCacheManagerV2 does)."""
        h = self._native()
        self._active, self._st.limit = False, -1
        _cache_suspend(h)
        self._bufs.clear()
        self._views.clear()
        self._update_fast()
        if self._counts_preemption():
            self._manager._iter_suspended += 1

    def resize(self, capacity: int | None, history_length: int | None = None) -> bool:
        """Set capacity (tokens with pages; None keeps it) and history_length
        (computed tokens; None keeps it) of an ACTIVE cache. Returns False,
        changing nothing, when the GPU has not enough pages; raises
        InvalidArgumentError and the like for a bad request. The cache's
        ``custom_priority_callback`` is asked about each new page first (as
        KVCacheManagerV2 asks as it allocates); an exception it raises fails
        the resize, which then changes nothing, and is re-raised here."""
        if capacity is None:
            capacity = self.capacity
        if history_length is None:
            history_length = -1
        elif history_length.__class__ is not int or history_length < 0:
            history_length = _convert.check(history_length, _I64, "history_length")
            if history_length < 0:
                raise InvalidArgumentError(f"history_length: must not be negative, got {history_length}")
        st = self._st
        if st.windows is not None and (st.fast or st.mark is not None and st.key in st.mark) and \
                st.defer_resize(capacity, history_length):
            return True  # a decode step's resize, deferred (see __init__)
        h = self._resource if self._state == "open" else self._native()
        if st.steps:
            st.flush()  # the deferred decode steps come before this resize
        try:
            if self._priority_cb is None:
                _cache_resize(h, capacity, history_length)
            else:
                _native.call_with_stash(self._stash, lambda: _cache_resize(h, capacity, history_length))
        except OutOfPagesError:
            return False
        if history_length >= 0:
            st.history = history_length
        st.capacity = int(capacity)
        # The decode step's path: each check is inlined before its call.
        if self._bufs or self._views:
            self._refresh_indices()
        if self.id is not None:
            self._note_pending_stats()
        return True

    def commit(self, accepted_input_tokens: Sequence[int], beam_search_indices: Sequence[int] | None = None,
               is_end: bool = False) -> None:
        """Append computed tokens to the committed sequence; completed blocks
        are published for reuse. Committed tokens are history: the history
        length advances to them (they must fit in the capacity). ``is_end``
        ends committing (kvcm's older ``commit(tokens, is_end)`` still works).

        With beam search, ``beam_search_indices`` has one entry per beam:
        beam j first takes over the history of beam
        ``beam_search_indices[j]`` (beams reordered, forked or dropped; where
        two beams would share the block they write into next, the later one
        gets a copy of it), then the tokens, converged and in beam 0, are
        committed. A block they complete is published once, from beam 0, and
        every beam reads beam 0's page of it from then on. None keeps the
        beams. With SSM layers a commit must start or end at the history
        length (the SSM state is the history's), else it raises
        SsmCommitOffHistoryError (an InvalidArgumentError and, as
        KVCacheManagerV2 reports it, an AssertionError). On error nothing
        changes."""
        t = accepted_input_tokens
        if beam_search_indices is None and is_end is False and (t.__class__ is list or t.__class__ is tuple):
            n = len(t)
            st = self._st
            if st.steps and st.defer_step(t):
                return  # the decode step's commit, deferred (see __init__)
            if st.defer(t):
                return  # a commit inside the block being filled, deferred (see __init__)
        if beam_search_indices is None and self._priority_cb is None:
            # Text tokens, no beams, no callback to re-raise from; anything
            # else (digest tokens too) takes the general path below, which
            # makes the same checks.
            try:
                toks, n, keep = _convert.tokens(accepted_input_tokens, "accepted_input_tokens")
            except TypeError:
                pass
            else:
                h = self._native()
                try:
                    _cache_commit(h, toks, n, is_end if is_end.__class__ is bool else bool(is_end))
                except InvalidArgumentError as err:
                    if SsmCommitOffHistoryError.RULE in err.message:
                        raise SsmCommitOffHistoryError(err.message, err.code) from None
                    raise
                del keep
                self._committed_by(h, n, is_end)
                if self._bufs or self._views:
                    self._refresh_indices()
                return
        if isinstance(beam_search_indices, bool):
            # kvcm's older commit(tokens, is_end): a bool is never indices.
            beam_search_indices, is_end = None, beam_search_indices
        toks, n, keep, dig = _tokens(accepted_input_tokens, "accepted_input_tokens", self._text_only)
        h = self._native()
        if beam_search_indices is None:
            def call() -> None:
                if dig is None:
                    _cache_commit(h, toks, n, bool(is_end))
                else:
                    _cache_commit_digests(h, toks, n, *dig, bool(is_end))
        else:
            if dig is not None:
                raise UnsupportedError("commit: digest tokens with beam_search_indices (a beam search step "
                                       "commits text tokens only)")
            idx, num_idx, keep_idx = _convert.tokens(list(beam_search_indices), "beam_search_indices")
            if num_idx == 0:
                raise InvalidArgumentError("beam_search_indices: has 0 entries; give one per beam, or None")

            def call() -> None:
                _cache_commit_beams(h, toks, n, idx, num_idx, bool(is_end))
        try:
            if self._priority_cb is None:
                call()
            else:
                # An exception the priority callback raised fails the commit
                # (which then changes nothing) and is re-raised here.
                try:
                    call()
                except KVCacheError as err:
                    self._stash.reraise(err)
                    raise
                self._stash.reraise()
        except InvalidArgumentError as err:
            if SsmCommitOffHistoryError.RULE in err.message:
                raise SsmCommitOffHistoryError(err.message, err.code) from None
            raise
        self._committed_by(h, n, is_end)
        if self._bufs or self._views:
            self._refresh_indices()  # beams reordered, or a sliding window let pages go

    def decode_steps(self, tokens: Sequence[int]) -> bool:
        """One-token decode steps in one library call (a kvcm extension,
        kvcm_kv_cache_decode_steps): for each token t in order what
        ``resize(max(capacity, history_length + 1), history_length + 1)``
        and ``commit([t])`` do. Returns False, changing nothing, when the
        GPU has not enough pages for the blocks the run adds; a cache not
        at its committed history (or otherwise not in a decode step) raises
        InvalidStateError. A cache with a custom_priority_callback re-raises
        what it raises."""
        toks, n, keep = _convert.tokens(tokens, "tokens")
        h = self._native()
        try:
            if self._priority_cb is None:
                _cache_decode_steps(h, toks, n)
            else:
                _native.call_with_stash(self._stash, lambda: _cache_decode_steps(h, toks, n))
        except OutOfPagesError:
            return False
        del keep
        st = self._st
        if n:
            st.capacity = -1 if st.capacity < 0 else max(st.capacity, st.committed + n)
            st.history = st.committed = -1 if st.committed < 0 else st.committed + n
            self._update_limit()
        if self._bufs or self._views:
            self._refresh_indices()
        if self.id is not None and n:
            self._note_pending_stats()
        return True

    def _committed_by(self, h: int, n: int, is_end: Any) -> None:
        """Update the deferral's mirror after the library committed n tokens
        (committed tokens are history; is_end stops commits)."""
        st = self._st
        c = st.committed
        if c < 0 or self._run_to:
            out = _I64()
            _cache_committed(h, out)
            c = out.value
            if c >= self._run_to:
                self._run_to = 0
        else:
            c += n
        st.committed = c
        if 0 <= st.history < c:
            st.history = c
        if is_end:
            self._stopped = True
        self._update_limit()

    @property
    def beam_width(self) -> int:
        """The number of beams (1 at creation)."""
        out = ctypes.c_int32()
        _cache_beam_width(self._native(), _byref(out))
        return out.value

    @beam_width.setter
    def beam_width(self, beam_width: int) -> None:
        """Set the number of beams of an ACTIVE cache, in [1,
        MAX_BEAM_WIDTH]. New beams fork from beam 0: they share its pages,
        except that each gets a copy of every block holding a position at or
        past the history length (the block beams write into next); new blocks
        get a page per beam. Beams at or beyond a smaller width are dropped
        with their uncommitted KV. Raises OutOfPagesError, changing nothing,
        when the GPU has no room for the copies."""
        _cache_set_beam_width(self._native(), beam_width)
        self._one_beam = beam_width == 1
        for key in [k for k in (*self._bufs, *self._views) if k[0] >= beam_width]:
            self._bufs.pop(key, None)
            self._views.pop(key, None)
        self._update_fast()
        self._refresh_indices()

    def stop_committing(self) -> None:
        _native.call("kvcm_kv_cache_stop_committing", self._native())
        self._stopped, self._st.limit = True, -1

    def prefetch(self, target: int) -> bool:
        """Bring a SUSPENDED cache's pages up to cache level ``target``
        without pinning them. False when that level has no room for some of
        them (those stay where they were)."""
        try:
            _cache_prefetch(self._native(), target)
        except OutOfPagesError:
            return False
        return True

    # -- pages ----------------------------------------------------------------
    def _fetch_indices(self, layer_group_id: int, beam: int = DEFAULT_BEAM_INDEX) -> array.array:
        h = self._native()
        if self.status != CacheStatus.ACTIVE:
            # A suspended cache holds no GPU page: every block reads -1 until
            # resume places them (and refreshes the views and buffers).
            return array.array("i", [BAD_PAGE_INDEX]) * self.num_blocks
        needed = ctypes.c_size_t()
        cap = self.num_blocks
        while True:
            a = array.array("i", bytes(4 * cap))
            ptr = a.buffer_info()[0] if cap else None
            out = ctypes.cast(ptr, ctypes.POINTER(ctypes.c_int32)) if ptr else None
            try:
                if beam == DEFAULT_BEAM_INDEX:
                    _cache_page_indices(h, layer_group_id, out, cap, ctypes.byref(needed))
                else:
                    _cache_beam_page_indices(h, layer_group_id, beam, out, cap, ctypes.byref(needed))
            except BufferTooSmallError:
                cap = needed.value
                continue
            if needed.value <= cap:
                del a[needed.value:]
                return a
            cap = needed.value

    def get_page_indices(self, layer_group_id: int, beam_id: int = DEFAULT_BEAM_INDEX) -> array.array:
        """The GPU base page index of every block in a layer group (-1 where
        the block has no page, every block of a SUSPENDED cache) in beam
        ``beam_id``, as a fresh ``array.array('i')``: a buffer-protocol object
        that owns its memory, so ``numpy.frombuffer(a, dtype=numpy.int32)`` or
        ``memoryview(a)`` use it without copying."""
        return self._fetch_indices(layer_group_id, beam_id)

    def get_aggregated_page_indices(self, layer_group_id: int, beam_id: int = DEFAULT_BEAM_INDEX,
                                    valid_only: bool = False) -> Iterator[int]:
        """The aggregated page index of every block of a layer group in beam
        ``beam_id`` (in ``range(beam_width)``): the block's GPU slot in that
        beam, which addresses every :class:`AggregatedPageDesc` of the layer
        group; -1 where a block has no page, or with ``valid_only`` only the
        blocks that have one. The cache must be ACTIVE."""
        h = self._native()
        needed = ctypes.c_size_t()
        cap = self.num_blocks
        while True:
            a = array.array("i", bytes(4 * cap))
            ptr = a.buffer_info()[0] if cap else None
            try:
                _cache_aggregated_indices(h, layer_group_id, beam_id, bool(valid_only),
                                          ctypes.cast(ptr, ctypes.POINTER(ctypes.c_int32)) if ptr else None,
                                          cap, ctypes.byref(needed))
            except BufferTooSmallError:
                cap = needed.value
                continue
            if needed.value <= cap:
                return iter(a[:needed.value])
            cap = needed.value

    def get_base_page_indices(self, layer_group_id: int,
                              beam_id: int = DEFAULT_BEAM_INDEX) -> array.array | memoryview:
        """KVCacheManagerV2's view of the base page indices of a layer group
        in beam ``beam_id`` (-1 where a block has no page; beams read the same
        index where they share a page): the buffer given to
        :meth:`set_base_page_index_buf`, else an ``array.array('i')`` the cache
        keeps and updates in place after each call that changes its pages
        (resume, resize, the capacity and history setters, commit, the beam
        width setter), so repeated calls copy nothing. Treat it as read-only;
        it is let go on suspend, and with its beam when the beam width
        shrinks past it. A SUSPENDED cache's blocks read -1."""
        key = (beam_id, layer_group_id)
        buf = self._bufs.get(key)
        if buf is not None:
            return buf
        view = self._views.get(key)
        if view is None:
            view = self._fetch_indices(layer_group_id, beam_id)
            self._views[key] = view
            self._update_fast()
        return view

    def get_ssm_block_base_index(self, layer_group_id: int, beam_id: int = 0) -> int:
        """The GPU slot of the cache's SSM state in the SSM layer group
        (KVCM2's get_ssm_block_base_index), BAD_PAGE_INDEX (-1) for an
        attention layer group. A cache gets its state at its first resume: a
        copy of the snapshot it reused, or a fresh one. The cache must be
        ACTIVE. The state is one per request, shared by its beams: beam_id
        must be DEFAULT_BEAM_INDEX (InvalidArgumentError otherwise)."""
        if beam_id != DEFAULT_BEAM_INDEX:
            raise InvalidArgumentError(f"beam_id: a cache holds one SSM state, read as beam {DEFAULT_BEAM_INDEX}, got {beam_id}")
        out = ctypes.c_int32()
        _cache_ssm_index(self._native(), layer_group_id, _byref(out))
        return int(out.value)

    def _reuse_diagnostics(self) -> Any:
        d = ffi.kvcm_reuse_diagnostics()
        _cache_reuse_diag(self._native(), _byref(d))
        return d

    def _get_num_reusable_tokens_before_pruning(self) -> int:
        """KVCM2's diagnostic: the prompt's tokens whose full blocks the tree
        held by content at creation (after reuse_match_backoff)."""
        return int(self._reuse_diagnostics().content_tokens)

    def _get_num_reusable_tokens_before_hybrid_pruning(self) -> int:
        """KVCM2's diagnostic: the prompt's tokens the attention layer groups
        could reuse at creation, before the SSM snapshot cut them back."""
        return int(self._reuse_diagnostics().attention_tokens)

    _get_num_tokens_before_hybrid_pruning = _get_num_reusable_tokens_before_hybrid_pruning

    def set_base_page_index_buf(self, beam_idx: int, layer_group_id: int, buf: Any) -> None:
        """Keep the base page indices of a layer group in beam ``beam_idx``
        in a caller-owned buffer (a 1-D int32 buffer, format 'i', of at least
        ``num_blocks`` entries; the entries past the blocks read -1): the
        cache writes them now (-1 for every block while SUSPENDED) and after
        each call that changes its pages (resume included), until ``buf`` is
        None, the cache is suspended or the beam width shrinks past the
        beam."""
        key = (beam_idx, layer_group_id)
        if buf is None:
            self._bufs.pop(key, None)
            self._update_fast()
            return
        mv = memoryview(buf)
        if mv.ndim != 1 or mv.format != "i" or mv.readonly:
            raise TypeError("buf: expected a writable 1-D buffer of int32 (format 'i')")
        idx = self._fetch_indices(layer_group_id, beam_idx)
        if len(mv) < len(idx):
            raise ValueError(f"buf: holds {len(mv)} indices, the cache has {len(idx)} blocks")
        self._write(mv, idx)
        self._bufs[key] = mv
        self._views.pop(key, None)
        self._update_fast()

    @staticmethod
    def _write(mv: memoryview, idx: array.array) -> None:
        n = len(idx)
        mv[:n] = memoryview(idx)
        if len(mv) > n:
            mv[n:] = array.array("i", [BAD_PAGE_INDEX]) * (len(mv) - n)

    def _refresh_indices(self) -> None:
        """Update the views and registered buffers in place."""
        for key, mv in list(self._bufs.items()):
            beam, lg = key
            idx = self._fetch_indices(lg, beam)
            if len(mv) < len(idx):
                del self._bufs[key]
                self._update_fast()
                raise ValueError(f"buf of layer group {lg}, beam {beam}: holds {len(mv)} indices, the cache "
                                 f"now has {len(idx)} blocks; it was let go")
            self._write(mv, idx)
        for key, view in self._views.items():
            beam, lg = key
            idx = self._fetch_indices(lg, beam)
            try:
                view[:] = idx
            except BufferError:
                # A length change while the caller holds an export of the
                # view: hand out a new one from now on.
                self._views[key] = idx

    def __repr__(self) -> str:
        if self.closed:
            return "<kvcm._KVCache closed>"
        return f"<kvcm._KVCache {self.status.name} id={self.id!r}>"
