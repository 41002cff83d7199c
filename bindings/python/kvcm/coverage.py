"""KVCM2 names whose models kvcm does not cover yet (the model-coverage
issue: SSM state, beam search, SWA scratch slots).

They are importable so that code written against KVCM2 imports unchanged;
using one raises :class:`~kvcm.UnsupportedError` (a ``NotImplementedError``)
naming the capability kvcm lacks.
"""

from __future__ import annotations

from typing import Any, NoReturn

from .errors import UnsupportedError

__all__ = [
    "SsmLayerConfig", "SwaScratchReuseConfig", "AttnLifeCycle", "PlannedDropHandle",
    "ScratchDesc", "SsmSnapshotIterationStatsDelta",
]

SSM = "SSM (Mamba) state layers"
SWA_SCRATCH = "SWA scratch-slot reuse"
BEAMS = "beam search"
LIFE_CYCLES = "KVCM2's AttnLifeCycle objects (kvcm's layer groups are integers)"
PLANNED_DROP = "planned committed-block drops"
PER_LAYER = "PageIndexMode.PER_LAYER page indices"


def missing(name: str, capability: str) -> NoReturn:
    """Raise the error of a KVCM2 name whose capability kvcm lacks."""
    raise UnsupportedError(f"{name}: kvcm does not support {capability} yet (model coverage)")


class _Uncovered:
    """A KVCM2 class kvcm cannot serve: constructing it raises."""

    _capability = ""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        missing(type(self).__name__, self._capability)


class SsmLayerConfig(_Uncovered):
    """KVCM2's SSM (Mamba) layer: model coverage."""

    _capability = SSM


class SwaScratchReuseConfig(_Uncovered):
    """KVCM2's SWA scratch reuse: model coverage."""

    _capability = SWA_SCRATCH


class AttnLifeCycle(_Uncovered):
    """KVCM2's life-cycle object: kvcm names layer groups by integers."""

    _capability = LIFE_CYCLES

    @staticmethod
    def make(window_size: int | None, num_sink_tokens: int | None, tokens_per_block: int) -> "AttnLifeCycle":
        missing("AttnLifeCycle.make", LIFE_CYCLES)


class PlannedDropHandle(_Uncovered):
    _capability = PLANNED_DROP


class ScratchDesc(_Uncovered):
    _capability = SWA_SCRATCH


class SsmSnapshotIterationStatsDelta(_Uncovered):
    _capability = SSM

