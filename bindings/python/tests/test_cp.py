"""CP-aware KV management: the null, manager-backed and ContextPilot indexes,
capability probing, clamping and repair of a middleware's answers, exceptions
(contained, or re-raised in strict mode), and a manager notifying an attached
index."""

from __future__ import annotations

import gc
import math
import weakref

import pytest
from conftest import prefill

import kvcm
from kvcm import (
    ContextPilotKVManager,
    EventKind,
    InvalidHandleError,
    InvalidStateError,
    ManagerBackedCPAwareKVManager,
    NullCPAwareKVManager,
)


def serve(manager, stream, tokens, request_id=None):
    """A whole request: create (reusing), resume, compute and commit, close."""
    c = manager.create_kv_cache(input_tokens=tokens, request_id=request_id)
    c.resume(stream)
    prefill(c, tokens)
    c.suspend()
    c.close()


def stored_keys(manager):
    return [e.key for e in manager.drain_events() if e.kind == EventKind.BLOCK_STORED]


class Recorder:
    """A middleware with every method; records what it is told."""

    def __init__(self, score=0.5):
        self.score = score
        self.allocated: dict[str, list[int]] = {}
        self.freed: list[tuple[str, list[int]]] = []
        self.calls: list[str] = []

    def predict_prefix_reuse(self, request_id, token_ids):
        self.calls.append("predict")
        return self.score

    def get_cp_cached_blocks(self, request_id):
        return list(self.allocated.get(request_id, []))

    def notify_blocks_allocated(self, request_id, block_hashes):
        self.allocated.setdefault(request_id, []).extend(block_hashes)

    def notify_blocks_freed(self, request_id, block_hashes):
        self.freed.append((request_id, list(block_hashes)))

    def get_allocation_priority(self, request_ids):
        return sorted(request_ids, reverse=True)


def test_null_index_changes_nothing():
    with NullCPAwareKVManager() as cp:
        assert cp.predict_prefix_reuse("a", range(9)) == 0.0
        assert cp.get_cp_cached_blocks("a") == []
        cp.notify_blocks_allocated("a", [1, 2])
        cp.notify_blocks_freed("a", [1, 2])
        assert cp.get_allocation_priority(["c", "a", "b"]) == ["c", "a", "b"]
        assert cp.get_allocation_priority([]) == []
        assert cp.fault_count == 0
    with pytest.raises(kvcm.ClosedError):
        cp.predict_prefix_reuse("a", [])


def test_full_middleware_is_delegated_to():
    mw = Recorder(score=0.75)
    with ContextPilotKVManager(mw) as cp:
        assert cp.capabilities == frozenset(kvcm.cp.CP_METHODS)
        assert cp.predict_prefix_reuse("r1", [1, 2, 3]) == 0.75
        cp.notify_blocks_allocated("r1", [5, 2**64 - 1])
        assert cp.get_cp_cached_blocks("r1") == [5, 2**64 - 1]
        cp.notify_blocks_freed("r1", [5])
        assert mw.freed == [("r1", [5])]
        assert cp.get_allocation_priority(["a", "c", "b"]) == ["c", "b", "a"]
        assert cp.get_allocation_priority(["x", "x", "y"]) == ["y", "x", "x"]
        assert cp.predict_prefix_reuse("üñí\x00code", []) == 0.75, "ids are bytes with a length"
        assert cp.fault_count == 0


def test_middleware_missing_methods_gets_null_behaviour():
    class OnlyScores:
        get_cp_cached_blocks = 5  # not callable: not a capability

        def predict_prefix_reuse(self, request_id, token_ids):
            return len(token_ids) / 10

    with ContextPilotKVManager(OnlyScores()) as cp:
        assert cp.capabilities == {"predict_prefix_reuse"}
        assert cp.predict_prefix_reuse("r", range(4)) == pytest.approx(0.4)
        assert cp.get_cp_cached_blocks("r") == []
        cp.notify_blocks_allocated("r", [1])
        cp.notify_blocks_freed("r", [1])
        assert cp.get_allocation_priority(["b", "a"]) == ["b", "a"]
        assert cp.fault_count == 0

    with ContextPilotKVManager(object()) as cp:
        assert cp.capabilities == frozenset()
        assert cp.predict_prefix_reuse("r", [1]) == 0.0


