"""The example engine's model in numpy, on the emulated device: no torch, no
GPU (the CPU mode that make test runs).

The same decoder as engine.py, op for op: RMSNorm, rotary position
embeddings (half-split), grouped-query attention with a causal mask and
sliding-window layers, SwiGLU MLPs, random weights from a fixed seed (numpy's
generator: the logits are not torch's). Attention writes each chunk's K/V
into kvcm's pages and reads the context's K/V back from the pages by page
index, through a host-mapped staging buffer and batch copies on the cache's
stream (driver.StagedBytes: the emulated device's memory is not
host-visible). float32 throughout.
"""

from __future__ import annotations

import numpy as np
from driver import TINY, EngineBase, ModelConfig, Result, StagedBytes, kv_layers

import kvcm

__all__ = ["TINY", "Engine", "ModelConfig", "Result", "kv_layers"]

DTYPE = np.float32


class Weights:
    def __init__(self, cfg: ModelConfig) -> None:
        rng = np.random.default_rng(cfg.seed)

        def w(*shape: int, scale: float | None = None) -> np.ndarray:
            s = scale if scale is not None else 1.0 / np.sqrt(shape[0])
            return (rng.standard_normal(shape) * s).astype(DTYPE)

        d, hd = cfg.dim, cfg.head_dim
        self.emb = w(cfg.vocab, d, scale=1.0)
        self.layers = []
        for _ in range(cfg.layers):
            self.layers.append(dict(
                attn_norm=np.ones(d, DTYPE),
                wq=w(d, cfg.heads * hd), wk=w(d, cfg.kv_heads * hd), wv=w(d, cfg.kv_heads * hd),
                wo=w(cfg.heads * hd, d),
                mlp_norm=np.ones(d, DTYPE),
                w1=w(d, cfg.ffn), w3=w(d, cfg.ffn), w2=w(cfg.ffn, d)))
        self.norm = np.ones(d, DTYPE)
        self.out = w(d, cfg.vocab)
        self.inv_freq = 1.0 / (cfg.rope_theta ** (np.arange(0, hd, 2, dtype=np.float64) / hd))


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return (x * (1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps))).astype(DTYPE) * w


def rope(x: np.ndarray, pos: np.ndarray, inv_freq: np.ndarray) -> np.ndarray:
    """x: (T, heads, head_dim), rotated by position (half-split rotation)."""
    ang = pos.astype(np.float64)[:, None] * inv_freq[None, :]
    cos, sin = np.cos(ang).astype(DTYPE)[:, None, :], np.sin(ang).astype(DTYPE)[:, None, :]
    x1, x2 = np.split(x, 2, axis=-1)
    return np.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


class StagedPages(StagedBytes):
    """K/V token ranges of (num_kv_heads, head_dim) float32 through staging:
    one layer's chunk K and V written and its context K and V read back in
    one transfer."""

    def __init__(self, m: kvcm.KVCacheManager, cfg: ModelConfig, max_tokens: int) -> None:
        self.tok_shape = (cfg.kv_heads, cfg.head_dim)
        super().__init__(m, cfg, cfg.kv_heads * cfg.head_dim * np.dtype(DTYPE).itemsize, max_tokens, ranges=4)

    def write_read(self, layer: int, beg: int, end: int, k: np.ndarray, v: np.ndarray, ctx: int):
        """Writes k, v at [beg, end) of the layer's buffers, returns the K and V
        of [ctx, end)."""
        raw = self.transfer(
            [((layer, "key"), beg, end, np.ascontiguousarray(k, DTYPE).tobytes()),
             ((layer, "value"), beg, end, np.ascontiguousarray(v, DTYPE).tobytes())],
            [((layer, "key"), ctx, end), ((layer, "value"), ctx, end)])
        return [np.frombuffer(r, DTYPE).reshape(end - ctx, *self.tok_shape) for r in raw]


class Engine(EngineBase):
    """Batch-1 inference over one kvcm manager on the emulated device, in numpy."""

    def __init__(self, m: kvcm.KVCacheManager, cfg: ModelConfig, chunk: int, max_tokens: int) -> None:
        super().__init__(m, cfg, chunk)
        self.w = Weights(cfg)
        self.pages = StagedPages(m, cfg, max_tokens)
        self.stream = m.create_stream()

    def to_host(self, logits: np.ndarray) -> np.ndarray:
        return logits

    def forward(self, tokens: list[int], beg: int) -> np.ndarray:
        cfg, w = self.cfg, self.w
        n = len(tokens)
        end = beg + n
        pos = np.arange(beg, end)
        x = w.emb[np.asarray(tokens)]
        rep = cfg.heads // cfg.kv_heads
        scale = DTYPE(1.0 / np.sqrt(cfg.head_dim))
        for i, lw in enumerate(w.layers):
            h = rms_norm(x, lw["attn_norm"], cfg.eps)
            q = rope((h @ lw["wq"]).reshape(n, cfg.heads, cfg.head_dim), pos, w.inv_freq)
            k = rope((h @ lw["wk"]).reshape(n, cfg.kv_heads, cfg.head_dim), pos, w.inv_freq)
            v = (h @ lw["wv"]).reshape(n, cfg.kv_heads, cfg.head_dim)
            window = cfg.window if i in cfg.window_layers else None
            ctx = 0 if window is None else max(0, beg - window + 1)
            kc, vc = self.pages.write_read(i, beg, end, k, v, ctx)
            kpos = np.arange(ctx, end)
            mask = kpos[None, :] <= pos[:, None]
            if window is not None:
                mask &= kpos[None, :] > pos[:, None] - window
            qh = q.transpose(1, 0, 2)  # (heads, T, hd)
            kh = np.repeat(kc.transpose(1, 0, 2), rep, axis=0)  # (heads, ctx, hd)
            vh = np.repeat(vc.transpose(1, 0, 2), rep, axis=0)
            s = np.where(mask[None], (qh @ kh.transpose(0, 2, 1)) * scale, DTYPE(-np.inf))
            p = np.exp(s - s.max(axis=-1, keepdims=True))
            o = (p / p.sum(axis=-1, keepdims=True)) @ vh  # (heads, T, hd)
            x = x + o.transpose(1, 0, 2).reshape(n, -1) @ lw["wo"]
            h = rms_norm(x, lw["mlp_norm"], cfg.eps)
            x = x + (silu(h @ lw["w1"]) * (h @ lw["w3"])) @ lw["w2"]
        return (rms_norm(x[-1:], w.norm, cfg.eps) @ w.out)[0].astype(DTYPE)
