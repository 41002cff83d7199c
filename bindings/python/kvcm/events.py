"""KV cache events in TensorRT-LLM's shape (KVCM2's ``KVCacheEventManager``).

A :class:`KVCacheEventManager` handed to ``KVCacheManager(config,
event_manager)`` receives the manager's block events: a created event per
layer group at construction, then stored, removed and updated events as
commits publish blocks, pages move between levels, leave, or change
priority. ``flush_iteration_events()`` ends an iteration: it collects the
manager's pending events and publishes them; ``get_latest_events()`` takes
what was published. The records are the ones TensorRT-LLM's event
serializer and KV-aware routers consume.

Block hashes: ``hash_algo="v1_block_key"`` (also what ``"auto"`` selects)
gives TensorRT-LLM's v1 block hashes, computed from the block's tokens, its
parent's hash and, for a first block, the request's LoRA id and salt id, so
a router computing them from prompts matches. ``"v2_sha256"`` and
``"v2_sha256_64"`` name KVCM2's sha256 block keys, which kvcm does not
compute: with them kvcm reports its own 64-bit chained key in KVCM2's forms
of a raw key (the key's 8 bytes, as ``sequence_to_blockchain_keys`` and
``probe_first_new_block_key`` give them): their 16 hex digits, or their
first 8 bytes read big-endian (TensorRT-LLM's
``truncate_sha256_hash_to_int64``), so a client relating events to those
keys as it would with KVCM2 matches; stable within a manager but not what a
router derives from KVCM2's keys.
"""

from __future__ import annotations

import hashlib
import time
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from threading import Condition
from typing import Any, Callable, Union

__all__ = [
    "UniqueToken", "KVCacheCreatedData", "KVCacheStoredBlockData", "KVCacheStoredData", "KVCacheRemovedData",
    "KVCacheEventDiff", "KVCacheUpdatedData", "KVCacheEvent", "KVCacheEventManager",
    "HASH_ALGO_AUTO", "HASH_ALGO_V1", "HASH_ALGO_V2", "HASH_ALGO_V2_SHA256_64",
    "hash_v1_block_key", "cache_salt_id",
]

HASH_ALGO_AUTO = "auto"
HASH_ALGO_V1 = "v1_block_key"
HASH_ALGO_V2 = "v2_sha256"
HASH_ALGO_V2_SHA256_64 = "v2_sha256_64"

EventBlockHash = Union[int, str]
BlockHashLike = Union[bytes, int, str]
MmKey = tuple

_M32 = (1 << 32) - 1
_M64 = (1 << 64) - 1


def _truncate64(raw: bytes) -> int:
    """A raw block key's 64-bit event hash: its first 8 bytes read
    big-endian (TensorRT-LLM's truncate_sha256_hash_to_int64)."""
    return int.from_bytes(raw[:8], "big")


def _mix32(value: int, seed: int) -> int:
    value &= _M32
    value = (((value >> 16) ^ value) * 0x45D9F3B) & _M32
    value = (((value >> 16) ^ value) * 0x45D9F3B) & _M32
    value = ((value >> 16) ^ value) & _M32
    value = (value + 0x9E3779B9) & _M32  # a 32-bit sum in the C++ hasher
    return (seed ^ ((value + ((seed << 6) & _M64) + (seed >> 2)) & _M64)) & _M64


def _mix64(value: int, seed: int) -> int:
    value &= _M64
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _M64
    value = (value ^ (value >> 31)) & _M64
    return (seed ^ ((value + 0x9E3779B9 + ((seed << 6) & _M64) + (seed >> 2)) & _M64)) & _M64


def hash_v1_block_key(tokens: Sequence[int], parent_hash: int = 0, lora_task_id: int | None = None,
                      cache_salt_id: int | None = None) -> int:
    """TensorRT-LLM's v1 block hash (its C++ BlockKeyHasher): the block's
    token count and parent hash seed it, a first block mixes in the salt id,
    every token is mixed in, then the LoRA id."""
    seed = (len(tokens) ^ ((parent_hash * 0xBF58476D1CE4E5B9) & _M64)) & _M64
    if parent_hash == 0 and cache_salt_id is not None:
        seed = _mix64(cache_salt_id, seed)
    for t in tokens:
        seed = _mix32(int(t), seed)
    if lora_task_id is not None:
        seed = _mix64(lora_task_id, seed)
    return seed