@pytest.mark.parametrize("raw, want", [
    (math.nan, 0.0), (2.5, 1.0), (-1.0, 0.0), (math.inf, 1.0), (True, 1.0), ("abc", 0.0), (None, 0.0),
    ([0.5], 0.0), (0.3, 0.3),
])
def test_scores_are_clamped_and_garbage_is_zero(raw, want):
    class M:
        def predict_prefix_reuse(self, request_id, token_ids):
            return raw

    with ContextPilotKVManager(M()) as cp:
        assert cp.predict_prefix_reuse("r", [1, 2]) == pytest.approx(want)
        assert cp.fault_count == (0 if raw == 0.3 or raw is True else 1)


@pytest.mark.parametrize("answer", [
    ["z", "a", "b", "c"],          # invented id
    ["c", "c", "c"],               # repeated
    ["b"],                         # too short
    [],                            # empty
    None,                          # not a list
    [["unhashable"], "a"],         # garbage entries
    ["c", "b", "a", "a", "b"],     # too long
])
def test_garbage_orders_are_repaired_into_permutations(answer):
    class M:
        def get_allocation_priority(self, request_ids):
            return answer

    ids = ["a", "b", "c"]
    with ContextPilotKVManager(M()) as cp:
        got = cp.get_allocation_priority(ids)
        assert sorted(got) == ids
        assert cp.fault_count == 1


def test_bad_block_hashes_are_a_fault():
    class M:
        def __init__(self):
            self.answer = [-1]

        def get_cp_cached_blocks(self, request_id):
            return self.answer

    mw = M()
    with ContextPilotKVManager(mw) as cp:
        assert cp.get_cp_cached_blocks("r") == []
        mw.answer = [2**64]
        assert cp.get_cp_cached_blocks("r") == []
        mw.answer = list(range(200))  # more than the library's first buffer
        assert cp.get_cp_cached_blocks("r") == list(range(200))
        assert cp.fault_count == 2
    with NullCPAwareKVManager() as cp, pytest.raises(ValueError):
        cp.notify_blocks_allocated("r", [-5])


def test_exceptions_are_contained_or_reraised_in_strict_mode():
    class Boom(Exception):
        pass

    class M:
        def predict_prefix_reuse(self, request_id, token_ids):
            raise Boom(request_id)

        def get_allocation_priority(self, request_ids):
            raise Boom("order")

    with ContextPilotKVManager(M()) as cp:
        assert cp.predict_prefix_reuse("r", [1]) == 0.0
        assert cp.get_allocation_priority(["a", "b"]) == ["a", "b"]
        assert cp.fault_count == 2
        assert [str(e) for e in cp.errors] == ["r", "order"]

    with ContextPilotKVManager(M(), strict=True) as cp:
        with pytest.raises(Boom, match="r2"):
            cp.predict_prefix_reuse("r2", [1])
        with pytest.raises(Boom, match="order"):
            cp.get_allocation_priority(["a"])
        assert cp.fault_count == 2


def test_attached_index_is_notified_on_create_commit_and_close_only(manager):
    mw = Recorder()
    cp = ContextPilotKVManager(mw, strict=True)
    manager.attach_cp(cp)
    stream = manager.create_stream()
    prompt = list(range(100, 118))  # 4 full blocks
    c = manager.create_kv_cache(input_tokens=prompt, request_id="writer")
    assert mw.allocated == {}
    c.resume(stream)
    prefill(c, prompt)
    keys = stored_keys(manager)
    assert mw.allocated == {"writer": keys}
    cache_id = c.cache_id
    c.suspend()
    c.resume(stream)
    c.suspend()
    assert mw.freed == []
    c.close()
    assert mw.freed == [("writer", keys)]

    # A second request reuses 4 blocks: notified at creation.
    c2 = manager.create_kv_cache(input_tokens=prompt[:16] + [7], request_id="reader")
    assert mw.allocated["reader"] == keys
    c2.close()
    assert mw.freed[-1] == ("reader", keys)

    # Untracked: no request id, or after detach.
    manager.create_kv_cache(input_tokens=prompt).close()
    manager.detach_cp()
    manager.create_kv_cache(input_tokens=prompt, request_id="late").close()
    assert len(mw.freed) == 2
    cp.close()
    assert cache_id > 0


