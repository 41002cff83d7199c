"""The fresh run through Python (kvcm extension: create_kv_cache's
fresh_blocks and fresh_from_block, the cache's fresh_range): the contract of
core/freshrun_test.go, on both backends, with a fake engine writing and
checking the page bytes through the pool base addresses."""

from __future__ import annotations

import pytest
from conftest import small_config
from engine import FakeEngine

import kvcm
from kvcm import AttentionLayerConfig, BufferConfig, GpuCacheTierConfig, HostCacheTierConfig, KVCacheManager
from kvcm import MigrationPath

PROMPT = list(range(16))  # 4 blocks of 4 tokens
OTHER = list(range(500, 516))
# Two full-attention layers with key and value: 4 buffers of 16 bytes a token.
BUFFERS_PER_POSITION = 4


def tiered_config() -> kvcm.KVCacheManagerConfig:
    """4 GPU pages and 8 host pages of one layer group (2 layers x key/value
    x 64 bytes a block)."""
    layers = [AttentionLayerConfig(i, [BufferConfig("key", 64), BufferConfig("value", 64)]) for i in (0, 1)]
    return small_config(tiers=[GpuCacheTierConfig(4 * 256, pool_granularity=0), HostCacheTierConfig(8 * 256)],
                        layers=layers)


def compute(m: KVCacheManager, engine: FakeEngine, tokens: list[int]) -> None:
    with m.create_kv_cache(input_tokens=tokens) as c:
        c.resume(engine.stream)
        c.resize(len(tokens))
        engine.write(c, tokens, 0, len(tokens))
        c.commit(tokens)


def onboarded(m: KVCacheManager) -> int:
    return m.get_migration_stats()[MigrationPath.HOST_TO_GPU].pages


@pytest.fixture
def pushed(backend):
    """A manager where PROMPT's 4 blocks, computed by the engine of seed 1,
    were pushed to host by another prompt; the engines of seeds 1 and 2."""
    cfg = tiered_config()
    with KVCacheManager(cfg, device="emu") as m:
        first = FakeEngine(m, cfg, seed=1)
        second = FakeEngine(m, cfg, seed=2, stream=first.stream)
        compute(m, first, PROMPT)
        compute(m, first, OTHER)
        assert m.get_storage_stats(1)[0].evictable == 4, "the prompt's 4 blocks went to host"
        yield m, first, second
        first.close()
        second.close()


def checked(engine: FakeEngine, cache: kvcm._KVCache, frm: int, to: int) -> int:
    """Verify positions [frm, to) against engine's bytes (it asserts each);
    return how many buffer positions it checked."""
    engine.verify(cache, PROMPT, frm, to)
    return len(engine.read(cache, frm, to))


def test_the_run_is_computed_while_the_tail_is_onboarded(pushed):
    """A cache created with a fresh run of the first 2 blocks reuses the
    whole prefix (its history), gets fresh GPU pages for the run and
    onboards only the 2 blocks after it, which hold the first engine's
    bytes. Nothing is committed until the run is; the engine writes the
    run's KV and commits exactly its tokens, the commit completing it
    joining the tail. The next cache reuses
    all 4 blocks from the GPU: the run's blocks hold the bytes the engine
    computed, the tail the first engine's. The tail is read after
    wait_fresh_tail (resume orders the stream after the run's pages only),
    which is idempotent and refused on a SUSPENDED cache."""
    m, first, second = pushed
    before = onboarded(m)
    c = m.create_kv_cache(input_tokens=PROMPT, fresh_blocks=2)
    assert c.fresh_range == (0, 8)
    assert c.reused_tokens == 16, "reused: the whole matched prefix, the run included"
    assert c.history_length == 16
    assert c.num_committed_tokens == 0, "nothing committed until the run is"
    with pytest.raises(kvcm.InvalidStateError, match="SUSPENDED"):
        c.wait_fresh_tail(first.stream)
    assert c.resume(first.stream)
    assert onboarded(m) - before == 2, "only the tail's 2 blocks come up (one layer group)"
    c.wait_fresh_tail()  # resume left the tail's onboarding to it
    c.wait_fresh_tail(first.stream)  # idempotent
    assert checked(first, c, 8, 16) == 8 * BUFFERS_PER_POSITION, "the tail holds the first engine's bytes"

    second.write(c, PROMPT, 0, 8)
    with pytest.raises(kvcm.InvalidArgumentError, match="tokens"):
        c.commit(PROMPT[:12])
    assert c.num_committed_tokens == 0, "a commit past the run changes nothing"
    c.commit(PROMPT[:4])
    assert c.num_committed_tokens == 4
    c.commit(PROMPT[4:8])
    assert c.num_committed_tokens == 16, "the run's commit joins the tail"
    assert c.committed_tokens == PROMPT
    c.close()

    with m.create_kv_cache(input_tokens=PROMPT) as d:
        assert d.reused_tokens == 16
        assert d.fresh_range == (0, 0), "no run asked: none"
        mid = onboarded(m)
        assert d.resume(first.stream)
        assert onboarded(m) == mid, "reused from the GPU, nothing onboarded"
        assert checked(second, d, 0, 8) == 8 * BUFFERS_PER_POSITION, "the run the engine computed"
        assert checked(first, d, 8, 16) == 8 * BUFFERS_PER_POSITION, "the tail as first computed"


