"""CP-aware KV management: the five-method interface of the design.

Every implementation is a native CP index (``kvcm_cp_index``) with the same
methods::

    predict_prefix_reuse(request_id, token_ids) -> float   # in [0.0, 1.0]
    get_cp_cached_blocks(request_id) -> list[int]         # block hashes
    notify_blocks_allocated(request_id, block_hashes) -> None
    notify_blocks_freed(request_id, block_hashes) -> None  # terminal frees only
    get_allocation_priority(request_ids) -> list           # highest overlap first

Block hashes are the chained block hashes of the manager's radix tree (the
``key`` of :class:`~kvcm.CacheEvent`), the same in Go, C++ and Python.

* :class:`NullCPAwareKVManager`: zero scores, identity order, no state.
* :class:`ManagerBackedCPAwareKVManager`: scores from the manager's own block
  index across cache levels.
* :class:`ContextPilotKVManager`: delegates to a middleware object, probing it
  with ``getattr`` + ``callable``; only the methods it has are handed to the
  library, the others behave as the null index's.

Attach one to a manager (:meth:`KVCacheManager.attach_cp`) and create caches
with a ``request_id``: the manager then notifies the index itself (reused
blocks at creation and completed blocks at each commit as allocated, all of
them as freed once when the cache closes; suspend, resume and level moves
notify nothing).

Errors raised by a middleware
-----------------------------
The design says the external index must never break scheduling, and the
library contains every failure of an external index: an exception raised by
a middleware method, a score that is not a number or lies outside [0, 1]
(clamped; NaN becomes 0), a priority order that is not a permutation of its
input (repaired: invented or repeated ids dropped, missing ones appended in
input order), or block hashes that are not 64-bit integers. Each is answered
with the null behaviour and counted in :attr:`CPAwareKVManager.fault_count`;
the exceptions themselves are kept in :attr:`ContextPilotKVManager.errors`
(the most recent 16). With ``strict=True`` an exception raised while one of
this object's own methods runs is also re-raised once that method's C call
has returned (stash and re-raise, as for the priority callback of caches);
exceptions raised during a manager's notifications (inside
``create_kv_cache``, ``commit`` and ``close``) are never raised there, since
those calls succeeded.
"""

from __future__ import annotations

import collections
import ctypes
import threading
from typing import Any, Iterable, Sequence

from . import _convert, _native
from ._managed import Managed, callback_guard
from ._native import ffi
from .errors import BufferTooSmallError

__all__ = [
    "CPAwareKVManager",
    "NullCPAwareKVManager",
    "ManagerBackedCPAwareKVManager",
    "ContextPilotKVManager",
    "CP_METHODS",
]

#: The five methods of the interface, in vtable order.
CP_METHODS = (
    "predict_prefix_reuse",
    "get_cp_cached_blocks",
    "notify_blocks_allocated",
    "notify_blocks_freed",
    "get_allocation_priority",
)

_U64 = (1 << 64) - 1


def _id_bytes(request_id: Any, what: str = "request_id") -> bytes:
    if isinstance(request_id, str):
        return request_id.encode("utf-8", "surrogateescape")
    if isinstance(request_id, (bytes, bytearray, memoryview)):
        return bytes(request_id)
    raise TypeError(f"{what}: expected str or bytes, got {type(request_id).__name__}")


def _keys_array(block_hashes: Iterable[int] | None) -> tuple[Any, int]:
    if block_hashes is None:
        return None, 0
    keys = [_convert.check(k, ctypes.c_uint64, f"block_hashes[{i}]") for i, k in enumerate(block_hashes)]
    if not keys:
        return None, 0
    return (ctypes.c_uint64 * len(keys))(*keys), len(keys)


