"""Consumptive ownership of codecs; Python codecs refused; native factories."""

from __future__ import annotations

import ctypes
import shutil
import subprocess

import pytest
from conftest import REPO, small_config
from engine import FakeEngine

import kvcm
from kvcm import (
    CodecFailedError,
    CodecRejectedError,
    ConsumedError,
    DataLostError,
    InvalidConfigError,
    KVCacheColdPageCodec,
    KVCacheManager,
    create_default_kv_cache_cold_page_codec,
)
from kvcm import _native
from kvcm.codec import CODEC_FACTORY


def test_default_codec_consumed_on_success(config):
    before = kvcm.live_handle_count()
    codec = create_default_kv_cache_cold_page_codec()
    assert not codec.closed
    assert kvcm.live_handle_count() == before + 1  # an unconsumed default codec is a live handle
    with KVCacheManager(config, cold_page_codec=codec, device="emu") as m:
        assert codec.closed
        assert m.tokens_per_block == 4
    assert kvcm.live_handle_count() == before
    with pytest.raises(ConsumedError, match=r"consumed by KVCacheManager\(\)") as ei:
        KVCacheManager(config, cold_page_codec=codec, device="emu")
    assert "cannot be used again" in str(ei.value)
    with pytest.raises(ConsumedError):
        with codec:
            pass
    codec.close()  # closing a consumed codec does nothing
    assert kvcm.live_handle_count() == before


def test_codec_consumed_when_the_library_rejects_the_config():
    before = kvcm.live_handle_count()
    codec = create_default_kv_cache_cold_page_codec()
    cfg = small_config()
    cfg.layers[0].buffers[0].size = -1
    with pytest.raises(InvalidConfigError, match=r"layers\[0\]\.buffers\[0\]\.size"):
        KVCacheManager(cfg, cold_page_codec=codec, device="emu")
    assert codec.closed
    # The library destroyed it on its failure path: no handle is left.
    assert kvcm.live_handle_count() == before
    with pytest.raises(ConsumedError):
        KVCacheManager(small_config(), cold_page_codec=codec, device="emu")


def test_codec_consumed_when_python_rejects_the_config():
    before = kvcm.live_handle_count()
    codec = create_default_kv_cache_cold_page_codec()
    cfg = small_config()
    cfg.tokens_per_block = "four"
    with pytest.raises(TypeError, match="tokens_per_block"):
        KVCacheManager(cfg, cold_page_codec=codec)
    assert codec.closed
    assert kvcm.live_handle_count() == before
    with pytest.raises(ConsumedError):
        KVCacheManager(small_config(), cold_page_codec=codec)


def test_unused_codec_is_destroyed_by_close_and_gc():
    before = kvcm.live_handle_count()
    codec = create_default_kv_cache_cold_page_codec()
    codec.close()
    assert kvcm.live_handle_count() == before
    with pytest.raises(kvcm.ClosedError, match="codec is closed"):
        KVCacheManager(small_config(), cold_page_codec=codec)
    codec = create_default_kv_cache_cold_page_codec()
    del codec
    import gc

    gc.collect()
    assert kvcm.live_handle_count() == before


def test_python_codec_subclass_refused():
    with pytest.raises(TypeError, match="Python implementations and subclasses of the cold-page codec are not supported"):

        class MyCodec(KVCacheColdPageCodec):
            def encode(self, *args):
                return True


def test_python_codec_construction_refused():
    with pytest.raises(TypeError, match="cannot be constructed directly"):
        KVCacheColdPageCodec()


def test_non_codec_objects_refused(config):
    class DuckCodec:
        def configure(self, descs):
            return True

    with pytest.raises(TypeError, match="Python codec implementations are not supported"):
        KVCacheManager(config, cold_page_codec=DuckCodec())


