"""SSM layers (KVCacheManagerV2's SsmLayerConfig): one fixed-size state per
request in a layer group of its own, snapshots where a commit ends on a
block boundary and at a partial last block published at close, reuse that
ends at the last snapshot, and the snapshot lookup statistics."""

from __future__ import annotations

import pytest
from conftest import small_config
from engine import FakeEngine

import kvcm
from kvcm import (
    BAD_PAGE_INDEX,
    AttentionLayerConfig,
    BufferConfig,
    InvalidArgumentError,
    InvalidConfigError,
    KVCacheManager,
    SsmCommitOffHistoryError,
    SsmLayerConfig,
    SsmSnapshotIterationStatsDelta,
)


def ssm_config(**kw):
    layers = [
        AttentionLayerConfig(0, [BufferConfig("key", 64), BufferConfig("value", 64)]),
        SsmLayerConfig(1, [BufferConfig("ssm_state", 256), BufferConfig("conv_state", 64)]),
    ]
    kw.setdefault("commit_min_snapshot", True)
    return small_config(layers=layers, **kw)


def compute_to(cache, tokens, n):
    """Grow, compute and commit up to n tokens in one commit."""
    cache.resize(max(n, cache.capacity))
    cache.commit(tokens[cache.num_committed_tokens:n])


def test_ssm_layers_need_commit_min_snapshot():
    """Without commit_min_snapshot the config's constructor refuses SSM layers
    (an InvalidConfigError naming the field and, as in KVCacheManagerV2, an
    AssertionError), and so does the manager for the field cleared later; a
    cap on SSM slots without SSM layers names max_ssm_slots."""
    with pytest.raises(AssertionError):
        ssm_config(commit_min_snapshot=False)
    with pytest.raises(InvalidConfigError, match="commit_min_snapshot") as e:
        ssm_config(commit_min_snapshot=False)
    assert e.value.field == "commit_min_snapshot"
    cfg = ssm_config()
    cfg.commit_min_snapshot = False
    with pytest.raises(InvalidConfigError, match="commit_min_snapshot") as e:
        KVCacheManager(cfg, device="emu")
    assert e.value.field == "commit_min_snapshot"
    with pytest.raises(InvalidConfigError, match="max_ssm_slots"):
        KVCacheManager(small_config(max_ssm_slots=2), device="emu")


def test_an_ssm_cache_holds_one_state_in_its_own_layer_group(backend):
    """The SSM layers form the last layer group, with no page per block: an
    ACTIVE cache has one SSM state whatever its length, and attention layer
    groups report BAD_PAGE_INDEX for it."""
    with KVCacheManager(ssm_config(), device="emu") as m:
        ssm = m.get_layer_group_id(1)
        assert ssm == 1 and [list(g) for g in m.layer_grouping] == [[0], [1]]
        with m.create_kv_cache(None, list(range(10))) as c:
            assert c.resume(m.create_stream())
            c.resize(10)
            slot = c.get_ssm_block_base_index(ssm)
            assert slot != BAD_PAGE_INDEX
            assert list(c.get_base_page_indices(ssm)) == [BAD_PAGE_INDEX] * 3
            assert c.get_ssm_block_base_index(0) == BAD_PAGE_INDEX
            c.resize(40)
            assert c.get_ssm_block_base_index(ssm) == slot


def test_a_model_of_ssm_layers_only_is_served(backend):
    """KVCacheManagerV2 takes a configuration of SSM layers only (a pure
    Mamba model): its one layer group is the SSM group, blocks have no page,
    and a snapshot at a block boundary is reused."""
    layers = [SsmLayerConfig(i, [BufferConfig("ssm_state", 256), BufferConfig("conv_state", 64)]) for i in (0, 1)]
    tokens = list(range(12))
    with KVCacheManager(small_config(layers=layers, commit_min_snapshot=True), device="emu") as m:
        assert [list(g) for g in m.layer_grouping] == [[0, 1]]
        ssm = m.get_layer_group_id(0)
        s = m.create_stream()
        with m.create_kv_cache(None, tokens) as a:
            assert a.resume(s)
            compute_to(a, tokens, 8)
            assert list(a.get_base_page_indices(ssm)) == [BAD_PAGE_INDEX] * 2
            assert a.get_ssm_block_base_index(ssm) != BAD_PAGE_INDEX
        assert m.probe_reuse(None, tokens) == 8
        with m.create_kv_cache(None, tokens) as b:
            assert b.num_committed_tokens == 8
            assert b.resume(s) and b.get_ssm_block_base_index(ssm) != BAD_PAGE_INDEX


