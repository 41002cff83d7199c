"""Exceptions of the kvcm package.

Every failing call of the C library returns a status with a code and a
message; the binding raises the exception class mapped from the code, carrying
both. All of them derive from :class:`KVCacheError`. Classes that correspond
to a builtin category also derive from it (an :class:`InvalidArgumentError`
is a ``ValueError``), so ordinary ``except ValueError`` code keeps working.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = [
    "KVCacheError",
    "InvalidArgumentError",
    "TextOnlyConflictError",
    "InvalidHandleError",
    "InvalidStateError",
    "ScratchInUseError",
    "ConfigAssertionError",
    "SsmNeedsSnapshotError",
    "SsmCommitOffHistoryError",
    "OutOfMemoryError",
    "OutOfPagesError",
    "ResumeRefusedError",
    "InvalidConfigError",
    "CodecRejectedError",
    "DataLostError",
    "BufferTooSmallError",
    "ManagerClosedError",
    "CuError",
    "DeviceError",
    "UnsupportedError",
    "CorruptedError",
    "InternalError",
    "PoisonedError",
    "CodecFailedError",
    "StorageIOError",
    "ClosedError",
    "ConsumedError",
    "LibraryNotFoundError",
]


class KVCacheError(Exception):
    """Base class of every kvcm error.

    ``code`` is the C status code (``None`` for errors raised by the Python
    layer itself) and ``message`` the library's message.
    """

    code: int | None = None

    def __init__(self, message: str, code: int | None = None):
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code


class InvalidArgumentError(KVCacheError, ValueError):
    """An argument is out of its documented range; the message names it."""


class TextOnlyConflictError(InvalidArgumentError, RuntimeError):
    """A cache asked not to be text-only on a manager configured
    ``text_only=True``, which a cache may only tighten: an
    InvalidArgumentError naming ``text_only`` and, as KVCacheManagerV2's C++
    check raises it, a ``RuntimeError``."""


class InvalidHandleError(KVCacheError):
    """A handle is stale: freed, consumed or never issued."""


class InvalidStateError(KVCacheError, RuntimeError):
    """The call is not allowed in the object's current state (a
    ``RuntimeError``, as KVCacheManagerV2's C++ backend reports such
    misuse)."""


class ScratchInUseError(InvalidStateError, ValueError):
    """Scratch reuse cannot be switched while the cache's current step needs
    scratch blocks: an InvalidStateError, and a ``ValueError`` as
    KVCacheManagerV2 reports it."""


class OutOfMemoryError(KVCacheError, MemoryError):
    """Memory ran out (KVCM2's base of :class:`OutOfPagesError`)."""


class OutOfPagesError(OutOfMemoryError):
    """A cache level cannot supply the pages the call needs."""


class ResumeRefusedError(KVCacheError):
    """Resume was refused: GPU utilization is above ``max_util_for_resume``."""


class InvalidConfigError(KVCacheError, ValueError):
    """The manager configuration is invalid.

    ``field`` is the offending field's path, such as
    ``"layers[2].buffers[0].size"``, when the library names one.
    """

    field: str | None

    _FIELD = re.compile(r"invalid config: ([A-Za-z_][A-Za-z0-9_.\[\]]*): ")

    def __init__(self, message: str, code: int | None = None, field: str | None = None):
        super().__init__(message, code)
        if field is None:
            m = self._FIELD.search(message)
            field = m.group(1) if m else None
        self.field = field


class ConfigAssertionError(InvalidConfigError, AssertionError):
    """A configuration value KVCacheManagerV2 checks where it is made (a
    config class's constructor, a tier's ``assert_valid()``): an
    ``AssertionError``, as its pure-Python backend asserts, and an
    InvalidConfigError (a ``ValueError``, as its C++ backend raises it)
    whose ``field`` names the field."""


class SsmNeedsSnapshotError(ConfigAssertionError):
    """A :class:`~kvcm.KVCacheManagerConfig` has SSM layers without
    ``commit_min_snapshot``: an InvalidConfigError naming that field, and an
    ``AssertionError`` as KVCacheManagerV2's config constructor reports it."""


class SsmCommitOffHistoryError(InvalidArgumentError, AssertionError):
    """With SSM layers a commit neither starts nor ends at the history
    length (the one SSM state is the history's): an InvalidArgumentError
    naming ``tokens``, and an ``AssertionError`` as KVCacheManagerV2 reports
    it. The commit changed nothing."""

    # The library's message for this rule (core's Commit).
    RULE = "with SSM layers a commit starts or ends at the history length"


class CodecRejectedError(KVCacheError):
    """The cold-page codec rejected the configuration (at manager creation)."""


class DataLostError(KVCacheError):
    """A failure destroyed pages of the cache; close it.

    Every call on the cache but ``close`` raises it once the failure is known;
    lost pages are never published, so the next request recomputes them.
    """


class BufferTooSmallError(KVCacheError):
    """A caller-provided buffer was too small (a binding bug if it escapes)."""


class ManagerClosedError(KVCacheError):
    """The manager has been closed."""


class CuError(KVCacheError):
    """A device call failed (KVCM2's name). ``error_code`` is the CUresult
    the library's message names (``[CUresult 2]``), else None (the emulated
    device has no CUresult). Constructed as KVCM2's ``CuError(error_code)``
    (a first argument that is not a message: a CUresult, an int), it carries
    that code with the message ``CUDA driver error: <code>``."""

    error_code: Any

    _CODE = re.compile(r"\[CUresult (-?\d+)\]")

    def __init__(self, message: Any, code: int | None = None, error_code: Any = None):
        if not isinstance(message, str):
            message, error_code = f"CUDA driver error: {message}", message
        super().__init__(message, code)
        if error_code is None:
            m = self._CODE.search(message)
            error_code = int(m.group(1)) if m else None
        self.error_code = error_code


class DeviceError(CuError):
    """The device (or its emulation) failed."""


class UnsupportedError(KVCacheError, NotImplementedError):
    """Valid, but this build or machine cannot serve it."""


class CorruptedError(KVCacheError):
    """A broken invariant was recorded: the library refuses calls from now on
    (KVCM2's name; :class:`InternalError` and :class:`PoisonedError` are the
    two ways it shows)."""


class InternalError(CorruptedError):
    """A bug inside the library; the library is poisoned from now on."""


class PoisonedError(CorruptedError):
    """An earlier call panicked; restart the process."""


class CodecFailedError(KVCacheError):
    """A codec's encode or decode returned false.

    A failed decode drops the pages it was bringing back (the cache then raises
    :class:`DataLostError`; the next request recomputes them). A failed encode
    leaves its pages usable, and the call that needed their slots raises
    :class:`OutOfPagesError` naming the failure.
    """


class StorageIOError(KVCacheError, OSError):
    """Reading or writing a disk tier's file failed (ENOSPC, EIO, EFBIG, EOF).

    The library is not poisoned. Pages an asynchronous read or write lost make
    their caches raise :class:`DataLostError`.
    """


class ClosedError(KVCacheError):
    """The Python object was closed; it cannot be used any more."""


class ConsumedError(KVCacheError):
    """The Python object was handed over (consumed) and cannot be used any more."""


class LibraryNotFoundError(KVCacheError, ImportError):
    """libkvcm.so was found neither next to the package nor via KVCM_LIBRARY."""


# C status code -> exception class. The values are the ABI's stable codes;
# _status.py checks them against the generated layer at import time.
_BY_CODE: dict[int, type[KVCacheError]] = {
    1: InvalidArgumentError,
    2: InvalidHandleError,
    3: InvalidStateError,
    4: OutOfPagesError,
    5: ResumeRefusedError,
    6: InvalidConfigError,
    7: CodecRejectedError,
    8: DataLostError,
    9: BufferTooSmallError,
    10: ManagerClosedError,
    11: DeviceError,
    12: UnsupportedError,
    13: InternalError,
    14: PoisonedError,
    15: CodecFailedError,
    16: StorageIOError,
}

for _code, _cls in _BY_CODE.items():
    _cls.code = _code
del _code, _cls


_first_internal_error: str | None = None


def first_internal_error() -> str | None:
    """The message of the first InternalError the library reported to this
    process (what poisoned it), or None."""
    return _first_internal_error


def error_for_code(code: int, message: str) -> KVCacheError:
    """The exception for a C status code and message."""
    global _first_internal_error
    cls = _BY_CODE.get(code, KVCacheError)
    if cls is InternalError and _first_internal_error is None:
        _first_internal_error = message
    return cls(message, code)
