"""The library itself: loading, the generated ctypes layer against the header
(layouts, length-delimited strings as addresses), poisoning."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import textwrap

import pytest
from conftest import HERE

import kvcm
from kvcm._native import ffi


def run_python(code: str, plain: bool = False, **env: str) -> subprocess.CompletedProcess:
    e = dict(os.environ)
    e.update(env)
    if plain:
        e.pop("GLIBC_TUNABLES", None)  # as a user's process starts
    paths = [str(HERE)] if os.environ.get("KVCM_TEST_INSTALLED") == "1" else [str(HERE.parent), str(HERE)]
    e["PYTHONPATH"] = os.pathsep.join(paths)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=e, capture_output=True,
                          text=True, timeout=120)


def test_library_loads_in_a_plain_process():
    # A Go c-shared library whose static TLS block is larger than glibc's
    # surplus for dlopen fails to load in Python ("cannot allocate memory in
    # static TLS block") unless the user sets GLIBC_TUNABLES.
    r = run_python("import kvcm; print(kvcm.version())", plain=True)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == kvcm.version()


def test_struct_layouts_match_the_header():
    assert ffi.check_layouts() == []


ID = b"req\x00uest-42"  # request ids are (pointer, length) and may contain NULs


def test_generated_cp_slot_prototypes_pass_request_id_as_address():
    """The generated CFUNCTYPEs of the CP vtable slots pass request_id as an
    address, never as ctypes.c_char_p (which reads up to a NUL): a slot gets
    every byte of an id, NULs included, and the length tells it where the id
    ends. kvcm/cp.py uses the generated prototypes."""
    seen = []

    def notify(self_, request_id, request_id_len, keys, num_keys):
        seen.append((request_id, request_id_len))
        return 0

    cb = ffi.kvcm_cp_index_vtable_notify_blocks_allocated(notify)
    fn = ctypes.cast(cb, ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                          ctypes.c_void_p, ctypes.c_size_t))
    buf = ctypes.create_string_buffer(ID, len(ID))
    assert fn(None, ctypes.addressof(buf), len(ID), None, 0) == 0
    (arg, n), = seen
    assert n == len(ID)
    assert not isinstance(arg, bytes), (
        "the slot received %r: ctypes already read the id up to a NUL, its %d bytes are lost" % (arg, n))
    assert ctypes.string_at(arg, n) == ID


def test_generated_struct_fields_with_len_read_back_whole():
    """Length-delimited struct fields (kvcm_cp_request_id.data,
    kvcm_reuse_scope.salt: "may contain NULs") read back whole, past a NUL."""
    keep = ctypes.create_string_buffer(ID, len(ID))
    rid = ffi.kvcm_cp_request_id()
    ctypes.memmove(ctypes.addressof(rid) + ffi.kvcm_cp_request_id.data.offset,
                   ctypes.byref(ctypes.c_void_p(ctypes.addressof(keep))), ctypes.sizeof(ctypes.c_void_p))
    rid.len = len(ID)
    data = rid.data
    if not isinstance(data, bytes):
        data = ctypes.string_at(data, rid.len)
    assert data[:rid.len] == ID, "kvcm_cp_request_id.data read back as %r" % (data,)


def test_length_delimited_strings_are_addresses_everywhere():
    """Fields and function parameters with a length are c_void_p; NUL-terminated
    strings (no length) stay c_char_p."""
    for cls, field in [(ffi.kvcm_cp_request_id, "data"), (ffi.kvcm_reuse_scope, "salt"),
                       (ffi.kvcm_kv_cache_options, "request_id")]:
        assert dict(cls._fields_)[field] is ctypes.c_void_p, (cls.__name__, field)
    for name in ("kvcm_cp_predict_prefix_reuse", "kvcm_cp_get_cached_blocks",
                 "kvcm_cp_notify_blocks_allocated", "kvcm_cp_notify_blocks_freed"):
        _restype, argtypes = ffi.FUNCTIONS[name]
        assert argtypes[ffi.PARAMETERS[name].index("request_id")] is ctypes.c_void_p, name
    assert dict(ffi.kvcm_cache_tier_config._fields_)["path"] is ctypes.c_char_p
    assert ffi.FUNCTIONS["kvcm_debug_panic"][1] == [ctypes.c_char_p]


def test_enum_values_match_the_error_classes():
    for code in ffi.StatusCode:
        if code == ffi.StatusCode.OK:
            continue
        e = kvcm.errors.error_for_code(int(code), "x")
        name = type(e).__name__.upper().replace("ERROR", "")
        assert name.replace("MANAGERCLOSED", "CLOSED").replace("STORAGEIO", "IO") == \
            code.name.replace("_", ""), (code, type(e))


def test_panic_becomes_internal_error_and_poisons():
    r = run_python(
        """
        import kvcm
        from conftest import small_config
        try:
            kvcm.library._debug_panic("boom from python")
        except kvcm.InternalError as e:
            print("internal:", "boom from python" in str(e))
        print("poisoned:", kvcm.is_poisoned())
        try:
            kvcm.KVCacheManager(small_config(), device="emu")
        except kvcm.PoisonedError as e:
            print("refused:", e.code)
        """,
        KVCM_ENABLE_DEBUG_PANIC="1",
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split("\n")[:3] == ["internal: True", "poisoned: True", "refused: 14"], r.stdout


def test_debug_panic_is_off_by_default():
    r = run_python(
        """
        import kvcm
        try:
            kvcm.library._debug_panic()
        except kvcm.UnsupportedError:
            print("unsupported", kvcm.is_poisoned())
        """
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "unsupported False"


def test_readme_example_runs():
    readme = (HERE.parent / "README.md").read_text()
    code = readme.split("```python\n", 1)[1].split("```", 1)[0]
    before = kvcm.live_handle_count()
    exec(compile(code, "README.md", "exec"), {})
    assert kvcm.live_handle_count() == before


def test_an_extension_built_for_another_library_is_refused(monkeypatch):
    """The compiled extension calls through the library's function table by
    slot: when a slot holds another function than the one of its name (an
    extension built against another header of the same, unreleased ABI
    version), loading refuses it with an ImportError naming the function,
    and nothing is attached."""
    from kvcm import _native

    real = _native._ext
    if real is None:
        pytest.skip("kvcm._kvcm_ext is not built")
    attached = []

    class Shifted:
        def functions(self):
            return real.functions()

        def slots(self, get_api):
            s = real.slots(get_api)
            return s[1:] + s[:1]

        def attach(self, get_api):
            attached.append(get_api)

    monkeypatch.setattr(_native, "_ext", Shifted())
    with pytest.raises(ImportError, match=f"slot of {real.functions()[0]} holds another function"):
        _native._attach_ext()
    assert attached == []
    monkeypatch.setattr(_native, "_ext", real)
    _native._attach_ext()  # the real extension's slots match the library's symbols
