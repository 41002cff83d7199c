"""KVCacheManagerV2's ``_exceptions``: kvcm's error classes. ``LogicError``
(KVCacheManagerV2's own bug report) has no kvcm counterpart: kvcm reports
misuse as ``kvcm.InvalidStateError``, a ``RuntimeError`` like the C++
backend's errors."""

from kvcm import CorruptedError, CuError, OutOfMemoryError, OutOfPagesError  # noqa: F401


class LogicError(Exception):
    """KVCacheManagerV2's internal-bug error; kvcm never raises it."""
