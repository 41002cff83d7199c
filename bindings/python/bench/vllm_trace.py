"""Issue 11's trace, side by side with vLLM v1's KV-cache manager.

The trace: prompts of 1k, 8k and 32k tokens at 32 tokens a block, every
other request sharing half its prompt with the one before; per request:
create with prefix lookup -> allocate the uncached tokens -> commit -> 128
one-token decode steps -> close; with and without eviction pressure (room
for two requests' blocks, or for all of them). Each figure is process CPU
time per request, the median of interleaved rounds, each round on fresh
managers built outside the timing (so that no round reuses another's
blocks).

* ``vLLM``: ``vllm.v1.core.kv_cache_manager.KVCacheManager`` with SHA-256
  block hashes (``get_hash_fn_by_name("sha256")``), driven as vLLM's
  scheduler drives it: a ``Request`` (its block hasher hashes the prompt's
  full blocks), ``get_computed_blocks``, ``allocate_slots`` for the
  uncached tokens, then per decode step ``append_output_token_ids`` and
  ``allocate_slots(request, 1)`` (which caches each block it fills), and
  ``free``;
* ``kvcm``: the kvcm package, the cycle of ``bookkeeping.py``
  (``create_kv_cache``, ``resume``, ``resize``, ``commit``, per step
  ``resize`` +1 and ``commit`` of one token, ``close``), prompts as lists;
* ``Go`` (with ``--go``): ``kvcm bench bookkeeping``'s µs per request for
  the same prompt size and pressure (SHA-256 key, per-step calls), from its
  own process.

The reused tokens per request are printed for both managers, and the script
fails if they differ: the trace is the same only if they agree.

Run with a Python that has vLLM installed (vLLM needs torch; this runs on the
CPU and touches no tensor) and the kvcm package importable, e.g.
``make bench-vllm VLLM_PYTHON=/path/to/venv/bin/python``.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bookkeeping as bk  # noqa: E402  (puts the kvcm package on the path)

try:
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_manager import KVCacheManager as VllmManager
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.request import Request, RequestStatus
    import torch
except ImportError as e:  # pragma: no cover - depends on the environment
    sys.exit(f"vllm_trace.py: vLLM is not importable with {sys.executable} ({e}); "
             f"run it with a Python that has vLLM installed")

# As vLLM's engine does after start-up: the objects of the imports (torch's
# and vLLM's modules) leave the collector's generations, so that a
# collection during the rounds does not scan them for either manager.
gc.freeze()

TPB = bk.TPB
STEPS = bk.DECODE_STEPS
DECODE_TOKEN = 7  # every decode step's token, in both managers


def blocks_per_request(prompt: int) -> int:
    return (prompt + STEPS) // TPB + 2


def capacity(prompt: int, requests: int, pressure: bool) -> int:
    """GPU blocks of either manager: two requests' worth under pressure,
    every request's without."""
    per = blocks_per_request(prompt)
    return (2 if pressure else requests) * per + 8  # as kvcm bench bookkeeping sizes it


class Vllm:
    """vLLM's manager on the trace."""

    def __init__(self) -> None:
        self.hash_fn = get_hash_fn_by_name("sha256")
        init_none_hash(self.hash_fn)
        self.hasher = get_request_block_hasher(TPB, self.hash_fn)
        self.params = SamplingParams(max_tokens=STEPS + 1)

    def manager(self, prompt: int, blocks: int) -> VllmManager:
        spec = FullAttentionSpec(block_size=TPB, num_kv_heads=1, head_size=16, dtype=torch.float16)
        cfg = KVCacheConfig(
            num_blocks=blocks + 1,  # block 0 is vLLM's null block
            kv_cache_tensors=[],
            kv_cache_groups=[KVCacheGroupSpec(["layer.0"], spec)],
        )
        return VllmManager(cfg, max_model_len=prompt + STEPS + TPB, scheduler_block_size=TPB,
                           hash_block_size=TPB, enable_caching=True)

    def cycle(self, m: VllmManager, prompts: list[list[int]], first: int, decode: int) -> tuple[float, float]:
        """(CPU seconds per request, reused tokens per request)."""
        reused = 0
        t0 = time.process_time()
        for i, p in enumerate(prompts):
            r = Request(str(first + i), p, self.params, None, block_hasher=self.hasher)
            blocks, hit, _ = m.get_computed_blocks(r)
            n = len(p)
            if m.allocate_slots(r, n - hit, hit, blocks) is None:
                raise RuntimeError(f"vLLM refused the prefill of request {first + i}")
            r.status = RequestStatus.RUNNING
            r.num_computed_tokens = n
            for _ in range(STEPS):
                r.append_output_token_ids(decode)
                if m.allocate_slots(r, 1) is None:
                    raise RuntimeError(f"vLLM refused a decode step of request {first + i}")
                r.num_computed_tokens += 1
            m.free(r)
            reused += hit
        return (time.process_time() - t0) / len(prompts), reused / len(prompts)


