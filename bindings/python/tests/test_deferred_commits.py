"""The decode step's deferred commits and steps (manager.py,
_KVCache.__init__): a commit that stays inside the block being filled and
inside the history waits in the Python cache and reaches the library in one
commit before anything else observes the cache; a whole decode step (resize
by one token inside the block, commit it) waits too and reaches it in one
kvcm_kv_cache_decode_steps. Each test states the rule it checks; the reference
is a cache with a priority callback, which never defers, on a manager of its
own built from the same configuration."""

from __future__ import annotations

import random

import pytest
from conftest import small_config

from kvcm import (
    CacheStatus,
    ClosedError,
    InvalidArgumentError,
    InvalidStateError,
    KVCacheManager,
)

PROMPT = list(range(500, 510))  # 2 full blocks and 2 tokens at 4 tokens a block


def _pair(config, prompt=PROMPT):
    """(subject, reference) managers, streams and caches, prefilled alike."""
    out = []
    for ref in (False, True):
        m = KVCacheManager(config, device="emu")
        s = m.create_stream()
        cb = (lambda _b, _lc: 35) if ref else None
        c = m.create_kv_cache(input_tokens=prompt, custom_priority_callback=cb)
        assert c.resume(s)
        n = len(prompt)
        assert c.resize(n, n)
        c.commit(prompt[c.num_committed_tokens:])
        out.append((m, s, c))
    return out


def _observe(m, c):
    """Everything a caller can read of the cache and of its manager's tree."""
    lg = [m.get_layer_group_id(i) for i in range(3)]
    return dict(
        committed=c.num_committed_tokens,
        history=c.history_length,
        capacity=c.capacity,
        tokens=c.committed_tokens,
        status=c.status,
        cached=c.cached_tokens_by_level,
        pages=[list(c.get_page_indices(g)) for g in lg],
        base=[list(c.get_base_page_indices(g)) for g in lg],
        stats=m.stats,
        reusable=m.probe_reuse(None, c.committed_tokens),
    )


def _same_error(f_subject, f_reference):
    """Both calls raise the same error class and message, or neither does."""
    errs = []
    for f in (f_subject, f_reference):
        try:
            f()
            errs.append(None)
        except Exception as e:  # noqa: BLE001 - compared below
            errs.append((type(e), str(e)))
    assert errs[0] == errs[1]
    return errs[0]


@pytest.fixture(autouse=True)
def _both_backends(backend):
    """Every rule here holds through the compiled extension (its CacheStep:
    the decode step in C) and through the ctypes path alike."""
    return backend


@pytest.fixture
def pair():
    got = _pair(small_config())
    yield got
    for m, _s, _c in got:
        m.close()


def test_every_query_sees_the_deferred_commits(pair):
    """Rule: after each decode step (resize by one, commit one token), every
    query of the cache and of its manager reads what it reads when every
    commit reaches the library at once."""
    (m, _, c), (mr, _, r) = pair
    assert c._defers and not r._defers
    for k in range(13):
        for cache in (c, r):
            n = cache.num_committed_tokens
            assert cache.resize(n + 1, n + 1)
            cache.commit([900 + k])
        assert c._pending == ([] if (11 + k) % 4 == 0 else [900 + k]), "a commit completing no block waits"
        assert _observe(m, c) == _observe(mr, r)
        assert c._pending == [], "the queries flushed the waiting tokens"


def test_commits_wait_only_inside_the_block_and_the_history(pair):
    """Rule: only commits that complete no block and stay inside the history
    wait; one that completes a block publishes it in that call, and one past
    the history advances it in that call."""
    (m, _, c), _ = pair
    n = c.num_committed_tokens  # 10: two tokens into the third block
    c.resize(n + 4, n + 1)
    c.commit([1])
    assert c._pending == [1]
    assert m.probe_reuse(None, PROMPT + [1, 2]) == 8, "the partial block is not published"
    c.resize(n + 4, n + 2)
    c.commit([2])  # completes block 2: published now, with the waiting token
    assert c._pending == []
    assert m.probe_reuse(None, PROMPT + [1, 2]) == 12
    c.commit([3])  # past the history (12): the library advances it
    assert c._pending == [] and c.history_length == 13


