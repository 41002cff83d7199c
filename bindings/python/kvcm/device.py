"""A small stream and memory helper over the manager's device.

Enough for an engine emulation or a test to move page bytes: streams
(:meth:`KVCacheManager.create_stream`), device or host-mapped memory
(:meth:`KVCacheManager.alloc_memory`), batch copies, copies from ordinary
host memory, host functions in stream order, and synchronization. On the
emulated device, GPU pool memory is not host-visible, exactly like real
device memory: read and write pages by batch-copying between them and a
host-mapped buffer on a stream.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any, Callable, Iterable, Sequence

from . import _native
from ._convert import set_field
from ._managed import Managed, callback_guard
from ._native import ffi
from .errors import InvalidStateError


__all__ = ["MemoryKind", "Stream", "DeviceMemory"]


MemoryKind = ffi.MemoryKind




class Stream(Managed):
    """A stream of the manager's device (``kvcm_stream``).

    ``handle`` is the native stream handle (a CUstream on CUDA) that
    :meth:`_KVCache.resume` and codecs take. Destroyed by ``close()`` or
    with its manager. ``close()`` raises :class:`~kvcm.InvalidStateError`,
    naming the cache and leaving the stream open, while an ACTIVE cache uses
    it: suspend or close the cache first.
    """

    _what = "stream"

    def __init__(self, manager: Any, handle: int) -> None:
        super().__init__()
        self._manager = manager
        self._adopt(int(handle))
        self._stash = _native.Stash()
        self._pending: dict[int, Any] = {}
        self._pending_lock = threading.Lock()

    @property
    def handle(self) -> int:
        return self._native()

    def __int__(self) -> int:
        return self.handle

    def _release(self, handle: int) -> None:
        mh = self._manager._handle_or_none()
        if mh is not None:
            try:
                _native.call("kvcm_manager_destroy_stream", mh, handle)
            except InvalidStateError:
                with self._lock:  # refused: the stream is still alive
                    self._adopt(handle)
                raise

    def synchronize(self) -> None:
        """Wait for all enqueued work. Raises the first asynchronous failure;
        an exception raised by a host function is re-raised here."""
        h = self._native()
        _native.call_with_stash(self._stash, lambda: _native.call("kvcm_stream_synchronize", h))

    def batch_copy(self, descs: Iterable[Sequence[int]]) -> None:
        """Enqueue copies ``(dst, src, size)`` as one submission."""
        items = list(descs)
        arr = (ffi.kvcm_copy_desc * max(len(items), 1))()
        for i, (dst, src, size) in enumerate(items):
            set_field(arr[i], "dst", dst, f"descs[{i}].dst")
            set_field(arr[i], "src", src, f"descs[{i}].src")
            set_field(arr[i], "size", size, f"descs[{i}].size")
        _native.call("kvcm_stream_batch_copy", self._native(), arr if items else None, len(items))

    def copy_from_host(self, dst: int, data: Any) -> None:
        """Enqueue a copy of ordinary host bytes (any buffer) to ``dst``; the
        bytes are consumed before the call returns."""
        mv = memoryview(data).cast("B")
        n = mv.nbytes
        if n == 0:
            return
        if mv.readonly:
            buf = (ctypes.c_char * n).from_buffer_copy(mv)
        else:
            buf = (ctypes.c_char * n).from_buffer(mv)
        _native.call("kvcm_stream_copy_from_host", self._native(), dst, buf, n)

    def enqueue_host_func(self, fn: Callable[[], Any]) -> None:
        """Run ``fn()`` on a host thread in stream order. If it raises, the
        stream fails and :meth:`synchronize` re-raises the exception."""
        h = self._native()
        stash = self._stash

        def trampoline(_user: Any) -> int:
            try:
                fn()
                return 0
            except BaseException as e:  # noqa: BLE001 - no exception may cross into C
                stash.put(e)
                return 1
            finally:
                with self._pending_lock:
                    self._pending.pop(key, None)

        cb = ffi.kvcm_host_func(callback_guard(trampoline))
        key = id(cb)
        with self._pending_lock:
            self._pending[key] = cb  # alive until it has run
        try:
            _native.call("kvcm_stream_enqueue_host_func", h, cb, None)
        except BaseException:
            with self._pending_lock:
                self._pending.pop(key, None)
            raise

    def __repr__(self) -> str:
        return f"<kvcm.Stream {'closed' if self.closed else hex(self._resource)}>"


class DeviceMemory(Managed):
    """Memory on the manager's device. Host-mapped memory is also host
    memory at the same address: :meth:`view` gives a writable memoryview of
    it (valid until ``close()`` or the manager's close; do not keep it
    beyond), :meth:`read` and :meth:`write` copy with a liveness check."""

    _what = "device memory"

    def __init__(self, manager: Any, ptr: int, size: int, kind: MemoryKind) -> None:
        super().__init__()
        self._manager = manager
        self.size = size
        self.kind = kind
        self._adopt(int(ptr))

    @property
    def ptr(self) -> int:
        """The address (device address; host address too when host-mapped)."""
        return self._native()

    def __int__(self) -> int:
        return self.ptr

    def _release(self, ptr: int) -> None:
        mh = self._manager._handle_or_none()
        if mh is not None:
            _native.call("kvcm_manager_free_memory", mh, ptr)

    def _host(self) -> Any:
        if self.kind != MemoryKind.HOST_MAPPED:
            raise TypeError("device memory is not host-visible; copy it to host-mapped memory on a stream")
        return (ctypes.c_char * self.size).from_address(self.ptr)

    def view(self) -> memoryview:
        """A writable memoryview of host-mapped memory (no copy)."""
        return memoryview(self._host()).cast("B")

    def read(self, offset: int = 0, size: int | None = None) -> bytes:
        if size is None:
            size = self.size - offset
        if offset < 0 or size < 0 or offset + size > self.size:
            raise ValueError(f"[{offset}, {offset + size}) is outside [0, {self.size})")
        return ctypes.string_at(self.ptr + offset, size) if size else b""

    def write(self, offset: int, data: Any) -> None:
        mv = memoryview(data).cast("B")
        if offset < 0 or offset + mv.nbytes > self.size:
            raise ValueError(f"[{offset}, {offset + mv.nbytes}) is outside [0, {self.size})")
        if self.kind != MemoryKind.HOST_MAPPED:
            raise TypeError("device memory is not host-visible; use Stream.copy_from_host")
        ctypes.memmove(self.ptr + offset, bytes(mv), mv.nbytes)

    def __repr__(self) -> str:
        if self.closed:
            return "<kvcm.DeviceMemory closed>"
        return f"<kvcm.DeviceMemory {self.kind.name} {self.size} bytes at {hex(self._resource)}>"