def cache_salt_id(salt: int | bytes | str | None) -> int | None:
    """The salt id a v1 hash mixes in: an int as is; a str or bytes salt by
    the first 8 bytes of its sha256, little-endian (TensorRT-LLM's
    ``get_cache_salt_id`` for a str)."""
    if salt is None or isinstance(salt, int):
        return salt
    data = salt.encode("utf-8") if isinstance(salt, str) else bytes(salt)
    return int.from_bytes(hashlib.sha256(data).digest()[:8], "little", signed=False)


@dataclass(slots=True, frozen=True)
class UniqueToken:
    token_id: Union[int, str]
    token_extra_id: int = 0


@dataclass(slots=True, frozen=True)
class KVCacheCreatedData:
    num_blocks_per_cache_level: list[int]


@dataclass(slots=True, frozen=True)
class KVCacheStoredBlockData:
    block_hash: EventBlockHash
    tokens: list[UniqueToken]
    cache_level: int
    priority: int
    mm_keys: list[MmKey] = field(default_factory=list)
    cache_salt: str | None = None


@dataclass(slots=True, frozen=True)
class KVCacheStoredData:
    parent_hash: EventBlockHash | None
    blocks: list[KVCacheStoredBlockData]


@dataclass(slots=True, frozen=True)
class KVCacheRemovedData:
    block_hashes: list[EventBlockHash]


@dataclass(slots=True, frozen=True)
class KVCacheEventDiff:
    old_value: int
    new_value: int


@dataclass(slots=True, frozen=True)
class KVCacheUpdatedData:
    block_hash: EventBlockHash
    cache_level: KVCacheEventDiff | None
    priority: KVCacheEventDiff | None


@dataclass(slots=True, frozen=True)
class KVCacheEvent:
    event_id: int
    data: Union[KVCacheCreatedData, KVCacheStoredData, KVCacheRemovedData, KVCacheUpdatedData]
    window_size: int
    hash_algo: str | None = None
    attention_dp_rank: int | None = None
    layer_group_id: int | None = None


AttentionDpGatherFn = Callable[[list[KVCacheEvent]], list[list[KVCacheEvent]]]


@dataclass(slots=True)
class _Block:
    """What the event manager knows of a stored block (kvcm's key)."""

    hash: EventBlockHash
    v1: int  # the v1 hash, the parent hash of its children under v1
    layer_groups: set[int]
    tokens: list[UniqueToken]
    parent: EventBlockHash | None
    # v1_ok: the block and its ancestors hold text tokens only, so v1 is
    # TensorRT-LLM's v1 hash (else kvcm's key, as KVCM2 falls back).
    v1_ok: bool = True
    # last_digest: the last multimodal item digest of the chain so far, which
    # synthetic tokens above mm_token_id_offset continue.
    last_digest: bytes | None = None
    mm_keys: list[MmKey] = field(default_factory=list)