class CPAwareKVManager(Managed):
    """A native CP index (``kvcm_cp_index``); the base of every
    implementation. Not constructible directly."""

    _what = "CP index"

    def __init__(self) -> None:
        super().__init__()
        if type(self) is CPAwareKVManager:
            raise TypeError("CPAwareKVManager is abstract: use NullCPAwareKVManager, "
                            "ManagerBackedCPAwareKVManager or ContextPilotKVManager")

    def _release(self, handle: int) -> None:
        _native.call("kvcm_cp_destroy", handle)

    # Direct calls run through _call, which ContextPilotKVManager overrides
    # to re-raise a middleware's exceptions in strict mode.
    def _call(self, fn: str, *args: Any) -> None:
        _native.call(fn, self._native(), *args)

    def predict_prefix_reuse(self, request_id: Any, token_ids: Sequence[int] | None) -> float:
        """The predicted fraction of the request's tokens whose KV can be
        reused, in [0.0, 1.0]."""
        rid = _id_bytes(request_id)
        toks, n, _keep = _convert.tokens(token_ids, "token_ids")
        out = ctypes.c_double()
        self._call("kvcm_cp_predict_prefix_reuse", rid, len(rid), toks, n, ctypes.byref(out))
        return out.value

    def get_cp_cached_blocks(self, request_id: Any) -> list[int]:
        """Hashes of the blocks known to be cached for the request, in chain
        order."""
        rid = _id_bytes(request_id)
        needed = ctypes.c_size_t()
        cap = 0
        buf: Any = None
        while True:
            try:
                self._call("kvcm_cp_get_cached_blocks", rid, len(rid), buf, cap, ctypes.byref(needed))
            except BufferTooSmallError:  # the answer grew between two calls
                pass
            if needed.value <= cap:
                return [int(buf[i]) for i in range(needed.value)]
            cap = needed.value
            buf = (ctypes.c_uint64 * cap)()

    def notify_blocks_allocated(self, request_id: Any, block_hashes: Iterable[int] | None) -> None:
        """The request holds these blocks (allocation, registration)."""
        rid = _id_bytes(request_id)
        keys, n = _keys_array(block_hashes)
        self._call("kvcm_cp_notify_blocks_allocated", rid, len(rid), keys, n)

    def notify_blocks_freed(self, request_id: Any, block_hashes: Iterable[int] | None) -> None:
        """The request released these blocks for good (terminal frees only)."""
        rid = _id_bytes(request_id)
        keys, n = _keys_array(block_hashes)
        self._call("kvcm_cp_notify_blocks_freed", rid, len(rid), keys, n)

    def get_allocation_priority(self, request_ids: Sequence[Any]) -> list:
        """request_ids reordered from highest to lowest predicted overlap
        (always a permutation; ties keep the input order). The ids are
        returned as given."""
        ids = list(request_ids)
        if not ids:
            return []
        arr = (ffi.kvcm_cp_request_id * len(ids))()
        keep = []
        for i, rid in enumerate(ids):
            b = _id_bytes(rid, f"request_ids[{i}]")
            arr[i].data, k = _native.byte_buffer(b)
            arr[i].len = len(b)
            keep.append(k)
        order = (ctypes.c_size_t * len(ids))()
        self._call("kvcm_cp_get_allocation_priority", arr, len(ids), order)
        del keep
        return [ids[order[i]] for i in range(len(ids))]

    @property
    def fault_count(self) -> int:
        """Failures, invalid scores and repaired orders the external index of
        a delegating index produced (0 for the other kinds)."""
        out = ctypes.c_uint64()
        _native.call("kvcm_cp_get_fault_count", self._native(), ctypes.byref(out))
        return out.value

    def _handle(self) -> int:
        return self._native()

    def __repr__(self) -> str:
        return f"<kvcm.{type(self).__name__} {'closed' if self.closed else 'open'}>"


class NullCPAwareKVManager(CPAwareKVManager):
    """The CP-disabled index: every score 0.0, every order the input order,
    no state. Enabling it changes nothing."""

    def __init__(self) -> None:
        super().__init__()
        out = ffi.kvcm_cp_index()
        _native.call("kvcm_cp_create_null", ctypes.byref(out))
        self._adopt(int(out.value))


class ManagerBackedCPAwareKVManager(CPAwareKVManager):
    """Scores from the manager's own block index: the longest cached prefix
    of the request's full blocks (as the manager would reuse it), each block
    weighted by the level its pages are on (``level_weights[l]``, default
    ``(1.0, 0.5, 0.25)``), over the request's tokens. Blocks outlive the
    requests that made them. Create it before the manager's first commit
    (``InvalidStateError`` otherwise); its scores are 0 once the manager is
    closed. ``reuse_scope`` (a ReuseScope: ``lora_id`` and ``salt``), or
    kvcm's older ``lora_task_id`` and ``salt``, is the reuse scope of every
    request it scores."""

    def __init__(self, manager: Any, level_weights: Sequence[float] | None = None,
                 lora_task_id: int | None = None, salt: bytes | str | None = None, *,
                 reuse_scope: Any = None) -> None:
        super().__init__()
        opts = _native.versioned(ffi.kvcm_cp_manager_backed_options)
        weights = None
        if level_weights:
            weights = (ctypes.c_double * len(level_weights))(*[float(w) for w in level_weights])
            opts.level_weights = weights
            opts.num_level_weights = len(level_weights)
        from .manager import _scope_fields

        lora_id, salt = _scope_fields(reuse_scope, lora_task_id, salt)
        scope, has_lora, keep = manager._scope(lora_id, salt)
        opts.scope = scope
        opts.scope_has_lora_id = has_lora
        out = ffi.kvcm_cp_index()
        _native.call("kvcm_cp_create_manager_backed", manager._native(), ctypes.byref(opts), ctypes.byref(out))
        del keep, weights
        self._adopt(int(out.value))


