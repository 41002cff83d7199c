"""Regression tests for defects found in a review of the hand-written Python
bindings (kvcm/*.py). Each test fails on the code it was written against."""

from __future__ import annotations

import ctypes
import gc
import os
import subprocess
import sys
import textwrap
import weakref
from pathlib import Path

import pytest

import kvcm
from kvcm import ContextPilotKVManager, KVCacheColdPageCodec
from kvcm import _native
from kvcm.codec import CODEC_FACTORY

HERE = Path(__file__).resolve().parent


# ---- cp.py: a ContextPilotKVManager that is not closed is never destroyed ----
#
# Every trampoline captures ``fail = self._failed`` (a bound method, so a strong
# reference to the wrapper), and the trampolines live in the module-global
# ``_live`` registry until the native destroy slot runs. The native index is
# destroyed only by the wrapper's close()/__del__, which can therefore never
# run: the wrapper, its middleware and the native index leak for the life of
# the process.


class _Middleware:
    def predict_prefix_reuse(self, request_id, token_ids):
        return 0.5


def test_unclosed_context_pilot_index_is_finalized():
    gc.collect()
    before = kvcm.live_handle_count()
    mw = _Middleware()
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
    assert not alive, "ContextPilotKVManager never garbage collected (reachable from kvcm.cp._live)"
    assert mw_ref() is None, "middleware kept alive after its index was dropped"
    assert handles == before, f"native CP index leaked: {handles - before} live handle(s)"


# ---- codec.py: a failing native factory gives ctypes.ArgumentError ----
#
# CODEC_FACTORY's restype is c_void_p, so a factory's kvcm_status* comes back
# as a Python int. _native.check(int) hands that int to kvcm_status_get_code,
# whose argtype is POINTER(kvcm_status): ctypes raises ArgumentError, the
# library's error code and message are lost, and the status is never freed
# (kvcm_status_free is not reached).


def test_from_factory_failure_raises_library_error():
    made = []

    def failing_factory(_out):
        # A genuine library status (INVALID_HANDLE) returned as the factory's
        # result, as a C factory wrapping a failing kvcm call would.
        st = _native.lib.kvcm_cp_destroy(0)
        assert st
        addr = ctypes.cast(st, ctypes.c_void_p).value
        made.append(addr)
        return addr

    fn = CODEC_FACTORY(failing_factory)
    with pytest.raises(kvcm.KVCacheError) as info:
        KVCacheColdPageCodec.from_factory(fn)
    assert made
    assert isinstance(info.value, kvcm.InvalidHandleError), repr(info.value)


def test_from_factory_failure_by_address_raises_library_error():
    # The same with the factory given as an address (the documented int form).
    def failing_factory(_out):
        st = _native.lib.kvcm_cp_destroy(0)
        return ctypes.cast(st, ctypes.c_void_p).value

    fn = CODEC_FACTORY(failing_factory)
    addr = ctypes.cast(fn, ctypes.c_void_p).value
    with pytest.raises(kvcm.KVCacheError):
        KVCacheColdPageCodec.from_factory(addr)


# ---- _managed.py: a finalizer that runs inside a callback deadlocks ----
#
# Managed.__del__ calls close() synchronously wherever the garbage collector
# happens to run. The priority callback (and CP notifications, and host
# functions) run on a thread that holds the manager's lock; any allocation
# there may trigger a collection, and a collected cache of the same manager
# then calls kvcm_kv_cache_close, which takes the same (non-reentrant) lock:
# the process hangs. Run in a subprocess with a timeout.

_DEADLOCK_SCRIPT = textwrap.dedent(
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


def test_finalizer_inside_callback_does_not_deadlock(tmp_path):
    script = tmp_path / "gc_in_callback.py"
    script.write_text(_DEADLOCK_SCRIPT.format(pkg=str(HERE.parent), tests=str(HERE)))
    try:
        r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=30,
                           env=dict(os.environ))
    except subprocess.TimeoutExpired:
        pytest.fail("deadlock: a cache finalized by the GC inside a priority callback closed itself "
                    "while the manager's lock was held")
    assert r.returncode == 0 and "OK" in r.stdout, r.stdout + r.stderr


# ---- codec.py: from_factory skips the fork guard ----
#
# create_default_kv_cache_cold_page_codec() goes through _native.call, which
# raises ForkedProcessError in a fork() child; from_factory() calls the
# factory (and, for the library's own factory, the Go runtime) directly, so in
# a fork child it runs Go code that the package promises never to touch there.

_FORK_SCRIPT = textwrap.dedent(
    """
    import os, sys
    sys.path.insert(0, {pkg!r})
    import kvcm
    from kvcm import ForkedProcessError, KVCacheColdPageCodec, create_default_kv_cache_cold_page_codec
    from kvcm import _native
    kvcm.live_handle_count()  # the library is loaded
    addr = _native.function_address("kvcm_create_default_cold_page_codec")
    pid = os.fork()
    if pid == 0:
        out = []
        for name, f in (("create_default", create_default_kv_cache_cold_page_codec),
                        ("from_factory", lambda: KVCacheColdPageCodec.from_factory(addr))):
            try:
                f()
                out.append(name + ":called-into-library")
            except ForkedProcessError:
                out.append(name + ":refused")
        print(" ".join(out), flush=True)
        os._exit(0)
    os.waitpid(pid, 0)
    """
)


def test_from_factory_refuses_in_fork_child(tmp_path):
    script = tmp_path / "fork_factory.py"
    script.write_text(_FORK_SCRIPT.format(pkg=str(HERE.parent)))
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ))
    assert "create_default:refused" in r.stdout, r.stdout + r.stderr
    assert "from_factory:refused" in r.stdout, r.stdout + r.stderr