def test_commits_after_the_joined_tail_extend_the_chain(backend):
    """Commits go on past the joined tail as after any reuse, one decode
    token at a time included (the binding defers those again once the run
    is committed): the blocks after the prefix are published behind it, and
    a later request reuses all of it."""
    cfg = tiered_config()
    cfg.cache_tiers[0] = GpuCacheTierConfig(8 * 256, pool_granularity=0)
    with KVCacheManager(cfg, device="emu") as m:
        engine = FakeEngine(m, cfg, seed=1)
        compute(m, engine, PROMPT)
        prompt = PROMPT + list(range(900, 908))
        with m.create_kv_cache(input_tokens=prompt, fresh_blocks=1) as c:
            assert c.fresh_range == (0, 4)
            assert c.resume(engine.stream)
            assert c.resize(len(prompt), len(prompt))
            c.commit(prompt[:1])
            assert c._pending == [], "the run's commits reach the library at once"
            c.commit(prompt[1:4])
            assert c.num_committed_tokens == 16, "the run's commit joins the tail"
            c.commit(prompt[16:17])
            assert c._pending == prompt[16:17], "a decode token waits again"
            for t in prompt[17:]:
                c.commit([t])
            assert c.num_committed_tokens == 24
            assert c.committed_tokens == prompt
        assert m.probe_reuse(None, prompt + [7]) == 24
        engine.close()


def test_a_run_in_the_middle_keeps_the_block_before_it(pushed):
    """A run from block 1 keeps block 0 reused and committed; the run's
    commit follows it and joins the tail, every block holding the bytes of
    whoever computed it."""
    m, first, second = pushed
    with m.create_kv_cache(None, PROMPT, "mid", fresh_blocks=2, fresh_from_block=1) as c:
        assert c.fresh_range == (4, 12)
        assert c.num_committed_tokens == 4, "the block before the run is committed"
        assert c.resume(first.stream)
        second.write(c, PROMPT, 4, 12)
        c.commit(PROMPT[4:12])
        assert c.num_committed_tokens == 16
    with m.create_kv_cache(input_tokens=PROMPT) as d:
        assert d.resume(first.stream)
        assert checked(first, d, 0, 4) == 4 * BUFFERS_PER_POSITION
        assert checked(second, d, 4, 12) == 8 * BUFFERS_PER_POSITION
        assert checked(first, d, 12, 16) == 4 * BUFFERS_PER_POSITION


def test_a_run_reaching_the_match_end_is_a_cut(pushed):
    """A run reaching the match's end is a plain cut: no run, the prefix
    reused up to the run's start (here nothing)."""
    m, first, _ = pushed
    with m.create_kv_cache(input_tokens=PROMPT, fresh_blocks=4) as c:
        assert c.fresh_range == (0, 0)
        assert c.reused_tokens == 0


def test_bad_runs_raise_naming_the_argument(backend):
    """Bad runs are refused naming the argument, and create nothing:
    negative counts, a start without a run, values that are not ints or do
    not fit int64, and a layout with a sliding window. TensorRT-LLM's
    positional signature is unchanged: the run is keyword-only."""
    with KVCacheManager(tiered_config(), device="emu") as m:
        for kwargs, err, name in [
            ({"fresh_blocks": -1}, kvcm.InvalidArgumentError, "fresh_blocks"),
            ({"fresh_blocks": 1, "fresh_from_block": -1}, kvcm.InvalidArgumentError, "fresh_from_block"),
            ({"fresh_from_block": 1}, kvcm.InvalidArgumentError, "fresh_from_block"),
            ({"fresh_blocks": 1 << 70}, kvcm.InvalidArgumentError, "fresh_blocks"),
            ({"fresh_blocks": "2"}, TypeError, "fresh_blocks"),
            ({"fresh_blocks": True}, TypeError, "fresh_blocks"),
            ({"fresh_blocks": 1, "fresh_from_block": 1.0}, TypeError, "fresh_from_block"),
        ]:
            with pytest.raises(err, match=f"^{name}: |: {name}: "):
                m.create_kv_cache(input_tokens=PROMPT, **kwargs)
        assert m.num_open_caches() == 0
        with pytest.raises(TypeError):
            m.create_kv_cache(None, PROMPT, None, None, None, None, False, 2)
    with KVCacheManager(small_config(), device="emu") as w:
        with pytest.raises(kvcm.InvalidArgumentError, match="fresh_blocks: not supported with sliding-window"):
            w.create_kv_cache(input_tokens=PROMPT, fresh_blocks=1)