# Vtables handed to the library, kept alive until their destroy slot ran
# (which may be long after the Python wrapper is gone: an attached manager
# keeps the index). Destroyed holders wait in the graveyard until the next
# index is made, so a callback object is never freed while it runs.
_live: dict[int, "_Holder"] = {}
_graveyard: list["_Holder"] = []
_live_lock = threading.Lock()
_next_key = 1


class _Holder:
    __slots__ = ("key", "middleware", "callbacks", "vtable", "owner", "faults", "__weakref__")


class _Faults:
    """What a ContextPilotKVManager's callbacks report to: the errors kept,
    and the stash of a strict direct call. Owned by the wrapper and by its
    holder in ``_live``; it never refers to the wrapper, so a wrapper the
    program drops is finalized (closing the native index) even while the
    library still holds its callbacks."""

    __slots__ = ("errors", "stash", "direct", "strict")

    def __init__(self, strict: bool) -> None:
        self.errors: collections.deque[BaseException] = collections.deque(maxlen=16)
        self.stash = _native.Stash()
        self.direct = threading.local()
        self.strict = strict

    def failed(self, e: BaseException) -> None:
        """A middleware method raised (or answered garbage): keep it; in a
        strict direct call, stash it for re-raising."""
        self.errors.append(e)
        if self.strict and getattr(self.direct, "active", 0) > 0:
            self.stash.put(e)


class ContextPilotKVManager(CPAwareKVManager):
    """Delegates to ``middleware``: for each of the five methods, if
    ``getattr(middleware, name, None)`` is callable it is used, otherwise the
    null behaviour applies (the vtable slot stays NULL). Scores are clamped
    into [0.0, 1.0] (NaN → 0.0) and orders repaired by the library; see the
    module docstring for how exceptions are handled (``strict``).

    The middleware receives request ids as ``str`` (decoded from UTF-8) and
    block hashes as lists of ``int``; ``get_allocation_priority`` receives a
    list of ``str`` and returns them reordered. It may be called from any
    thread, concurrently, and must not call into the manager.
    """

    def __init__(self, middleware: Any, *, strict: bool = False) -> None:
        super().__init__()
        global _next_key
        self._middleware = middleware
        faults = _Faults(bool(strict))
        self._faults = faults
        #: The most recent exceptions of the middleware (at most 16).
        self.errors: collections.deque[BaseException] = faults.errors
        self._stash = faults.stash
        self._direct = faults.direct
        found = {name: getattr(middleware, name, None) for name in CP_METHODS}
        self.capabilities = frozenset(n for n, fn in found.items() if callable(fn))

        holder = _Holder()
        with _live_lock:
            _graveyard.clear()
            holder.key = _next_key
            _next_key += 1
            _live[holder.key] = holder
        holder.middleware = middleware
        holder.faults = faults
        vt = _native.versioned(ffi.kvcm_cp_index_vtable)
        cbs: list[Any] = []

        def slot(name: str, cftype: Any, impl: Any) -> None:
            if name in self.capabilities:
                cb = cftype(callback_guard(impl))
                cbs.append(cb)
                setattr(vt, name, cb)

        # Not self._failed: the callbacks live in _live as long as the native
        # index, which only this wrapper's close()/__del__ destroys; a strong
        # reference to the wrapper there would keep it alive for good.
        fail = faults.failed
        slot("predict_prefix_reuse", ffi.kvcm_cp_index_vtable_predict_prefix_reuse,
             _predict(found["predict_prefix_reuse"], fail))
        slot("get_cp_cached_blocks", ffi.kvcm_cp_index_vtable_get_cp_cached_blocks,
             _cached(found["get_cp_cached_blocks"], fail))
        slot("notify_blocks_allocated", ffi.kvcm_cp_index_vtable_notify_blocks_allocated,
             _notify(found["notify_blocks_allocated"], fail))
        slot("notify_blocks_freed", ffi.kvcm_cp_index_vtable_notify_blocks_freed,
             _notify(found["notify_blocks_freed"], fail))
        slot("get_allocation_priority", ffi.kvcm_cp_index_vtable_get_allocation_priority,
             _priority(found["get_allocation_priority"], fail))
        key = holder.key

        def destroy(_self: Any) -> None:
            with _live_lock:
                h = _live.pop(key, None)
                if h is not None:
                    # Let go of the middleware and every callback but this
                    # one (running now): it waits in the graveyard.
                    h.middleware, h.vtable, h.owner, h.faults = None, None, None, None
                    h.callbacks = [c for c in h.callbacks if c is holder_destroy[0]]
                    _graveyard.append(h)

        holder_destroy: list[Any] = []
        d = ffi.kvcm_cp_index_vtable_destroy(callback_guard(destroy))
        holder_destroy.append(d)
        cbs.append(d)
        vt.destroy = d
        holder.callbacks = cbs
        holder.vtable = vt
        obj = ffi.kvcm_cp_index_object()
        obj.vtable = ctypes.pointer(vt)
        obj.self = ctypes.c_void_p(key)
        out = ffi.kvcm_cp_index()
        # Consumed by the call, on success and on failure (destroy runs then).
        _native.call("kvcm_cp_create_delegating", ctypes.byref(obj), ctypes.byref(out))
        self._adopt(int(out.value))

    @property
    def middleware(self) -> Any:
        return self._middleware

    @property
    def strict(self) -> bool:
        """Re-raise a middleware's exception from this object's own calls."""
        return self._faults.strict

    @strict.setter
    def strict(self, value: bool) -> None:
        self._faults.strict = bool(value)

    def _failed(self, e: BaseException) -> None:
        """A middleware method raised (or answered garbage): keep it; in a
        strict direct call, stash it for re-raising."""
        self._faults.failed(e)

    def _call(self, fn: str, *args: Any) -> None:
        h = self._native()
        if not self.strict:
            _native.call(fn, h, *args)
            return
        self._stash.take()  # nothing from earlier notifications
        self._direct.active = getattr(self._direct, "active", 0) + 1
        try:
            _native.call_with_stash(self._stash, lambda: _native.call(fn, h, *args))
        finally:
            self._direct.active -= 1

    def __repr__(self) -> str:
        caps = ", ".join(sorted(self.capabilities)) or "nothing"
        return f"<kvcm.ContextPilotKVManager {'closed' if self.closed else 'open'} implementing {caps}>"


