"""Page indices through the buffer protocol; page bytes across tiers."""

from __future__ import annotations

import array

import pytest
from conftest import small_config
from engine import FakeEngine

import kvcm
from kvcm import DiskCacheTierConfig, GpuCacheTierConfig, HostCacheTierConfig, KVCacheManager, MigrationPath

PROMPT = list(range(2000, 2020))


def active_cache(m, tokens, stream):
    c = m.create_kv_cache(input_tokens=tokens)
    c.resume(stream)
    c.resize(len(tokens))
    return c


def test_page_indices_are_a_buffer(manager):
    s = manager.create_stream()
    with active_cache(manager, PROMPT, s) as c:
        idx = c.get_page_indices(0)
        assert isinstance(idx, array.array) and idx.typecode == "i" and idx.itemsize == 4
        mv = memoryview(idx)
        assert mv.format == "i" and mv.itemsize == 4 and mv.nbytes == 4 * len(idx) and not mv.readonly
        assert len(idx) == 5 and list(mv) == list(idx)
        assert len(set(idx)) == 5
        # The window layer's group: the same number of blocks.
        assert len(c.get_page_indices(manager.get_layer_group_id(2))) == 5
        # Each call returns a fresh object the caller owns.
        again = c.get_page_indices(0)
        assert again == idx and again is not idx
        mv.release()


def test_page_indices_with_numpy_without_copy(manager):
    np = pytest.importorskip("numpy")
    s = manager.create_stream()
    with active_cache(manager, PROMPT, s) as c:
        idx = c.get_page_indices(0)
        a = np.frombuffer(idx, dtype=np.int32)
        b = np.asarray(idx)
        assert a.tolist() == list(idx) == b.tolist()
        assert a.dtype == np.int32 and b.dtype == np.int32
        assert a.ctypes.data == idx.buffer_info()[0] == b.ctypes.data  # same memory, no copy
        idx[0] = -7
        assert a[0] == -7 and b[0] == -7


def test_windowed_layer_releases_pages(manager):
    s = manager.create_stream()
    with active_cache(manager, PROMPT, s) as c:
        c.resize(20, 20)
        full = c.get_page_indices(manager.get_layer_group_id(0))
        win = c.get_page_indices(manager.get_layer_group_id(2))
        assert all(i >= 0 for i in full)
        # A window of 8 tokens at history 20 keeps blocks 3 and 4 only.
        assert [i == kvcm.BAD_PAGE_INDEX for i in win] == [True, True, True, False, False]


@pytest.mark.parametrize("tier", ["host", "disk"])
def test_pages_evicted_to_a_cold_tier_come_back_byte_exact(tier, tmp_path):
    cold = HostCacheTierConfig(32 << 10) if tier == "host" else DiskCacheTierConfig(32 << 10, str(tmp_path))
    cfg = small_config(tiers=[GpuCacheTierConfig(2560, pool_granularity=0), cold], enable_stats=True)
    with KVCacheManager(cfg, device="emu") as m:
        eng = FakeEngine(m, cfg, seed=11)
        seqs = [list(range(10_000 * (r + 1), 10_000 * (r + 1) + 20)) for r in range(3)]
        caches = []
        digests = []
        for t in seqs:
            c = active_cache(m, t, eng.stream)
            assert eng.write(c, t, 0, 20) > 0
            c.resize(20, 20)
            digests.append(eng.verify(c, t, 0, 20))
            c.suspend()
            caches.append(c)
        # Three 5-page caches cannot all be on an 8-slot GPU: some pages left.
        on_cold = sum(s.used for s in m.get_storage_stats(1))
        assert on_cold > 0
        mig = m.get_migration_stats()
        out_path = MigrationPath.GPU_TO_HOST if tier == "host" else MigrationPath.GPU_TO_DISK
        in_path = MigrationPath.HOST_TO_GPU if tier == "host" else MigrationPath.DISK_TO_GPU
        assert mig[out_path].pages > 0 and mig[out_path].bytes > 0
        assert m.stats.evictions > 0
        for c, t, want in zip(caches, seqs, digests):
            c.resume(eng.stream)
            assert eng.verify(c, t, 0, 20) == want
            c.suspend()
        assert m.get_migration_stats()[in_path].pages > 0
        # Prefetch brings the first cache's pages up without pinning them.
        caches[0].prefetch(0)
        for c in caches:
            c.close()
        eng.close()


def test_write_read_through_host_mapped_memory(manager):
    s = manager.create_stream()
    host = manager.alloc_memory(256)
    dev = manager.alloc_memory(256, kvcm.MemoryKind.DEVICE)
    with pytest.raises(TypeError, match="not host-visible"):
        dev.view()
    host.write(0, bytes(range(256)))
    s.batch_copy([(dev.ptr, host.ptr, 256)])
    s.synchronize()  # the copy is asynchronous: wait before reusing its source
    host.write(0, bytes(256))
    s.copy_from_host(host.ptr + 128, b"\xff" * 16)
    s.batch_copy([(host.ptr, dev.ptr, 64)])
    s.synchronize()
    got = host.read()
    assert got[:64] == bytes(range(64))
    assert got[64:128] == bytes(64)
    assert got[128:144] == b"\xff" * 16
    view = host.view()
    assert view[1] == 1
    view.release()
    host.close()
    dev.close()
    with pytest.raises(kvcm.ClosedError):
        host.read()
