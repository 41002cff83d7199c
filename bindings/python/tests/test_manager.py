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
        assert list(c.get_page_indices(0)) == [-1] * 5, "a SUSPENDED cache holds no GPU page"
    assert c.closed and c.status == CacheStatus.CLOSED
    with pytest.raises(ClosedError, match="KV cache is closed"):
        c.resume(s)
    with pytest.raises(ClosedError):
        c.num_committed_tokens
    # Reuse: a prompt cached whole is reused whole (KVCacheManagerV2's rule).
    assert manager.probe_reuse(None, PROMPT) == 20
    assert manager.probe_reuse(PROMPT) == 20, "kvcm's older probe_reuse(input_tokens)"
    assert manager.probe_reuse(None, PROMPT[:19]) == 16, "whole blocks without partial reuse"
    assert manager.probe_reuse(PROMPT, lora_task_id=7) == 0
    assert manager.probe_reuse(PROMPT, salt=b"tenant") == 0
    with manager.create_kv_cache(input_tokens=PROMPT) as c2:
        assert c2.num_committed_tokens == c2.reused_tokens == 20


def test_errors_map_to_classes(manager):
    s = manager.create_stream()
    c = manager.create_kv_cache(input_tokens=PROMPT)
    c.resume(s)
    with pytest.raises(InvalidArgumentError, match="history_length") as ei:
        c.resize(4, 8)
    assert ei.value.code == 1 and isinstance(ei.value, ValueError)
    with pytest.raises(InvalidArgumentError, match="capacity"):
        c.commit(PROMPT[:4])  # capacity is 0
    assert c.resize(1 << 20) is False, "out of pages: False, as KVCacheManagerV2"
    with pytest.raises(OutOfPagesError) as ei:
        c.capacity = 1 << 20
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
    cfg = small_config(tiers=[kvcm.GpuCacheTierConfig(8 * page, pool_granularity=0), kvcm.DiskCacheTierConfig(8 * page, str(tmp_path))],
                       layers=layers)
    with KVCacheManager(cfg, device="emu") as m:
        with pytest.raises(StorageIOError, match="disk") as ei:
            m.resize(1, 1 << 50)  # a 1 PiB blob file: too large, or no space
        assert isinstance(ei.value, OSError) and ei.value.code == 16
        assert not kvcm.is_poisoned()
        assert m.get_quota(1) == 8 * page  # nothing changed


def _persistent_config(path, persistent=True):
    """A 4-page GPU tier over a 32-page disk tier in path (tiny pages)."""
    layers = [kvcm.AttentionLayerConfig(0, [kvcm.BufferConfig("key", 64), kvcm.BufferConfig("value", 64)])]
    tiers = [kvcm.GpuCacheTierConfig(4 * 128, pool_granularity=0), kvcm.DiskCacheTierConfig(32 * 128, str(path), persistent=persistent)]
    return small_config(tiers=tiers, layers=layers)


@pytest.mark.parametrize("persistent", [True, False])
def test_persistent_disk_tier_is_reused_by_the_next_manager(tmp_path, persistent):
    """A persistent disk tier's committed blocks outlive close and the next manager on the directory reuses them;
    a tier that is not persistent leaves nothing."""
    prompts = [list(range(100 * i, 100 * i + 8)) for i in range(8)]
    with KVCacheManager(_persistent_config(tmp_path, persistent), device="emu") as m:
        s = m.create_stream()
        for p in prompts:  # 2 blocks each through 4 GPU pages: the first ones go to disk
            with m.create_kv_cache(input_tokens=p) as c:
                c.resume(s)
                prefill(c, p)
        s.synchronize()
    with KVCacheManager(_persistent_config(tmp_path, persistent), device="emu") as m:
        assert m.probe_reuse(prompts[0]) == (8 if persistent else 0)


def test_second_manager_on_persistent_dir_is_refused(tmp_path):
    """A second live manager on a persistent disk tier's directory raises InvalidStateError; after close it starts."""
    cfg = _persistent_config(tmp_path)
    with KVCacheManager(cfg, device="emu"):
        with pytest.raises(InvalidStateError, match="locked") as ei:
            KVCacheManager(cfg, device="emu")
        assert ei.value.code == 3 and not kvcm.is_poisoned()
    KVCacheManager(cfg, device="emu").close()