def test_the_ssm_state_is_read_for_beam_0_only(backend):
    """get_ssm_block_base_index refuses a beam other than 0, naming beam_id:
    a cache has one SSM state."""
    with KVCacheManager(ssm_config(), device="emu") as m:
        ssm = m.get_layer_group_id(1)
        with m.create_kv_cache(None, list(range(10))) as c:
            assert c.resume(m.create_stream())
            c.resize(10)
            assert c.get_ssm_block_base_index(ssm, beam_id=0) != BAD_PAGE_INDEX
            with pytest.raises(InvalidArgumentError, match="beam_id"):
                c.get_ssm_block_base_index(ssm, beam_id=1)


def test_reuse_ends_at_the_last_snapshot_and_is_counted(backend):
    """A commit ending on a block boundary snapshots the state; a later
    prompt reuses up to the last snapshot into a state of its own, and each
    creation with input tokens counts one snapshot lookup, pending in the
    cache until commit_pending_stats (as in KVCM2)."""
    tokens = list(range(24))
    with KVCacheManager(ssm_config(), device="emu") as m:
        s = m.create_stream()
        with m.create_kv_cache(None, tokens) as a:
            assert m.get_and_reset_ssm_snapshot_iteration_stats() == {}, "pending in the cache"
            a.commit_pending_stats()
            assert a.resume(s)
            compute_to(a, tokens, 12)  # one commit of three blocks: a snapshot at 12
            compute_to(a, tokens, 18)  # ends mid-block: none
        assert m.get_and_reset_ssm_snapshot_iteration_stats() == {
            1: SsmSnapshotIterationStatsDelta(1, 0, 1, 0, 24, 0, 0)}
        assert [m.probe_reuse(None, tokens[:n]) for n in (24, 16, 12, 11)] == [12, 12, 12, 0]
        with m.create_kv_cache(None, tokens[:20]) as b:
            assert b.num_committed_tokens == 12
            assert b._get_num_reusable_tokens_before_pruning() == 16
            assert b._get_num_reusable_tokens_before_hybrid_pruning() == 16, "the snapshot cuts 16 to 12"
            assert b.resume(s)
            assert b.get_ssm_block_base_index(1) != BAD_PAGE_INDEX
            b.commit_pending_stats()
        got = m.get_and_reset_ssm_snapshot_iteration_stats()
        assert got == {1: SsmSnapshotIterationStatsDelta(1, 1, 0, 12, 8, 1, 0)}
        assert got[1].iter_snapshot_hit_rate == 1.0
        assert m.get_and_reset_ssm_snapshot_iteration_stats() == {}


def test_an_ssm_snapshot_lookup_leaves_the_cache_dirty_until_committed_or_discarded(backend):
    """A cache created with input tokens has its SSM snapshot lookup pending,
    so its id is dirty at once, also with no block counted (3 tokens at 4 a
    block), until commit_pending_stats or discard_pending_stats; a cache
    created without input tokens looks nothing up."""
    with KVCacheManager(ssm_config(), device="emu") as m:
        with m.create_kv_cache(None, [1, 2, 3], 5) as a:
            assert m.get_dirty_stats_kv_cache_ids() == {5}
            assert a.resume(m.create_stream())
            a.discard_pending_stats()
            assert m.get_dirty_stats_kv_cache_ids() == set()
            assert m.get_and_reset_ssm_snapshot_iteration_stats() == {}, "the discarded lookup never counts"
            assert a.resize(a.capacity)
            assert m.get_dirty_stats_kv_cache_ids() == set(), "the discarded lookup is no longer pending"
        with m.create_kv_cache(None, [1, 2, 3], 6) as b:
            assert m.get_dirty_stats_kv_cache_ids() == {6}
            b.commit_pending_stats()
            assert m.get_dirty_stats_kv_cache_ids() == set()
        with m.create_kv_cache(None, None, 7):
            assert m.get_dirty_stats_kv_cache_ids() == set()


