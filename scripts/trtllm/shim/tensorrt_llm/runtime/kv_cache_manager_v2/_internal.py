"""Stand-ins for KVCacheManagerV2's internal classes, which kvcm does not have."""

from __future__ import annotations

from typing import Any, NoReturn


class KVCM2InternalError(NotImplementedError):
    """A test reached into KVCacheManagerV2's internals, which kvcm does not have."""


def internal(name: str) -> type:
    """A class named ``name`` whose construction and attributes raise
    KVCM2InternalError naming it."""

    def fail(*_args: Any, **_kwargs: Any) -> NoReturn:
        raise KVCM2InternalError(f"{name} is internal to KVCacheManagerV2; kvcm has none")

    class _Meta(type):
        def __getattr__(cls, attr: str) -> NoReturn:
            raise KVCM2InternalError(f"{name}.{attr} is internal to KVCacheManagerV2; kvcm has none")

    return _Meta(name, (), {"__init__": fail, "__module__": __name__})
