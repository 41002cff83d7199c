"""Tests of the generated ctypes layer (kvcm._ffi) from a review of kvcmgen:
length-delimited ``const char*`` (one with a length) is an address, never
c_char_p, which ctypes reads only up to a NUL.
"""

from __future__ import annotations

import ctypes

from kvcm import _ffi as ffi

ID = b"req\x00uest-42"  # request ids are (pointer, length) and may contain NULs


def test_generated_cp_slot_prototypes_pass_request_id_as_address():
    """The generated CFUNCTYPEs of the CP vtable slots must not declare
    request_id as ctypes.c_char_p: ctypes would turn the argument into bytes
    with strlen(), truncating an id with a NUL and reading an id without one
    (the usual case: ids are not NUL-terminated) past its end; the length
    argument could not repair it, because the address is gone. A const char*
    that has a len is generated as c_void_p, and kvcm/cp.py uses the
    generated prototypes."""
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
    """kvcm_cp_request_id.data and kvcm_reuse_scope.salt are length-delimited
    ("may contain NULs"): as c_char_p fields, reading them through ctypes
    would stop at the first NUL."""
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