class KVCacheEventManager:
    """A queue of KV cache events, published per iteration.

    ``max_kv_event_entries`` bounds the published queue (the oldest go
    first); 0 or less disables events. ``window_size`` (or the entry of
    ``window_size_by_layer_group``) is every event's window size;
    ``attention_dp_gather``, with ``attention_dp_rank``, gathers every
    rank's events at flush and publishes them on rank 0.
    A stored block's multimodal digest tokens are reported as their hex
    digests; such a block and its descendants have no v1 hash, so under
    ``v1_block_key`` they report kvcm's key instead (read as
    ``v2_sha256_64`` reads it). With
    ``mm_token_id_offset`` (not negative) a stored block lists its items in
    ``mm_keys``: ``(digest, item-local offset)`` per run of an item's tokens
    (its digest token starts one at 0; a token above the offset continues
    the chain's last item at offset ``token - mm_token_id_offset``).
    """

    def __init__(
        self,
        max_kv_event_entries: int,
        *,
        window_size: int = 0,
        attention_dp_rank: int | None = None,
        attention_dp_gather: AttentionDpGatherFn | None = None,
        hash_algo: str = HASH_ALGO_V2,
        window_size_by_layer_group: dict[int, int] | None = None,
        mm_token_id_offset: int | None = None,
    ) -> None:
        if hash_algo == HASH_ALGO_AUTO:
            hash_algo = HASH_ALGO_V1
        elif hash_algo not in (HASH_ALGO_V1, HASH_ALGO_V2, HASH_ALGO_V2_SHA256_64):
            raise ValueError(f"hash_algo: Unsupported V2 KV cache event hash algorithm: {hash_algo!r}")
        self._max = max_kv_event_entries
        self._window_size = window_size
        self._window_by_lg = dict(window_size_by_layer_group or {})
        self._window_given = window_size_by_layer_group is not None
        self._dp_rank = attention_dp_rank
        self._dp_gather = attention_dp_gather
        self._hash_algo = hash_algo
        if mm_token_id_offset is not None and (type(mm_token_id_offset) is not int or mm_token_id_offset < 0):
            raise ValueError(f"mm_token_id_offset: expected a non-negative int or None, got {mm_token_id_offset!r}")
        self.mm_token_id_offset = mm_token_id_offset
        self._next_id = 0
        self._blocks: dict[int, _Block] = {}
        self._pending: list[KVCacheEvent] = []
        self._latest_stored: dict[int | None, KVCacheEvent] = {}
        self._removed: dict[int | None, list[EventBlockHash]] = {}
        self._events: deque[KVCacheEvent] = deque()
        self._cond = Condition()
        self._sources: list[Any] = []  # managers whose events flush collects

    @property
    def hash_algo(self) -> str:
        return self._hash_algo

    # -- what the manager reports ----------------------------------------------
    def add_created_event(self, num_blocks_per_cache_level: Sequence[int],
                          layer_group_ids: Sequence[int] | None = None) -> None:
        data = KVCacheCreatedData(list(num_blocks_per_cache_level))
        if layer_group_ids is None:
            self._add(data, None)
            return
        for lg in layer_group_ids:
            self._add(data, int(lg))

    def set_layer_group_window_sizes(self, window_sizes: dict[int, int]) -> None:
        with self._cond:
            self._window_by_lg = dict(window_sizes)

    def add_stored_event(self, parent_hash: EventBlockHash | None, blocks: Sequence[KVCacheStoredBlockData],
                         layer_group_id: int | None = None) -> None:
        if not blocks or self._max <= 0:
            return
        with self._cond:
            self._flush_removed(layer_group_id)
            data = KVCacheStoredData(parent_hash, list(blocks))
            latest = self._latest_stored.get(layer_group_id)
            if not self._removed and latest is not None and latest.data.blocks[-1].block_hash == parent_hash:
                # A chain committed in one iteration is one stored event.
                merged = replace(latest, data=replace(latest.data, blocks=[*latest.data.blocks, *blocks]))
                i = next(i for i in range(len(self._pending) - 1, -1, -1) if self._pending[i] is latest)
                self._pending[i] = merged
                self._latest_stored[layer_group_id] = merged
                return
            self._latest_stored[layer_group_id] = self._add_locked(data, layer_group_id)

    def add_removed_event(self, block_hashes: BlockHashLike | Iterable[BlockHashLike],
                          layer_group_id: int | None = None) -> None:
        """Report blocks removed. An event hash (int or str) is reported as
        it is; ``bytes`` is a block key (kvcm's 8 little-endian bytes, as
        ``sequence_to_blockchain_keys`` gives them): a block this manager
        reported stored is reported removed by its event hash, for each
        layer group it was stored for, and forgotten; any other key is
        ignored (KVCM2's rule for raw keys)."""
        if self._max <= 0:
            return
        if isinstance(block_hashes, (int, str, bytes)):
            block_hashes = (block_hashes,)
        with self._cond:
            for h in block_hashes:
                if not isinstance(h, bytes):
                    self._removed.setdefault(layer_group_id, []).append(h)
                    self._latest_stored.pop(layer_group_id, None)
                    continue
                key = self._raw_key(h)
                b = None if key is None else self._blocks.pop(key, None)
                if b is not None:
                    for lg in sorted(b.layer_groups):
                        self._removed.setdefault(lg, []).append(b.hash)
                        self._latest_stored.pop(lg, None)

    def add_removed_life_cycle_event(self, block_hash: bytes, life_cycle_id: int) -> None:
        """Report one layer group's page of a stored block removed:
        ``block_hash`` is the block's key (``bytes``, as in
        add_removed_event), ``life_cycle_id`` the layer group. The block is
        forgotten once no layer group holds it; a key or layer group the
        manager did not report stored is ignored."""
        if self._max <= 0:
            return
        lg = int(life_cycle_id)
        with self._cond:
            key = self._raw_key(block_hash)
            b = None if key is None else self._blocks.get(key)
            if b is None or lg not in b.layer_groups:
                return
            b.layer_groups.discard(lg)
            if not b.layer_groups:
                del self._blocks[key]
            self._removed.setdefault(lg, []).append(b.hash)
            self._latest_stored.pop(lg, None)

    def add_updated_event(self, block_hash: BlockHashLike, *, cache_level: KVCacheEventDiff | None = None,
                          priority: KVCacheEventDiff | None = None, layer_group_id: int | None = None) -> None:
        """Report a block's level or priority change (nothing without
        either). A ``bytes`` block key of a block not reported stored is
        ignored, as in add_removed_event."""
        if cache_level is None and priority is None:
            return
        if isinstance(block_hash, bytes):
            with self._cond:
                key = self._raw_key(block_hash)
                b = None if key is None else self._blocks.get(key)
            if b is None:
                return
            block_hash = b.hash
        self._add(KVCacheUpdatedData(block_hash, cache_level, priority), layer_group_id)

    @staticmethod
    def _raw_key(block_hash: bytes) -> int | None:
        """kvcm's block key of a raw key argument: its 8 little-endian
        bytes; None for bytes of another length (no block has that key)."""
        return int.from_bytes(block_hash, "little") if len(block_hash) == 8 else None

    # -- iterations -----------------------------------------------------------------
    def flush_iteration_events(self) -> None:
        """Collect the attached managers' pending events and publish every
        event of the iteration (gathered over attention-DP ranks when a
        gather function was given)."""
        for source in list(self._sources):
            source._collect_events(self)
        with self._cond:
            local = self._drain_pending()
        if self._dp_gather is not None:
            gathered = self._dp_gather(self._trim(local, self._max))
            if self._dp_rank != 0:
                return
            events = [e for rank in gathered for e in self._trim(rank, self._max)]
            with self._cond:
                self._publish(events, self._max * max(1, len(gathered)))
                self._cond.notify_all()
            return
        with self._cond:
            self._publish(local, self._max)
            self._cond.notify_all()

    def get_latest_events(self, timeout_ms: float | None = None) -> list[KVCacheEvent]:
        """Take the published events; wait for some up to ``timeout_ms``
        (forever when None; not at all when 0)."""
        with self._cond:
            if not self._events:
                if timeout_ms is None:
                    while not self._events:
                        self._cond.wait()
                elif timeout_ms > 0:
                    deadline = time.monotonic() + timeout_ms / 1000
                    while not self._events:
                        left = deadline - time.monotonic()
                        if left <= 0:
                            break
                        self._cond.wait(timeout=left)
            out = list(self._events)
            self._events.clear()
            return out

    # -- internals ------------------------------------------------------------------
    def _attach(self, manager: Any) -> None:
        self._sources.append(manager)

    def _detach(self, manager: Any) -> None:
        if manager in self._sources:
            self._sources.remove(manager)

    def _window(self, lg: int | None) -> int:
        return self._window_size if lg is None else self._window_by_lg.get(lg, self._window_size)

    def _add(self, data: Any, lg: int | None) -> None:
        if self._max <= 0:
            return
        with self._cond:
            self._add_locked(data, lg)

    def _add_locked(self, data: Any, lg: int | None) -> KVCacheEvent:
        if not isinstance(data, KVCacheRemovedData):
            for k in list(self._removed):
                self._flush_removed(k)
        ev = KVCacheEvent(self._next_id, data, self._window(lg), self._hash_algo, self._dp_rank, lg)
        self._next_id += 1
        self._pending.append(ev)
        if not isinstance(data, KVCacheStoredData):
            self._latest_stored.pop(lg, None)
        return ev

    def _flush_removed(self, lg: int | None) -> None:
        hashes = self._removed.pop(lg, None)
        if hashes:
            self._add_locked(KVCacheRemovedData(hashes), lg)

    def _drain_pending(self) -> list[KVCacheEvent]:
        for k in list(self._removed):
            self._flush_removed(k)
        out, self._pending = self._pending, []
        self._latest_stored.clear()
        return out

    def _publish(self, events: Sequence[KVCacheEvent], cap: int) -> None:
        self._events.extend(events)
        while len(self._events) > cap:
            self._events.popleft()

    @staticmethod
    def _trim(events: Sequence[KVCacheEvent], cap: int) -> list[KVCacheEvent]:
        if cap <= 0:
            return []
        return list(events[-cap:])

    # -- kvcm's block events, translated (called by the manager) -------------------
    def _block_hash(self, key: int, v1: int) -> EventBlockHash:
        """A block's event hash from its key: the v1 hash, or KVCM2's forms
        of a raw key (the key's 8 bytes as sequence_to_blockchain_keys and
        probe_first_new_block_key give them): their hex for v2_sha256, and
        for v2_sha256_64 their first 8 bytes read big-endian, as
        TensorRT-LLM's truncate_sha256_hash_to_int64 reads a raw key."""
        if self._hash_algo == HASH_ALGO_V1:
            return v1
        raw = key.to_bytes(8, "little")
        if self._hash_algo == HASH_ALGO_V2_SHA256_64:
            return _truncate64(raw)
        return raw.hex()

    def _on_stored(self, key: int, parent: int, tokens: Sequence[int], level: int, priority: int,
                   scope: tuple[int | None, Any] | None, layer_groups: Sequence[int],
                   digests: dict[int, bytes] | None = None) -> None:
        up = self._blocks.get(parent)
        lora, salt = scope if scope is not None else (None, None)
        v1_ok = (up.v1_ok if up else True) and not digests
        # A block with digest tokens has no v1 hash: it and its descendants
        # report kvcm's key instead (KVCM2 falls back to its own key).
        v1 = hash_v1_block_key(tokens, up.v1 if up else 0, lora, None if up else cache_salt_id(salt)) if v1_ok \
            else _truncate64(key.to_bytes(8, "little"))
        dg = digests or {}
        toks = [UniqueToken(dg[i].hex()) if i in dg else UniqueToken(int(t)) for i, t in enumerate(tokens)]
        last, mm_keys = self._mm_keys(tokens, dg, up.last_digest if up else None)
        b = _Block(self._block_hash(key, v1), v1, set(layer_groups), toks, up.hash if up else None, v1_ok, last, mm_keys)
        self._blocks[key] = b
        block = KVCacheStoredBlockData(b.hash, b.tokens, level, priority, list(mm_keys))
        for lg in layer_groups:
            self.add_stored_event(b.parent, [block], lg)

    def _mm_keys(self, tokens: Sequence[int], digests: dict[int, bytes], item: bytes | None
                 ) -> tuple[bytes | None, list[MmKey]]:
        """The last item digest after a block, and its mm_keys with
        mm_token_id_offset (none without): (digest, item-local offset) per
        run of an item's tokens, a digest token starting one at 0 and a token
        above the offset continuing the chain's last item at its local
        index, until a text token."""
        last = item
        for i in sorted(digests):
            last = digests[i]
        off = self.mm_token_id_offset
        if off is None:
            return last, []
        keys: list[MmKey] = []
        in_run = False
        for i, t in enumerate(tokens):
            if i in digests:
                item = digests[i]
                keys.append((item, 0))
                in_run = True
            elif item is not None and t > off:
                if not in_run:
                    keys.append((item, t - off))
                in_run = True
            else:
                in_run = False
        return last, keys

    def _on_removed(self, key: int) -> None:
        b = self._blocks.pop(key, None)
        if b is not None:
            for lg in sorted(b.layer_groups):
                self.add_removed_event(b.hash, lg)

    def _on_page(self, key: int, lg: int, old_level: int, level: int, priority: int) -> None:
        b = self._blocks.get(key)
        if b is None:
            return
        if level < 0:  # that layer group's page left the cache
            if lg in b.layer_groups:
                b.layer_groups.discard(lg)
                self.add_removed_event(b.hash, lg)
            return
        if old_level < 0 or lg not in b.layer_groups:  # a page filled a gap: stored again for it
            b.layer_groups.add(lg)
            self.add_stored_event(b.parent, [KVCacheStoredBlockData(b.hash, b.tokens, level, priority, list(b.mm_keys))], lg)
            return
        self.add_updated_event(b.hash, cache_level=KVCacheEventDiff(old_level, level), layer_group_id=lg)

    def _on_priority(self, key: int, old: int, new: int) -> None:
        b = self._blocks.get(key)
        if b is not None:
            for lg in sorted(b.layer_groups):
                self.add_updated_event(b.hash, priority=KVCacheEventDiff(old, new), layer_group_id=lg)
