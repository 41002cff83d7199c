"""Manager and cache lifecycle, handles, errors, queries."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap

import pytest
from conftest import HERE, prefill, small_config

import kvcm
from kvcm import (
    CacheStatus,
    ClosedError,
    InvalidArgumentError,
    InvalidStateError,
    KVCacheManager,
    OutOfPagesError,
    StorageIOError,
)

PROMPT = list(range(1000, 1020))


def test_manager_context_manager_closes(config):
    before = kvcm.live_handle_count()
    with KVCacheManager(config, device="emu") as m:
        assert not m.closed
        assert kvcm.live_handle_count() == before + 1
        assert m.tokens_per_block == 4
        assert m.num_layer_groups == 2
        assert m.num_cache_levels == 1
        assert m.device_kind == kvcm.DeviceKind.EMU
    assert m.closed
    assert kvcm.live_handle_count() == before
    with pytest.raises(ClosedError, match="KVCacheManager is closed"):
        m.create_kv_cache(input_tokens=PROMPT)
    with pytest.raises(ClosedError):
        m.probe_reuse(PROMPT)
    with pytest.raises(ClosedError):
        m.stats
    m.close()  # idempotent


def test_manager_finalizer_releases_handle(config):
    before = kvcm.live_handle_count()
    m = KVCacheManager(config, device="emu")
    c = m.create_kv_cache(input_tokens=PROMPT)
    assert kvcm.live_handle_count() == before + 2
    del m, c
    gc.collect()
    assert kvcm.live_handle_count() == before


def test_cache_lifecycle(manager):
    s = manager.create_stream()
    with manager.create_kv_cache(input_tokens=PROMPT, id="req-1") as c:
        assert c.status == CacheStatus.SUSPENDED and not c.is_active
        assert c.id == "req-1"
        assert c.num_committed_tokens == c.history_length == c.capacity == 0
        assert c.resume(s) is True
        assert c.is_active and c.cuda_stream is s
        assert c.resize(len(PROMPT)) is True
        assert c.capacity == len(PROMPT) and c.history_length == 0
        # Commit in chunks, before the sliding-window layer (8 tokens) drops
        # the blocks it no longer needs, so they are published too.
        c.resize(len(PROMPT), 12)
        c.commit(PROMPT[:10])
        assert c.num_committed_tokens == 10
        c.commit(PROMPT[10:12])
        c.resize(len(PROMPT), len(PROMPT))
        c.commit(PROMPT[12:], is_end=True)
        with pytest.raises(InvalidStateError):
            c.commit([1])
        idx = c.get_page_indices(manager.get_layer_group_id(0))
        assert len(idx) == 5 and all(i >= 0 for i in idx)
        c.suspend()
        assert c.status == CacheStatus.SUSPENDED
        with pytest.raises(InvalidStateError, match="resize"):
            c.resize(24)
        with pytest.raises(InvalidStateError):
            c.get_page_indices(0)
    assert c.closed and c.status == CacheStatus.CLOSED
    with pytest.raises(ClosedError, match="KV cache is closed"):
        c.resume(s)
    with pytest.raises(ClosedError):
        c.num_committed_tokens
    # Reuse: at most len-1 tokens, in whole blocks.
    assert manager.probe_reuse(PROMPT) == 16
    assert manager.probe_reuse(PROMPT, lora_task_id=7) == 0
    assert manager.probe_reuse(PROMPT, salt=b"tenant") == 0
    with manager.create_kv_cache(input_tokens=PROMPT) as c2:
        assert c2.num_committed_tokens == c2.reused_tokens == 16


def test_errors_map_to_classes(manager):
    s = manager.create_stream()
    c = manager.create_kv_cache(input_tokens=PROMPT)
    c.resume(s)
    with pytest.raises(InvalidArgumentError, match="history_length") as ei:
        c.resize(4, 8)
    assert ei.value.code == 1 and isinstance(ei.value, ValueError)
    with pytest.raises(InvalidArgumentError, match="tokens"):
        c.commit(PROMPT[:4])  # history is 0
    with pytest.raises(OutOfPagesError) as ei:
        c.resize(1 << 20)
    assert isinstance(ei.value, MemoryError) and ei.value.code == 4
    assert c.capacity == 0  # a failed call changes nothing
    with pytest.raises(InvalidArgumentError, match="layer"):
        manager.get_layer_group_id(99)
    with pytest.raises(InvalidArgumentError):
        manager.get_buffer_location(0, "nope")
    with pytest.raises(InvalidArgumentError, match="role: contains a NUL byte"):
        manager.get_buffer_location(0, "key\0junk")  # not cut to "key"
    with pytest.raises(InvalidArgumentError, match="level"):
        manager.get_quota(5)
    c.close()


def test_disk_error_is_storage_io_error(tmp_path):
    """A disk tier's file that cannot be sized raises StorageIOError (an OSError), not InternalError."""
    page = 1 << 20  # large pages, so a 1 PiB tier stays within a pool group's slot range
    layers = [kvcm.AttentionLayerConfig(0, [kvcm.BufferConfig("key", page), kvcm.BufferConfig("value", page)])]
    cfg = small_config(tiers=[kvcm.GpuCacheTierConfig(8 * page), kvcm.DiskCacheTierConfig(8 * page, str(tmp_path))],
                       layers=layers)
    with KVCacheManager(cfg, device="emu") as m:
        with pytest.raises(StorageIOError, match="disk") as ei:
            m.resize(1, 1 << 50)  # a 1 PiB blob file: too large, or no space
        assert isinstance(ei.value, OSError) and ei.value.code == 16
        assert not kvcm.is_poisoned()
        assert m.get_quota(1) == 8 * page  # nothing changed


