"""A program written only from TensorRT-LLM's KVCacheManagerV2 public API
(``tensorrt_llm.runtime.kv_cache_manager_v2``: its names, signatures, defaults
and documented behaviour), run with ``import kvcm`` in its place
(docs/trtllm.md, "A KVCacheManagerV2 program").

Everything the checks below call on the manager and its caches is a name of
KVCacheManagerV2. The one part that is not is the engine's memory access
(``DeviceIO``): an engine writes and reads KV through its own kernels; here a
copy from the host on the engine's stream and a copy back, through kvcm's
device helpers, so the program runs on the emulated device and on CUDA alike.

Run by pytest (``make py-test``), or as a program:

    python3 bindings/python/tests/test_kvcm2_program.py [--device cuda]

``--device cuda`` (or KVCM2_PROGRAM_DEVICE=cuda) makes every check also
require that the manager runs on CUDA (KVCacheManagerV2's only device)."""

from __future__ import annotations

import array
import os
import sys
import zlib
from typing import Any, Callable, Sequence

import kvcm as kv2  # in place of: import tensorrt_llm.runtime.kv_cache_manager_v2 as kv2

TOKENS_PER_BLOCK = 16
TOKEN_BYTES = 64
WINDOW = 32
KEY, VALUE = kv2.DataRole("key"), kv2.DataRole("value")


def required_device() -> str:
    return os.environ.get("KVCM2_PROGRAM_DEVICE", "auto")


def make_config(gpu_quota: int = 16 << 20, host_quota: int = 16 << 20, **kw: Any) -> kv2.KVCacheManagerConfig:
    """Layer 0 full attention, layer 1 a sliding window of WINDOW tokens;
    each with a KEY and a VALUE buffer of TOKEN_BYTES a token."""
    buffers = lambda: [kv2.BufferConfig(role=r, size=TOKEN_BYTES * TOKENS_PER_BLOCK) for r in (KEY, VALUE)]
    return kv2.KVCacheManagerConfig(
        tokens_per_block=TOKENS_PER_BLOCK,
        cache_tiers=[kv2.GpuCacheTierConfig(quota=gpu_quota), kv2.HostCacheTierConfig(quota=host_quota)],
        layers=[
            kv2.AttentionLayerConfig(layer_id=kv2.LayerId(0), buffers=buffers()),
            kv2.AttentionLayerConfig(layer_id=kv2.LayerId(1), buffers=buffers(), sliding_window_size=WINDOW,
                                     num_sink_tokens=0),
        ],
        **kw,
    )


class DeviceIO:
    """The engine's memory access (not KVCacheManagerV2's API): writes bytes
    at a device address on a stream, reads them back."""

    def __init__(self, manager: Any) -> None:
        self._stream = manager.create_stream()
        self._host = manager.alloc_memory(1 << 16)

    @property
    def stream(self) -> int:
        """The engine's stream, as the CUstream handle KVCacheManagerV2 takes."""
        return self._stream.handle

    def write(self, addr: int, data: bytes) -> None:
        self._stream.copy_from_host(addr, data)

    def read(self, addr: int, size: int) -> bytes:
        self._stream.batch_copy([(self._host.ptr, addr, size)])
        self._stream.synchronize()
        return self._host.read(0, size)


