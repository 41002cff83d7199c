"""KVCM2 names whose models kvcm does not cover (the model-coverage issue:
KVCM2's AttnLifeCycle objects; kvcm names layer groups by integers).

They are importable so that code written against KVCM2 imports unchanged;
using one raises :class:`~kvcm.UnsupportedError` (a ``NotImplementedError``)
naming the capability kvcm lacks.
"""

from __future__ import annotations

from typing import Any, NoReturn

from .errors import UnsupportedError

__all__ = ["AttnLifeCycle"]

LIFE_CYCLES = "KVCM2's AttnLifeCycle objects (kvcm's layer groups are integers)"


def missing(name: str, capability: str) -> NoReturn:
    """Raise the error of a KVCM2 name whose capability kvcm lacks."""
    raise UnsupportedError(f"{name}: kvcm does not support {capability} yet (model coverage)")


class _Uncovered:
    """A KVCM2 class kvcm cannot serve: constructing it raises."""

    _capability = ""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        missing(type(self).__name__, self._capability)


class AttnLifeCycle(_Uncovered):
    """KVCM2's life-cycle object: kvcm names layer groups by integers."""

    _capability = LIFE_CYCLES

    @staticmethod
    def make(window_size: int | None, num_sink_tokens: int | None, tokens_per_block: int) -> "AttnLifeCycle":
        missing("AttnLifeCycle.make", LIFE_CYCLES)
