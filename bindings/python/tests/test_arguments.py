"""Integer arguments and token sequences: what the binding hands to C.

Rules (kvcm._convert): every integer argument is an int (or has
``__index__``; bool, float and str are refused with TypeError) that fits
its parameter's C type (InvalidArgumentError otherwise); the error names the
argument and is raised before any C call, so nothing changes. Token
sequences from array('i'), numpy, memoryview and list are the same tokens.
Every test here runs through both backends (the compiled extension and the
ctypes path), which follow the same rules.
"""

from __future__ import annotations

import array
import ctypes
import os

import pytest
from conftest import small_config

import kvcm
from kvcm import (
    AttentionLayerConfig,
    BatchDesc,
    BufferConfig,
    GpuCacheTierConfig,
    InvalidArgumentError,
    KVCacheManager,
    RequestDesc,
)

pytestmark = pytest.mark.usefixtures("backend")

PROMPT = list(range(1000, 1020))
I32 = (-(1 << 31), (1 << 31) - 1)
I64 = (-(1 << 63), (1 << 63) - 1)
U64 = (0, (1 << 64) - 1)


@pytest.fixture
def active(manager):
    """An ACTIVE cache that committed PROMPT[:8] (so PROMPT's prefix is cached)."""
    s = manager.create_stream()
    c = manager.create_kv_cache(input_tokens=PROMPT)
    c.resume(s)
    c.resize(12, 8)
    c.commit(PROMPT[:8])
    yield c
    c.close()


def _state(manager, cache):
    return (manager.get_quota(0), cache.capacity, cache.history_length, cache.num_committed_tokens,
            [(s.total, s.free) for s in manager.get_storage_stats(0)])


# (what, the C type's range, call(manager, cache, value), the argument's name)
CALLS = [
    ("resize_level cache_level", I32, lambda m, c, v: m.resize(v, 64 * 1024), "cache_level"),
    ("resize_level quota", I64, lambda m, c, v: m.resize(0, v), "quota"),
    ("get_quota", I32, lambda m, c, v: m.get_quota(v), "cache_level"),
    ("get_storage_stats", I32, lambda m, c, v: m.get_storage_stats(v), "cache_level"),
    ("get_layer_group_id", I32, lambda m, c, v: m.get_layer_group_id(v), "layer_id"),
    ("get_buffer_location", I32, lambda m, c, v: m.get_buffer_location(v, "key"), "layer_id"),
    ("probe_reuse lora", I64, lambda m, c, v: m.probe_reuse(PROMPT, lora_task_id=v), "lora_task_id"),
    ("create_kv_cache lora", I64, lambda m, c, v: m.create_kv_cache(lora_task_id=v, input_tokens=PROMPT),
     "lora_task_id"),
    ("alloc_memory", U64, lambda m, c, v: m.alloc_memory(v), "size"),
    ("drain_events", I32, lambda m, c, v: m.drain_events(v), "max_events"),
    ("cache resize capacity", I64, lambda m, c, v: c.resize(v), "capacity"),
    ("cache resize history_length", I64, lambda m, c, v: c.resize(12, v), "history_length"),
    ("resume stream", U64, lambda m, c, v: c.resume(v), "cuda_stream"),
    ("prefetch", I32, lambda m, c, v: c.prefetch(v), "level"),
    ("get_page_indices", I32, lambda m, c, v: c.get_page_indices(v), "layer_group_id"),
    ("probe_reuse token", I32, lambda m, c, v: m.probe_reuse(PROMPT[:5] + [v]), r"input_tokens\[5\]"),
    ("commit token", I32, lambda m, c, v: c.commit([v]), r"accepted_input_tokens\[0\]"),
]


def _out_of_range(bounds):
    lo, hi = bounds
    # Values that wrap onto small valid ones: the defect this guards against.
    return [hi + 1 + 4, lo - 1, (1 << 64) + 16]


@pytest.mark.parametrize("what,bounds,call,name", CALLS, ids=[c[0] for c in CALLS])
def test_integer_argument_out_of_its_c_range_is_refused_naming_it(manager, active, what, bounds, call, name):
    """A value outside the parameter's C type raises InvalidArgumentError
    naming the argument, and nothing changes."""
    before = _state(manager, active)
    for v in _out_of_range(bounds):
        with pytest.raises(InvalidArgumentError, match=rf"^{name}: {v} is out of range"):
            call(manager, active, v)
        assert _state(manager, active) == before


