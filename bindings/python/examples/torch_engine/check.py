"""Exactness and time to first token of the example engine over kvcm.

Exactness: for requests that share a prefix, the first-token logits, every
decode step's logits and the greedy tokens with the prefix reused from the
GPU tier, from host and from disk (the default, lossless codec) must equal,
bit for bit, those of the same request computed without any cache (a fresh
salt). TTFT: a request whose 4k- or 16k-token prefix is cached on GPU, on
host, on disk, against computing it cold. Blocks are pushed to colder tiers
by filler traffic; the table shows where the reused tokens actually were.

    # CUDA (fp16, the 8-layer model, 4k and 16k prefixes):
    KVCM_LIBRARY=$PWD/build/gpu/lib/libkvcm.so KVCM_PYTHON_BACKEND=ctypes PYTHONPATH=bindings/python \\
        python3 bindings/python/examples/torch_engine/check.py --device cuda
    # CPU torch on the emulated device (float32, a tiny model, exactness only):
    PYTHONPATH=bindings/python python3 bindings/python/examples/torch_engine/check.py --device cpu

The exit status is non-zero when any check failed.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from engine import TINY, Engine, ModelConfig, kv_layers  # noqa: E402

import kvcm  # noqa: E402

LEVELS = ("gpu", "host", "disk")
failures = 0


def check(name: str, ok: bool, detail: str = "") -> None:
    global failures
    failures += not ok
    print(f"{'ok  ' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}", flush=True)


class Setup:
    """A manager with GPU, host and disk tiers sized in requests of
    ``request_tokens``, and the engine over it."""

    def __init__(self, args, cfg: ModelConfig, dtype: torch.dtype, request_tokens: int, disk_dir: str) -> None:
        self.itemsize = torch.empty((), dtype=dtype).element_size()
        self.token_bytes = cfg.layers * 2 * cfg.kv_heads * cfg.head_dim * self.itemsize
        req = (request_tokens + args.tpb) * self.token_bytes
        self.quota = [args.gpu_requests * req, args.host_requests * req, args.disk_requests * req]
        config = kvcm.KVCacheManagerConfig(
            tokens_per_block=args.tpb,
            cache_tiers=[kvcm.GpuCacheTierConfig(self.quota[0]), kvcm.HostCacheTierConfig(self.quota[1]),
                         kvcm.DiskCacheTierConfig(self.quota[2], disk_dir)],
            layers=kv_layers(cfg, args.tpb, self.itemsize),
            enable_partial_reuse=False)
        self.m = kvcm.KVCacheManager(config, device="cuda" if args.device == "cuda" else "emu")
        self.eng = Engine(self.m, cfg, args.device, dtype, args.chunk, max_tokens=request_tokens + args.tpb)
        self.request_tokens = request_tokens
        self.fills = 0
        self.rng = random.Random(cfg.seed)

    def tokens(self, n: int, first: int | None = None) -> list[int]:
        out = [self.rng.randrange(self.eng.cfg.vocab) for _ in range(n)]
        if first is not None and out:
            out[0] = first
        return out

    def push_below(self, level: int) -> None:
        """Filler traffic of twice the quotas above ``level``: the least recently
        used blocks (the shared prefix) move down to ``level``."""
        nbytes = 2 * sum(self.quota[:level])
        per = self.request_tokens * self.token_bytes
        for _ in range(math.ceil(nbytes / per)):
            self.fills += 1
            self.eng.fill(self.tokens(self.request_tokens), salt=f"fill-{self.fills}".encode())

    def close(self) -> None:
        self.eng.close()
        self.m.close()


def coldest(levels: list[int]) -> str:
    nz = [i for i, n in enumerate(levels) if n]
    return LEVELS[max(nz)] if nz else "-"


def exactness(args, cfg: ModelConfig, dtype: torch.dtype) -> None:
    prefix_len = args.exact_prefix
    suffix_len, steps = args.chunk + 5, 8
    with tempfile.TemporaryDirectory(prefix="kvcm-torch-engine-") as disk:
        s = Setup(args, cfg, dtype, prefix_len + suffix_len + steps, disk)
        try:
            prefix = s.tokens(prefix_len)
            s.eng.generate(prefix + s.tokens(suffix_len, first=0), 1)  # the prefix is cached from here on
            for level, name in enumerate(LEVELS):
                prompt = prefix + s.tokens(suffix_len, first=level + 1)
                ref = s.eng.generate(prompt, steps, salt=f"ref-{name}".encode())
                check(f"reference from {name}: computed without cache", ref.reused == 0, f"reused {ref.reused}")
                s.push_below(level)
                got = s.eng.generate(prompt, steps)
                check(f"reuse from {name}: the shared prefix is reused", got.reused == prefix_len,
                      f"reused {got.reused} of {prefix_len}, by level {got.levels}")
                check(f"reuse from {name}: the reused blocks were on {name}", coldest(got.levels) == name,
                      f"by level {got.levels}")
                diff = (got.prompt_logits - ref.prompt_logits).abs().max().item()
                check(f"reuse from {name}: first-token logits bitwise equal",
                      torch.equal(got.prompt_logits, ref.prompt_logits), f"max |diff| {diff:.3g}")
                steps_equal = len(got.step_logits) == len(ref.step_logits) and all(
                    torch.equal(a, b) for a, b in zip(got.step_logits, ref.step_logits))
                step_diff = max(((a - b).abs().max().item() for a, b in zip(got.step_logits, ref.step_logits)), default=0.0)
                check(f"reuse from {name}: {len(ref.step_logits)} decode steps' logits bitwise equal", steps_equal,
                      f"max |diff| {step_diff:.3g}")
                check(f"reuse from {name}: greedy tokens equal", got.tokens == ref.tokens,
                      f"{got.tokens} vs {ref.tokens}")
        finally:
            s.close()


def pcie_rate() -> float:
    """Host-to-device GB/s of a pinned 256 MiB copy (the median of 5)."""
    src = torch.empty(256 << 20, dtype=torch.uint8, pin_memory=True)
    dst = torch.empty_like(src, device="cuda")
    times = []
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        dst.copy_(src, non_blocking=True)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    return src.numel() / sorted(times)[2] / 1e9


def ttft(args, cfg: ModelConfig, dtype: torch.dtype) -> None:
    suffix_len = 64
    rate = pcie_rate() if args.device == "cuda" else float("nan")
    rows = []
    for prefix_len in args.prefixes:
        with tempfile.TemporaryDirectory(prefix="kvcm-torch-engine-") as disk:
            s = Setup(args, cfg, dtype, prefix_len + suffix_len, disk)
            try:
                s.eng.generate(s.tokens(2 * args.chunk), 1, salt=b"warm-up")  # kernels, allocator
                prefix = s.tokens(prefix_len)
                cold = s.eng.generate(prefix + s.tokens(suffix_len, first=0), 1, salt=b"cold")
                rows.append((prefix_len, "cold", cold, None))
                s.eng.generate(prefix + s.tokens(suffix_len, first=1), 1)  # caches the prefix
                gpu_ttft = None
                for level, name in enumerate(LEVELS):
                    s.push_below(level)
                    r = s.eng.generate(prefix + s.tokens(suffix_len, first=2 + level), 1)
                    check(f"{prefix_len} tokens from {name}: prefix reused", r.reused == prefix_len,
                          f"reused {r.reused}, by level {r.levels}")
                    if level == 0:
                        gpu_ttft = r.ttft
                    rows.append((prefix_len, name, r, gpu_ttft))
                bytes_per_token = s.token_bytes
            finally:
                s.close()
        print(flush=True)
    print(f"model: {cfg.layers} layers, dim {cfg.dim}, {cfg.heads} heads / {cfg.kv_heads} KV heads, "
          f"window {cfg.window} on layers {list(cfg.window_layers)}; {dtype}; tokens_per_block {args.tpb}, "
          f"chunk {args.chunk}; KV {bytes_per_token} bytes per token; H2D pinned copy {rate:.1f} GB/s")
    print(f"{'prefix':>7} {'source':>6} {'TTFT ms':>9} {'vs cold':>8} {'reused':>7} {'by level (gpu/host/disk)':>26}"
          f" {'KV MB':>7} {'extra ms':>9} {'at H2D ms':>10}")
    cold_of = {}
    for prefix_len, name, r, gpu_ttft in rows:
        if name == "cold":
            cold_of[prefix_len] = r.ttft
        mb = r.reused * bytes_per_token / 1e6
        extra = "" if gpu_ttft is None or name == "gpu" else f"{(r.ttft - gpu_ttft) * 1e3:9.1f}"
        at_rate = "" if name in ("cold", "gpu") else f"{mb / 1e3 / rate * 1e3:10.1f}"
        print(f"{prefix_len:>7} {name:>6} {r.ttft * 1e3:9.1f} {cold_of[prefix_len] / r.ttft:7.1f}x {r.reused:>7}"
              f" {'/'.join(map(str, r.levels)):>26} {mb:7.1f} {extra:>9} {at_rate:>10}")
    print("KV MB: reused tokens x bytes per token of every layer (the window layers onboard less); extra ms: TTFT "
          "over the GPU-cached one; at H2D ms: KV MB at the measured pinned copy rate.")


def main() -> int:
    # cuBLAS's deterministic mode needs its workspace fixed before its first call.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--what", default=None, help="exact,ttft (default: both on cuda, exact on cpu)")
    p.add_argument("--prefixes", default="4096,16384", help="TTFT prefix lengths")
    p.add_argument("--tpb", type=int, default=None, help="tokens per block (default 32 on cuda, 16 on cpu)")
    p.add_argument("--chunk", type=int, default=None, help="prefill chunk (default 512 on cuda, 32 on cpu)")
    p.add_argument("--exact-prefix", type=int, default=None, help="shared prefix of the exactness check")
    p.add_argument("--gpu-requests", type=int, default=3, help="GPU quota in requests")
    p.add_argument("--host-requests", type=int, default=8, help="host quota in requests")
    p.add_argument("--disk-requests", type=int, default=64, help="disk quota in requests")
    args = p.parse_args()
    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        print("no CUDA device")
        return 1
    args.tpb = args.tpb or (32 if cuda else 16)
    args.chunk = args.chunk or (512 if cuda else 32)
    args.exact_prefix = args.exact_prefix or 4 * args.chunk
    args.prefixes = [int(x) for x in args.prefixes.split(",") if x]
    what = set((args.what or ("exact,ttft" if cuda else "exact")).split(","))
    cfg, dtype = (ModelConfig(), torch.float16) if cuda else (TINY, torch.float32)
    print(f"kvcm {kvcm.version()} on {args.device}, torch {torch.__version__}", flush=True)
    if "exact" in what:
        # Bitwise equality compares kvcm's bytes, not cuBLAS's choice of
        # reduction order: with torch's nondeterministic kernels a decode step
        # differed by up to 3e-3 between two identical runs on the H200.
        torch.use_deterministic_algorithms(True)
        exactness(args, cfg, dtype)
        torch.use_deterministic_algorithms(False)
    if "ttft" in what:
        ttft(args, cfg, dtype)
    check("every handle released", kvcm.live_handle_count() == 0, str(kvcm.live_handle_count()))
    print(f"{failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
