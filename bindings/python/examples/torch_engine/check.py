"""Exactness and time to first token of the example engine over kvcm.

Exactness, per cold-page codec: for requests that share a prefix, the
first-token logits, every decode step's logits and the greedy tokens with
the prefix reused from the GPU tier, from host and from disk must equal, bit
for bit, those of the same request computed without any cache (a fresh
salt), for the lossless codecs (default, gather, auto). For the FP8 codec,
whose host and disk pages are quantized, the logit error against the
uncached request is reported (max and mean |diff|, greedy tokens that
agree); from the GPU tier, where no codec ran, it must be exact too. On the
emulated device the gather and FP8 codecs must be refused (CUDA only).

TTFT: a request whose 4k- or 16k-token prefix is cached on GPU, on host, on
disk, against computing it cold; each cell measured --repeat times, the
median and the range printed. Blocks are pushed to colder tiers by filler
traffic; the table shows where the reused tokens actually were.

    # CUDA (PyTorch, fp16, the 8-layer model, 4k and 16k prefixes):
    KVCM_LIBRARY=$PWD/build/gpu/lib/libkvcm.so KVCM_PYTHON_BACKEND=ctypes PYTHONPATH=bindings/python \\
        python3 bindings/python/examples/torch_engine/check.py --device cuda
    # CPU torch on the emulated device (float32, a tiny model, exactness only):
    PYTHONPATH=bindings/python python3 bindings/python/examples/torch_engine/check.py --device cpu
    # numpy on the emulated device (no torch; what make test runs):
    PYTHONPATH=bindings/python python3 bindings/python/examples/torch_engine/check.py --backend numpy

The exit status is non-zero when any check failed.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import random
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
from driver import TINY, ModelConfig, kv_layers  # noqa: E402

import kvcm  # noqa: E402

LEVELS = ("gpu", "host", "disk")
LOSSLESS = ("default", "gather", "auto")
CUDA_ONLY = ("gather", "fp8")
failures = 0


def check(name: str, ok: bool, detail: str = "") -> None:
    global failures
    failures += not ok
    print(f"{'ok  ' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}", flush=True)


def info(name: str, detail: str) -> None:
    print(f"info {name}: {detail}", flush=True)


class Backend:
    """The engine's backend: torch (CUDA or CPU) or numpy (the emulated device)."""

    def __init__(self, args) -> None:
        self.name, self.cuda = args.backend, args.device == "cuda"
        if self.name == "torch":
            import torch
            import engine

            self.torch, self.mod = torch, engine
            self.dtype = torch.float16 if self.cuda else torch.float32
            self.itemsize = torch.empty((), dtype=self.dtype).element_size()
            self.element = str(self.dtype).rsplit(".", 1)[-1]
        else:
            import numpy_engine

            self.mod = numpy_engine
            self.dtype = numpy_engine.DTYPE
            self.itemsize = np.dtype(self.dtype).itemsize
            self.element = np.dtype(self.dtype).name
        self.device = "cuda" if self.cuda else "emu"

    def engine(self, m, cfg: ModelConfig, chunk: int, max_tokens: int):
        if self.name == "torch":
            return self.mod.Engine(m, cfg, "cuda" if self.cuda else "cpu", self.dtype, chunk, max_tokens=max_tokens)
        return self.mod.Engine(m, cfg, chunk, max_tokens=max_tokens)

    def deterministic(self, on: bool) -> None:
        # Bitwise equality compares kvcm's bytes, not cuBLAS's choice of
        # reduction order: with torch's nondeterministic kernels a decode step
        # differed by up to 3e-3 between two identical runs on the H200.
        if self.name == "torch":
            self.torch.use_deterministic_algorithms(on)


def make_codec(codec: str, be: Backend):
    """The cold_page_codec argument for a codec name."""
    if codec == "fp8":
        # A 32-bit model only meets the FP8 codec on the emulated device,
        # which refuses it before it reads an element.
        return kvcm.codec.Fp8(be.element if be.itemsize == 2 else "float16")
    return codec