@pytest.mark.parametrize("what,bounds,call,name", CALLS, ids=[c[0] for c in CALLS])
@pytest.mark.parametrize("bad", [4.0, "4", True, None, b"4"], ids=["float", "str", "bool", "None", "bytes"])
def test_integer_argument_that_is_not_an_int_is_refused_naming_it(manager, active, what, bounds, call, name, bad):
    """A float, str, bool or None is a TypeError naming the argument (never
    int()-converted), and nothing changes. A bytes token is a multimodal
    digest token, which must be 32 bytes: a ValueError naming the token."""
    if bad is True and "token" in what:
        pytest.skip("tokens are converted by array('i'), which takes a bool token as 0 or 1")
    err = TypeError
    if isinstance(bad, bytes) and "token" in what:
        err = ValueError
    if bad is None and what in ("probe_reuse lora", "create_kv_cache lora", "cache resize capacity",
                                "cache resize history_length", "resume stream"):
        pytest.skip("None is this argument's documented default")
    before = _state(manager, active)
    with pytest.raises(err, match=rf"^{name}: expected an int|{name}"):
        call(manager, active, bad)
    assert _state(manager, active) == before


def test_integer_arguments_take_index_types(manager, active):
    """An IntEnum or any object with __index__ is the integer it stands for."""

    class Idx:
        def __init__(self, v):
            self.v = v

        def __index__(self):
            return self.v

    assert manager.get_quota(Idx(0)) == manager.get_quota(0)
    active.resize(Idx(16), Idx(8))
    assert active.capacity == 16


def _set(path):
    """A function setting the attribute at path (dotted, [i] indexes) of a config."""

    def setter(cfg, v):
        obj = cfg
        parts = path.replace("[", ".").replace("]", "").split(".")
        for p in parts[:-1]:
            obj = obj[int(p)] if p.isdigit() else getattr(obj, p)
        setattr(obj, parts[-1], v)
        return cfg

    return setter


# (the field's path, the C type's range, config(value)): the path is named
CONFIG_FIELDS = [
    ("tokens_per_block", I32, lambda v: _set("tokens_per_block")(small_config(), v)),
    ("cache_tiers[0].quota", I64, lambda v: small_config(tiers=[GpuCacheTierConfig(v)])),
    ("cache_tiers[0].max_quota", I64, lambda v: small_config(tiers=[GpuCacheTierConfig(64 * 1024, v)])),
    ("cache_tiers[1].quota", I64, lambda v: small_config(host_quota=v)),
    ("layers[0].layer_id", I32, lambda v: _set("layers[0].layer_id")(small_config(), v)),
    ("layers[0].buffers[1].size", I64, lambda v: _set("layers[0].buffers[1].size")(small_config(), v)),
    ("layers[2].sliding_window_size", I32, lambda v: _set("layers[2].sliding_window_size")(small_config(), v)),
    ("layers[2].num_sink_tokens", I32, lambda v: _set("layers[2].num_sink_tokens")(small_config(), v)),
    ("constraints[0].kv_caches[0].capacity", I64,
     lambda v: small_config(constraints=[BatchDesc([RequestDesc(v)])])),
    ("typical_step.kv_caches[0].history_length", I64,
     lambda v: small_config(typical_step=BatchDesc([RequestDesc(8, v)]))),
]


@pytest.mark.parametrize("path,bounds,make", CONFIG_FIELDS, ids=[c[0] for c in CONFIG_FIELDS])
def test_config_integer_out_of_its_c_range_is_refused_naming_it(path, bounds, make):
    """A configuration integer outside its C field's type raises
    InvalidArgumentError naming the field's path; no manager is made."""
    before = kvcm.live_handle_count()
    name = path.replace("[", r"\[").replace("]", r"\]").replace(".", r"\.")
    for v in _out_of_range(bounds):
        with pytest.raises(InvalidArgumentError, match=rf"^{name}: {v} is out of range"):
            KVCacheManager(make(v), device="emu")
    assert kvcm.live_handle_count() == before


@pytest.mark.parametrize("kw,bounds", [("device_ordinal", I32), ("event_queue_capacity", (0, (1 << 32) - 1))])
def test_manager_integer_options_are_checked(kw, bounds):
    """device_ordinal and event_queue_capacity are checked like arguments."""
    before = kvcm.live_handle_count()
    for v in _out_of_range(bounds):
        with pytest.raises(InvalidArgumentError, match=rf"^{kw}: {v} is out of range"):
            KVCacheManager(small_config(), device="emu", **{kw: v})
    for bad in (1.0, "0", True):
        with pytest.raises(TypeError, match=rf"^{kw}: expected an int"):
            KVCacheManager(small_config(), device="emu", **{kw: bad})
    assert kvcm.live_handle_count() == before


