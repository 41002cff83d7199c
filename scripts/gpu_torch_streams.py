"""Engine streams on CUDA, from Python: a program written against
KVCacheManagerV2's API hands kvcm the CUDA streams it already owns
(torch.cuda.Stream objects, their raw handles, the current stream, the legacy
default stream 0). Run on a GPU machine with PyTorch:

    KVCM_LIBRARY=build/gpu/lib/libkvcm.so PYTHONPATH=bindings/python \\
        python3 scripts/gpu_torch_streams.py

Each check prints one line; the exit status is non-zero when any failed.
"""

from __future__ import annotations

import sys

import torch

import kvcm
from kvcm import (AttentionLayerConfig, BufferConfig, GpuCacheTierConfig, HostCacheTierConfig,
                  KVCacheManager, KVCacheManagerConfig)

TPB = 16
passed = failures = 0


def check(name: str, ok: bool, detail: str = "") -> None:
    global passed, failures
    passed += bool(ok)
    failures += not ok
    print(f"{'ok  ' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}", flush=True)


def config() -> KVCacheManagerConfig:
    layers = [AttentionLayerConfig(i, [BufferConfig("key", 4096), BufferConfig("value", 4096)]) for i in range(4)]
    return KVCacheManagerConfig(tokens_per_block=TPB,
                                cache_tiers=[GpuCacheTierConfig(64 << 20), HostCacheTierConfig(64 << 20)],
                                layers=layers)


def serve(m: KVCacheManager, prompt: list[int], stream) -> int:
    """One request on an engine stream: create with reuse, resume, compute the
    rest (the pages' bytes are written by torch on that stream), commit, close.
    Returns the reused token count."""
    c = m.create_kv_cache(None, prompt)
    reused = c.num_committed_tokens
    ok = c.resume(stream)
    check(f"resume on {type(stream).__name__} {getattr(stream, 'cuda_stream', stream)}", ok)
    c.capacity = len(prompt)
    pages = c.get_base_page_indices(0)
    base = m.get_mem_pool_base_address(0, "key")
    stride = m.get_page_stride(0, "key")
    check("pages are on the GPU", all(p >= 0 for p in pages) and base != 0, f"{len(pages)} pages, base {base:#x}")
    handle = getattr(stream, "cuda_stream", stream)
    torch_stream = torch.cuda.ExternalStream(handle) if handle else torch.cuda.default_stream()
    with torch.cuda.stream(torch_stream):
        torch.cuda._sleep(1_000_000)  # the stream is busy: kvcm must order after it, not before
    c.commit(prompt[reused:])
    check("commit advances the history", c.history_length == len(prompt), f"history {c.history_length}")
    other = torch.cuda.Stream()
    c.cuda_stream = other
    check("moved to another stream", c.cuda_stream is other)
    c.suspend()
    c.close()
    torch.cuda.synchronize()
    return reused


def main() -> int:
    if not torch.cuda.is_available():
        print("no CUDA device")
        return 1
    with KVCacheManager(config(), device="cuda") as m:
        prompt = list(range(1000, 1000 + 8 * TPB))
        s = torch.cuda.Stream()
        check("first request reuses nothing", serve(m, prompt, s) == 0)
        check("a torch stream's handle", serve(m, prompt, s.cuda_stream) == len(prompt))
        check("the current stream", serve(m, prompt, torch.cuda.current_stream()) == len(prompt))
        check("the legacy default stream 0", serve(m, prompt, 0) == len(prompt))
        check("probe_reuse in KVCacheManagerV2's argument order", m.probe_reuse(None, prompt) == len(prompt))
    check("every handle released", kvcm.live_handle_count() == 0, str(kvcm.live_handle_count()))
    print(f"torch streams: {passed} passed, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
