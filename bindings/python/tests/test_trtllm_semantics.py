"""KVCacheManagerV2's reuse, commit and lifecycle semantics through the
binding: the manager's and the cache's operations with their names,
signatures and results."""

from __future__ import annotations

import array
from typing import NamedTuple

import pytest
from conftest import prefill, small_config

from kvcm import InvalidArgumentError, InvalidStateError, KVCacheManager, OutOfPagesError

PROMPT = list(range(1000, 1020))


class Scope(NamedTuple):
    """A stand-in for KVCacheManagerV2's ReuseScope: any object with
    lora_id and salt is a scope."""

    lora_id: int | None = None
    salt: int | None = None


def serve(m, tokens, scope=None):
    s = m.create_stream()
    with m.create_kv_cache(scope, tokens) as c:
        assert c.resume(s)
        prefill(c, tokens)


def test_a_fully_cached_prompt_is_reused_whole(manager):
    """8 committed tokens at 4 a block: KVCacheManagerV2 reuses 8, so does kvcm."""
    serve(manager, PROMPT[:8])
    assert manager.probe_reuse(None, PROMPT[:8]) == 8
    with manager.create_kv_cache(None, PROMPT[:8]) as c:
        assert c.num_committed_tokens == c.history_length == c.capacity == 8
        assert c.committed_tokens == PROMPT[:8]


def test_lora_id_none_and_zero_are_different_scopes(manager):
    serve(manager, PROMPT[:8], Scope(lora_id=0))
    assert manager.probe_reuse(Scope(lora_id=0), PROMPT[:8]) == 8
    assert manager.probe_reuse(Scope(), PROMPT[:8]) == 0
    assert manager.probe_reuse(None, PROMPT[:8]) == 0
    assert manager.probe_reuse(PROMPT[:8], lora_task_id=0) == 0, "kvcm's lora_task_id 0 stays no adapter"
    serve(manager, PROMPT[:8], Scope(salt=0))
    assert manager.probe_reuse(Scope(salt=0), PROMPT[:8]) == 8
    assert manager.probe_reuse(Scope(salt=1), PROMPT[:8]) == 0
    with manager.create_kv_cache(Scope(lora_id=0), PROMPT[:8]) as c:
        assert c.reuse_scope == Scope(lora_id=0)
    with pytest.raises(TypeError, match="reuse_scope"):
        manager.probe_reuse(Scope(), PROMPT, lora_task_id=1)


def test_probe_first_new_block_key_names_the_block_to_commit(manager):
    k0 = manager.probe_first_new_block_key(Scope(), PROMPT[:12])
    assert isinstance(k0, bytes) and len(k0) == 8
    serve(manager, PROMPT[:4])
    k1 = manager.probe_first_new_block_key(Scope(), PROMPT[:12])
    assert k1 != k0
    events = {e.key.to_bytes(8, "little") for e in manager.drain_events()}
    assert k0 in events, "the first block's key is the key its commit published"
    assert manager.probe_first_new_block_key(Scope(), PROMPT[:7]) is None


def test_probe_first_new_block_key_takes_probe_reuses_parameter_names(manager):
    """probe_first_new_block_key(reuse_scope, input_tokens), as probe_reuse
    (docs/trtllm.md): a keyword call answers as the positional one, and a bad
    token is refused naming input_tokens."""
    serve(manager, PROMPT[:4])
    positional = manager.probe_first_new_block_key(Scope(), PROMPT[:12])
    assert manager.probe_first_new_block_key(reuse_scope=Scope(), input_tokens=PROMPT[:12]) == positional
    with pytest.raises((TypeError, ValueError, OverflowError), match="input_tokens"):
        manager.probe_first_new_block_key(Scope(), [1, 2, 1 << 40, 3])