def test_a_commit_that_does_not_wait_reaches_the_library_and_commits_wait_after_it(pair):
    """Rule: a commit of several tokens that completes a block reaches the
    library in that call, after the tokens waiting before it, and commits
    inside the next block wait again; an empty commit reaches it too; the
    cache reads what a cache that never defers reads."""
    (m, _, c), (mr, _, r) = pair
    for cache in (c, r):
        n = cache.num_committed_tokens  # 10: two tokens into the third block
        assert cache.resize(n + 8, n + 8)
        cache.commit([1])
    assert c._pending == [1]
    for cache in (c, r):
        cache.commit([2, 3, 4])  # completes block 2, one token into block 3
    assert c._pending == []
    assert m.probe_reuse(None, PROMPT + [1, 2]) == 12, "the block is published by that call"
    for cache in (c, r):
        cache.commit([5])
    assert c._pending == [5], "the commit after it waits inside the new block"
    for cache in (c, r):
        cache.commit([])
    assert c._pending == [], "an empty commit reaches the library, after the waiting token"
    assert _observe(m, c) == _observe(mr, r)


def test_suspend_and_resume_keep_the_deferred_commits(pair):
    """Rule: suspend is an observation: the waiting tokens are committed
    before it, and after resume the cache reads them."""
    (m, s, c), (mr, sr, r) = pair
    for cache, stream in ((c, s), (r, sr)):
        n = cache.num_committed_tokens
        cache.resize(n + 1, n + 1)
        cache.commit([7])
        cache.suspend()
        assert cache.resume(stream)
    assert _observe(m, c) == _observe(mr, r)


def test_close_publishes_the_deferred_partial_block():
    """Rule: with partial reuse the partial block is published at close, its
    deferred tokens included."""
    cfg = small_config(enable_partial_reuse=True)
    got = _pair(cfg)
    try:
        for _m, _s, cache in got:
            n = cache.num_committed_tokens
            cache.resize(n + 1, n + 1)
            cache.commit([7])
            cache.close()
        (m, _, _), (mr, _, _) = got
        assert m.probe_reuse(None, PROMPT + [7]) == mr.probe_reuse(None, PROMPT + [7]) == 11
    finally:
        for m, _s, _c in got:
            m.close()


def test_manager_close_with_deferred_commits_closes_the_cache(pair):
    """Rule: closing the manager commits its caches' waiting tokens, then
    closes them; the cache refuses calls afterwards, a deferrable commit
    included."""
    (m, _, c), _ = pair
    n = c.num_committed_tokens
    c.resize(n + 2, n + 2)
    c.commit([7])
    assert c._pending == [7]
    m.close()
    assert c.closed and c.status == CacheStatus.CLOSED
    with pytest.raises(ClosedError):
        c.commit([8])
    with pytest.raises(ClosedError):
        c.num_committed_tokens


def test_errors_are_raised_by_the_call_that_causes_them(pair):
    """Rule: a commit the library refuses is never deferred: it raises in
    that call the error (class and message) it raises without deferral, and
    changes nothing; the tokens deferred before it stay committed."""
    (m, s, c), (mr, sr, r) = pair
    for cache in (c, r):
        n = cache.num_committed_tokens
        cache.resize(n + 1, n + 1)
        cache.commit([7])
    # Past the capacity.
    err = _same_error(lambda: c.commit([1, 2]), lambda: r.commit([1, 2]))
    assert err is not None and err[0] is InvalidArgumentError and "capacity" in err[1]
    # Not a token id.
    for bad in ([2**31], [1.5], ["x"], [None]):
        err = _same_error(lambda: c.commit(bad), lambda: r.commit(bad))
        assert err is not None
    assert _observe(m, c) == _observe(mr, r)
    assert c.committed_tokens[-1] == 7
    # After stop_committing, and on a suspended cache.
    for cache in (c, r):
        n = cache.num_committed_tokens
        cache.resize(n + 2, n + 1)
        cache.commit([8])
    for cache, stream in ((c, s), (r, sr)):
        cache.suspend()
    err = _same_error(lambda: c.commit([9]), lambda: r.commit([9]))
    assert err is not None and err[0] is InvalidStateError
    for cache, stream in ((c, s), (r, sr)):
        assert cache.resume(stream)
        cache.stop_committing()
    err = _same_error(lambda: c.commit([9]), lambda: r.commit([9]))
    assert err is not None and err[0] is InvalidStateError
    assert _observe(m, c) == _observe(mr, r)


