"""What the example engine's backends share, without torch or numpy: the
model's shape, the manager's layers for it, and the serving loop over one
kvcm manager (reuse, chunked prefill on a fixed grid, greedy decode, commit
of every chunk and token).

A backend (engine.py: PyTorch; numpy_engine.py: numpy on the emulated
device) subclasses :class:`EngineBase` with the forward pass and the way it
reaches kvcm's pages.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import kvcm


@dataclass(frozen=True)
class ModelConfig:
    vocab: int = 4096
    dim: int = 512
    layers: int = 8
    heads: int = 8
    kv_heads: int = 2
    ffn: int = 1536
    window: int = 1024  # of the sliding-window layers
    window_layers: tuple[int, ...] = (2, 5)
    rope_theta: float = 10000.0
    eps: float = 1e-5
    seed: int = 1234

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads


TINY = ModelConfig(vocab=256, dim=64, layers=8, heads=4, kv_heads=2, ffn=128, window=64)


def kv_layers(cfg: ModelConfig, tokens_per_block: int, itemsize: int) -> list[kvcm.AttentionLayerConfig]:
    """The manager's layers for the model: a key and a value buffer each."""
    size = tokens_per_block * cfg.kv_heads * cfg.head_dim * itemsize
    return [kvcm.AttentionLayerConfig(i, [kvcm.BufferConfig("key", size), kvcm.BufferConfig("value", size)],
                                      sliding_window_size=cfg.window if i in cfg.window_layers else None)
            for i in range(cfg.layers)]


@dataclass
class Result:
    reused: int  # prompt tokens reused from the cache
    levels: list[int]  # the reused tokens per cache level (where they were when the request came)
    prompt_logits: Any  # logits of the last prompt token (a float32 numpy array)
    tokens: list[int] = field(default_factory=list)  # greedy tokens
    step_logits: list[Any] = field(default_factory=list)  # logits of each decode step (numpy)
    ttft: float = 0.0  # seconds from create_kv_cache to the first token's logits


class StagedBytes:
    """Pages reached through a host-mapped staging buffer and batch copies on
    the cache's stream: the emulated device's memory is not host-visible (any
    device works this way). Moves the bytes of token ranges of one buffer."""

    def __init__(self, m: kvcm.KVCacheManager, cfg: ModelConfig, token_bytes: int, max_tokens: int,
                 ranges: int = 1) -> None:
        """Staging for ``ranges`` token ranges of up to ``max_tokens`` tokens
        in one :meth:`transfer`."""
        self.tok = token_bytes
        self.locs = {(lid, role): m.get_buffer_location(lid, role)
                     for lid in range(cfg.layers) for role in ("key", "value")}
        self.tpb = m.tokens_per_block
        self.staging = m.alloc_memory(ranges * max_tokens * token_bytes, kvcm.MemoryKind.HOST_MAPPED)
        self.max_tokens, self.ranges = max_tokens, ranges

    def begin(self, cache: kvcm._KVCache) -> None:
        self.stream = cache.cuda_stream
        self.base = {lg: list(cache.get_page_indices(lg)) for lg in {loc.layer_group for loc in self.locs.values()}}

    def _runs(self, key, beg: int, end: int, at: int):
        """(device address, staging offset, bytes) per block of [beg, end),
        staged from offset ``at``."""
        if end - beg > self.max_tokens:
            raise ValueError(f"[{beg}, {end}): more than the staging buffer's {self.max_tokens} tokens")
        loc = self.locs[key]
        base = self.base[loc.layer_group]
        pos = beg
        while pos < end:
            b, off = divmod(pos, self.tpb)
            n = min(end, (b + 1) * self.tpb) - pos
            if base[b] < 0:
                raise RuntimeError(f"layer {key[0]} {key[1]}: block {b} has no GPU page")
            yield loc.page_address(base[b]) + off * self.tok, at + (pos - beg) * self.tok, n * self.tok
            pos += n

    def transfer(self, writes: list, reads: list) -> list[bytearray]:
        """Writes ``(key, beg, end, data)`` into the pages, then reads ``(key,
        beg, end)`` back, in stream order: two batch copies and one
        synchronize (a read sees the writes before it)."""
        if len(writes) + len(reads) > self.ranges:
            raise ValueError(f"{len(writes)} writes and {len(reads)} reads: staging holds {self.ranges} ranges")
        span = self.max_tokens * self.tok
        descs = []
        for i, (key, beg, end, data) in enumerate(writes):
            self.staging.write(i * span, data)
            descs += [(dev, self.staging.ptr + s, n) for dev, s, n in self._runs(key, beg, end, i * span)]
        if descs:
            self.stream.batch_copy(descs)
        descs, spans = [], []
        for j, (key, beg, end) in enumerate(reads, start=len(writes)):
            descs += [(self.staging.ptr + s, dev, n) for dev, s, n in self._runs(key, beg, end, j * span)]
            spans.append((j * span, (end - beg) * self.tok))
        if descs:
            self.stream.batch_copy(descs)
        self.stream.synchronize()
        return [bytearray(self.staging.read(at, n)) for at, n in spans]

    def write_bytes(self, key, beg: int, end: int, data: bytes) -> None:
        self.transfer([(key, beg, end, data)], [])

    def read_bytes(self, key, beg: int, end: int) -> bytearray:
        return self.transfer([], [(key, beg, end)])[0]

    def close(self) -> None:
        self.staging.close()