def test_shutdown_refuses_while_caches_are_open(config):
    """shutdown and clear_reusable_blocks refuse, changing nothing, while
    caches are open, with KVCM2's message (the call's name and the count);
    the error is a RuntimeError, as KVCM2's C++ backend raises."""
    m = KVCacheManager(config, device="emu")
    serve(m, PROMPT)
    c = m.create_kv_cache()
    with pytest.raises(InvalidStateError, match=r"shutdown\(\) with 1 KV cache\(s\) still open"):
        m.shutdown()
    assert not m.closed
    with pytest.raises(RuntimeError, match=r"clear_reusable_blocks\(\) with 1 KV cache\(s\) still open"):
        m.clear_reusable_blocks()
    assert m.probe_reuse(None, PROMPT) == len(PROMPT), "the refused clear changed nothing"
    c.close()
    m.shutdown()
    assert m.closed
    m.shutdown()  # no-op once closed


def test_clear_reusable_blocks_drops_every_committed_block(manager):
    serve(manager, PROMPT)
    assert manager.probe_reuse(None, PROMPT) == 20
    manager.clear_reusable_blocks()
    assert manager.probe_reuse(None, PROMPT) == 0
    assert all(s.free == s.total for s in manager.get_storage_stats(0))


def test_commit_advances_history_length(manager):
    s = manager.create_stream()
    with manager.create_kv_cache() as c:
        c.resume(s)
        c.capacity = 8
        c.commit(PROMPT[:6])
        assert c.history_length == 6 and c.num_committed_tokens == 6
        c.history_length = 7
        assert c.history_length == 7
        c.commit(PROMPT[6:7], None, True)
        with pytest.raises(InvalidStateError):
            c.commit(PROMPT[7:8])
        with pytest.raises(InvalidStateError):
            c.commit([1], [0])


def test_resume_and_resize_answer_false_when_out_of_pages(config):
    config.cache_tiers[0].quota = 8 * 512  # a few pages
    with KVCacheManager(config, device="emu") as m:
        s = m.create_stream()
        with m.create_kv_cache() as c:
            assert c.resume(s)
            assert c.resize(1 << 16) is False
            assert c.capacity == 0
            with pytest.raises(OutOfPagesError):
                c.capacity = 1 << 16
            c.suspend()
            assert c.resume() is True, "None resumes on the last stream"
            assert c.cuda_stream is s


def test_cuda_stream_setter_moves_the_cache(manager):
    s1, s2 = manager.create_stream(), manager.create_stream()
    with manager.create_kv_cache() as c:
        c.cuda_stream = s1
        assert c.resume() is True
        c.resize(8)
        c.cuda_stream = s2
        assert c.cuda_stream is s2
        c.commit(PROMPT[:8])
        c.suspend()
        assert c.resume() and c.cuda_stream is s2


def test_base_page_indices_are_a_view_kept_up_to_date(manager):
    s = manager.create_stream()
    lg = manager.get_layer_group_id(0)
    with manager.create_kv_cache() as c:
        c.resume(s)
        c.resize(8)
        v = c.get_base_page_indices(lg)
        assert v is c.get_base_page_indices(lg), "no copy per call"
        assert list(v) == list(c.get_page_indices(lg))
        buf = array.array("i", [7] * 6)
        c.set_base_page_index_buf(0, lg, memoryview(buf))
        assert list(buf[:2]) == list(v) and list(buf[2:]) == [-1] * 4
        c.resize(16)
        assert list(buf[:4]) == list(c.get_page_indices(lg)) and buf[4] == -1, "updated by resize"
        assert list(c.get_base_page_indices(lg)) == list(buf)
        with pytest.raises(InvalidArgumentError, match="beam_id"):
            c.get_base_page_indices(lg, 1)
        c.set_base_page_index_buf(0, lg, None)
        assert list(c.get_base_page_indices(lg)) == list(c.get_page_indices(lg))
        assert list(c.get_page_indices(lg, 0)) == list(c.get_page_indices(lg))
        with pytest.raises(InvalidArgumentError, match="beam"):
            c.get_page_indices(lg, 1)