def test_the_caches_methods_keep_their_rules_for_every_call_form(pair, backend):
    """Rule: a cache's resize and commit (on the extension path the
    compiled step's, which the cache installs as its own) give what the
    class's methods give for every call form: keywords, None, too many
    arguments and bad values get the same result or error (class and
    message) as on a cache that never defers, and leave the two alike."""
    (m, _, c), (mr, _, r) = pair
    from kvcm import _native

    assert (c.resize.__self__ is c._st) == (backend == "extension" and _native._ext is not None)
    n = c.num_committed_tokens
    calls = [
        lambda x: x.resize(capacity=n + 4, history_length=n + 1),
        lambda x: x.resize(None, n + 2),
        lambda x: x.resize(n + 4),
        lambda x: x.resize(n + 4, None),
        lambda x: x.resize("x"),
        lambda x: x.resize(n + 4, -1),
        lambda x: x.resize(-1),
        lambda x: x.resize(2**70),
        lambda x: x.resize(True, n + 2),
        lambda x: x.resize(n + 4, n + 2, 5),
        lambda x: x.resize(),
        lambda x: x.commit(accepted_input_tokens=[7]),
        lambda x: x.commit([8], None, False),
        lambda x: x.commit((9,)),
        lambda x: x.commit([True]),
        lambda x: x.commit([]),
        lambda x: x.commit(),
        lambda x: x.resize(n + 400000, n + 4),
    ]
    def outcome(call, cache):
        try:
            return "returned", call(cache)
        except Exception as e:  # noqa: BLE001 - compared below
            return type(e), str(e)

    got = []
    for call in calls:
        got.append(outcome(call, c))
        assert got[-1] == outcome(call, r)
        assert _observe(m, c) == _observe(mr, r)
    assert got[-1] == ("returned", False), "a resize past the pages returns False"


def test_a_resize_keeps_the_statistics_mark_of_a_cache_with_an_id():
    """Rule: a cache with an id, on a manager with statistics, has its id
    marked dirty after every resize that leaves it pending statistics, and
    only then, however its resize runs (a marked id stays marked without a
    library query; the extension's step resizes a marked cache in C):
    after commit_pending_stats the mark is back with the next resize that
    allocates a block, not with one that allocates none; with its id set to
    None, none."""
    m = KVCacheManager(small_config(), device="emu")
    try:
        s = m.create_stream()
        c = m.create_kv_cache(input_tokens=PROMPT, id=7)
        assert c.resume(s)
        n = len(PROMPT)
        assert c.resize(n, n)
        assert m.get_dirty_stats_kv_cache_ids() == {7}
        for k in range(1, 4):
            assert c.resize(n + k, n + k)
            assert m.get_dirty_stats_kv_cache_ids() == {7}, "a marked id stays marked"
        c.commit_pending_stats()
        assert m.get_dirty_stats_kv_cache_ids() == set()
        assert c.resize(n + 4, n + 3), "no new block"
        assert m.get_dirty_stats_kv_cache_ids() == set(), "nothing pending: no mark"
        assert c.resize(n + 8, n + 4), "a new block"
        assert m.get_dirty_stats_kv_cache_ids() == {7}
        c.commit_pending_stats()
        assert m.get_dirty_stats_kv_cache_ids() == set()
        c.id = None
        assert c.resize(n + 12, n + 5)
        assert m.get_dirty_stats_kv_cache_ids() == set(), "no id: no mark"
        c.close()
    finally:
        m.close()


def test_a_cache_in_a_cycle_through_its_id_is_collected():
    """Rule: a cache unreachable but for a reference cycle through its
    statistics id (a request object holding its cache) is collected and
    closed by the garbage collector, its step state included."""
    import gc
    import weakref

    class Request:
        pass

    m = KVCacheManager(small_config(), device="emu")
    try:
        s = m.create_stream()
        c = m.create_kv_cache(input_tokens=PROMPT)
        assert c.resume(s)
        req = Request()
        req.cache, c.id = c, req
        assert c.resize(len(PROMPT) + 4, len(PROMPT))
        c.commit_pending_stats()  # the manager's dirty mark holds the id until then
        assert m.get_dirty_stats_kv_cache_ids() == set()
        gone = weakref.ref(c)
        del c, req
        gc.collect()
        assert gone() is None
        assert m.num_open_caches() == 0, "its finalizer closed it"
    finally:
        m.close()


