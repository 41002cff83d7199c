"""KVCacheManagerV2's ``_introspection``: white-box hooks its tests use to
look inside the manager (page states, pool ratios, tree pages). kvcm has
none of those; a test calling one fails with KVCM2InternalError naming it.
The hooks that only name layer groups (KVCM2's life cycles) answer from the
manager's public layout: ``attention_life_cycle_ids``,
``swa_life_cycle_ids`` and ``ssm_life_cycle_id``."""

from typing import Any, NoReturn

from ._internal import KVCM2InternalError


def attention_life_cycle_ids(manager: Any) -> list[int]:
    """The attention layer groups' ids, in order."""
    return [int(lc) for lc in manager._life_cycles() if not lc.is_ssm]


def swa_life_cycle_ids(manager: Any) -> list[int]:
    """The ids of the attention layer groups with a sliding window, in order."""
    return [int(lc) for lc in manager._life_cycles() if not lc.is_ssm and lc.window_size is not None]


def ssm_life_cycle_id(manager: Any) -> int | None:
    """The SSM layer group's id, None without SSM layers."""
    return next((int(lc) for lc in manager._life_cycles() if lc.is_ssm), None)


def __getattr__(name: str) -> NoReturn:
    if name.startswith("__"):
        raise AttributeError(name)

    def fail(*_args: Any, **_kwargs: Any) -> NoReturn:
        raise KVCM2InternalError(f"_introspection.{name} is internal to KVCacheManagerV2; kvcm has none")

    return fail  # type: ignore[return-value]
