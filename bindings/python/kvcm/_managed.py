"""The one base class of every Python object that owns a native resource."""

from __future__ import annotations

import collections
import os
import threading
from typing import Any, Callable

from .errors import ClosedError, ConsumedError

__all__ = [
    "Managed",
    "check_not_forked",
    "ForkedProcessError",
    "callback_guard",
    "in_callback",
    "release_deferred",
]


class ForkedProcessError(ClosedError):
    """libkvcm was loaded before this process was forked.

    A Go shared library does not survive ``fork()``: the child has only the
    forking thread, none of the Go runtime's, so any call may deadlock or
    crash. Start worker processes with the ``spawn`` (or ``forkserver``)
    start method and create managers in the child.
    """


_forked = False


def _after_fork_in_child() -> None:
    global _forked
    _forked = True


os.register_at_fork(after_in_child=_after_fork_in_child)


def check_not_forked() -> None:
    """Raise ForkedProcessError in a fork() child of a process that loaded kvcm."""
    if _forked:
        raise ForkedProcessError(
            "kvcm: this process was fork()ed from one that had loaded libkvcm; a Go shared "
            "library cannot be used after fork(). Use multiprocessing's 'spawn' start method "
            "(multiprocessing.get_context('spawn')) and create the manager in the child."
        )


# ---- finalizers that run inside library callbacks ----------------------------
#
# A callback (a cache's priority function, a CP index's slots, a host
# function) runs on a thread that may hold one of the library's locks (the
# manager's, for instance). Python code there may trigger the garbage
# collector, and a finalizer that then closed its object synchronously would
# call back into the library and take that same non-reentrant lock: a
# deadlock. So every callback wrapper marks its thread (callback_guard), and a
# finalizer on a marked thread only queues its object; the queue is released
# by the next ordinary API call (release_deferred), at the latest when the
# call that ran the callback returns.

_tls = threading.local()
_deferred: "collections.deque[Managed]" = collections.deque()


def in_callback() -> bool:
    """Whether this thread is running a callback of the library."""
    return getattr(_tls, "depth", 0) > 0


def callback_guard(impl: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a Python function handed to the library as a C callback: while it
    runs, finalizers on this thread defer their close() (see above). ``impl``
    returns (and its frame is gone) before the mark is removed."""

    def guarded(*args: Any) -> Any:
        _tls.depth = getattr(_tls, "depth", 0) + 1
        try:
            return impl(*args)
        finally:
            _tls.depth -= 1

    return guarded


def release_deferred() -> None:
    """Close the objects whose finalizers ran inside a callback. Does nothing
    inside a callback, in a fork child, or while this thread already drains."""
    if not _deferred or _forked or in_callback() or getattr(_tls, "draining", False):
        return
    _tls.draining = True
    try:
        while True:
            try:
                obj = _deferred.popleft()
            except IndexError:
                return
            try:
                obj.close()
            except Exception:
                # As in a finalizer: nothing can be reported.
                pass
            del obj
    finally:
        _tls.draining = False


class Managed:
    """Owns one native resource (a handle or a C struct).

    * ``close()`` releases it; closing twice does nothing.
    * ``with obj:`` closes it on exit.
    * ``__del__`` closes it if the program did not (never in a fork child;
      inside a library callback the close is deferred to the next API call).
    * ``_consume(by)`` hands the resource over to a C call that takes
      ownership of it: the object forgets it without releasing it, and every
      later use raises :class:`~kvcm.ConsumedError` naming ``by``.

    Subclasses set ``_what`` (a name for messages) and implement
    ``_release(resource)``.
    """

    _what = "object"
    # What every object starts with, as class attributes (the instance's
    # replace them): an object per request (a KV cache) writes fewer.
    _resource: Any = None
    _state = "unset"  # "open", "closed", "consumed"
    _consumed_by: str | None = None

    def __init__(self) -> None:
        self._lock = threading.Lock()

    # -- for subclasses -------------------------------------------------
    def _adopt(self, resource: Any) -> None:
        self._resource = resource
        self._state = "open"

    def _release(self, resource: Any) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def _native(self) -> Any:
        """The resource, or raise ClosedError / ConsumedError."""
        if self._state == "open":
            if _forked:
                check_not_forked()
            return self._resource
        raise self._unusable()

    def _unusable(self) -> Exception:
        if self._state == "consumed":
            return ConsumedError(
                f"this {self._what} was consumed by {self._consumed_by} and cannot be used again; "
                f"create a new one"
            )
        return ClosedError(f"this {self._what} is closed")

    def _consume(self, by: str = "another object") -> Any:
        """Take the resource for a C call that consumes it. From now on the
        object is unusable, whatever that call does."""
        with self._lock:
            resource = self._native()
            self._resource = None
            self._state = "consumed"
            self._consumed_by = by
            return resource

    def _mark_closed(self) -> None:
        """Forget the resource without releasing it: its owner released it."""
        with self._lock:
            if self._state == "open":
                self._resource = None
                self._state = "closed"

    # -- public ---------------------------------------------------------
    @property
    def closed(self) -> bool:
        """True once closed or consumed."""
        return self._state != "open"

    def close(self) -> None:
        """Release the native resource. Idempotent."""
        with self._lock:
            if self._state != "open":
                return
            if _forked:
                check_not_forked()
            resource = self._resource
            self._resource = None
            self._state = "closed"
        try:
            self._release(resource)
        finally:
            if _deferred:
                release_deferred()

    def __enter__(self):
        self._native()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            if self._state == "open" and not _forked:
                if in_callback():
                    # The library may hold a lock that close() takes: keep
                    # the object (resurrected) until the callback is over.
                    _deferred.append(self)
                else:
                    self.close()
        except Exception:
            # Nothing can be reported from a finalizer (and at interpreter
            # shutdown the library may already be gone).
            pass