def test_is_end_is_never_deferred(pair):
    """Rule: a commit with is_end reaches the library in that call; later
    commits are refused as without deferral."""
    (m, _, c), (mr, _, r) = pair
    for cache in (c, r):
        n = cache.num_committed_tokens
        cache.resize(n + 2, n + 1)
        cache.commit([7], is_end=True)
    assert c._pending == []
    err = _same_error(lambda: c.commit([8]), lambda: r.commit([8]))
    assert err is not None and err[0] is InvalidStateError
    assert _observe(m, c) == _observe(mr, r)


def _resize_move(rnd, most_advance):
    """A move of _random_walk: the same resize of both caches, growing the
    capacity by 0-3 tokens and the history by 0-most_advance within it."""
    def move(c, r):
        grow, adv = rnd.randint(0, 3), rnd.randint(0, most_advance)
        args = (lambda cache: (cache.capacity + grow, min(cache.capacity + grow, cache.history_length + adv)))
        _same_error(lambda: c.resize(*args(c)), lambda: r.resize(*args(r)))
    return move


def _random_walk(got, rnd, steps, moves, suspend_until):
    """Runs steps random moves on the deferring cache and its reference (got,
    from _pair): a draw from rnd below a move's bound (moves: (bound, move),
    the first bound that holds) runs move(c, r); else below suspend_until both
    caches are suspended and resumed, and above it what they show is
    compared. At the end they are compared, closed, and the managers'
    statistics must agree."""
    (m, s, c), (mr, sr, r) = got
    try:
        for step in range(steps):
            op = rnd.random()
            move = next((mv for bound, mv in moves if op < bound), None)
            if move is not None:
                move(c, r)
            elif op < suspend_until:
                for cache, stream in ((c, s), (r, sr)):
                    cache.suspend()
                    assert cache.resume(stream)
            else:
                assert _observe(m, c) == _observe(mr, r), f"step {step}"
        assert _observe(m, c) == _observe(mr, r)
        c.close()
        r.close()
        assert m.stats == mr.stats
    finally:
        m.close()
        mr.close()


@pytest.mark.parametrize("seed", range(6))
def test_random_steps_match_the_library(seed):
    """Rule: any sequence of resizes, commits (one to a few tokens, valid or
    not), queries and suspends reads and raises exactly as without deferral."""
    rnd = random.Random(seed)
    deferred = 0

    def commit(c, r):
        nonlocal deferred
        toks = [rnd.randint(0, 50) for _ in range(rnd.choice((1, 1, 1, 2, 3)))]
        end = rnd.random() < 0.01
        _same_error(lambda: c.commit(toks, is_end=end), lambda: r.commit(toks, is_end=end))
        deferred += bool(c._pending)

    _random_walk(_pair(small_config(enable_partial_reuse=bool(seed % 2))), rnd, 120,
                 [(0.35, _resize_move(rnd, 3)), (0.8, commit)], 0.85)
    assert deferred > 0, "some commits waited"


def _full_attention_config(**kw):
    from kvcm import AttentionLayerConfig, BufferConfig

    layers = [AttentionLayerConfig(i, [BufferConfig("key", 64), BufferConfig("value", 64)]) for i in range(3)]
    return small_config(layers=layers, **kw)


