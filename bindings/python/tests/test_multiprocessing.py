"""Processes: spawn works (each child makes its own manager); after fork()
the inherited library is refused with a clear error instead of deadlocking."""

from __future__ import annotations

import multiprocessing as mp
import os
import subprocess
import sys
import textwrap

from conftest import HERE, prefill, small_config
from engine import FakeEngine

import kvcm
from kvcm import KVCacheManager


def spawn_worker(seed: int) -> tuple[int, int, str]:
    """Runs in a spawned child: a manager of its own, a cache, bytes."""
    cfg = small_config()
    tokens = list(range(seed * 100, seed * 100 + 20))
    with KVCacheManager(cfg, device="emu") as m:
        eng = FakeEngine(m, cfg, seed=seed)
        with m.create_kv_cache(input_tokens=tokens) as c:
            c.resume(eng.stream)
            c.resize(20)
            eng.write(c, tokens, 0, 20)
            prefill(c, tokens)
            digest = eng.verify(c, tokens, 0, 20)
        eng.close()
        reuse = m.probe_reuse(tokens)
    return seed, reuse, digest


def test_spawn_children_use_their_own_managers(config):
    # The parent has the library loaded and a manager open.
    with KVCacheManager(config, device="emu") as m:
        assert m.probe_reuse([1, 2, 3]) == 0
        ctx = mp.get_context("spawn")
        with ctx.Pool(2) as pool:
            results = pool.map(spawn_worker, [1, 2, 3])
    assert [r[0] for r in results] == [1, 2, 3]
    assert all(r[1] == 20 for r in results), "each child's prompt is reused whole"
    # The same seed gives the same bytes in the parent.
    assert spawn_worker(2) == results[1]


def fork_child(m, q) -> None:
    out = []
    for action in (lambda: m.probe_reuse([1, 2, 3]), lambda: KVCacheManager(small_config())):
        try:
            action()
            out.append("no error")
        except kvcm.ForkedProcessError as e:
            out.append(str(e))
    q.put(out)


def test_fork_child_is_refused_clearly(config):
    ctx = mp.get_context("fork")
    with KVCacheManager(config, device="emu") as m:
        q = ctx.Queue()
        p = ctx.Process(target=fork_child, args=(m, q))
        p.start()
        try:
            out = q.get(timeout=60)
            p.join(60)
        finally:
            if p.is_alive():
                p.kill()
        assert p.exitcode == 0
        # The parent's manager is unaffected.
        assert m.probe_reuse([1, 2, 3]) == 0
    assert len(out) == 2
    for msg in out:
        assert "fork" in msg and "spawn" in msg, msg


# KVCacheColdPageCodec.from_factory refuses in a fork child like every other
# entry into the library: the factory (for the library's own, Go code) is
# never called there.
_FORK_SCRIPT = textwrap.dedent(
    """
    import os, sys
    sys.path.insert(0, {pkg!r})
    import kvcm
    from kvcm import ForkedProcessError, KVCacheColdPageCodec, create_default_kv_cache_cold_page_codec
    from kvcm import _native
    kvcm.live_handle_count()  # the library is loaded
    addr = _native.function_address("kvcm_create_default_cold_page_codec")
    pid = os.fork()
    if pid == 0:
        out = []
        for name, f in (("create_default", create_default_kv_cache_cold_page_codec),
                        ("from_factory", lambda: KVCacheColdPageCodec.from_factory(addr))):
            try:
                f()
                out.append(name + ":called-into-library")
            except ForkedProcessError:
                out.append(name + ":refused")
        print(" ".join(out), flush=True)
        os._exit(0)
    os.waitpid(pid, 0)
    """
)


def test_from_factory_is_refused_in_a_fork_child(tmp_path):
    script = tmp_path / "fork_factory.py"
    script.write_text(_FORK_SCRIPT.format(pkg=str(HERE.parent)))
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ))
    assert "create_default:refused" in r.stdout, r.stdout + r.stderr
    assert "from_factory:refused" in r.stdout, r.stdout + r.stderr
