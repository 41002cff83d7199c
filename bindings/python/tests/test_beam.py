"""Beam search through the binding, with KVCacheManagerV2's names: the beam
width (get and set, and when it may change), page indices per beam, commit
with beam_search_indices (beams taking over another beam's history), the
shared prefix and the copy of the diverging block, each beam's KV bytes."""

from __future__ import annotations

import array

import pytest
from conftest import small_config
from engine import FakeEngine

import kvcm
from kvcm import InvalidArgumentError, InvalidStateError, KVCacheManager, OutOfPagesError

PROMPT = list(range(500, 510))  # 4 a block: two full blocks and two tokens


@pytest.fixture
def beams(backend):
    """A manager, its fake engine, and an ACTIVE cache whose prompt KV is
    written and committed."""
    cfg = small_config()
    with KVCacheManager(cfg, device="emu") as m:
        eng = FakeEngine(m, cfg, seed=5)
        c = m.create_kv_cache(None, PROMPT)
        assert c.resume(eng.stream)
        assert c.resize(len(PROMPT))
        eng.write(c, PROMPT, 0, len(PROMPT))
        c.commit(PROMPT)
        yield m, eng, c
        c.close()
        eng.close()


def test_beam_width_starts_at_one_and_changes_only_when_active(manager):
    with manager.create_kv_cache(None, PROMPT) as c:
        assert c.beam_width == 1
        with pytest.raises(InvalidStateError):
            c.beam_width = 2
        c.resume(manager.create_stream())
        for bad in (0, kvcm.MAX_BEAM_WIDTH + 1):
            with pytest.raises(InvalidArgumentError, match="beam_width"):
                c.beam_width = bad
        c.beam_width = 4
        assert c.beam_width == 4
        c.suspend()
        assert c.beam_width == 4


def test_forked_beams_share_the_prefix_and_copy_the_diverging_block(beams):
    m, eng, c = beams
    lg = m.get_layer_group_id(0)
    c.beam_width = 3
    zero = list(c.get_base_page_indices(lg))
    assert zero == list(c.get_base_page_indices(lg, kvcm.DEFAULT_BEAM_INDEX))
    for k in (1, 2):
        idx = list(c.get_base_page_indices(lg, k))
        assert idx[:2] == zero[:2], "the full blocks are shared"
        assert idx[2] != zero[2], "the diverging block is the beam's own"
        eng.verify(c, PROMPT, 0, len(PROMPT), beam=k)
    with pytest.raises(InvalidArgumentError, match="beam_id"):
        c.get_page_indices(lg, 3)


def test_commit_with_beam_search_indices_takes_over_another_beams_history(beams):
    m, eng, c = beams
    lg = m.get_layer_group_id(0)
    c.beam_width = 2
    hyps = [list(PROMPT), list(PROMPT)]
    for pos in (10, 11):  # two decode steps, a token of its own in each beam
        assert c.resize(pos + 1)
        for k in (0, 1):
            hyps[k].append(900 + 10 * k + pos)
            eng.write(c, hyps[k], pos, pos + 1, beam=k)
        c.history_length = pos + 1
    view = c.get_base_page_indices(lg, 1)
    buf = array.array("i", [7] * 8)
    c.set_base_page_index_buf(0, lg, memoryview(buf))

    with pytest.raises(InvalidArgumentError, match="beam_search_indices"):
        c.commit([], [0, 2])
    with pytest.raises(InvalidArgumentError, match="beam_search_indices"):
        c.commit([], [0])
    c.commit([], [1, 1])  # beam 1 won both places
    for k in (0, 1):
        eng.verify(c, hyps[1], 0, 12, beam=k)
    assert list(buf[:3]) == list(c.get_page_indices(lg)), "the caller's buffer follows beam 0"
    assert list(view) == list(c.get_page_indices(lg, 1)), "the view follows beam 1"

    # The converged tokens complete block 2: it is committed once, from
    # beam 0, and both beams read that page.
    c.commit(hyps[1][10:12], [0, 0])
    assert c.num_committed_tokens == 12
    assert c.get_page_indices(lg)[2] == c.get_page_indices(lg, 1)[2]
    assert m.probe_reuse(None, hyps[1]) == 12


def test_failed_beam_calls_change_nothing(backend):
    cfg = small_config(gpu_quota=4 * 1024)
    with KVCacheManager(cfg, device="emu") as m:
        lg = m.get_layer_group_id(0)
        with m.create_kv_cache(None, PROMPT) as c:
            assert c.resume(m.create_stream())
            assert c.resize(len(PROMPT))
            c.commit(PROMPT)
            width = 1
            try:
                while True:  # fork until the GPU has no room for another copy
                    c.beam_width = width + 1
                    width += 1
            except OutOfPagesError:
                pass
            assert width > 1 and c.beam_width == width
            before = [list(c.get_page_indices(lg, k)) for k in range(width)]
            with pytest.raises(InvalidArgumentError):
                c.commit(PROMPT[:1], [0] * width)  # past the capacity
            assert c.num_committed_tokens == len(PROMPT)
            assert [list(c.get_page_indices(lg, k)) for k in range(width)] == before
            c.beam_width = 1
            assert c.beam_width == 1