CODEC_C = r"""
#include <stdlib.h>
#include "kvcm/kvcm.h"

/* A native C codec that forwards to the library's default codec and counts
   calls: made by a factory with kvcm_create_default_cold_page_codec's
   signature, wrapped in Python with KVCacheColdPageCodec.from_factory. */

typedef kvcm_status* (*create_fn)(kvcm_cold_page_codec*);
static create_fn g_create;
static int g_fail_configure, g_fail_decode;
static long g_counts[8]; /* configure, cold bytes, batching, location, encode, decode, destroy, created */

typedef struct { kvcm_cold_page_codec inner; } fwd;

static bool configure(void* self, const kvcm_pool_group_desc* d, kvcm_pool_group_index n) {
    fwd* f = self; g_counts[0]++;
    if (g_fail_configure) return false;
    return f->inner.vtable->configure(f->inner.self, d, n);
}
static size_t cold_bytes(void* self, kvcm_layer_group_id lg) {
    fwd* f = self; g_counts[1]++;
    return f->inner.vtable->query_cold_page_bytes(f->inner.self, lg);
}
static kvcm_layer_group_id batching(void* self, kvcm_layer_group_id lg) {
    fwd* f = self; g_counts[2]++;
    if (!f->inner.vtable->get_batching_layer_group_id) return lg;
    return f->inner.vtable->get_batching_layer_group_id(f->inner.self, lg);
}
static kvcm_page_index_location location(void* self, kvcm_layer_group_id lg) {
    fwd* f = self; g_counts[3]++;
    return f->inner.vtable->query_page_index_location(f->inner.self, lg);
}
static bool encode(void* self, kvcm_layer_group_id lg, void* dst, const kvcm_page_index_pair* p, size_t n, kvcm_stream s) {
    fwd* f = self; g_counts[4]++;
    return f->inner.vtable->encode(f->inner.self, lg, dst, p, n, s);
}
static bool decode(void* self, kvcm_layer_group_id lg, const void* src, const kvcm_page_index_pair* p, size_t n, kvcm_stream s) {
    fwd* f = self; g_counts[5]++;
    if (g_fail_decode) return false;
    return f->inner.vtable->decode(f->inner.self, lg, src, p, n, s);
}
static void destroy(void* self) {
    fwd* f = self; g_counts[6]++;
    f->inner.vtable->destroy(f->inner.self);
    free(f);
}

static const kvcm_cold_page_codec_vtable VT = {
    sizeof(kvcm_cold_page_codec_vtable), KVCM_ABI_VERSION,
    configure, cold_bytes, batching, location, encode, decode, destroy,
};

void test_codec_init(void* create) { g_create = (create_fn)create; }
void test_codec_fail_configure(int fail) { g_fail_configure = fail; }
void test_codec_fail_decode(int fail) { g_fail_decode = fail; }
long test_codec_count(int i) { return g_counts[i]; }
void test_codec_reset(void) { for (int i = 0; i < 8; i++) g_counts[i] = 0; }

kvcm_status* test_codec_factory(kvcm_cold_page_codec* out) {
    fwd* f = calloc(1, sizeof *f);
    kvcm_status* st = g_create(&f->inner);
    if (st) { free(f); return st; }
    out->vtable = &VT;
    out->self = f;
    g_counts[7]++;
    return NULL;
}
"""

CONFIGURE, COLD_BYTES, BATCHING, LOCATION, ENCODE, DECODE, DESTROY, CREATED = range(8)


@pytest.fixture(scope="module")
def native_codec_lib(tmp_path_factory):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    d = tmp_path_factory.mktemp("codec")
    src = d / "codec.c"
    src.write_text(CODEC_C)
    so = d / "libtestcodec.so"
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-I", str(REPO / "include"),
                    "-o", str(so), str(src)], check=True)
    lib = ctypes.CDLL(str(so))
    lib.test_codec_count.restype = ctypes.c_long
    lib.test_codec_init(ctypes.c_void_p(kvcm._native.function_address("kvcm_create_default_cold_page_codec")))
    return lib


def test_native_factory_codec_plugs_in(native_codec_lib):
    lib = native_codec_lib
    lib.test_codec_reset()
    before = kvcm.live_handle_count()
    codec = KVCacheColdPageCodec.from_factory(lib.test_codec_factory)
    assert lib.test_codec_count(CREATED) == 1
    cfg = small_config(gpu_quota=2560, host_quota=10240)
    tokens = [list(range(100 * r, 100 * r + 20)) for r in range(4)]
    with KVCacheManager(cfg, cold_page_codec=codec, device="emu") as m:
        assert codec.closed
        assert lib.test_codec_count(CONFIGURE) == 1
        eng = FakeEngine(m, cfg, seed=3)
        caches = []
        for t in tokens:  # more than the GPU holds: earlier caches go to the host tier
            c = m.create_kv_cache(input_tokens=t)
            c.resume(eng.stream)
            c.resize(20)
            eng.write(c, t, 0, 20)
            c.resize(20, 20)
            c.suspend()
            caches.append(c)
        assert lib.test_codec_count(ENCODE) > 0
        for c, t in zip(caches, tokens):
            c.resume(eng.stream)
            eng.verify(c, t, 0, 20)
            c.close()
        assert lib.test_codec_count(DECODE) > 0
        eng.close()
        assert lib.test_codec_count(DESTROY) == 0
    assert lib.test_codec_count(DESTROY) == 1
    assert kvcm.live_handle_count() == before