def test_events_name_the_committing_cache(manager):
    stream = manager.create_stream()
    c = manager.create_kv_cache(input_tokens=list(range(9)))
    c.resume(stream)
    prefill(c, list(range(9)))
    evs = [e for e in manager.drain_events() if e.kind == EventKind.BLOCK_STORED]
    assert evs and all(e.cache_id == c.cache_id for e in evs)
    c.close()


def test_middleware_errors_during_notifications_never_raise(manager):
    class Bad(Recorder):
        def notify_blocks_allocated(self, request_id, block_hashes):
            raise RuntimeError("index down")

    cp = ContextPilotKVManager(Bad(), strict=True)
    manager.attach_cp(cp)
    serve(manager, manager.create_stream(), list(range(12)), request_id="r")
    assert cp.fault_count == 3  # three commits completed blocks
    assert all(isinstance(e, RuntimeError) for e in cp.errors)
    assert cp.predict_prefix_reuse("r", [1]) == 0.5, "strict mode raises only this call's errors"
    cp.close()


def test_attached_index_outlives_its_wrapper(config):
    mw = Recorder()
    ref = weakref.ref(mw)
    with kvcm.KVCacheManager(config, device="emu") as m:
        cp = ContextPilotKVManager(mw)
        m.attach_cp(cp)
        cp.close()
        del cp, mw
        gc.collect()
        assert ref() is not None, "the manager still uses the middleware"
        serve(m, m.create_stream(), list(range(9)), request_id="r")
        assert ref().freed[0][0] == "r"
        m.detach_cp()
        gc.collect()
        assert ref() is None, "released once nothing uses it"


def test_manager_backed_scores_what_is_cached(manager):
    cp = ManagerBackedCPAwareKVManager(manager, level_weights=[1.0, 0.5])
    manager.attach_cp(cp)
    stream = manager.create_stream()
    system = list(range(100, 116))  # 4 blocks
    serve(manager, stream, system + [1, 2], request_id="writer")
    q = system[:12] + [900, 901, 902, 903]
    assert cp.predict_prefix_reuse("q", q) == pytest.approx(manager.probe_reuse(q) // 4 * 4 / len(q))
    assert cp.predict_prefix_reuse("q", q) > 0
    assert cp.predict_prefix_reuse("cold", list(range(5000, 5016))) == 0.0
    assert cp.get_allocation_priority(["cold", "unknown", "q"]) == ["q", "cold", "unknown"]
    assert len(cp.get_cp_cached_blocks("q")) == 3
    with pytest.raises(InvalidStateError):
        ManagerBackedCPAwareKVManager(manager)
    cp.close()


def test_stale_handles_and_type_checks(manager):
    cp = NullCPAwareKVManager()
    handle = cp._handle()
    cp.close()
    with pytest.raises(InvalidHandleError):
        kvcm._native.call("kvcm_cp_destroy", handle)
    with pytest.raises(TypeError):
        manager.attach_cp(object())
    with NullCPAwareKVManager() as cp2, pytest.raises(TypeError):
        cp2.predict_prefix_reuse(42, [])
    with pytest.raises(TypeError):
        kvcm.CPAwareKVManager()


def test_unclosed_index_is_collected_and_destroyed():
    """A ContextPilotKVManager dropped without close() is garbage collected
    with its middleware, and its native index is destroyed."""
    gc.collect()
    before = kvcm.live_handle_count()
    mw = Recorder()
    cp = ContextPilotKVManager(mw)
    assert cp.predict_prefix_reuse("r", [1, 2, 3]) == 0.5
    assert kvcm.live_handle_count() == before + 1
    cp_ref = weakref.ref(cp)
    mw_ref = weakref.ref(mw)
    del cp, mw
    gc.collect()
    gc.collect()
    alive = cp_ref() is not None
    handles = kvcm.live_handle_count()
    if alive:
        cp_ref().close()  # keep the leak from failing later tests
    assert not alive, "a ContextPilotKVManager dropped without close() was never garbage collected"
    assert mw_ref() is None, "middleware kept alive after its index was dropped"
    assert handles == before, f"native CP index leaked: {handles - before} live handle(s)"
