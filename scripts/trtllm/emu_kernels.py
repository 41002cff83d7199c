"""The test harness's kernels (TensorRT-LLM's ``kernels.py`` runs CUDA
kernels) on kvcm's emulated device, whose memory the host cannot address:
``fill_values`` writes a value per token with a copy from the host on the
cache's stream, ``check_values`` copies the bytes back to host-mapped
memory and compares. The value of a token depends on the layer, buffer,
beam and token, as with TensorRT-LLM's kernels.

scripts/trtllm/run-tests.sh puts this file in place of ``kernels.py``."""

from __future__ import annotations

import contextlib
import functools
import threading
import weakref
import zlib
from typing import Any, Iterator, Sequence

from tensorrt_llm.runtime.kv_cache_manager_v2 import newest_manager
from tensorrt_llm.runtime.kv_cache_manager_v2._utils import streams


def _stream(handle: Any) -> Any:
    s = streams.get(int(handle))
    if s is None:
        raise RuntimeError(f"stream {handle!r} was not made by the test harness (_utils streams)")
    return s


# Per manager, the host-mapped buffer check_values copies pages into.
_staging: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()


def _host_buffer(size: int) -> Any:
    m = newest_manager()
    buf = _staging.get(m)
    if buf is None or buf.closed or buf.size < size:
        buf = _staging[m] = m.alloc_memory(max(size, 1 << 16))
    return buf


@functools.lru_cache(maxsize=1 << 16)
def _value(token_bytes: int, layer_id: int, buf_id: int, beam: int, token: Any) -> bytes:
    key = token if isinstance(token, bytes) else int(token).to_bytes(8, "little", signed=True)
    seed = zlib.crc32(key, zlib.crc32(bytes([layer_id & 0xFF, layer_id >> 8 & 0xFF, buf_id, beam])))
    word = seed.to_bytes(4, "little")
    return (word * (token_bytes // 4 + 1))[:token_bytes]


def _expected(token_bytes: int, layer_id: int, buf_id: int, beam: int, tokens: Sequence[Any]) -> bytes:
    return b"".join(_value(token_bytes, layer_id, buf_id, beam, t) for t in tokens)


def fill_values(addr: int, token_bytes: int, layer_id: int, buf_id: int, beam: int,
                tokens: Sequence[Any], stream: Any) -> None:
    if tokens:
        _stream(stream).copy_from_host(int(addr), _expected(token_bytes, layer_id, buf_id, beam, tokens))


def check_values(addr: int, token_bytes: int, layer_id: int, buf_id: int, beam: int,
                 tokens: Sequence[Any], stream: Any) -> None:
    if not tokens:
        return
    want = _expected(token_bytes, layer_id, buf_id, beam, tokens)
    s = _stream(stream)
    host = _host_buffer(len(want))
    s.batch_copy([(host.ptr, int(addr), len(want))])
    s.synchronize()
    got = host.read(0, len(want))
    if got != want:
        bad = next(i for i in range(len(want)) if got[i] != want[i]) // token_bytes
        raise AssertionError(f"layer {layer_id} buffer {buf_id} beam {beam}: token {bad} of {len(tokens)} "
                             f"at {addr:#x} holds other values than were written")


@contextlib.contextmanager
def enable_kernel_delay() -> Iterator[None]:
    """TensorRT-LLM's kernels can be slowed to widen races; these need not."""
    yield


class HostGate:
    """Holds a stream at a point until released from the host."""

    def __init__(self) -> None:
        self._open = threading.Event()

    def block_stream(self, stream: Any) -> None:
        _stream(stream).enqueue_host_func(lambda: self._open.wait())

    def release(self) -> None:
        self._open.set()

    def close(self) -> None:
        self._open.set()
