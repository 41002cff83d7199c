"""KVCacheManager and its KV caches."""

from __future__ import annotations

import array
import ctypes
import os
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

from . import _convert, _native
from ._convert import set_field
from ._managed import Managed, callback_guard
from ._native import bind, ffi
from .codec import KVCacheColdPageCodec
from .config import (
    CacheTier,
    DiskCacheTierConfig,
    GpuCacheTierConfig,
    HostCacheTierConfig,
    KVCacheManagerConfig,
    SharedCacheTierConfig,
)
from .device import DeviceMemory, MemoryKind, Stream
from .errors import BufferTooSmallError, InvalidArgumentError, KVCacheError

__all__ = [
    "KVCacheManager",
    "_KVCache",
    "CacheStatus",
    "DeviceKind",
    "EventKind",
    "MigrationPath",
    "BufferLocation",
    "PoolDesc",
    "PoolGroupDesc",
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
class BufferLocation:
    """Where a (layer, role) buffer lives in the GPU layout: block ``b``
    with base page index ``i`` is at ``pool_base + (i*scale + offset) * bytes``."""

    layer_group: int
    pool: int
    pool_base: int
    scale: int
    offset: int
    bytes: int

    def page_index(self, base: int) -> int:
        return -1 if base < 0 else base * self.scale + self.offset

    def page_address(self, base: int) -> int:
        return self.pool_base + self.page_index(base) * self.bytes


@dataclass(frozen=True, slots=True)
class PoolDesc:
    base: int
    slot_bytes: int


@dataclass(frozen=True, slots=True)
class PoolGroupDesc:
    index: int
    num_slots: int
    layer_groups: tuple[int, ...]
    pools: tuple[PoolDesc, ...]

    @property
    def page_bytes(self) -> int:
        return sum(p.slot_bytes for p in self.pools)


@dataclass(frozen=True, slots=True)
class BlockStats:
    alloc_total_blocks: int
    alloc_new_blocks: int
    reused_blocks: int
    missed_blocks: int
    evictions: int
    lost_pages: int
    hit_rate: float


@dataclass(frozen=True, slots=True)
class PoolGroupStats:
    level: int
    tier: CacheTier
    index: int
    page_bytes: int
    total: int
    free: int
    evictable: int
    available: int

    @property
    def used(self) -> int:
        return self.total - self.free


@dataclass(frozen=True, slots=True)
class PeakBlockStats:
    index: int
    peak_used: int
    total: int


@dataclass(frozen=True, slots=True)
class MigrationStats:
    path: MigrationPath
    pages: int
    bytes: int


@dataclass(frozen=True, slots=True)
class CacheEvent:
    seq: int
    kind: EventKind
    key: int
    parent: int
    tokens: tuple[int, ...]
    layer_group: int
    #: The level an updated page is on now; -1 when that layer group's page
    #: was dropped while the block keeps others.
    level: int
    #: The id of the cache whose commit stored the block (stored events).
    cache_id: int = 0


_TIER_KIND = {GpuCacheTierConfig: 0, HostCacheTierConfig: 1, DiskCacheTierConfig: 2}

# The library functions, bound once (see _native.bind: every integer argument
# is checked against its C type; the keywords give the Python API's names).
_manager_create = bind("kvcm_manager_create")
_probe_reuse = bind("kvcm_manager_probe_reuse", tokens="input_tokens")
_resize_level = bind("kvcm_manager_resize_level", level="cache_level")
_get_quota = bind("kvcm_manager_get_quota", level="cache_level")
_layer_group_of = bind("kvcm_manager_get_layer_group_of")
_buffer_location = bind("kvcm_manager_get_buffer_location")
_pool_group_descs = bind("kvcm_manager_get_pool_group_descs")
_drain_events = bind("kvcm_manager_drain_events", events_cap="max_events")
_alloc_memory = bind("kvcm_manager_alloc_memory")
_cache_create = bind("kvcm_kv_cache_create")
_cache_close = bind("kvcm_kv_cache_close")
_cache_resume = bind("kvcm_kv_cache_resume")
_cache_suspend = bind("kvcm_kv_cache_suspend")
_cache_resize = bind("kvcm_kv_cache_resize")
_cache_commit = bind("kvcm_kv_cache_commit")
_cache_prefetch = bind("kvcm_kv_cache_prefetch")
_cache_page_indices = bind("kvcm_kv_cache_get_base_page_indices", layer_group="layer_group_id")
_cache_committed = bind("kvcm_kv_cache_get_num_committed_tokens")
_cache_history = bind("kvcm_kv_cache_get_history_length")
_cache_capacity = bind("kvcm_kv_cache_get_capacity")
_I64 = ctypes.c_int64
_byref = ctypes.byref
_TOKEN_PTR = ctypes.POINTER(ffi.kvcm_token)
_NO_SCOPE = ffi.kvcm_reuse_scope()  # read only: the default scope

_PRIORITY_RESULT = "custom_priority_callback's result"


def _priority_trampoline(stash: Any, user_id: Any, fn: Callable[[int, Any], int]) -> Any:
    """The C priority callback calling fn(block_index, user_id): its result
    (an int, clamped into [0, 100]) on success; an exception (a result that
    is not an int included) is stashed and reported as the callback's
    failure, which fails the commit."""
    lo, hi, ctname = _convert.RANGES[ctypes.c_int64]

    def trampoline(_user: Any, block_index: int, out: Any) -> int:
        try:
            v = fn(block_index, user_id)
            if type(v) is not int:
                v = _convert.integer(v, lo, hi, ctname, _PRIORITY_RESULT)
            out[0] = min(max(v, ffi.KVCM_MIN_PRIORITY), ffi.KVCM_MAX_PRIORITY)
            return 0
        except BaseException as e:  # noqa: BLE001 - no exception may cross into C
            stash.put(e)
            return 1

    # Runs with the manager's lock held: finalizers there defer.
    return ffi.kvcm_priority_func(callback_guard(trampoline))


def _build_c_config(config: KVCacheManagerConfig, device: DeviceKind, device_ordinal: int,
                    event_queue_capacity: int) -> tuple[Any, list[Any]]:
    """The kvcm_manager_config for config, and the objects it points into
    (keep them alive for the call)."""
    if not isinstance(config, KVCacheManagerConfig):
        raise TypeError(f"config: expected a KVCacheManagerConfig, got {type(config).__name__}")
    config._check_types()
    config._check_c_values()
    keep: list[Any] = []
    c = _native.versioned(ffi.kvcm_manager_config)
    set_field(c, "tokens_per_block", config.tokens_per_block)
    c.device = int(device)
    set_field(c, "device_ordinal", device_ordinal)
    set_field(c, "event_queue_capacity", event_queue_capacity)

    local = [t for t in config.cache_tiers if not isinstance(t, SharedCacheTierConfig)]
    tiers = (ffi.kvcm_cache_tier_config * max(len(local), 1))()
    for i, t in enumerate(local):
        tiers[i].kind = _TIER_KIND[type(t)]
        set_field(tiers[i], "quota", t.quota, f"cache_tiers[{i}].quota")
        if isinstance(t, GpuCacheTierConfig):
            set_field(tiers[i], "max_quota", t.max_quota or 0, f"cache_tiers[{i}].max_quota")
        if isinstance(t, DiskCacheTierConfig):
            p = os.fsencode(t.path)
            keep.append(p)
            tiers[i].path = p
    keep.append(tiers)
    c.cache_tiers = tiers if local else None
    c.num_cache_tiers = len(local)
    if len(local) < len(config.cache_tiers):  # _check_c_values: the last tier
        st, path = config.cache_tiers[-1], f"cache_tiers[{len(local)}]"
        sc = ffi.kvcm_shared_tier_config()
        addrs, ns = ",".join(st.addresses).encode(), st.namespace.encode()
        keep += [addrs, ns, sc]
        sc.addresses, sc.key_namespace = addrs, ns
        for name in ("ttl_ms", "dial_timeout_ms", "call_timeout_ms", "queue_bytes", "write_policy"):
            set_field(sc, name, int(getattr(st, name)), f"{path}.{name}")
        c.shared_tier = ctypes.pointer(sc)

    layers = (ffi.kvcm_attention_layer_config * max(len(config.layers), 1))()
    for i, layer in enumerate(config.layers):
        set_field(layers[i], "layer_id", layer.layer_id, f"layers[{i}].layer_id")
        set_field(layers[i], "sliding_window_size", layer.sliding_window_size or 0,
                  f"layers[{i}].sliding_window_size")
        set_field(layers[i], "num_sink_tokens", layer.num_sink_tokens or 0, f"layers[{i}].num_sink_tokens")
        bufs = (ffi.kvcm_buffer_config * max(len(layer.buffers), 1))()
        for j, b in enumerate(layer.buffers):
            role = b.role.encode()
            keep.append(role)
            bufs[j].role = role
            set_field(bufs[j], "size", b.size, f"layers[{i}].buffers[{j}].size")
        keep.append(bufs)
        layers[i].buffers = bufs if layer.buffers else None
        layers[i].num_buffers = len(layer.buffers)
    keep.append(layers)
    c.layers = layers if config.layers else None
    c.num_layers = len(config.layers)

    c.max_util_for_resume = float(config.max_util_for_resume)
    c.enable_partial_reuse = bool(config.enable_partial_reuse)
    c.enable_stats = bool(config.enable_stats)
    if config.initial_pool_ratio:
        r = (ctypes.c_double * len(config.initial_pool_ratio))(*config.initial_pool_ratio)
        keep.append(r)
        c.initial_pool_ratio = r
        c.num_initial_pool_ratio = len(config.initial_pool_ratio)

    def batch(b: Any, path: str) -> Any:
        reqs = (ffi.kvcm_request_desc * max(len(b.requests), 1))()
        for k, r in enumerate(b.requests):
            set_field(reqs[k], "capacity", r.capacity, f"{path}.requests[{k}].capacity")
            set_field(reqs[k], "history_length", r.history_length, f"{path}.requests[{k}].history_length")
        keep.append(reqs)
        d = ffi.kvcm_batch_desc()
        d.requests = reqs if b.requests else None
        d.num_requests = len(b.requests)
        return d

    if config.typical_step is not None:
        ts = batch(config.typical_step, "typical_step")
        keep.append(ts)
        c.typical_step = ctypes.pointer(ts)
    if config.constraints:
        cs = (ffi.kvcm_batch_desc * len(config.constraints))(*[batch(b, f"constraints[{i}]") for i, b in enumerate(config.constraints)])
        keep.append(cs)
        c.constraints = cs
        c.num_constraints = len(config.constraints)
    return c, keep


class KVCacheManager(Managed):
    """A paged KV-cache manager (``kvcm_manager``).

    ``KVCacheManager(config)`` uses the default lossless codec.
    ``KVCacheManager(config, cold_page_codec=codec)`` consumes ``codec``
    before the C call, whether construction succeeds or fails: never use it
    again. ``device`` selects ``"auto"`` (CUDA where available, else the
    emulated device), ``"emu"`` or ``"cuda"``.

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
        cold_page_codec: KVCacheColdPageCodec | None = None,
        *,
        device: str | DeviceKind = DeviceKind.AUTO,
        device_ordinal: int = 0,
        event_queue_capacity: int = 0,
    ) -> None:
        super().__init__()
        self._children: "weakref.WeakSet[Managed]" = weakref.WeakSet()
        self._config = config
        codec_struct = None
        if cold_page_codec is not None:
            if type(cold_page_codec) is not KVCacheColdPageCodec:
                raise TypeError(
                    "cold_page_codec: expected a native codec from create_default_kv_cache_cold_page_codec() "
                    "or KVCacheColdPageCodec.from_factory(); Python codec implementations are not "
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
        self._tokens_per_block = self._get_i32("kvcm_manager_get_tokens_per_block")
        self._num_levels = self._get_i32("kvcm_manager_get_num_levels")
        self._num_layer_groups = self._get_i32("kvcm_manager_get_num_layer_groups")

    # -- lifetime -------------------------------------------------------
    def _handle_or_none(self) -> int | None:
        return self._resource if self._state == "open" else None

    def _release(self, handle: int) -> None:
        for child in list(self._children):
            child._mark_closed()  # the manager frees them
        _native.call("kvcm_manager_destroy", handle)

    def _own(self, child: Managed) -> None:
        self._children.add(child)

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
        return [t.tier for t in self._config.cache_tiers]

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
        return BufferLocation(out.layer_group, out.pool, int(out.pool_base), out.scale, out.offset, out.bytes)

    def get_mem_pool_base_address(self, layer_id: int, data_role: str) -> int:
        """Base address of the pool holding (layer_id, data_role)."""
        return self.get_buffer_location(layer_id, data_role).pool_base

    def get_page_stride(self, layer_id: int, data_role: str) -> int:
        """Bytes between consecutive page indices of the buffer."""
        return self.get_buffer_location(layer_id, data_role).bytes

    def get_pool_group_descs(self, level: int = 0) -> list[PoolGroupDesc]:
        """The pool groups of a level, in that level's order (GPU: the
        descriptors a codec is configured with)."""
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
            out.append(PoolGroupDesc(
                d.index, d.num_slots,
                tuple(d.life_cycles[k] for k in range(d.num_life_cycles)),
                tuple(PoolDesc(int(d.pools[k].base), d.pools[k].slot_bytes) for k in range(d.num_pools)),
            ))
        return out

    # -- quota ------------------------------------------------------------
    def get_quota(self, cache_level: int) -> int:
        out = _I64()
        _get_quota(self._native(), cache_level, _byref(out))
        return out.value

    def resize(self, cache_level: int, quota: int) -> bool:
        """Change a level's byte quota (evicting / defragmenting to shrink).
        Returns True; raises on failure (nothing changed then)."""
        _resize_level(self._native(), cache_level, quota)
        return True

    # -- reuse and caches ---------------------------------------------------
    @staticmethod
    def _scope(lora_task_id: int | None, salt: bytes | str | None) -> tuple[Any, Any]:
        s = ffi.kvcm_reuse_scope()
        if lora_task_id is not None:
            set_field(s, "lora_id", lora_task_id, "lora_task_id")
        keep = None
        if salt:
            data = salt.encode() if isinstance(salt, str) else bytes(salt)
            s.salt, keep = _native.byte_buffer(data)
            s.salt_len = len(data)
        return s, keep

    def probe_reuse(self, input_tokens: Sequence[int], lora_task_id: int | None = None,
                    salt: bytes | str | None = None) -> int:
        """How many tokens of input_tokens a new cache would reuse now."""
        if lora_task_id is None and not salt:
            scope = _NO_SCOPE
        else:
            scope, _keep = self._scope(lora_task_id, salt)
        toks, n, _keep_tokens = _convert.tokens(input_tokens, "input_tokens")
        out = _I64()
        _probe_reuse(self._resource if self._state == "open" else self._native(), _byref(scope), toks, n,
                     _byref(out))
        return out.value

    def create_kv_cache(
        self,
        lora_task_id: int | None = None,
        input_tokens: Sequence[int] | None = None,
        id: Any = None,
        custom_priority_callback: Callable[[int, Any], int] | None = None,
        *,
        salt: bytes | str | None = None,
        request_id: str | bytes | None = None,
    ) -> "_KVCache":
        """A SUSPENDED cache holding the longest reusable cached prefix of
        input_tokens (see ``num_committed_tokens``). ``lora_task_id`` and
        ``salt`` form the reuse scope. ``custom_priority_callback(block_index,
        id)`` gives committed blocks their eviction priority, an int clamped
        into [0, 100]; it runs with the manager's lock held and must not call
        into the manager. An exception it raises (a result that is not an int
        included) fails the commit, which then changes nothing, and is
        re-raised by it; at close, where a trailing partial block is published,
        the block gets the default priority and close re-raises it.
        ``request_id`` names the request for the CP index attached with
        :meth:`attach_cp`, which is then notified about the cache's blocks."""
        return _KVCache(self, lora_task_id, input_tokens, id, custom_priority_callback, salt, request_id)

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
        return BlockStats(s.alloc_total_blocks, s.alloc_new_blocks, s.reused_blocks, s.missed_blocks,
                          s.evictions, s.lost_pages, s.hit_rate)

    @property
    def stats(self) -> BlockStats:
        """Cumulative block statistics."""
        out = ffi.kvcm_block_stats()
        _native.call("kvcm_manager_get_stats", self._native(), ctypes.byref(out))
        return self._block_stats(out)

    def get_and_reset_iteration_stats(self) -> BlockStats:
        out = ffi.kvcm_block_stats()
        _native.call("kvcm_manager_get_and_reset_iteration_stats", self._native(), ctypes.byref(out))
        return self._block_stats(out)

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
            PoolGroupStats(s.level, CacheTier(s.tier), s.index, s.page_bytes, s.total, s.free, s.evictable,
                           s.available)
            for s in self._array_query("kvcm_manager_get_storage_stats", ffi.kvcm_pool_group_stats,
                                       cache_level, level="cache_level")
        ]

    def get_and_reset_iteration_peak_block_stats(self, cache_level: int = 0) -> list[PeakBlockStats]:
        return [
            PeakBlockStats(s.index, s.peak_used, s.total)
            for s in self._array_query("kvcm_manager_get_and_reset_iteration_peak_block_stats",
                                       ffi.kvcm_peak_block_stats, cache_level, level="cache_level")
        ]

    def get_migration_stats(self) -> dict[MigrationPath, MigrationStats]:
        out = {}
        for s in self._array_query("kvcm_manager_get_migration_stats", ffi.kvcm_migration_stats):
            p = MigrationPath(s.path)
            out[p] = MigrationStats(p, s.pages, s.bytes)
        return out

    # -- events -----------------------------------------------------------------
    def drain_events(self, max_events: int = 1024) -> list[CacheEvent]:
        """Remove and return every queued cache event, oldest first.
        ``events_dropped`` counts events lost to a full queue."""
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
                e = events[i]
                toks = tuple(e.tokens[k] for k in range(e.num_tokens)) if e.num_tokens else ()
                out.append(CacheEvent(e.seq, EventKind(e.kind), e.key, e.parent, toks, e.layer_group, e.level,
                                      e.cache_id))
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