def test_base_page_index_buf_of_a_suspended_cache_fills_on_resume(manager):
    """A buffer given to a SUSPENDED cache reads -1 for every block (no GPU
    page is held) and gets the page indices when the cache resumes."""
    s = manager.create_stream()
    lg = manager.get_layer_group_id(0)
    with manager.create_kv_cache() as c:
        buf = array.array("i", [7] * 4)
        c.set_base_page_index_buf(0, lg, memoryview(buf))
        assert list(buf) == [-1] * 4
        assert c.resume(s) and c.resize(8)
        assert list(buf[:2]) == list(c.get_page_indices(lg)) and -1 not in buf[:2]
        c.suspend()
        assert list(c.get_page_indices(lg)) == [-1, -1]
        buf2 = array.array("i", [7] * 3)
        c.set_base_page_index_buf(0, lg, memoryview(buf2))
        assert list(buf2) == [-1] * 3
        assert c.resume(s)
        assert list(buf2[:2]) == list(c.get_page_indices(lg)) and -1 not in buf2[:2]


def test_manager_resize_returns_false_and_tries_its_best(config):
    config.cache_tiers[0].max_quota = 2 * config.cache_tiers[0].quota
    with KVCacheManager(config, device="emu") as m:
        q = m.get_quota(0)
        assert m.resize(0, 4 * q) is False, "beyond max_quota"
        assert m.get_quota(0) == q
        assert m.resize(0, 4 * q, best_efforts=True) is True
        assert q < m.get_quota(0) < 4 * q, "as far as max_quota lets it"


def test_prefetch_answers_a_bool(config):
    cfg = small_config(host_quota=64 * 1024)
    with KVCacheManager(cfg, device="emu") as m:
        with m.create_kv_cache() as c:
            assert c.prefetch(0) is True


def test_priority_callback_gets_life_cycles(manager):
    """The callback gets a LifeCycle per layer group, as KVCM2 an object
    that is not an int, with KVCM2's window_size, num_sink_blocks and
    get_stale_range (and kvcm's layer_group_id: int(lc))."""
    s = manager.create_stream()
    seen = []
    with manager.create_kv_cache(None, PROMPT[:4], None, lambda b, lc: seen.append((b, lc)) or 90) as c:
        c.resume(s)
        c.capacity = 4
        c.commit(PROMPT[:4])
    assert not any(isinstance(lc, int) for _, lc in seen)
    assert sorted(int(lc) for _, lc in seen) == list(range(manager.num_layer_groups))
    assert all(lc == lc.layer_group_id and [10, 11][lc] == 10 + int(lc) for _, lc in seen)
    assert {lc.window_size for _, lc in seen} == {None, 8}
    # KVCM2's AttnLifeCycle.get_stale_range(history_length, tokens_per_block):
    # the blocks past the sinks out of the window an input token at
    # history_length still sees (window 8, 4 tokens a block).
    swa = next(lc for _, lc in seen if lc.window_size == 8)
    full = next(lc for _, lc in seen if lc.window_size is None)
    assert (swa.get_stale_range(16, 4).beg, swa.get_stale_range(16, 4).end) == (0, 2)
    assert not swa.get_stale_range(7, 4) and not full.get_stale_range(100, 4)


def test_text_only_caches_refuse_digest_tokens(manager):
    """KVCM2's text_only: a text-only cache refuses multimodal digest tokens
    at creation and in commits, naming them; a plain cache takes them."""
    with pytest.raises(TypeError, match="text-only cache"):
        manager.create_kv_cache(None, [1, 2, b"\0" * 32], text_only=True)
    with manager.create_kv_cache(None, [1, 2, b"\0" * 32], text_only=False) as c:
        assert not c.text_only
    s = manager.create_stream()
    with manager.create_kv_cache(None, [1, 2], text_only=True) as c:
        assert c.text_only
        c.resume(s)
        c.capacity = 4
        with pytest.raises(TypeError, match="text-only cache"):
            c.commit([1, b"\1" * 32])
        assert c.num_committed_tokens == 0
        c.suspend()