def kvcm_config(blocks: int) -> bk.KVCacheManagerConfig:
    page = 2 * 16
    return bk.KVCacheManagerConfig(
        tokens_per_block=TPB,
        cache_tiers=[bk.GpuCacheTierConfig(blocks * page)],
        layers=[bk.AttentionLayerConfig(0, [bk.BufferConfig("key", 16), bk.BufferConfig("value", 16)])],
        max_util_for_resume=1.0,
    )


def kvcm_cycle(m: bk.KVCacheManager, stream, prompts: list[list[int]], decode: list[int]) -> tuple[float, float]:
    """(CPU seconds per request, reused tokens per request): bookkeeping.py's
    binding cycle, counting what each create reused."""
    reused = 0
    t0 = time.process_time()
    for p in prompts:
        c = m.create_kv_cache(input_tokens=p)
        c.resume(stream)
        n = len(p)
        c.resize(n, n)
        hit = c.num_committed_tokens
        c.commit(p[hit:])
        for k in range(STEPS):
            c.resize(n + k + 1, n + k + 1)
            c.commit(decode)
        c.close()
        reused += hit
    return (time.process_time() - t0) / len(prompts), reused / len(prompts)


def go_cycle(cmd: str) -> dict[tuple[int, bool], float]:
    """µs per request by (prompt, eviction) from ``kvcm bench
    bookkeeping``'s table (SHA-256 key, per-step calls)."""
    try:
        out = subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=900).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    res: dict[tuple[int, bool], float] = {}
    cols: dict[str, int] = {}
    for line in out.splitlines():
        if not line.startswith("|"):
            continue
        f = [c.strip() for c in line.strip("|").split("|")]
        if "µs / request" in f:
            cols = {name: i for i, name in enumerate(f)}
            continue
        if not cols or not f[0].endswith("k") or not f[0][:-1].isdigit():
            continue
        if f[cols["block key"]] != "sha256" or f[cols["decode steps"]] != "per-step calls":
            continue
        res[(int(f[0][:-1]) * 1024, f[cols["eviction"]] == "true")] = float(f[cols["µs / request"]])
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--requests", type=int, default=32, help="requests a round per size and pressure")
    ap.add_argument("--prompts", default="1024,8192,32768")
    ap.add_argument("--go", default="", help="the kvcm bench bookkeeping command (its table)")
    args = ap.parse_args()
    sizes = [int(s) for s in args.prompts.split(",")]
    v = Vllm()
    decode = [DECODE_TOKEN]
    rows: dict[tuple[int, bool], dict[str, list[float]]] = {}
    reused: dict[tuple[int, bool], set[tuple[float, float]]] = {}
    for r in range(args.rounds + 1):  # round 0 warms up, untimed
        for size in sizes:
            prompts = bk.requests(size, args.requests)
            for pressure in (False, True):
                blocks = capacity(size, len(prompts), pressure)
                cell = rows.setdefault((size, pressure), {"vllm": [], "kvcm": []})
                vm = v.manager(size, blocks)
                km = bk.KVCacheManager(kvcm_config(blocks))
                stream = km.create_stream()
                order = ("vllm", "kvcm") if r % 2 else ("kvcm", "vllm")
                hits = {}
                for who in order:
                    if who == "vllm":
                        t, hits[who] = v.cycle(vm, prompts, r * len(prompts), DECODE_TOKEN)
                    else:
                        t, hits[who] = kvcm_cycle(km, stream, prompts, decode)
                    if r:
                        cell[who].append(t * 1e6)
                km.close()
                reused.setdefault((size, pressure), set()).add((hits["vllm"], hits["kvcm"]))
    differ = {k: pairs for k, pairs in reused.items() if any(vr != kr for vr, kr in pairs)}
    if differ:
        sys.exit(f"vllm_trace.py: the managers reused different tokens, so the traces differ: {differ}")
    gov = go_cycle(args.go) if args.go else {}
    backend = "extension" if bk.EXTENSION else "ctypes"
    print(f"vLLM {sys.modules['vllm'].__version__ if hasattr(sys.modules.get('vllm'), '__version__') else '?'}, "
          f"kvcm {bk.kvcm.__version__} ({backend}), Python {sys.version.split()[0]}; "
          f"CPU µs per request, median of {args.rounds} interleaved rounds, {args.requests} requests each")
    print()
    head = "| prompt | eviction | reused tokens, vLLM / kvcm | vLLM | kvcm (Python) | kvcm / vLLM |"
    sep = "|---|---|---|---|---|---|"
    if gov:
        head += " kvcm (Go) | Go / vLLM |"
        sep += "---|---|"
    print(head)
    print(sep)
    for (size, pressure), cell in rows.items():
        vl, kv = statistics.median(cell["vllm"]), statistics.median(cell["kvcm"])
        hits = " or ".join(f"{vr:.0f} / {kr:.0f}" for vr, kr in sorted(reused[(size, pressure)]))
        line = (f"| {size // 1024}k | {str(pressure).lower()} | {hits} | {vl:,.1f} | {kv:,.1f} | "
                f"{kv / vl:.3f} |")
        if gov:
            g = gov.get((size, pressure))
            line += f" {g:,.1f} | {g / vl:.3f} |" if g else " - | - |"
        print(line)


if __name__ == "__main__":
    main()