def test_block_hashes_are_checked():
    """CP block hashes must be uint64 ints; the error names the element."""
    with kvcm.NullCPAwareKVManager() as cp:
        with pytest.raises(InvalidArgumentError, match=r"^block_hashes\[1\]: -1 is out of range for uint64_t"):
            cp.notify_blocks_allocated("r", [1, -1])
        with pytest.raises(TypeError, match=r"^block_hashes\[0\]: expected an int, got float"):
            cp.notify_blocks_freed("r", [1.0])


# ---- token sequences ---------------------------------------------------------

def _np():
    return pytest.importorskip("numpy")


TOKEN_FORMS = [
    ("list", lambda t: list(t)),
    ("tuple", lambda t: tuple(t)),
    ("generator", lambda t: (v for v in t)),
    ("array('i')", lambda t: array.array("i", t)),
    ("array('q')", lambda t: array.array("q", t)),
    ("memoryview", lambda t: memoryview(array.array("i", t))),
    ("read-only memoryview", lambda t: memoryview(array.array("i", t).tobytes()).cast("i")),
    ("strided memoryview", lambda t: memoryview(array.array("i", [x for v in t for x in (v, -7)]))[::2]),
    ("ctypes array", lambda t: (ctypes.c_int32 * len(t))(*t)),
    ("numpy int32", lambda t: _np().asarray(t, dtype=_np().int32)),
    ("numpy int64", lambda t: _np().asarray(t, dtype=_np().int64)),
    ("numpy read-only", lambda t: _np().frombuffer(_np().asarray(t, dtype=_np().int32).tobytes(), dtype=_np().int32)),
    ("numpy strided", lambda t: _np().repeat(_np().asarray(t, dtype=_np().int32), 2)[::2]),
]


@pytest.mark.parametrize("form,make", TOKEN_FORMS, ids=[f[0] for f in TOKEN_FORMS])
def test_token_sequences_of_every_form_are_the_same_tokens(form, make):
    """probe_reuse, create_kv_cache and commit see the same tokens whatever
    sequence or int32 buffer carries them."""
    full_attention = [AttentionLayerConfig(0, [BufferConfig("key", 64), BufferConfig("value", 64)])]
    with KVCacheManager(small_config(layers=full_attention), device="emu") as m:
        s = m.create_stream()
        with m.create_kv_cache(input_tokens=make(PROMPT)) as c:
            c.resume(s)
            c.resize(len(PROMPT), len(PROMPT))
            c.commit(make(PROMPT))
        assert m.probe_reuse(make(PROMPT)) == 20  # all of it: it is cached whole
        assert m.probe_reuse(make(PROMPT[:9])) == 8
        assert m.probe_reuse(make([1] + PROMPT[1:])) == 0
        with m.create_kv_cache(input_tokens=make(PROMPT[:13])) as c:
            assert c.num_committed_tokens == 12


@pytest.mark.parametrize("bad,err,match", [
    (array.array("d", [1.0, 2.0]), TypeError, "array of type 'd'"),
    (memoryview(array.array("f", [1.0])), TypeError, "format 'f'"),
    ([1, 2.0], TypeError, r"input_tokens\[1\]: expected an int, got float"),
    ([1, "2"], TypeError, r"input_tokens\[1\]: expected an int, got str"),
    ([1, 1 << 31], InvalidArgumentError, r"input_tokens\[1\]: 2147483648 is out of range for int32_t"),
    (array.array("q", [1, 1 << 32]), InvalidArgumentError, r"input_tokens\[1\]: 4294967296 is out of range"),
    (array.array("I", [1, 1 << 31]), InvalidArgumentError, r"input_tokens\[1\]: 2147483648 is out of range"),
    (b"\x01\x00\x00\x00", TypeError, "got bytes"),
    ("abc", TypeError, "got str"),
    (memoryview(bytes(8)).cast("B").cast("i", (1, 2)), TypeError, "one-dimensional"),
    (5, TypeError, "expected a sequence"),
], ids=["array-d", "memoryview-f", "float", "str-item", "int32-overflow", "array-q-overflow",
        "array-I-overflow", "bytes", "str", "2-d", "int"])