def test_native_codec_destroyed_when_construction_fails(native_codec_lib):
    lib = native_codec_lib
    lib.test_codec_reset()
    before = kvcm.live_handle_count()
    lib.test_codec_fail_configure(1)
    try:
        codec = KVCacheColdPageCodec.from_factory(ctypes.cast(lib.test_codec_factory, ctypes.c_void_p).value)
        with pytest.raises(CodecRejectedError, match="Configure"):
            KVCacheManager(small_config(), cold_page_codec=codec, device="emu")
    finally:
        lib.test_codec_fail_configure(0)
    assert codec.closed
    assert lib.test_codec_count(CONFIGURE) == 1
    assert lib.test_codec_count(DESTROY) == 1
    assert kvcm.live_handle_count() == before
    with pytest.raises(ConsumedError):
        KVCacheManager(small_config(), cold_page_codec=codec, device="emu")


def test_native_codec_failed_decode_drops_the_pages(native_codec_lib):
    """A decode returning false raises CodecFailedError; the cache can only be
    closed (DataLostError), the prefix is no longer offered and the next
    request recomputes it."""
    lib = native_codec_lib
    lib.test_codec_reset()
    cfg = small_config(gpu_quota=2560, host_quota=10240)
    prompt = list(range(20))
    with KVCacheManager(cfg, cold_page_codec=KVCacheColdPageCodec.from_factory(lib.test_codec_factory),
                        device="emu") as m:
        eng = FakeEngine(m, cfg, seed=5)
        for t in (prompt, list(range(500, 520))):  # the second pushes the first to the host tier
            c = m.create_kv_cache(input_tokens=t)
            c.resume(eng.stream)
            c.resize(20)
            eng.write(c, t, 0, 20)
            c.resize(20, 20)
            c.commit(t)
            c.close()
        lib.test_codec_fail_decode(1)
        try:
            reused = m.probe_reuse(prompt + [99])
            assert reused > 0
            c = m.create_kv_cache(input_tokens=prompt + [99])
            with pytest.raises(CodecFailedError, match="Decode") as ei:
                c.resume(eng.stream)
            assert ei.value.code == 15
            with pytest.raises(DataLostError):
                c.resume(eng.stream)
            assert m.probe_reuse(prompt + [99]) < reused
            c.close()
            c = m.create_kv_cache(input_tokens=prompt + [99])
            c.resume(eng.stream)  # only what is still on the GPU is reused: nothing to decode
            c.close()
        finally:
            lib.test_codec_fail_decode(0)
        eng.close()


def test_native_codec_never_handed_over_is_destroyed(native_codec_lib):
    lib = native_codec_lib
    lib.test_codec_reset()
    with KVCacheColdPageCodec.from_factory(lib.test_codec_factory) as codec:
        assert not codec.closed
    assert lib.test_codec_count(DESTROY) == 1


def test_from_factory_rejects_bad_arguments():
    with pytest.raises(ValueError):
        KVCacheColdPageCodec.from_factory(0)
    with pytest.raises(TypeError):
        KVCacheColdPageCodec.from_factory("libfoo.so")


def test_from_native_adopts_a_codec_object(config):
    before = kvcm.live_handle_count()
    raw = kvcm._native.ffi.kvcm_cold_page_codec()
    kvcm._native.call("kvcm_create_default_cold_page_codec", ctypes.byref(raw))
    codec = KVCacheColdPageCodec.from_native(ctypes.cast(raw.vtable, ctypes.c_void_p).value, raw.self)
    with KVCacheManager(config, cold_page_codec=codec, device="emu"):
        assert codec.closed
    assert kvcm.live_handle_count() == before


def test_failing_factory_raises_the_library_error():
    """A factory that returns a kvcm_status* raises the library's error for
    it (here InvalidHandleError), code and message kept."""
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


def test_failing_factory_given_by_address_raises_the_library_error():
    """The same with the factory given as an address (the documented int form)."""

    def failing_factory(_out):
        st = _native.lib.kvcm_cp_destroy(0)
        return ctypes.cast(st, ctypes.c_void_p).value

    fn = CODEC_FACTORY(failing_factory)
    addr = ctypes.cast(fn, ctypes.c_void_p).value
    with pytest.raises(kvcm.KVCacheError):
        KVCacheColdPageCodec.from_factory(addr)
