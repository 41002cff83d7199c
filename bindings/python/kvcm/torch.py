"""PyTorch interop: kvcm's hot pools as torch tensors without a copy, page
indices as int32 tensors, torch streams as the streams of caches.

``import kvcm.torch`` imports torch (``import kvcm`` never does)::

    import torch, kvcm, kvcm.torch as kt

    m = kvcm.KVCacheManager(config, device="cuda")
    k_pool = kt.pool_tensor(m, layer, "key", torch.float16, (n_kv_heads, head_dim))
    # k_pool: (num_pages, tokens_per_page, n_kv_heads, head_dim) on the GPU,
    # the pool's own memory.
    cache.resume(torch.cuda.current_stream())      # any torch.cuda.Stream
    pages = kt.page_indices(m, cache, layer, "key")  # int32 on the pool's device
    k = k_pool[pages]                                # the cache's pages, by index

Tensors over pools are valid while the manager is open and its GPU level
is not resized (resizing moves the pools). The emulated device's memory is
not host-visible, so :func:`pool_tensor` needs a CUDA manager; with an
emulated one, copy pages through host-mapped memory (see
``bindings/python/examples/torch_engine``).

Streams: every kvcm call that takes a stream (``resume``, the
``cuda_stream`` setter) accepts a ``torch.cuda.Stream`` (or anything with a
``cuda_stream`` handle); kvcm orders its page copies after the work already
on it, and torch work enqueued on it afterwards sees the pages.
"""

from __future__ import annotations

from typing import Any

import torch

from . import manager as _manager
from ._torch_layout import PoolLayout, PoolMemory, kernel_page_indices, pool_layout

__all__ = ["PoolLayout", "pool_layout", "kernel_page_indices", "pool_tensor", "page_indices", "base_page_indices_view", "current_stream"]


def pool_tensor(manager: Any, layer_id: int, role: str, dtype: torch.dtype, token_shape: Any) -> torch.Tensor:
    """The GPU pool of (layer_id, role) as a tensor of ``dtype`` over the
    pool's memory (no copy), shaped ``(num_pages, tokens_per_page,
    *token_shape)`` and indexed by :func:`page_indices`. Writing into it
    writes the pages. Raises TypeError for a manager not on CUDA, and
    ValueError (naming ``token_shape``) when the buffer's pages are not
    tokens of that shape and dtype."""
    if manager.device_kind != _manager.DeviceKind.CUDA:
        raise TypeError(f"manager: pools are device memory of {manager.device_kind.name}, not CUDA; "
                        "the emulated device's memory is not host-visible")
    itemsize = torch.empty((), dtype=dtype).element_size()
    layout = pool_layout(manager, layer_id, role, token_shape, itemsize)
    raw = torch.as_tensor(PoolMemory(manager, layout), device=f"cuda:{torch.cuda.current_device()}")
    return raw.view(dtype).view(layout.shape)


def page_indices(manager: Any, cache: Any, layer_id: int, role: str, device: Any = None) -> torch.Tensor:
    """The kernel page indices of (layer_id, role) of an ACTIVE cache as an
    int32 tensor on ``device`` (default: CUDA for a CUDA manager, else the
    CPU); -1 where a block has no page. A snapshot: fetch again after
    resume, resize or commit."""
    if device is None:
        device = "cuda" if manager.device_kind == _manager.DeviceKind.CUDA else "cpu"
    idx = kernel_page_indices(manager, cache, layer_id, role)
    return torch.tensor(idx, dtype=torch.int32, device=device)


def base_page_indices_view(cache: Any, layer_group_id: int, beam_id: int = 0) -> torch.Tensor:
    """A CPU int32 tensor over the cache's own base page index buffer
    (``get_base_page_indices``; no copy): the cache updates it in place after
    every call that changes its pages while its length stays; it is let go at
    suspend. Read-only by contract."""
    buf = cache.get_base_page_indices(layer_group_id, beam_id)
    if len(buf) == 0:
        return torch.empty(0, dtype=torch.int32)
    return torch.frombuffer(buf, dtype=torch.int32)


def current_stream() -> torch.cuda.Stream:
    """torch's current CUDA stream, to resume caches on (kvcm accepts it as
    is)."""
    return torch.cuda.current_stream()
