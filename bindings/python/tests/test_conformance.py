"""The cross-language conformance vectors (tests/conformance/*.vec, format in
its README.md), run through the Python binding. Go and C++ run the same
files and must meet the same expectations."""

from __future__ import annotations

from typing import NamedTuple

import pytest
from conftest import CONFORMANCE_DIR
from engine import FakeEngine

from kvcm import (
    AttentionLayerConfig,
    BufferConfig,
    GpuCacheTierConfig,
    HostCacheTierConfig,
    KVCacheManager,
    KVCacheManagerConfig,
    SsmLayerConfig,
)

VECTORS = sorted(CONFORMANCE_DIR.glob("*.vec"))

class Scope(NamedTuple):
    """A reuse scope as KVCacheManagerV2's ReuseScope: the binding takes any
    object with lora_id and salt."""

    lora_id: int | None = None
    salt: int | None = None


def scope(field: str) -> Scope | None:
    """A LORA field: "-" has no adapter, an integer is that adapter (0 included)."""
    return None if field == "-" else Scope(lora_id=int(field))


def parse(path):
    cfg = dict(tokens_per_block=None, tiers=[], layers=[], seed=0, partial=False, backoff=0)
    seqs: dict[str, list[int]] = {}
    steps = []
    header = False
    for no, raw in enumerate(path.read_text().splitlines(), 1):
        f = raw.split("#", 1)[0].split()
        if not f:
            continue
        if not header:
            assert f == ["kvcm-conformance", "1"], f"{path.name}:{no}: want header 'kvcm-conformance 1'"
            header = True
            continue
        k = f[0]
        if k == "tokens_per_block":
            cfg["tokens_per_block"] = int(f[1])
        elif k == "tier":
            # The vectors are the core's byte-exact pools (granularity 0).
            if f[1] == "gpu":
                cfg["tiers"].append(GpuCacheTierConfig(int(f[2]), pool_granularity=0))
            else:
                cfg["tiers"].append(HostCacheTierConfig(int(f[2])))
        elif k == "layer":
            bufs = [BufferConfig(f[i], int(f[i + 1])) for i in range(4, len(f), 2)]
            cfg["layers"].append(AttentionLayerConfig(int(f[1]), bufs, int(f[2]) or None, int(f[3]) or None))
        elif k == "ssm_layer":
            bufs = [BufferConfig(f[i], int(f[i + 1])) for i in range(2, len(f), 2)]
            cfg["layers"].append(SsmLayerConfig(int(f[1]), bufs))
        elif k == "partial_reuse":
            cfg["partial"] = f[1] == "on"
        elif k == "reuse_match_backoff":
            cfg["backoff"] = int(f[1])
        elif k == "seed":
            cfg["seed"] = int(f[1])
        elif k == "seq":
            seqs[f[1]] = [int(x) for x in f[2:]]
        else:
            steps.append((no, f))
    # kvcm's defaults, whatever KVCacheManagerConfig's are.
    config = KVCacheManagerConfig(tokens_per_block=cfg["tokens_per_block"], cache_tiers=cfg["tiers"], layers=cfg["layers"],
                                  max_util_for_resume=0.95, enable_partial_reuse=cfg["partial"], enable_stats=False,
                                  reuse_match_backoff=cfg["backoff"],
                                  commit_min_snapshot=any(isinstance(x, SsmLayerConfig) for x in cfg["layers"]))
    return config, cfg["seed"], seqs, steps


@pytest.mark.skipif(not VECTORS, reason=f"no conformance vectors in {CONFORMANCE_DIR}")
@pytest.mark.parametrize("path", VECTORS, ids=[p.stem for p in VECTORS])
def test_conformance_vector(path):
    config, seed, seqs, steps = parse(path)
    with KVCacheManager(config, device="emu") as m:
        eng = FakeEngine(m, config, seed)
        caches: dict = {}
        cseq: dict = {}
        met = 0
        for no, f in steps:
            where = f"{path.name}:{no} ({' '.join(f)})"
            op = f[0]

            def expect(got, want):
                assert str(got) == want, f"{where}: got {got}, want {want}"

            if op == "probe":
                expect(m.probe_reuse(scope(f[2]), seqs[f[1]]), f[3])
            elif op == "create":
                c = m.create_kv_cache(scope(f[3]), seqs[f[2]])
                caches[f[1]], cseq[f[1]] = c, seqs[f[2]]
                assert c.num_committed_tokens == c.history_length, where
                expect(c.history_length, f[4])
            elif op == "resume":
                caches[f[1]].resume(eng.stream)
            elif op == "suspend":
                caches[f[1]].suspend()
            elif op == "close":
                caches.pop(f[1]).close()
            elif op == "resize":
                hist = int(f[3])
                caches[f[1]].resize(int(f[2]), None if hist < 0 else hist)
            elif op == "write":
                eng.write(caches[f[1]], cseq[f[1]], int(f[2]), int(f[3]))
            elif op == "commit":
                c, frm, to = caches[f[1]], int(f[2]), int(f[3])
                assert c.num_committed_tokens == frm, where
                c.commit(cseq[f[1]][frm:to], is_end=f[4] == "end")
            elif op == "pages":
                idx = caches[f[1]].get_page_indices(m.get_layer_group_id(int(f[2])))
                expect(len(idx), f[3])
                expect(sum(1 for i in idx if i >= 0), f[4])
            elif op == "verify":
                expect(eng.verify(caches[f[1]], cseq[f[1]], int(f[2]), int(f[3])), f[4])
            elif op == "state":
                expect(eng.verify_state(caches[f[1]], cseq[f[1]], int(f[2])), f[3])
            elif op == "used":
                expect(sum(s.total - s.free for s in m.get_storage_stats(int(f[1]))), f[2])
            else:
                pytest.fail(f"{where}: unknown step {op!r}")
            met += 1
        for c in caches.values():
            c.close()
        eng.close()
    assert met == len(steps) > 0