class _KVCache(Managed):
    """One request's KV cache (``kvcm_kv_cache``): SUSPENDED → ACTIVE ⇄
    SUSPENDED → CLOSED, with committed ≤ history_length ≤ capacity."""

    _what = "KV cache"
    Status = CacheStatus

    def __init__(self, manager: KVCacheManager, lora_task_id: int | None, input_tokens: Sequence[int] | None,
                 id: Any, custom_priority_callback: Callable[[int, Any], int] | None,
                 salt: bytes | str | None, request_id: str | bytes | None = None) -> None:
        super().__init__()
        self._manager = manager
        self.id = id
        self._stash = _native.Stash()
        self._stream: Any = None
        opts = _native.versioned(ffi.kvcm_kv_cache_options)
        salt_keep = None
        if lora_task_id is not None or salt:
            scope, salt_keep = KVCacheManager._scope(lora_task_id, salt)
            opts.scope = scope
        toks, n, toks_keep = _convert.tokens(input_tokens, "input_tokens")
        if n:
            opts.input_tokens = ctypes.cast(toks, _TOKEN_PTR)
            opts.num_input_tokens = n
        self._priority_cb = None
        if custom_priority_callback is not None:
            if not callable(custom_priority_callback):
                raise TypeError("custom_priority_callback: expected a callable(block_index, id) -> int")
            self._priority_cb = _priority_trampoline(self._stash, id, custom_priority_callback)
            opts.priority = self._priority_cb
        rid_keep = None
        if request_id is not None:
            from .cp import _id_bytes

            rid = _id_bytes(request_id)
            opts.request_id, rid_keep = _native.byte_buffer(rid)
            opts.request_id_len = len(rid)
        out = ffi.kvcm_kv_cache()
        _cache_create(manager._native(), _byref(opts), _byref(out))
        del salt_keep, toks_keep, rid_keep
        self._adopt(out.value)
        manager._own(self)

    @property
    def manager(self) -> KVCacheManager:
        return self._manager

    def _release(self, handle: int) -> None:
        self._stream = None
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
    def cache_id(self) -> int:
        """The library's id of the cache, unique within its manager."""
        return self._get("kvcm_kv_cache_get_id", ctypes.c_uint64)

    @property
    def num_committed_tokens(self) -> int:
        out = _I64()
        _cache_committed(self._resource if self._state == "open" else self._native(), out)
        return out.value

    @property
    def history_length(self) -> int:
        out = _I64()
        _cache_history(self._resource if self._state == "open" else self._native(), out)
        return out.value

    @property
    def capacity(self) -> int:
        out = _I64()
        _cache_capacity(self._resource if self._state == "open" else self._native(), out)
        return out.value

    @property
    def reused_tokens(self) -> int:
        return self._get("kvcm_kv_cache_get_reused_tokens")

    @property
    def tokens_per_block(self) -> int:
        return self._manager.tokens_per_block

    @property
    def num_blocks(self) -> int:
        tpb = self.tokens_per_block
        return (self.capacity + tpb - 1) // tpb

    @property
    def cuda_stream(self) -> Any:
        """The stream the cache was resumed on (None unless ACTIVE)."""
        return self._stream

    # -- transitions -------------------------------------------------------------
    def resume(self, stream: Stream | int | None = None) -> bool:
        """Make the cache ACTIVE on ``stream``: pages on colder levels come
        back to the GPU and the stream waits for them. Returns True; raises
        ResumeRefusedError, OutOfPagesError, CodecFailedError (the codec
        failed to decode some pages: they are dropped) or DataLostError (the
        cache stays SUSPENDED; close it). A failure of the asynchronous decode
        not known yet reaches the stream and makes the next call raise
        DataLostError."""
        if stream is None:
            raise InvalidArgumentError("stream: a stream is required (KVCacheManager.create_stream())")
        handle = stream.handle if isinstance(stream, Stream) else stream
        _cache_resume(self._resource if self._state == "open" else self._native(), handle)
        self._stream = stream
        return True

    def suspend(self) -> None:
        _cache_suspend(self._native())
        self._stream = None

    def resize(self, capacity: int | None, history_length: int | None = None) -> bool:
        """Set capacity (tokens with pages) and history_length (computed
        tokens; None keeps it) of an ACTIVE cache. Returns True; raises
        OutOfPagesError (nothing changed) and the like."""
        if capacity is None:
            capacity = self.capacity
        if history_length is None:
            history_length = -1
        elif type(history_length) is not int or history_length < 0:
            history_length = _convert.check(history_length, _I64, "history_length")
            if history_length < 0:
                raise InvalidArgumentError(f"history_length: must not be negative, got {history_length}")
        _cache_resize(self._resource if self._state == "open" else self._native(), capacity, history_length)
        return True

    def commit(self, tokens: Sequence[int], is_end: bool = False) -> None:
        """Append computed tokens to the committed sequence; completed blocks
        are published for reuse. ``is_end`` ends committing."""
        toks, n, keep = _convert.tokens(tokens, "tokens")
        h = self._resource if self._state == "open" else self._native()
        if self._priority_cb is None:
            _cache_commit(h, toks, n, bool(is_end))
            return
        # An exception the priority callback raised fails the commit (which
        # then changes nothing) and is re-raised here.
        try:
            _cache_commit(h, toks, n, bool(is_end))
        except KVCacheError as err:
            self._stash.reraise(err)
            raise
        self._stash.reraise()

    def stop_committing(self) -> None:
        _native.call("kvcm_kv_cache_stop_committing", self._native())

    def prefetch(self, level: int) -> None:
        """Bring a SUSPENDED cache's pages up to ``level`` without pinning."""
        _cache_prefetch(self._native(), level)

    # -- pages ----------------------------------------------------------------
    def get_page_indices(self, layer_group_id: int) -> array.array:
        """The GPU base page index of every block in a layer group (-1 where
        the block has no page), as an ``array.array('i')``: a buffer-protocol
        object that owns its memory, so ``numpy.frombuffer(a, dtype=numpy.int32)``
        or ``memoryview(a)`` use it without copying. The cache must be ACTIVE."""
        h = self._native()
        needed = ctypes.c_size_t()
        cap = self.num_blocks
        while True:
            a = array.array("i", bytes(4 * cap))
            ptr = a.buffer_info()[0] if cap else None
            try:
                _cache_page_indices(h, layer_group_id,
                                    ctypes.cast(ptr, ctypes.POINTER(ctypes.c_int32)) if ptr else None,
                                    cap, ctypes.byref(needed))
            except BufferTooSmallError:
                cap = needed.value
                continue
            if needed.value <= cap:
                del a[needed.value:]
                return a
            cap = needed.value

    def __repr__(self) -> str:
        if self.closed:
            return "<kvcm._KVCache closed>"
        return f"<kvcm._KVCache {self.status.name} id={self.id!r}>"