# ---- trampolines: Python callables behind C slots; nothing may raise into C ----

def _rid(p: int | None, n: int) -> str:
    return ctypes.string_at(p, n).decode("utf-8", "surrogateescape") if n and p else ""


def _predict(fn: Any, fail: Any) -> Any:
    def impl(_self: Any, rid: Any, n: int, tokens: Any, nt: int, score: Any) -> int:
        try:
            toks = [tokens[i] for i in range(nt)] if nt else []
            v = fn(_rid(rid, n), toks)
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                v = float(v)  # numpy scalars and the like; garbage raises
            score[0] = float(v)
            return 0
        except BaseException as e:  # noqa: BLE001
            fail(e)
            return 1
    return impl


def _cached(fn: Any, fail: Any) -> Any:
    def impl(_self: Any, rid: Any, n: int, keys: Any, cap: int, needed: Any) -> int:
        try:
            ks = [int(k) for k in (fn(_rid(rid, n)) or [])]
            for k in ks:
                if k < 0 or k > _U64:
                    raise ValueError(f"get_cp_cached_blocks: {k} is not a 64-bit unsigned hash")
            needed[0] = len(ks)
            if len(ks) <= cap:
                for i, k in enumerate(ks):
                    keys[i] = k
            return 0
        except BaseException as e:  # noqa: BLE001
            fail(e)
            return 1
    return impl


def _notify(fn: Any, fail: Any) -> Any:
    def impl(_self: Any, rid: Any, n: int, keys: Any, nk: int) -> int:
        try:
            fn(_rid(rid, n), [keys[i] for i in range(nk)] if nk else [])
            return 0
        except BaseException as e:  # noqa: BLE001
            fail(e)
            return 1
    return impl


def _priority(fn: Any, fail: Any) -> Any:
    def impl(_self: Any, ids: Any, n: int, order: Any) -> int:
        try:
            names = [_rid(ids[i].data, ids[i].len) for i in range(n)]
            got = list(fn(list(names)))
            # Ids back to indices; equal ids take their indices in input
            # order; unknown, unhashable or surplus entries become an invalid
            # index, which the library repairs (and counts).
            free: dict[str, collections.deque[int]] = {}
            for i, name in enumerate(names):
                free.setdefault(name, collections.deque()).append(i)
            for i in range(n):
                j = n
                if i < len(got) and not (i == n - 1 and len(got) > n):
                    # (A surplus answer leaves its last slot invalid: the
                    # library appends the id it lacks there, the same
                    # order, and counts the fault.)
                    try:
                        q = free.get(got[i])
                    except TypeError:
                        q = None
                    if q:
                        j = q.popleft()
                order[i] = j
            return 0
        except BaseException as e:  # noqa: BLE001
            fail(e)
            return 1
    return impl
