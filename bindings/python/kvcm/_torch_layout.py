"""The torch-free half of :mod:`kvcm.torch`: how a buffer's hot pool looks
as an array (shape, strides, ``__cuda_array_interface__``) and the kernel
page indices of a cache, computed from the manager's layout queries only.
It never imports torch, so it is tested where torch is absent."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

from .common import PageIndexMode

__all__ = ["PoolLayout", "pool_layout", "PoolMemory", "kernel_page_indices"]


@dataclass(frozen=True, slots=True)
class PoolLayout:
    """A (layer, role) buffer's GPU pool seen as an array of its pages:
    ``shape`` is ``(num_pages, tokens_per_page, *token_shape)``, C-contiguous
    (page ``i`` starts ``page_bytes * i`` bytes after ``base``); indexed by
    the kernel page indices of :func:`kernel_page_indices`. Pages of other
    layers that share the pool lie in between: the array covers them, the
    indices never select them."""

    base: int
    num_pages: int
    page_bytes: int
    tokens_per_page: int
    token_shape: tuple[int, ...]
    itemsize: int

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.num_pages, self.tokens_per_page, *self.token_shape)

    @property
    def strides(self) -> tuple[int, ...]:
        """Byte strides of :attr:`shape` (C order)."""
        out = [self.itemsize]
        for n in reversed(self.shape[1:]):
            out.append(out[-1] * n)
        return tuple(reversed(out))

    @property
    def nbytes(self) -> int:
        return self.num_pages * self.page_bytes

    def cuda_array_interface(self, typestr: str = "|u1") -> dict[str, Any]:
        """The ``__cuda_array_interface__`` (version 3) of the pool's bytes.
        ``typestr`` ``"|u1"`` (the default) describes it as
        ``(num_pages, page_bytes)`` bytes, which any dtype can view (torch
        has no typestr for bfloat16); any other typestr must have
        :attr:`itemsize` bytes and describes it as :attr:`shape`. ``stream``
        is None: the consumer orders its own work (kvcm orders its copies
        against the stream a cache was resumed on)."""
        if typestr == "|u1":
            shape: tuple[int, ...] = (self.num_pages, self.page_bytes)
        else:
            if int(typestr[2:]) != self.itemsize:
                raise ValueError(f"typestr: {typestr!r} is not {self.itemsize} bytes per element")
            shape = self.shape
        return {"shape": shape, "typestr": typestr, "data": (self.base, False), "strides": None,
                "version": 3, "stream": None}


def pool_layout(manager: Any, layer_id: int, role: str, token_shape: Sequence[int], itemsize: int) -> PoolLayout:
    """The pool layout of (layer_id, role) for tokens of ``token_shape``
    elements of ``itemsize`` bytes (for K or V, ``(num_kv_heads,
    head_dim)``). Raises ValueError naming ``token_shape`` when a page is not
    ``tokens_per_page`` such tokens, and InvalidArgumentError with SWA scratch
    reuse (its scratch blocks need PER_LAYER indices; not supported here)."""
    token_shape = tuple(int(n) for n in token_shape)
    if itemsize <= 0 or any(n <= 0 for n in token_shape):
        raise ValueError(f"token_shape {token_shape} and itemsize {itemsize} must be positive")
    conv = manager.get_page_index_converter(layer_id, role)
    tpb = manager.tokens_per_block
    if tpb % conv.expansion:
        raise ValueError(f"layer {layer_id} role {role!r}: expansion {conv.expansion} does not divide {tpb}")
    tokens_per_page = tpb // conv.expansion
    page_bytes = manager.get_page_stride(layer_id, role)
    want = tokens_per_page * math.prod(token_shape) * itemsize
    if want != page_bytes:
        raise ValueError(f"token_shape: {tokens_per_page} tokens of {token_shape} x {itemsize} bytes are {want} "
                         f"bytes, a page of layer {layer_id} role {role!r} is {page_bytes}")
    base = manager.get_mem_pool_base_address(layer_id, role, PageIndexMode.SHARED)
    return PoolLayout(base, manager.get_page_index_upper_bound(layer_id, role), page_bytes, tokens_per_page,
                      token_shape, itemsize)


class PoolMemory:
    """An object exposing a pool through ``__cuda_array_interface__`` (as
    bytes, see :meth:`PoolLayout.cuda_array_interface`); it keeps the manager
    referenced, so the pool outlives the arrays made from it as long as they
    keep it (torch's ``as_tensor`` does). Valid until the manager closes or
    the GPU level is resized."""

    def __init__(self, manager: Any, layout: PoolLayout) -> None:
        self.manager = manager
        self.layout = layout

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return self.layout.cuda_array_interface()


def kernel_page_indices(manager: Any, cache: Any, layer_id: int, role: str) -> list[int]:
    """The kernel page index of every page of (layer_id, role) of an ACTIVE
    cache (-1 where a block has no page): the cache's base page indices of
    the layer's group through the buffer's converter, SHARED mode, for
    :class:`PoolLayout` arrays."""
    lg = manager.get_layer_group_id(layer_id)
    conv = manager.get_page_index_converter(layer_id, role)
    return conv(list(cache.get_base_page_indices(lg)), PageIndexMode.SHARED)
