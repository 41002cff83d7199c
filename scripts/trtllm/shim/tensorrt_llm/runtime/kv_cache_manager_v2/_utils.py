"""KVCacheManagerV2's ``_utils``: the helpers its tests use. Integer and
range helpers are kvcm's or plain Python; streams are kvcm streams of the
newest open manager (TensorRT-LLM's are CUDA streams of the process)."""

from __future__ import annotations

import contextlib
import sys
import weakref
from typing import Any, Callable, Iterable, Iterator, Sequence, TypeVar

import kvcm
from kvcm import HalfOpenRange, exact_div, typed_range  # noqa: F401

from . import newest_manager

T = TypeVar("T")

# Stream handle -> the kvcm Stream behind it, for the emulated kernels.
streams: "weakref.WeakValueDictionary[int, kvcm.Stream]" = weakref.WeakValueDictionary()


def div_up(x: int, y: int) -> int:
    return -(-x // y)


def round_up(x: int, y: int) -> int:
    return div_up(x, y) * y


def value_or(x: T | None, default: T) -> T:
    return default if x is None else x


def unwrap_optional(x: T | None) -> T:
    assert x is not None
    return x


def overlap(a: Sequence[int], b: Sequence[int]) -> tuple[int, ...]:
    """The overlap of half-open ranges a and b as (beg, end), () if none."""
    beg, end = max(a[0], b[0]), min(a[1], b[1])
    return (beg, end) if beg < end else ()


def intersect(a: HalfOpenRange, b: HalfOpenRange) -> HalfOpenRange:
    return HalfOpenRange(max(a.beg, b.beg), max(max(a.beg, b.beg), min(a.end, b.end)))


def remove_if(items: list[T], pred: Callable[[T], bool]) -> list[T]:
    """Remove the items pred accepts, in place; return them."""
    removed = [x for x in items if pred(x)]
    items[:] = [x for x in items if not pred(x)]
    return removed


def get_uniform_attribute(items: Iterable[T], fn: Callable[[T], Any]) -> Any:
    values = {id(v): v for v in (fn(x) for x in items)}
    assert len(values) == 1, "attribute is not uniform"
    return next(iter(values.values()))


@contextlib.contextmanager
def temporary_sys_path(path: str) -> Iterator[None]:
    sys.path.insert(0, path)
    try:
        yield
    finally:
        sys.path.remove(path)


def init_cuda_once() -> None:
    """Nothing to initialize: kvcm opens its device with the manager."""


class _FinishEvent:
    def __init__(self, stream: kvcm.Stream) -> None:
        self._stream = stream

    def synchronize(self) -> None:
        if not self._stream.closed:
            self._stream.synchronize()

    def query_complete(self) -> bool:
        self.synchronize()
        return True


class CachedCudaStream:
    """A stream of the newest open manager; ``handle`` is what caches take."""

    def __init__(self) -> None:
        self._stream = newest_manager().create_stream()
        streams[self._stream.handle] = self._stream

    @property
    def handle(self) -> int:
        return self._stream.handle

    def synchronize(self) -> None:
        if not self._stream.closed:
            self._stream.synchronize()


class TemporaryCudaStream(CachedCudaStream):
    """A stream for a ``with`` block; the manager closes it (kvcm refuses to
    close a stream an ACTIVE cache still uses)."""

    def __init__(self, prior_events: Sequence[Any] = ()) -> None:
        super().__init__()
        for e in prior_events:
            e.synchronize()

    def __enter__(self) -> "TemporaryCudaStream":
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def take_finish_event(self) -> _FinishEvent:
        return _FinishEvent(self._stream)