def test_a_stream_object_with_cuda_stream_is_its_handle(manager):
    class TorchLikeStream:  # torch.cuda.Stream's attribute
        cuda_stream = 0x7F00_0000_2000

    s = TorchLikeStream()
    with manager.create_kv_cache() as c:
        assert c.resume(s) is True
        assert c.cuda_stream is s
        c.capacity = 4
        c.cuda_stream = TorchLikeStream()
        c.commit(PROMPT[:4])


def test_a_partial_match_is_checked_at_its_endpoint(backend):
    """With partial reuse, a match ending in a partial block is usable where
    every layer group has the pages it needs at that endpoint: the sliding
    window that moved on over the partial tokens needs no page of a block it
    left, though that page is missing at the block boundary
    (TestPartialCoverageReuse's rewind endpoint)."""
    with KVCacheManager(small_config(enable_partial_reuse=True), device="emu") as m:
        s = m.create_stream()
        long = list(range(500, 524))
        with m.create_kv_cache(None, long) as a:  # history 24 at once: no window page of blocks 0-3
            assert a.resume(s)
            assert a.resize(24, 24)
            a.commit(long)
        base = long[:11]
        with m.create_kv_cache(None, base) as b:
            assert b.num_committed_tokens == 0, "at 8 tokens the window needs block 0's missing page"
            assert b.resume(s)
            assert b.resize(11, 11)
            b.commit(base)
        assert m.probe_reuse(None, base + [99]) == 11
        with m.create_kv_cache(None, base + [99]) as c:
            assert c.num_committed_tokens == 11
            assert c.resume(s)


def test_commit_is_end_publishes_the_partial_tail_at_once(backend):
    """KVCacheManagerV2 commits the trailing partial block when commits stop:
    another cache reuses it while the first stays open."""
    with KVCacheManager(small_config(enable_partial_reuse=True), device="emu") as m:
        s = m.create_stream()
        with m.create_kv_cache(None, PROMPT[:10]) as c:
            assert c.resume(s)
            assert c.resize(10, 10)
            c.commit(PROMPT[:10], is_end=True)
            assert m.probe_reuse(None, PROMPT[:10] + [7]) == 10


def test_probe_reuse_pages_report_the_widest_page_of_each_block(backend):
    """The pages of a reuse match with the tokens each covers: a partial block
    committed beside a shorter one covers a rewind endpoint with its wider page."""
    with KVCacheManager(small_config(enable_partial_reuse=True), device="emu") as m:
        full = m.get_layer_group_id(0)
        serve(m, PROMPT[:10])
        serve(m, PROMPT[:11])
        n, pages = m.probe_reuse_pages(None, PROMPT[:10] + [7], full, enable_partial=True)
        assert n == 10
        assert [p.covered for p in pages] == [4, 4, 3]
        assert all(p.level == 0 and p.slot >= 0 for p in pages)
        n, pages = m.probe_reuse_pages(Scope(), PROMPT[:9], full)
        assert (n, len(pages)) == (8, 2), "without partial a match ends inside a block only where it holds one whole"
        assert m.probe_reuse_pages(Scope(lora_id=0), PROMPT[:10], full, True) == (0, [])
        with pytest.raises(InvalidArgumentError, match="layer_group"):
            m.probe_reuse_pages(None, PROMPT[:10], 9)


def test_is_commit_allowed_until_commits_stop():
    """A cache takes commits until stop_committing, a commit with is_end or
    close: is_commit_allowed says which (the answer of KVCacheManagerV2's
    _introspection.is_commit_allowed)."""
    m = KVCacheManager(small_config())
    try:
        s = m.create_stream()
        for stop in ("stop_committing", "is_end", "close"):
            c = m.create_kv_cache(None, PROMPT)
            assert c.resume(s) and c.resize(8)
            assert c.is_commit_allowed
            if stop == "stop_committing":
                c.stop_committing()
            elif stop == "is_end":
                c.commit(PROMPT[:8], is_end=True)
            assert c.is_commit_allowed == (stop == "close"), stop
            c.close()
            assert not c.is_commit_allowed, stop
    finally:
        m.shutdown()
