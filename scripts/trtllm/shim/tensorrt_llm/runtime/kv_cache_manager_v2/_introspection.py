"""KVCacheManagerV2's ``_introspection``: white-box hooks its tests use to
look inside the manager (page states, pool ratios, tree pages). kvcm has
none of them; a test calling one fails with KVCM2InternalError naming it."""

from typing import Any, NoReturn

from ._internal import KVCM2InternalError


def __getattr__(name: str) -> NoReturn:
    if name.startswith("__"):
        raise AttributeError(name)

    def fail(*_args: Any, **_kwargs: Any) -> NoReturn:
        raise KVCM2InternalError(f"_introspection.{name} is internal to KVCacheManagerV2; kvcm has none")

    return fail  # type: ignore[return-value]