class EngineBase:
    """Batch-1 inference over one kvcm manager. A backend sets ``pages`` (with
    ``begin(cache)`` and ``close()``) and ``stream`` (what caches resume on),
    and implements :meth:`forward`, :meth:`sync` and :meth:`to_host`."""

    def __init__(self, m: kvcm.KVCacheManager, cfg: ModelConfig, chunk: int) -> None:
        if chunk % m.tokens_per_block:
            raise ValueError(f"chunk: {chunk} is not a multiple of tokens_per_block {m.tokens_per_block}")
        self.m, self.cfg, self.chunk = m, cfg, chunk
        self.pages: Any = None
        self.stream: Any = None

    def forward(self, tokens: list[int], beg: int) -> Any:
        """Positions [beg, beg + len(tokens)) of the cache begun in pages: writes
        their K/V, returns the last position's logits."""
        raise NotImplementedError

    def sync(self) -> None:
        """Waits for the device's work (for timing)."""

    def to_host(self, logits: Any) -> Any:
        """The logits as a float32 numpy array."""
        raise NotImplementedError

    def close(self) -> None:
        self.pages.close()

    def _resume(self, cache: kvcm._KVCache) -> None:
        if not cache.resume(self.stream):
            raise RuntimeError("resume refused: the GPU tier cannot take the request")

    @staticmethod
    def _resize(cache: kvcm._KVCache, capacity: int, history: int | None = None) -> None:
        if not cache.resize(capacity, history):
            raise RuntimeError(f"resize({capacity}, {history}) refused: the GPU tier is out of pages")

    def generate(self, prompt: list[int], max_new: int, salt: bytes | None = None) -> Result:
        """Serve one request: reuse the cached prefix (none under a fresh
        ``salt``), prefill the rest in grid-aligned chunks, decode greedily."""
        self.sync()
        t0 = time.perf_counter()
        cache = self.m.create_kv_cache(None, prompt, salt=salt)
        try:
            reused = cache.num_committed_tokens
            levels = cache.cached_tokens_by_level
            self._resume(cache)
            n = len(prompt)
            cap = n + max_new
            self._resize(cache, cap)
            self.pages.begin(cache)
            pos, logits = reused, None
            while pos < n:
                end = min(n, (pos // self.chunk + 1) * self.chunk)
                logits = self.forward(prompt[pos:end], pos)
                self._resize(cache, cap, end)
                cache.commit(prompt[pos:end])
                self.pages.begin(cache)
                pos = end
            if logits is None:
                raise ValueError("prompt: every token was reused; nothing to compute the first token from")
            self.sync()
            host = self.to_host(logits)
            res = Result(reused, levels, host, ttft=time.perf_counter() - t0)
            tok = int(host.argmax())
            for step in range(max_new):
                res.tokens.append(tok)
                if step == max_new - 1:
                    break
                logits = self.forward([tok], n + step)
                self._resize(cache, cap, n + step + 1)
                cache.commit([tok])
                self.pages.begin(cache)
                host = self.to_host(logits)
                res.step_logits.append(host)
                tok = int(host.argmax())
            return res
        finally:
            cache.close()

    def fill(self, tokens: list[int], salt: bytes) -> None:
        """Commit a request's blocks without computing them (their pages hold
        whatever was there): traffic that pushes other blocks to colder
        levels. Its salt keeps them from ever being reused."""
        cache = self.m.create_kv_cache(None, tokens, salt=salt)
        try:
            self._resume(cache)
            n = len(tokens)
            self._resize(cache, n)
            for beg in range(0, n, self.chunk):
                end = min(n, beg + self.chunk)
                self._resize(cache, n, end)
                cache.commit(tokens[beg:end])
        finally:
            cache.close()