def token_value(layer: int, buf: int, token: int) -> bytes:
    seed = zlib.crc32(int(token).to_bytes(8, "little"), zlib.crc32(bytes([layer, buf])))
    return (seed.to_bytes(4, "little") * (TOKEN_BYTES // 4))[:TOKEN_BYTES]


class FakeEngine:
    """Computes a step: writes each new token's KV into the pages of every
    layer and buffer, after checking the history's KV in the pages it has,
    addressing a page as KVCacheManagerV2 documents it (pool base address +
    page stride x base page index x page index scale)."""

    def __init__(self, manager: Any, config: kv2.KVCacheManagerConfig) -> None:
        self.manager, self.config, self.io = manager, config, DeviceIO(manager)

    def _addr(self, cache: Any, layer: int, buf: int, position: int) -> int | None:
        m, role = self.manager, self.config.layers[layer].buffers[buf].role
        lg = m.get_layer_group_id(layer)
        base = cache.get_base_page_indices(lg)[position // TOKENS_PER_BLOCK]
        if base == kv2.BAD_PAGE_INDEX:
            return None
        page = base * m.get_page_index_scale(layer, role)
        pool = m.get_mem_pool_base_address(layer, role)
        return pool + m.get_page_stride(layer, role) * page + TOKEN_BYTES * (position % TOKENS_PER_BLOCK)

    def _needs(self, layer: int, position: int, history: int) -> bool:
        window = self.config.layers[layer].sliding_window_size
        return window is None or position >= history + 1 - window

    def check(self, cache: Any, history: Sequence[int]) -> None:
        for layer in range(len(self.config.layers)):
            for buf in range(2):
                for pos, token in enumerate(history):
                    addr = self._addr(cache, layer, buf, pos)
                    if addr is None:
                        assert not self._needs(layer, pos, len(history)), (
                            f"layer {layer}: position {pos} in the window has no page")
                        continue
                    if not self._needs(layer, pos, len(history)):
                        continue
                    got = self.io.read(addr, TOKEN_BYTES)
                    assert got == token_value(layer, buf, token), (
                        f"layer {layer} buffer {buf}: position {pos} holds other KV than was written")

    def step(self, cache: Any, history: Sequence[int], new: Sequence[int]) -> None:
        self.check(cache, history)
        for layer in range(len(self.config.layers)):
            for buf in range(2):
                for i, token in enumerate(new):
                    addr = self._addr(cache, layer, buf, len(history) + i)
                    assert addr is not None, f"layer {layer}: new position {len(history) + i} has no page"
                    self.io.write(addr, token_value(layer, buf, token))


def run_manager(check: Callable[[Any, FakeEngine], None], config: kv2.KVCacheManagerConfig | None = None,
                **kw: Any) -> None:
    config = config or make_config()
    manager = kv2.KVCacheManager(config, **kw)
    try:
        if required_device() == "cuda":
            assert manager.device_kind.name == "CUDA", f"the manager runs on {manager.device_kind.name}"
        check(manager, FakeEngine(manager, config))
    except BaseException:
        manager.close()  # kvcm's forced close: a failed check may leave caches open
        raise
    manager.shutdown()


def serve(manager: Any, engine: FakeEngine, prompt: list[int], decode: list[int],
          scope: kv2.ReuseScope | None = None) -> int:
    """One request: reuse what the tree holds, prefill the rest, decode token
    by token (growing the capacity a block at a time, committing the history
    first), close. Returns the tokens reused."""
    cache = manager.create_kv_cache(scope or kv2.ReuseScope(), prompt)
    reused = cache.num_committed_tokens
    assert cache.resume(engine.io.stream)
    assert cache.status == kv2._KVCache.Status.ACTIVE and cache.is_active
    assert cache.resize(len(prompt))
    history = list(prompt[:reused])
    engine.step(cache, history, prompt[reused:])
    cache.commit(prompt[reused:])
    history = list(prompt)
    assert cache.history_length == len(history) == cache.num_committed_tokens
    for token in decode:
        if len(history) + 1 > cache.capacity:
            cache.commit(history[cache.num_committed_tokens:])
            assert cache.resize(len(history) + TOKENS_PER_BLOCK)
        engine.step(cache, history, [token])
        history.append(token)
    cache.commit(history[cache.num_committed_tokens:])
    engine.check(cache, history)
    assert cache.committed_tokens == history
    cache.close()
    assert cache.status == kv2._KVCache.Status.CLOSED
    return reused


def test_config_defaults_are_kvcm2s():
    """KVCacheManagerConfig's documented defaults; ReuseScope's None and 0
    LoRA ids are different scopes."""
    cfg = make_config()
    for tier in cfg.cache_tiers:
        tier.assert_valid()
    assert (cfg.max_util_for_resume, cfg.enable_partial_reuse, cfg.enable_stats) == (0.97, True, True)
    assert (cfg.reuse_match_backoff, cfg.commit_min_snapshot, cfg.text_only) == (0, False, False)
    assert kv2.ReuseScope() == kv2.ReuseScope(lora_id=None, salt=None)
    assert kv2.ReuseScope(lora_id=0) != kv2.ReuseScope()
    assert (kv2.GPU_LEVEL, kv2.DEFAULT_BEAM_INDEX, kv2.BAD_PAGE_INDEX) == (0, 0, -1)


def test_kv_bytes_survive_decode_and_reuse():
    """A request's KV, written through the pool base addresses, reads back
    while it decodes; a second request with the same prompt reuses it whole
    (a fully cached prompt is reused whole) and finds the same bytes."""

    def check(m: Any, engine: FakeEngine) -> None:
        prompt = list(range(100, 100 + 3 * TOKENS_PER_BLOCK))
        assert serve(m, engine, prompt, list(range(500, 540))) == 0
        assert m.probe_reuse(kv2.ReuseScope(), prompt) == len(prompt)
        assert serve(m, engine, prompt, list(range(600, 610))) == len(prompt)
        assert m.probe_reuse(kv2.ReuseScope(lora_id=3), prompt) == 0, "another scope reuses nothing"

    run_manager(check)


def test_suspend_and_resume_keep_the_kv():
    """A SUSPENDED cache holds no GPU page (its base indices read
    BAD_PAGE_INDEX); resumed, it reads the KV it had."""

    def check(m: Any, engine: FakeEngine) -> None:
        prompt = list(range(2 * TOKENS_PER_BLOCK))
        cache = m.create_kv_cache(kv2.ReuseScope(), prompt)
        assert cache.resume(engine.io.stream) and cache.resize(len(prompt))
        engine.step(cache, [], prompt)
        cache.commit(prompt)
        cache.suspend()
        assert cache.status == kv2._KVCache.Status.SUSPENDED
        lg = m.get_layer_group_id(0)
        assert all(i == kv2.BAD_PAGE_INDEX for i in cache.get_base_page_indices(lg))
        assert cache.resume()  # on the stream it last had
        engine.check(cache, prompt)
        cache.close()

    run_manager(check)


def test_resize_returns_false_when_out_of_pages():
    """resize() and resume() report running out of pages with False,
    changing nothing; the capacity setter raises OutOfPagesError."""

    def check(m: Any, engine: FakeEngine) -> None:
        cache = m.create_kv_cache()
        assert cache.resume(engine.io.stream)
        assert cache.resize(TOKENS_PER_BLOCK)
        assert not cache.resize(1 << 24)
        assert cache.capacity == TOKENS_PER_BLOCK
        try:
            cache.capacity = 1 << 24
            raise AssertionError("the capacity setter did not raise")
        except kv2.OutOfPagesError:
            pass
        assert cache.capacity == TOKENS_PER_BLOCK
        cache.close()

    run_manager(check)


def test_page_indices_follow_the_sliding_window():
    """get_base_page_indices has a page for every block of full attention
    and, for the sliding window, BAD_PAGE_INDEX for blocks the window left;
    a buffer given to set_base_page_index_buf is kept up to date (and is
    what get_base_page_indices reads from then on)."""

    def check(m: Any, engine: FakeEngine) -> None:
        full, swa = m.get_layer_group_id(0), m.get_layer_group_id(1)
        tokens = list(range(6 * TOKENS_PER_BLOCK))
        cache = m.create_kv_cache()
        buf = array.array("i", [7]) * 8
        assert cache.resume(engine.io.stream)
        cache.set_base_page_index_buf(kv2.DEFAULT_BEAM_INDEX, swa, memoryview(buf))
        for b in range(6):
            assert cache.resize((b + 1) * TOKENS_PER_BLOCK)
            block = tokens[b * TOKENS_PER_BLOCK:(b + 1) * TOKENS_PER_BLOCK]
            engine.step(cache, tokens[:b * TOKENS_PER_BLOCK], block)
            cache.commit(block)
        assert cache.num_blocks == 6
        assert kv2.BAD_PAGE_INDEX not in list(cache.get_base_page_indices(full))
        # The window keeps the blocks from (history + 1 - window) // tokens_per_block on.
        kept = (len(tokens) + 1 - WINDOW) // TOKENS_PER_BLOCK
        swa_idx = list(buf[:6])
        assert swa_idx[:kept] == [kv2.BAD_PAGE_INDEX] * kept and kv2.BAD_PAGE_INDEX not in swa_idx[kept:]
        assert list(buf[6:]) == [kv2.BAD_PAGE_INDEX] * 2, "past the blocks: BAD_PAGE_INDEX"
        engine.check(cache, tokens)
        cache.close()

    run_manager(check)


def test_statistics_count_allocation_and_reuse():
    """Storage statistics per pool group; the iteration statistics per layer
    group count reused blocks once the cache commits its pending stats."""

    def check(m: Any, engine: FakeEngine) -> None:
        for st in m.get_storage_statistics(kv2.GPU_LEVEL):
            assert st.total > 0 and 0 <= st.available <= st.total and st.slot_sizes
        prompt = list(range(3 * TOKENS_PER_BLOCK))
        serve(m, engine, prompt, [])
        m.get_and_reset_iteration_stats()
        cache = m.create_kv_cache(kv2.ReuseScope(), prompt + [999], id=7)
        assert cache.num_committed_tokens == len(prompt)
        cache.commit_pending_stats()
        stats = m.get_and_reset_iteration_stats()
        assert set(stats) == {m.get_layer_group_id(0), m.get_layer_group_id(1)}
        assert stats[m.get_layer_group_id(0)].iter_reused_blocks == 3
        cache.close()

    run_manager(check)


def test_events_report_created_and_stored_blocks():
    """A KVCacheEventManager handed to the manager reports its layer groups
    (created) and, after the iteration's flush, the committed blocks (stored)."""
    events = kv2.KVCacheEventManager(1000)

    def check(m: Any, engine: FakeEngine) -> None:
        prompt = list(range(2 * TOKENS_PER_BLOCK))
        serve(m, engine, prompt, [])
        events.flush_iteration_events()
        kinds = [type(e.data).__name__ for e in events.get_latest_events(0)]
        assert "KVCacheCreatedData" in kinds and "KVCacheStoredData" in kinds

    run_manager(check, event_manager=events)


def test_lifecycle_guards():
    """Commits stop at is_end; shutdown() and clear_reusable_blocks() refuse
    while a cache is open; cleared, the tree reuses nothing."""

    def check(m: Any, engine: FakeEngine) -> None:
        prompt = list(range(2 * TOKENS_PER_BLOCK))
        cache = m.create_kv_cache(kv2.ReuseScope(), prompt)
        assert cache.resume(engine.io.stream) and cache.resize(len(prompt))
        engine.step(cache, [], prompt)
        cache.commit(prompt, is_end=True)
        for refused in (m.shutdown, m.clear_reusable_blocks):
            try:
                refused()
                raise AssertionError(f"{refused.__name__} did not refuse")
            except RuntimeError as e:
                assert "1 KV cache(s) still open" in str(e)
        try:
            cache.commit([1])
            raise AssertionError("a commit after is_end was accepted")
        except (RuntimeError, ValueError):
            pass
        cache.close()
        assert m.probe_reuse(kv2.ReuseScope(), prompt) == len(prompt)
        m.clear_reusable_blocks()
        assert m.probe_reuse(kv2.ReuseScope(), prompt) == 0

    run_manager(check)


def main(argv: list[str]) -> int:
    if "--device" in argv:
        os.environ["KVCM2_PROGRAM_DEVICE"] = argv[argv.index("--device") + 1]
    checks = [(n, f) for n, f in sorted(globals().items()) if n.startswith("test_") and callable(f)]
    failed = 0
    for name, fn in checks:
        try:
            fn()
            print(f"ok   {name}")
        except Exception as e:  # report every check, then the count
            failed += 1
            print(f"FAIL {name}: {type(e).__name__}: {e}")
    print(f"{len(checks) - failed} of {len(checks)} checks passed (device: {required_device()})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
