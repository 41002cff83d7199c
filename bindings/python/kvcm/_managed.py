"""The one base class of every Python object that owns a native resource."""

from __future__ import annotations

import os
import threading
from typing import Any

from .errors import ClosedError, ConsumedError

__all__ = ["Managed", "check_not_forked", "ForkedProcessError"]


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


class Managed:
    """Owns one native resource (a handle or a C struct).

    * ``close()`` releases it; closing twice does nothing.
    * ``with obj:`` closes it on exit.
    * ``__del__`` closes it if the program did not (never in a fork child).
    * ``_consume(by)`` hands the resource over to a C call that takes
      ownership of it: the object forgets it without releasing it, and every
      later use raises :class:`~kvcm.ConsumedError` naming ``by``.

    Subclasses set ``_what`` (a name for messages) and implement
    ``_release(resource)``.
    """

    _what = "object"

    def __init__(self) -> None:
        self._resource: Any = None
        self._state = "unset"  # "open", "closed", "consumed"
        self._consumed_by: str | None = None
        self._lock = threading.Lock()

    # -- for subclasses -------------------------------------------------
    def _adopt(self, resource: Any) -> None:
        self._resource = resource
        self._state = "open"

    def _release(self, resource: Any) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def _native(self) -> Any:
        """The resource, or raise ClosedError / ConsumedError."""
        state = self._state
        if state == "open":
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
            check_not_forked()
            resource = self._resource
            self._resource = None
            self._state = "closed"
        self._release(resource)

    def __enter__(self):
        self._native()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            if getattr(self, "_state", None) == "open" and not _forked:
                self.close()
        except Exception:
            # Nothing can be reported from a finalizer (and at interpreter
            # shutdown the library may already be gone).
            pass