def test_max_ssm_slots_caps_the_ssm_pool_group():
    """max_ssm_slots caps the SSM layer group's GPU slots; a constraint of
    zero-capacity requests (KVCM2's hybrid floor: states only) needs one slot
    per request, and a cap below that names max_ssm_slots."""
    with KVCacheManager(ssm_config(max_ssm_slots=3), device="emu") as m:
        descs = m.pool_group_descs
        assert descs[1].num_slots == 3
        assert descs[0].num_slots > 3
    states_only = [kvcm.BatchDesc([kvcm.KVCacheDesc(0, 0)] * 3)]
    with KVCacheManager(ssm_config(max_ssm_slots=3, constraints=states_only), device="emu") as m:
        assert m.pool_group_descs[1].num_slots == 3
    with pytest.raises(InvalidConfigError) as e:
        KVCacheManager(ssm_config(max_ssm_slots=2, constraints=states_only), device="emu")
    assert e.value.field == "max_ssm_slots"


def test_ssm_names_are_kvcm_s_own():
    """SsmLayerConfig and SsmSnapshotIterationStatsDelta are no longer model
    coverage."""
    assert kvcm.SsmLayerConfig is SsmLayerConfig
    d = SsmSnapshotIterationStatsDelta(iter_snapshot_lookups=2, iter_snapshot_hits=1)
    assert d.iter_snapshot_hit_rate == 0.5 and not d.empty


def test_ssm_manager_serves_events_priorities_and_clamping(backend):
    """The KVCM2 surfaces that walk the layers take SSM layers: an event
    manager, a priority callback (asked with the SSM LifeCycle), and
    clamp_max_seq_len_for_mem (one state per request)."""
    asked = []

    def priority(ordinal, lc):
        asked.append((int(lc), lc.is_ssm, lc.window_size))
        return 50

    em = kvcm.KVCacheEventManager(64)
    with KVCacheManager(ssm_config(max_ssm_slots=2), em, device="emu") as m:
        tokens = list(range(8))
        with m.create_kv_cache(None, tokens, custom_priority_callback=priority) as c:
            assert c.resume(m.create_stream())
            compute_to(c, tokens, 8)
        assert (1, True, None) in asked and (0, False, None) in asked
        em.flush_iteration_events()
        assert em.get_latest_events(0)
        assert m.clamp_max_seq_len_for_mem(3, 1 << 20) == 0, "two SSM slots hold two requests, not three"
        assert m.clamp_max_seq_len_for_mem(2, 64) == 64


def test_ssm_buffers_take_no_tokens_per_block_override():
    """An SSM layer's state is not a block of tokens: an override on its
    buffer raises InvalidConfigError naming it, in the layer's constructor
    (also an AssertionError, as KVCacheManagerV2 asserts it there) and, for
    an override set later, at manager creation."""
    with pytest.raises(AssertionError, match="SSM") as e:
        SsmLayerConfig(1, [BufferConfig("ssm_state", 256, tokens_per_block_override=2)])
    assert isinstance(e.value, InvalidConfigError) and e.value.field == "buffers[0].tokens_per_block_override"
    layers = [
        AttentionLayerConfig(0, [BufferConfig("key", 64)]),
        SsmLayerConfig(1, [BufferConfig("ssm_state", 256)]),
    ]
    layers[1].buffers[0].tokens_per_block_override = 2
    with pytest.raises(InvalidConfigError, match="SSM") as e:
        KVCacheManager(small_config(layers=layers, commit_min_snapshot=True), device="emu")
    assert e.value.field == "layers[1].buffers[0].tokens_per_block_override"