@pytest.mark.parametrize("windowed", [False, True])
def test_decode_steps_wait_inside_the_block_and_flush_when_it_fills(windowed):
    """Rule: a decode step (resize by one token, commit it) whose resize
    needs no page and moves no sliding window waits, resize and commit
    together, and reaches the library (kvcm_kv_cache_decode_steps) when the
    step fills the block; a resize that needs a page, or moves a window,
    reaches the library in its call. After each step every query reads what
    it reads without deferral."""
    cfg = small_config() if windowed else _full_attention_config()
    got = _pair(cfg)
    (m, _, c), (mr, _, r) = got
    try:
        waited = 0
        for k in range(14):
            n, before = c.num_committed_tokens, c._st.steps
            for cache in (c, r):
                assert cache.resize(n + 1, n + 1)
            moves = windowed and n + 2 > 8 and (n + 2 - 8) % 4 == 0
            deferred = n % 4 != 0 and not moves
            assert c._st.steps == (before + 1 if deferred else 0), f"step {k}: the resize waits, or flushes"
            for cache in (c, r):
                cache.commit([900 + k])
            waited += c._st.steps
            if (n + 1) % 4 == 0:
                assert c._st.pending == 0, "a step filling its block is flushed with it"
            assert c.num_committed_tokens == r.num_committed_tokens == n + 1
            assert c.history_length == r.history_length and c.capacity == r.capacity
            if k % 5 == 4:
                # Queries that register no page index views (those make
                # every resize take the library's path).
                assert (c.committed_tokens, c.cached_tokens_by_level, m.stats) == (
                    r.committed_tokens, r.cached_tokens_by_level, mr.stats), f"step {k}"
                assert c._st.pending == 0, "the queries flushed the waiting steps"
        assert waited > 0
        assert _observe(m, c) == _observe(mr, r)
        c.close()
        r.close()
        assert m.stats == mr.stats
    finally:
        m.close()
        mr.close()


def test_an_observer_between_a_steps_resize_and_its_commit_flushes_the_resize(pair):
    """Rule: a deferred resize waiting for its commit reaches the library
    before any observer reads the cache (the page indices of the new
    capacity, the library's capacity), and its commit is then an ordinary
    one; a commit of other tokens than the step's one gets the library's
    answer."""
    (m, _, c), (mr, _, r) = pair
    for cache in (c, r):
        assert cache.resize(11, 11)  # moves the 8-token window: not deferred
        cache.commit([6])
    n = c.num_committed_tokens
    for cache in (c, r):
        assert cache.resize(n + 1, n + 1)
    assert c._st.steps == 1
    assert _observe(m, c) == _observe(mr, r)
    assert c._st.pending == 0
    for cache in (c, r):
        cache.commit([7])
    for cache in (c, r):
        assert cache.resize(n + 2, n + 2)
    _same_error(lambda: c.commit([1, 2]), lambda: r.commit([1, 2]))
    assert _observe(m, c) == _observe(mr, r)


@pytest.mark.parametrize("seed", range(4))
def test_random_decode_steps_match_the_library(seed):
    """Rule: decode steps mixed with other resizes, commits, queries and
    suspends read and raise exactly as without deferral."""
    rnd = random.Random(100 + seed)
    stepped = 0

    def step(c, r):
        nonlocal stepped
        tok = rnd.randint(0, 50)
        n = c.num_committed_tokens
        assert n == r.num_committed_tokens
        _same_error(lambda: c.resize(n + 1, n + 1), lambda: r.resize(n + 1, n + 1))
        stepped += c._st.steps
        _same_error(lambda: c.commit([tok]), lambda: r.commit([tok]))

    def commit(c, r):
        toks = [rnd.randint(0, 50) for _ in range(rnd.choice((1, 2)))]
        _same_error(lambda: c.commit(toks), lambda: r.commit(toks))

    got = _pair(small_config(enable_partial_reuse=bool(seed % 2)) if seed < 2 else _full_attention_config())
    _random_walk(got, rnd, 150, [(0.6, step), (0.75, _resize_move(rnd, 2)), (0.85, commit)], 0.9)
    assert stepped > 0, "some decode steps waited"


def test_decode_steps_method_equals_the_per_step_calls(pair):
    """Rule: KVCache.decode_steps(tokens) (a kvcm extension) leaves the
    cache as the per-step resize and commit calls do; a cache not at its
    committed history raises InvalidStateError, changing nothing."""
    (m, _, c), (mr, _, r) = pair
    toks = list(range(300, 311))
    assert c.decode_steps(toks)
    for t in toks:
        n = r.num_committed_tokens
        assert r.resize(n + 1, n + 1)
        r.commit([t])
    assert _observe(m, c) == _observe(mr, r)
    n = c.num_committed_tokens
    assert c.resize(n + 2, n + 1)
    with pytest.raises(InvalidStateError, match="history at the committed tokens"):
        c.decode_steps([1])
    assert c.num_committed_tokens == n and c.history_length == n + 1
