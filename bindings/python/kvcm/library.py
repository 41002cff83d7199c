"""Library-wide queries: versions, live handles, poisoning."""

from __future__ import annotations

from pathlib import Path

from . import _native
from ._library import find_library
from ._managed import check_not_forked, release_deferred

__all__ = ["version", "abi_version", "live_handle_count", "is_poisoned", "poison_reason", "take_poison", "library_path"]


def library_path() -> Path:
    """The libkvcm.so this process uses (or would load)."""
    return find_library()


def version() -> str:
    """The library's version, "major.minor.patch"."""
    check_not_forked()
    v = _native.lib.kvcm_get_library_version()
    return v.decode() if isinstance(v, bytes) else str(v)


def abi_version() -> int:
    """The library's ABI version (KVCM_ABI_VERSION of the loaded library)."""
    check_not_forked()
    return int(_native.lib.kvcm_get_abi_version())


def live_handle_count() -> int:
    """Live handles of every type (managers, caches, unconsumed default
    codecs) in this process, for leak tests."""
    check_not_forked()
    # Objects finalized inside a callback are released first, so that the
    # count does not include handles only waiting for that.
    release_deferred()
    return int(_native.lib.kvcm_live_handle_count())


def is_poisoned() -> bool:
    """Whether a panic inside the library poisoned it."""
    check_not_forked()
    return bool(_native.lib.kvcm_is_poisoned())


def poison_reason() -> str | None:
    """What poisoned the library (the first InternalError's message this
    process saw), or None while it is not poisoned. Never clears."""
    if not is_poisoned():
        return None
    from .errors import first_internal_error

    return first_internal_error() or "the library is poisoned: an earlier call panicked"


def take_poison() -> str | None:
    """poison_reason(), once no manager is alive (None while one is). kvcm's
    poisoning is never cleared: after a panic the library's state cannot be
    trusted, so the process must restart (KVCM2 clears it here)."""
    from .manager import num_live_managers

    if num_live_managers() > 0:
        return None
    return poison_reason()


def _debug_panic(message: str = "debug panic") -> None:
    """Panic inside the library (only with KVCM_ENABLE_DEBUG_PANIC=1): the
    call raises InternalError and the library is poisoned for the rest of
    the process. For tests, in a subprocess."""
    check_not_forked()
    _native.call("kvcm_debug_panic", message.encode())