class Setup:
    """A manager with GPU, host and disk tiers sized in requests of
    ``request_tokens``, with the named cold-page codec, and the engine over it."""

    def __init__(self, args, be: Backend, cfg: ModelConfig, request_tokens: int, disk_dir: str,
                 codec: str = "default") -> None:
        self.token_bytes = cfg.layers * 2 * cfg.kv_heads * cfg.head_dim * be.itemsize
        req = (request_tokens + args.tpb) * self.token_bytes
        self.quota = [args.gpu_requests * req, args.host_requests * req, args.disk_requests * req]
        config = kvcm.KVCacheManagerConfig(
            tokens_per_block=args.tpb,
            cache_tiers=[kvcm.GpuCacheTierConfig(self.quota[0]), kvcm.HostCacheTierConfig(self.quota[1]),
                         kvcm.DiskCacheTierConfig(self.quota[2], disk_dir)],
            layers=kv_layers(cfg, args.tpb, be.itemsize),
            enable_partial_reuse=False)
        self.m = kvcm.KVCacheManager(config, cold_page_codec=make_codec(codec, be), device=be.device)
        try:
            self.eng = be.engine(self.m, cfg, args.chunk, request_tokens + args.tpb)
        except BaseException:
            self.m.close()
            raise
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


def bitwise(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def exactness(args, be: Backend, cfg: ModelConfig, codec: str) -> None:
    prefix_len = args.exact_prefix
    suffix_len, steps = args.chunk + 5, 8
    tag = f"[{codec}]"
    with tempfile.TemporaryDirectory(prefix="kvcm-torch-engine-") as disk:
        if codec in CUDA_ONLY and not be.cuda:
            try:
                Setup(args, be, cfg, prefix_len + suffix_len + steps, disk, codec).close()
            except kvcm.CodecRejectedError as e:
                check(f"{tag} refused on the emulated device", "CUDA device only" in str(e), str(e))
            else:
                check(f"{tag} refused on the emulated device", False, "the manager was made")
            return
        s = Setup(args, be, cfg, prefix_len + suffix_len + steps, disk, codec)
        try:
            prefix = s.tokens(prefix_len)
            s.eng.generate(prefix + s.tokens(suffix_len, first=0), 1)  # the prefix is cached from here on
            for level, name in enumerate(LEVELS):
                prompt = prefix + s.tokens(suffix_len, first=level + 1)
                ref = s.eng.generate(prompt, steps, salt=f"ref-{name}".encode())
                check(f"{tag} reference from {name}: computed without cache", ref.reused == 0, f"reused {ref.reused}")
                s.push_below(level)
                got = s.eng.generate(prompt, steps)
                check(f"{tag} reuse from {name}: the shared prefix is reused", got.reused == prefix_len,
                      f"reused {got.reused} of {prefix_len}, by level {got.levels}")
                check(f"{tag} reuse from {name}: the reused blocks were on {name}", coldest(got.levels) == name,
                      f"by level {got.levels}")
                pairs = [(got.prompt_logits, ref.prompt_logits)] + list(zip(got.step_logits, ref.step_logits))
                diffs = [np.abs(a.astype(np.float64) - b.astype(np.float64)) for a, b in pairs]
                first_max, first_mean = diffs[0].max(), diffs[0].mean()
                step_max = max((d.max() for d in diffs[1:]), default=0.0)
                step_mean = float(np.mean([d.mean() for d in diffs[1:]])) if diffs[1:] else 0.0
                agree = sum(a == b for a, b in zip(got.tokens, ref.tokens))
                if codec in LOSSLESS or level == 0:
                    # Lossless codecs, and the GPU tier (no codec ran): bit for bit.
                    check(f"{tag} reuse from {name}: first-token logits bitwise equal",
                          bitwise(got.prompt_logits, ref.prompt_logits), f"max |diff| {first_max:.3g}")
                    steps_equal = len(got.step_logits) == len(ref.step_logits) and all(
                        bitwise(a, b) for a, b in zip(got.step_logits, ref.step_logits))
                    check(f"{tag} reuse from {name}: {len(ref.step_logits)} decode steps' logits bitwise equal",
                          steps_equal, f"max |diff| {step_max:.3g}")
                    check(f"{tag} reuse from {name}: greedy tokens equal", got.tokens == ref.tokens,
                          f"{got.tokens} vs {ref.tokens}")
                else:
                    scale = np.abs(ref.prompt_logits.astype(np.float64)).max()
                    info(f"{tag} reuse from {name}: logit error against no cache",
                         f"first token max |diff| {first_max:.3g}, mean {first_mean:.3g} (max |logit| {scale:.3g}); "
                         f"{len(ref.step_logits)} decode steps max {step_max:.3g}, mean {step_mean:.3g}; "
                         f"greedy tokens agree {agree}/{len(ref.tokens)}")
        finally:
            s.close()


def pcie_rate(be: Backend) -> float:
    """Host-to-device GB/s of a pinned 256 MiB copy (the median of 5)."""
    torch = be.torch
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


def ttft(args, be: Backend, cfg: ModelConfig, codec: str) -> None:
    suffix_len, n = 64, args.repeat
    rate = pcie_rate(be) if be.cuda else float("nan")
    rows = []  # (prefix_len, source, [ttft seconds], reused, levels of the last run)
    for prefix_len in args.prefixes:
        with tempfile.TemporaryDirectory(prefix="kvcm-torch-engine-") as disk:
            s = Setup(args, be, cfg, prefix_len + suffix_len, disk, codec)
            try:
                s.eng.generate(s.tokens(2 * args.chunk), 1, salt=b"warm-up")  # kernels, allocator
                prefix = s.tokens(prefix_len)
                cold = [s.eng.generate(prefix + s.tokens(suffix_len, first=0), 1, salt=f"cold-{i}".encode())
                        for i in range(n)]
                rows.append((prefix_len, "cold", [r.ttft for r in cold], cold[-1].reused, cold[-1].levels))
                s.eng.generate(prefix + s.tokens(suffix_len, first=1), 1)  # caches the prefix
                for level, name in enumerate(LEVELS):
                    runs = []
                    for _ in range(n):
                        s.push_below(level)
                        r = s.eng.generate(prefix + s.tokens(suffix_len, first=2 + level), 1)
                        check(f"[{codec}] {prefix_len} tokens from {name}: prefix reused", r.reused == prefix_len,
                              f"reused {r.reused}, by level {r.levels}")
                        runs.append(r)
                    rows.append((prefix_len, name, [r.ttft for r in runs], runs[-1].reused, runs[-1].levels))
                bytes_per_token = s.token_bytes
            finally:
                s.close()
        print(flush=True)
    print(f"model: {cfg.layers} layers, dim {cfg.dim}, {cfg.heads} heads / {cfg.kv_heads} KV heads, "
          f"window {cfg.window} on layers {list(cfg.window_layers)}; {be.name} {be.element}; tokens_per_block "
          f"{args.tpb}, chunk {args.chunk}; codec {codec}; KV {bytes_per_token} bytes per token; "
          f"H2D pinned copy {rate:.1f} GB/s; {n} runs per cell")
    print(f"{'prefix':>7} {'source':>6} {'TTFT ms':>9} {'range ms':>15} {'vs cold':>8} {'reused':>7}"
          f" {'by level (gpu/host/disk)':>26} {'KV MB':>7} {'extra ms':>9} {'at H2D ms':>10}")
    cold_of, gpu_of = {}, {}
    for prefix_len, name, times, reused, levels in rows:
        med = statistics.median(times)
        if name == "cold":
            cold_of[prefix_len] = med
        if name == "gpu":
            gpu_of[prefix_len] = med
        mb = reused * bytes_per_token / 1e6
        extra = "" if name in ("cold", "gpu") else f"{(med - gpu_of[prefix_len]) * 1e3:9.1f}"
        at_rate = "" if name in ("cold", "gpu") else f"{mb / 1e3 / rate * 1e3:10.1f}"
        rng = f"{min(times) * 1e3:.1f}-{max(times) * 1e3:.1f}"
        print(f"{prefix_len:>7} {name:>6} {med * 1e3:9.1f} {rng:>15} {cold_of[prefix_len] / med:7.1f}x {reused:>7}"
              f" {'/'.join(map(str, levels)):>26} {mb:7.1f} {extra:>9} {at_rate:>10}")
    print("TTFT ms: the median of the runs, range ms: their min-max; vs cold: median over median; by level: of the "
          "last run; KV MB: reused tokens x bytes per token of every layer (the window layers onboard less); "
          "extra ms: median TTFT over the GPU-cached one; at H2D ms: KV MB at the measured pinned copy rate.")


def main() -> int:
    # cuBLAS's deterministic mode needs its workspace fixed before its first call.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    has_torch = importlib.util.find_spec("torch") is not None
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", choices=("torch", "numpy"), default="torch" if has_torch else "numpy",
                   help="torch (CUDA or CPU) or numpy (the emulated device; default without torch)")
    p.add_argument("--device", choices=("cuda", "cpu"), default=None,
                   help="torch's device (default cuda where available); numpy runs on cpu")
    p.add_argument("--what", default=None, help="exact,ttft (default: both on cuda, exact on cpu)")
    p.add_argument("--codecs", default=None,
                   help="cold-page codecs of the exactness check (default default,gather,auto,fp8; on the "
                        "emulated device gather and fp8 must be refused)")
    p.add_argument("--ttft-codecs", default="default", help="cold-page codecs of the TTFT table")
    p.add_argument("--repeat", type=int, default=5, help="runs per TTFT cell")
    p.add_argument("--prefixes", default="4096,16384", help="TTFT prefix lengths")
    p.add_argument("--tpb", type=int, default=None, help="tokens per block (default 32 on cuda, 16 on cpu)")
    p.add_argument("--chunk", type=int, default=None, help="prefill chunk (default 512 on cuda, 32 on cpu)")
    p.add_argument("--exact-prefix", type=int, default=None, help="shared prefix of the exactness check")
    p.add_argument("--gpu-requests", type=int, default=3, help="GPU quota in requests")
    p.add_argument("--host-requests", type=int, default=8, help="host quota in requests")
    p.add_argument("--disk-requests", type=int, default=64, help="disk quota in requests")
    args = p.parse_args()
    if args.backend == "torch" and not has_torch:
        print("torch is not installed (--backend numpy runs without it)")
        return 1
    if args.device is None:
        args.device = "cpu"
        if args.backend == "torch":
            import torch

            args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.backend == "numpy" and args.device != "cpu":
        print("--backend numpy runs on the emulated device only (--device cpu)")
        return 1
    if args.repeat < 1:
        print("--repeat: at least 1")
        return 1
    be = Backend(args)
    if be.cuda and not be.torch.cuda.is_available():
        print("no CUDA device")
        return 1
    args.tpb = args.tpb or (32 if be.cuda else 16)
    args.chunk = args.chunk or (512 if be.cuda else 32)
    args.exact_prefix = args.exact_prefix or 4 * args.chunk
    args.prefixes = [int(x) for x in args.prefixes.split(",") if x]
    codecs = [c for c in (args.codecs or "default,gather,auto,fp8").split(",") if c]
    what = set((args.what or ("exact,ttft" if be.cuda else "exact")).split(","))
    cfg = ModelConfig() if be.cuda else TINY
    version = f"torch {be.torch.__version__}" if be.name == "torch" else f"numpy {np.__version__}"
    print(f"kvcm {kvcm.version()} on {be.device}, {be.name} backend, {version}", flush=True)
    if "exact" in what:
        be.deterministic(True)
        for codec in codecs:
            if codec == "fp8" and be.itemsize != 2 and be.cuda:
                info("[fp8]", f"skipped: the FP8 codec quantizes 16-bit pages, the model is {be.element}")
                continue
            exactness(args, be, cfg, codec)
        be.deterministic(False)
    if "ttft" in what:
        for codec in [c for c in args.ttft_codecs.split(",") if c]:
            ttft(args, be, cfg, codec)
    check("every handle released", kvcm.live_handle_count() == 0, str(kvcm.live_handle_count()))
    print(f"{failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
