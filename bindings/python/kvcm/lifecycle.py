"""KVCacheManagerV2's life-cycle values: the shape of a layer group's
attention (sliding window and sink blocks) and the stale-block rule that
follows from it, which kvcm's core applies to sliding-window layer groups.

The layer group a priority callback is asked about is
:class:`kvcm.manager.LifeCycle`, which carries the same fields and rule plus
its layer group id.
"""

from __future__ import annotations

from typing import NamedTuple

from .common import HalfOpenRange
from .errors import InvalidArgumentError

__all__ = ["AttnLifeCycle", "stale_range"]


def stale_range(window_size: int | None, num_sink_blocks: int, history_length: int,
                tokens_per_block: int) -> HalfOpenRange:
    """The blocks past the sinks that a sequence of history_length computed
    tokens no longer needs: out of the window that the input token at
    position history_length still sees. Empty without a window."""
    start = min(-(-history_length // tokens_per_block), num_sink_blocks)
    if window_size is None:
        return HalfOpenRange(start, start)
    return HalfOpenRange(start, max(start, (history_length + 1 - window_size) // tokens_per_block))


class AttnLifeCycle(NamedTuple):
    """An attention layer group's life cycle: its sliding window (None for
    full attention) and its sink tokens in whole blocks."""

    window_size: int | None
    num_sink_blocks: int

    @staticmethod
    def make(window_size: int | None, num_sink_tokens: int | None, tokens_per_block: int) -> "AttnLifeCycle":
        """The life cycle of a layer with window_size and num_sink_tokens
        (rounded up to blocks of tokens_per_block); sink tokens need a
        window."""
        if tokens_per_block <= 0:
            raise InvalidArgumentError(f"tokens_per_block: {tokens_per_block} must be positive")
        if window_size is not None and window_size <= 0:
            raise InvalidArgumentError(f"window_size: {window_size} must be positive or None")
        if num_sink_tokens is not None and num_sink_tokens < 0:
            raise InvalidArgumentError(f"num_sink_tokens: {num_sink_tokens} must not be negative")
        if num_sink_tokens and window_size is None:
            raise InvalidArgumentError(f"num_sink_tokens: {num_sink_tokens} sink tokens need a window_size")
        return AttnLifeCycle(window_size, -(-(num_sink_tokens or 0) // tokens_per_block))

    def get_stale_range(self, history_length: int, tokens_per_block: int) -> HalfOpenRange:
        """See :func:`stale_range`."""
        return stale_range(self.window_size, self.num_sink_blocks, history_length, tokens_per_block)