def test_persistent_must_be_a_bool(tmp_path):
    """persistent is checked as a bool, naming the field."""
    cfg = _persistent_config(tmp_path, persistent=1)
    with pytest.raises(TypeError, match=r"cache_tiers\[1\]\.persistent"):
        KVCacheManager(cfg, device="emu")


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
    assert manager.get_mem_pool_base_address(1, "value", kvcm.PageIndexMode.PER_LAYER) == loc.pool_base
    assert manager.get_mem_pool_base_address(1, "value") == loc.pool_base + loc.offset * loc.bytes
    assert manager.get_page_stride(1, "value") == 64
    assert manager.layer_grouping == [[0, 1], [2]] or sorted(map(sorted, manager.layer_grouping)) == [[0, 1], [2]]
    descs = manager.get_pool_group_descs(0)
    assert [d.pool_group_index for d in descs] == list(range(len(descs)))
    assert sorted(lg for d in descs for lg in d.layer_groups) == [0, 1]
    assert any(p.base_address == loc.pool_base for d in descs for p in d.pools)
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
        assert st.reused_blocks == 5 and st.alloc_new_blocks == 5, "the prompt is reused whole"
        assert st.alloc_total_blocks == st.alloc_new_blocks + st.reused_blocks
        assert 0 < st.hit_rate <= 1
        it = m.get_and_reset_iteration_block_stats()
        assert it.reused_blocks == 5
        assert m.get_and_reset_iteration_block_stats().reused_blocks == 0
        events = m.drain_events()
        stored = [e for e in events if e.kind == kvcm.EventKind.BLOCK_STORED]
        assert len(stored) == 5
        assert [e.seq for e in events] == list(range(events[0].seq, events[0].seq + len(events)))
        assert stored[0].tokens == tuple(PROMPT[:4])
        assert stored[1].parent == stored[0].key
        assert m.drain_events() == []
        assert m.events_dropped == 0
        assert isinstance(m.get_migration_stats(), dict)


def test_priority_callback_is_asked_as_pages_are_allocated(manager):
    """As KVCacheManagerV2 asks custom_priority_callback(block_ordinal,
    life_cycle) per page it allocates: resize asks once per layer group of
    each new block, and the commit keeps those priorities (asking nothing
    more)."""
    s = manager.create_stream()
    seen = []

    def priority(block_ordinal, life_cycle):
        seen.append((block_ordinal, life_cycle))
        return 80

    with manager.create_kv_cache(input_tokens=PROMPT, id="r", custom_priority_callback=priority) as c:
        c.resume(s)
        c.resize(8, 8)
        assert seen == [(0, 0), (0, 1), (1, 0), (1, 1)], "asked at allocation, before any commit"
        c.commit(PROMPT[:8])
    assert seen == [(0, 0), (0, 1), (1, 0), (1, 1)], "the commit keeps the allocation's priorities"
    windows = {int(lc): lc.window_size for _, lc in seen}
    swa = manager.get_layer_group_id(2)
    assert windows == {swa: 8, 1 - swa: None}
    assert all(lc.num_sink_blocks == 0 for _, lc in seen)


class Boom(Exception):
    pass


@pytest.mark.parametrize("failure", ["raises", "returns a float", "returns None"])
def test_failing_priority_callback_fails_resize_changing_nothing(manager, failure):
    """A priority callback that raises (or answers something that is not an
    int) fails the resize that allocates the pages, which changes nothing;
    the exception is re-raised; the retry succeeds once the callback does,
    and the commit publishes the blocks."""
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
        with pytest.raises(expected, match="block 0" if failure == "raises" else "priority"):
            c.resize(8, 8)
        assert (c.capacity, c.history_length, c.num_blocks) == (0, 0, 0), "the failed resize changed nothing"
        fail[0] = False
        assert c.resize(8, 8)
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
            c.resume(None)  # it never had one


def test_engine_stream_handles_run_unchanged_on_the_emulated_device(manager):
    """Any int is a stream handle the engine owns: on the emulated device each
    value is an emulated stream of its own (as torch.cuda.Stream().cuda_stream
    would be a CUstream on CUDA), the default stream's 0 included."""
    for handle in (0, 12345, 0x7F00_0000_1000):
        with manager.create_kv_cache() as c:
            assert c.resume(handle) is True
            assert c.cuda_stream == handle
            c.capacity = 8
            c.commit(PROMPT[:8])
            c.cuda_stream = handle + 1  # another engine stream
            c.suspend()
            assert c.resume() is True and c.cuda_stream == handle + 1


def test_version_queries():
    assert kvcm.version().count(".") == 2
    assert kvcm.abi_version() == 2  # version 2 appended to the first ABI
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
