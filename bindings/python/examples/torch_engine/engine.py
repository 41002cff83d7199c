"""A small Llama-shaped decoder whose KV cache is kvcm's.

RMSNorm, rotary position embeddings, grouped-query attention, SwiGLU MLPs,
random weights from a fixed seed, some layers with a sliding window. Each
layer's K and V live in kvcm's pools (buffers "key" and "value", one token
a (num_kv_heads, head_dim) slice); attention writes the chunk's K/V into its
pages, gathers the context's K/V back from the pages by page index and runs
scaled-dot-product attention over them. Prefill is chunked on a fixed grid
(chunk boundaries at multiples of ``chunk``), so a request that reuses a
cached prefix ending on the grid computes the remaining chunks exactly as a
request without cache does.

Two ways to reach the pages: on CUDA, the pools are torch tensors over the
pool memory (``kvcm.torch.pool_tensor``), indexed by page index; on the
emulated device (CPU torch), whose memory is not host-visible, pages are
batch-copied to and from a host-mapped staging buffer on the cache's stream.

The model's shape and the serving loop are driver.py's (shared with the
numpy backend, numpy_engine.py).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from driver import TINY, EngineBase, ModelConfig, Result, StagedBytes, kv_layers

import kvcm

__all__ = ["TINY", "Engine", "ModelConfig", "Result", "kv_layers"]


class Weights:
    def __init__(self, cfg: ModelConfig, device: torch.device, dtype: torch.dtype) -> None:
        g = torch.Generator().manual_seed(cfg.seed)

        def w(*shape: int, scale: float | None = None) -> torch.Tensor:
            s = scale if scale is not None else 1.0 / math.sqrt(shape[0])
            return (torch.randn(*shape, generator=g) * s).to(device=device, dtype=dtype)

        d, hd = cfg.dim, cfg.head_dim
        self.emb = w(cfg.vocab, d, scale=1.0)
        self.layers = []
        for _ in range(cfg.layers):
            self.layers.append(dict(
                attn_norm=torch.ones(d, device=device, dtype=dtype),
                wq=w(d, cfg.heads * hd), wk=w(d, cfg.kv_heads * hd), wv=w(d, cfg.kv_heads * hd),
                wo=w(cfg.heads * hd, d),
                mlp_norm=torch.ones(d, device=device, dtype=dtype),
                w1=w(d, cfg.ffn), w3=w(d, cfg.ffn), w2=w(cfg.ffn, d)))
        self.norm = torch.ones(d, device=device, dtype=dtype)
        self.out = w(d, cfg.vocab)
        inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
        self.inv_freq = inv.to(device)


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def rope(x: torch.Tensor, pos: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """x: (T, heads, head_dim), rotated by position (half-split rotation)."""
    ang = pos.to(torch.float64)[:, None] * inv_freq[None, :]
    cos, sin = ang.cos().to(torch.float32)[:, None, :], ang.sin().to(torch.float32)[:, None, :]
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).to(x.dtype)


class CudaPages:
    """Pages as torch tensors over kvcm's GPU pools (no copy)."""

    def __init__(self, m: kvcm.KVCacheManager, cfg: ModelConfig, dtype: torch.dtype) -> None:
        import kvcm.torch as kt

        self.kt = kt
        self.m = m
        self.dtype = dtype
        self.shape = (cfg.kv_heads, cfg.head_dim)
        self.keys = [(lid, role) for lid in range(cfg.layers) for role in ("key", "value")]
        self.pools: dict = {}

    def begin(self, cache: kvcm._KVCache) -> None:
        """Fetch the pools and the cache's page indices (after resume, resize
        or commit). The pool tensors are made again each time (a few calls):
        they stay right should the manager ever move its pools."""
        self.pools = {key: self.kt.pool_tensor(self.m, *key, self.dtype, self.shape) for key in self.keys}
        self.host_idx = {key: self.kt.kernel_page_indices(self.m, cache, *key) for key in self.pools}
        self.idx = {key: torch.tensor(v, dtype=torch.long, device="cuda") for key, v in self.host_idx.items()}

    def _slots(self, key, beg: int, end: int):
        tpp = self.pools[key].shape[1]
        if min(self.host_idx[key][beg // tpp:(end - 1) // tpp + 1]) < 0:
            raise RuntimeError(f"layer {key[0]} {key[1]}: a page of [{beg}, {end}) is not on the GPU")
        pos = torch.arange(beg, end, device=self.idx[key].device)
        return self.idx[key][pos // tpp], pos % tpp

    def write(self, key, beg: int, end: int, x: torch.Tensor) -> None:
        page, off = self._slots(key, beg, end)
        self.pools[key][page, off] = x

    def read(self, key, beg: int, end: int) -> torch.Tensor:
        page, off = self._slots(key, beg, end)
        return self.pools[key][page, off]

    def close(self) -> None:
        self.pools.clear()


class StagedPages(StagedBytes):
    """Pages reached through a host-mapped staging buffer and batch copies
    on the cache's stream (the emulated device; any device works)."""

    def __init__(self, m: kvcm.KVCacheManager, cfg: ModelConfig, dtype: torch.dtype, max_tokens: int) -> None:
        self.dtype = dtype
        self.tok_shape = (cfg.kv_heads, cfg.head_dim)
        super().__init__(m, cfg, cfg.kv_heads * cfg.head_dim * torch.empty((), dtype=dtype).element_size(), max_tokens)

    def write(self, key, beg: int, end: int, x: torch.Tensor) -> None:
        data = x.detach().to("cpu", self.dtype).contiguous().view(torch.uint8).numpy().tobytes()
        self.write_bytes(key, beg, end, data)

    def read(self, key, beg: int, end: int) -> torch.Tensor:
        raw = self.read_bytes(key, beg, end)
        return torch.frombuffer(raw, dtype=self.dtype).view(end - beg, *self.tok_shape)


class Engine(EngineBase):
    """Batch-1 inference over one kvcm manager, in PyTorch."""

    def __init__(self, m: kvcm.KVCacheManager, cfg: ModelConfig, device: str, dtype: torch.dtype,
                 chunk: int, max_tokens: int) -> None:
        super().__init__(m, cfg, chunk)
        self.device, self.dtype = torch.device(device), dtype
        self.w = Weights(cfg, self.device, dtype)
        self.cuda = self.device.type == "cuda"
        if self.cuda:
            self.pages = CudaPages(m, cfg, dtype)
            self.stream = torch.cuda.current_stream()
        else:
            self.pages = StagedPages(m, cfg, dtype, max_tokens)
            self.stream = m.create_stream()

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def to_host(self, logits: torch.Tensor):
        return logits.cpu().numpy()

    @torch.inference_mode()
    def forward(self, tokens: list[int], beg: int) -> torch.Tensor:
        """Positions [beg, beg + len(tokens)) of the cache begun in pages: writes
        their K/V, returns the last position's logits (float32)."""
        cfg, w = self.cfg, self.w
        end = beg + len(tokens)
        t = torch.tensor(tokens, device=self.device)
        pos = torch.arange(beg, end, device=self.device)
        x = w.emb[t]
        rep = cfg.heads // cfg.kv_heads
        for i, lw in enumerate(w.layers):
            h = rms_norm(x, lw["attn_norm"], cfg.eps)
            q = rope((h @ lw["wq"]).view(-1, cfg.heads, cfg.head_dim), pos, w.inv_freq)
            k = rope((h @ lw["wk"]).view(-1, cfg.kv_heads, cfg.head_dim), pos, w.inv_freq)
            v = (h @ lw["wv"]).view(-1, cfg.kv_heads, cfg.head_dim)
            self.pages.write((i, "key"), beg, end, k)
            self.pages.write((i, "value"), beg, end, v)
            window = cfg.window if i in cfg.window_layers else None
            ctx = 0 if window is None else max(0, beg - window + 1)
            kc = self.pages.read((i, "key"), ctx, end).to(self.device)
            vc = self.pages.read((i, "value"), ctx, end).to(self.device)
            kpos = torch.arange(ctx, end, device=self.device)
            mask = kpos[None, :] <= pos[:, None]
            if window is not None:
                mask &= kpos[None, :] > pos[:, None] - window
            qh = q.transpose(0, 1)[None]  # (1, heads, T, hd)
            kh = kc.transpose(0, 1).repeat_interleave(rep, dim=0)[None]
            vh = vc.transpose(0, 1).repeat_interleave(rep, dim=0)[None]
            o = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask)
            x = x + o[0].transpose(0, 1).reshape(len(tokens), -1) @ lw["wo"]
            h = rms_norm(x, lw["mlp_norm"], cfg.eps)
            x = x + (F.silu(h @ lw["w1"]) * (h @ lw["w3"])) @ lw["w2"]
        return (rms_norm(x[-1:], w.norm, cfg.eps) @ w.out)[0].float()