def test_manager_close_closes_its_caches_and_streams(config):
    before = kvcm.live_handle_count()
    m = KVCacheManager(config, device="emu")
    s = m.create_stream()
    mem = m.alloc_memory(4096)
    c = m.create_kv_cache(input_tokens=PROMPT)
    c.resume(s)
    m.close()
    assert c.closed and s.closed and mem.closed
    assert kvcm.live_handle_count() == before
    with pytest.raises(ClosedError):
        c.suspend()
    with pytest.raises(ClosedError):
        s.synchronize()
    with pytest.raises(ClosedError):
        mem.view()


def test_stream_in_use_is_not_destroyed(manager):
    """Closing a stream an ACTIVE cache uses raises, names the cache and
    leaves the stream open; once the cache is suspended it closes."""
    s = manager.create_stream()
    c = manager.create_kv_cache(input_tokens=PROMPT)
    c.resume(s)
    with pytest.raises(InvalidStateError, match=f"ACTIVE cache {c.cache_id}"):
        s.close()
    assert not s.closed
    s.synchronize()
    c.suspend()
    s.close()
    assert s.closed
    c.close()


def test_queries(manager):
    loc = manager.get_buffer_location(1, "value")
    assert loc.layer_group == manager.get_layer_group_id(1) == manager.get_layer_group_id(0)
    assert loc.bytes == 64 and loc.pool_base != 0
    assert manager.get_mem_pool_base_address(1, "value") == loc.pool_base
    assert manager.get_page_stride(1, "value") == 64
    assert manager.layer_grouping == [[0, 1], [2]] or sorted(map(sorted, manager.layer_grouping)) == [[0, 1], [2]]
    descs = manager.get_pool_group_descs(0)
    assert [d.index for d in descs] == list(range(len(descs)))
    assert sorted(lg for d in descs for lg in d.layer_groups) == [0, 1]
    assert any(p.base == loc.pool_base for d in descs for p in d.pools)
    st = manager.get_storage_stats(0)
    assert len(st) == len(descs)
    assert all(s.free == s.total and s.used == 0 and s.tier == kvcm.CacheTier.GPU_MEM for s in st)
    q = manager.get_quota(0)
    assert manager.resize(0, q // 2) is True
    assert manager.get_quota(0) == q // 2
    assert sum(s.total for s in manager.get_storage_stats(0)) < sum(s.total for s in st)
    peaks = manager.get_and_reset_iteration_peak_block_stats(0)
    assert len(peaks) == len(st)


def test_stats_and_events():
    cfg = small_config(enable_stats=True)
    with KVCacheManager(cfg, device="emu") as m:
        s = m.create_stream()
        with m.create_kv_cache(input_tokens=PROMPT) as c:
            c.resume(s)
            prefill(c, PROMPT)
        with m.create_kv_cache(input_tokens=PROMPT) as c:
            pass
        st = m.stats
        assert st.reused_blocks == 4 and st.alloc_new_blocks == 5
        assert st.alloc_total_blocks == st.alloc_new_blocks + st.reused_blocks
        assert 0 < st.hit_rate <= 1
        it = m.get_and_reset_iteration_stats()
        assert it.reused_blocks == 4
        assert m.get_and_reset_iteration_stats().reused_blocks == 0
        events = m.drain_events()
        stored = [e for e in events if e.kind == kvcm.EventKind.BLOCK_STORED]
        assert len(stored) == 5
        assert [e.seq for e in events] == list(range(events[0].seq, events[0].seq + len(events)))
        assert stored[0].tokens == tuple(PROMPT[:4])
        assert stored[1].parent == stored[0].key
        assert m.drain_events() == []
        assert m.events_dropped == 0
        assert isinstance(m.get_migration_stats(), dict)


def test_priority_callback_gives_committed_blocks_their_priority(manager):
    s = manager.create_stream()
    seen = []

    def priority(block_index, req_id):
        seen.append((block_index, req_id))
        return 80

    with manager.create_kv_cache(input_tokens=PROMPT, id="r", custom_priority_callback=priority) as c:
        c.resume(s)
        c.resize(8, 8)
        c.commit(PROMPT[:8])
    assert seen == [(0, "r"), (1, "r")]


class Boom(Exception):
    pass


@pytest.mark.parametrize("failure", ["raises", "returns a float", "returns None"])
def test_failing_priority_callback_fails_commit_changing_nothing(manager, failure):
    """A priority callback that raises (or answers something that is not an
    int) fails the commit, which changes nothing; the exception is
    re-raised; the retry succeeds once the callback does."""
    s = manager.create_stream()
    fail = [True]

    def priority(block_index, req_id):
        if fail[0]:
            if failure == "raises":
                raise Boom(f"block {block_index}")
            return 50.0 if failure == "returns a float" else None
        return 80

    other = list(range(5000, 5012))
    expected = Boom if failure == "raises" else TypeError
    with manager.create_kv_cache(input_tokens=other, custom_priority_callback=priority) as c:
        c.resume(s)
        c.resize(8, 8)
        with pytest.raises(expected, match="block 0" if failure == "raises" else "priority"):
            c.commit(other[:8])
        assert c.num_committed_tokens == 0
        assert manager.probe_reuse(other) == 0, "nothing was published"
        fail[0] = False
        c.commit(other[:8])
        assert c.num_committed_tokens == 8
    assert manager.probe_reuse(other) == 8


def test_host_func_exception_reraised_at_synchronize(manager):
    s = manager.create_stream()
    ran = []
    s.enqueue_host_func(lambda: ran.append(1))
    s.synchronize()
    assert ran == [1]

    def fail():
        raise RuntimeError("from the stream")

    s.enqueue_host_func(fail)
    with pytest.raises(RuntimeError, match="from the stream"):
        s.synchronize()
    s.synchronize()  # a later interval is clean
    s.close()
    with pytest.raises(ClosedError):
        s.enqueue_host_func(lambda: None)


def test_resume_needs_a_stream(manager):
    with manager.create_kv_cache(input_tokens=PROMPT) as c:
        with pytest.raises(InvalidArgumentError, match="stream"):
            c.resume(None)
        with pytest.raises(kvcm.KVCacheError):
            c.resume(12345)  # not a stream of this device


def test_version_queries():
    assert kvcm.version().count(".") == 2
    assert kvcm.abi_version() == 2  # ABI version 2 added kvcm_manager_config.shared_tier
    from kvcm import _ffi
    assert _ffi.KVCM_ABI_VERSION == 2
    assert not kvcm.is_poisoned()
    assert kvcm.library_path().name == "libkvcm.so"


def test_stale_handles_are_reported_not_dereferenced(manager):
    """Below the Python guards, the library itself rejects stale handles."""
    import ctypes

    c = manager.create_kv_cache(input_tokens=PROMPT)
    stale = c._resource
    c.close()
    out = ctypes.c_int32()
    with pytest.raises(kvcm.InvalidHandleError) as ei:
        kvcm._native.call("kvcm_kv_cache_get_status", stale, ctypes.byref(out))
    assert ei.value.code == 2
    with pytest.raises(kvcm.InvalidHandleError):
        kvcm._native.call("kvcm_manager_get_tokens_per_block", 0, ctypes.byref(out))


# A cache that the garbage collector finalizes while a callback runs (the
# priority callback, CP notifications and host functions run with the
# manager's lock held) closes without taking that lock again. Run in a
# subprocess with a timeout, as a failure hangs the process.
_GC_IN_CALLBACK_SCRIPT = textwrap.dedent(
    """
    import gc, sys
    sys.path.insert(0, {pkg!r})
    sys.path.insert(0, {tests!r})
    from conftest import small_config
    from kvcm import KVCacheManager

    m = KVCacheManager(small_config(), device="emu")
    s = m.create_stream()

    # An unreachable cache in a reference cycle: only the cyclic GC frees it.
    garbage = m.create_kv_cache(input_tokens=[9, 9, 9, 9, 9])
    garbage.cycle = garbage
    del garbage

    def priority(block_index, _id):
        gc.collect()  # what any allocation in the callback may trigger
        return 50

    c = m.create_kv_cache(input_tokens=[1, 2, 3, 4, 5], custom_priority_callback=priority)
    c.resume(s)
    c.resize(8, 4)
    c.commit([1, 2, 3, 4])
    c.close()
    m.close()
    print("OK")
    """
)


def test_cache_collected_inside_a_callback_closes_without_deadlock(tmp_path):
    script = tmp_path / "gc_in_callback.py"
    script.write_text(_GC_IN_CALLBACK_SCRIPT.format(pkg=str(HERE.parent), tests=str(HERE)))
    try:
        r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=30,
                           env=dict(os.environ))
    except subprocess.TimeoutExpired:
        pytest.fail("deadlock: a cache finalized by the GC inside a priority callback closed itself "
                    "while the manager's lock was held")
    assert r.returncode == 0 and "OK" in r.stdout, r.stdout + r.stderr