def test_a_partial_block_is_published_with_its_state_at_close(backend):
    """A cache closing with its commits ending mid-block publishes that block
    with the SSM state at its end: a prompt holding the whole block reuses up
    to there (an unaligned hit) from that state, KV and state byte for byte;
    without partial reuse only a prompt ending with it does."""
    tokens = list(range(16))
    for partial in (True, False):
        cfg = ssm_config(enable_partial_reuse=partial)
        with KVCacheManager(cfg, device="emu") as m:
            eng = FakeEngine(m, cfg, seed=3)
            s = m.create_stream()
            with m.create_kv_cache(None, tokens) as a:
                assert a.resume(s)
                assert a.resize(10, 0)
                eng.write(a, tokens, 0, 10)
                a.commit(tokens[:10])
            m.get_and_reset_ssm_snapshot_iteration_stats()
            assert m.probe_reuse(None, tokens[:14]) == (10 if partial else 0)
            assert m.probe_reuse(None, tokens[:9] + [99]) == 0, "the state is at 10, not 9"
            prompt = tokens[:14] if partial else tokens[:10]
            with m.create_kv_cache(None, prompt) as b:
                assert b.num_committed_tokens == 10
                assert b.resume(s)
                eng.verify(b, tokens, 0, 10)
                eng.verify_state(b, tokens, 10)
                b.commit_pending_stats()
            assert m.get_and_reset_ssm_snapshot_iteration_stats() == {
                1: SsmSnapshotIterationStatsDelta(1, 1, 0, 10, len(prompt) - 10, 0, 1)}
            eng.close()


def test_a_commit_off_the_history_raises_an_assertion_error(backend):
    """With SSM layers a commit that neither starts nor ends at the history
    length raises SsmCommitOffHistoryError, an InvalidArgumentError naming
    tokens and, as KVCacheManagerV2 reports it, an AssertionError; it
    changes nothing."""
    tokens = list(range(16))
    with KVCacheManager(ssm_config(), device="emu") as m:
        with m.create_kv_cache(None, tokens) as c:
            assert c.resume(m.create_stream())
            assert c.resize(12, 10)
            with pytest.raises(AssertionError):
                c.commit(tokens[:8])
            with pytest.raises(InvalidArgumentError, match="tokens: ") as e:
                c.commit(tokens[:8])
            assert isinstance(e.value, SsmCommitOffHistoryError)
            assert c.num_committed_tokens == 0
            c.commit(tokens[:10])
            assert c.num_committed_tokens == 10


def test_a_snapshot_without_a_gpu_slot_is_taken_on_the_host(backend):
    """While live states hold every GPU SSM slot, a block-boundary snapshot
    is taken on the host level; a later prompt resumes from it, KV and state
    byte for byte."""
    cfg = ssm_config(gpu_quota=64 * 1024, host_quota=64 * 1024, max_ssm_slots=2)
    tokens = list(range(16))
    with KVCacheManager(cfg, device="emu") as m:
        eng = FakeEngine(m, cfg, seed=4)
        s = m.create_stream()
        with m.create_kv_cache(None, [500, 501]) as holder:
            assert holder.resume(s)  # one GPU SSM slot
            with m.create_kv_cache(None, tokens) as a:
                assert a.resume(s)  # the other
                assert a.resize(8, 0)
                eng.write(a, tokens, 0, 8)
                a.commit(tokens[:8])
            host = m.get_storage_stats(1)
            assert host[1].total - host[1].free == 1, "the snapshot is on the host level"
        assert m.probe_reuse(None, tokens[:12]) == 8
        with m.create_kv_cache(None, tokens[:12]) as b:
            assert b.num_committed_tokens == 8
            assert b.resume(s)
            eng.verify(b, tokens, 0, 8)
            eng.verify_state(b, tokens, 8)
        eng.close()