def test_non_int32_tokens_are_refused_or_range_checked(manager, bad, err, match):
    """Tokens that are not int32 values are refused (non-integer buffers,
    floats, strings) or converted with a range check (other integer
    buffers), naming the argument; a wrapped value never reaches C."""
    with pytest.raises(err, match=match):
        manager.probe_reuse(bad)


def test_token_lists_take_every_int32_value_and_refuse_the_rest(backend):
    """Rule: a token list or tuple carries every int32 value as itself, at
    each end of the range and around the interpreter's one-digit ints
    (|x| < 2**30, which the extension reads without a call), and int
    subclasses (bool) and values past int32 get the Python conversion's
    rules (the same tokens or the same error)."""
    import struct

    values = [0, 1, -1, 2**30 - 1, 2**30, -(2**30) + 1, -(2**30), 2**31 - 1, -(2**31), 2**15, -(2**15)]
    for seq in (values, tuple(values)):
        addr, n, keep = kvcm._convert.tokens(seq, "tokens")
        assert n == len(values)
        got = list(struct.unpack(f"={n}i", ctypes.string_at(addr, 4 * n)))
        del keep
        assert got == values
    addr, n, keep = kvcm._convert.tokens([True, 3], "tokens")
    assert list(struct.unpack("=2i", ctypes.string_at(addr, 8))) == [1, 3]
    del keep
    for bad in (2**31, -(2**31) - 1, 2**64):
        with pytest.raises(InvalidArgumentError, match=r"tokens\[1\]: .* is out of range for int32_t"):
            kvcm._convert.tokens([1, bad], "tokens")


def test_numpy_non_int32_tokens():
    """numpy float arrays are refused; an int64 array out of int32 range too."""
    np = pytest.importorskip("numpy")
    with KVCacheManager(small_config(), device="emu") as m:
        with pytest.raises(TypeError, match="format 'd'"):
            m.probe_reuse(np.zeros(4))
        with pytest.raises(InvalidArgumentError, match=r"input_tokens\[2\]: 4294967296 is out of range"):
            m.probe_reuse(np.array([0, 1, 1 << 32], dtype=np.int64))
        with pytest.raises(TypeError, match="format '>i'"):
            m.probe_reuse(np.zeros(4, dtype=">i4"))


def test_array_tokens_cannot_be_resized_during_the_call(active):
    """An array('i') handed over without a copy is exported for the call: it
    is not resized under the library, and usable afterwards."""
    a = array.array("i", PROMPT[8:12])
    active.resize(12, 12)
    active.commit(a)
    a.append(5)  # no export left behind
    assert active.num_committed_tokens == 12


# ---- both backends -----------------------------------------------------------

def test_the_backend_in_use_binds_the_functions(manager, backend):
    """The module-level bound functions are the backend's: builtins of the
    extension, Python functions on the ctypes path."""
    from kvcm import _native, manager as manager_module

    assert _native.backend() == backend
    fn = manager_module._cache_resize
    assert (type(fn).__name__ == "builtin_function_or_method") == (backend == "extension")
    assert kvcm._convert.tokens is (_native._ext.tokens if backend == "extension" else kvcm._convert.tokens_py)


def test_a_failed_call_raises_the_class_of_its_status(manager):
    """A returned status becomes the exception class errors.py maps its code
    to, with the library's message and code; a stale handle is one."""
    from kvcm import _native

    out = ctypes.c_int32()
    with pytest.raises(kvcm.InvalidHandleError) as e:
        _native.call("kvcm_manager_get_tokens_per_block", 12345, ctypes.byref(out))
    assert e.value.code == kvcm.InvalidHandleError.code and e.value.message


def test_every_abi_function_has_a_fast_path():
    """The extension covers every function of the ctypes layer but
    kvcm_get_api (the table it calls through), with the same parameters."""
    from kvcm import _native

    if _native._ext is None:
        if os.environ.get("KVCM_REQUIRE_EXTENSION") == "1":
            pytest.fail("kvcm._kvcm_ext is not built (make py-ext)")
        pytest.skip("kvcm._kvcm_ext is not built")
    assert set(_native._ext.functions()) == set(_native.ffi.FUNCTIONS) - {"kvcm_get_api"}
    with pytest.raises(ValueError, match="parameters"):
        _native._ext.bind("kvcm_kv_cache_resize", ("cache",))
