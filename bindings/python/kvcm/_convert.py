"""Checked conversions of Python values to the C types of the ABI.

ctypes converts silently: ``c_int32(2**32 + 5)`` is 5, a float passes
through ``int()``. Every integer the package hands to the library goes
through this module instead, with the C type the generated layer gives its
parameter or struct field:

* It must be an ``int`` or an object with ``__index__`` (numpy integers, an
  ``IntEnum``). ``bool``, floats, strings and everything else raise
  ``TypeError`` naming the argument (``True`` is refused because it is
  almost always a mistake for a count, a level or a handle).
* It must fit the C type: otherwise :class:`~kvcm.InvalidArgumentError` (a
  ``ValueError``) naming the argument, the value and the type's range.

Both are raised before any C call, so nothing changes.

Token sequences (``tokens``) are int32 arrays in C. A C-contiguous,
one-dimensional buffer of 4-byte signed integers (``array('i')``, a numpy
``int32`` array, a memoryview of either) is handed to the library without a
copy when it is writable (read-only ones are copied with one memcpy); any
other integer buffer (numpy ``int64``, ``array('q')``) and any other
iterable of ints (a range, a generator) is converted by ``array('i')``, and
a list or tuple by ``struct`` (about 8 ns a token, 18 times faster than
``(c_int32 * n)(*tokens)``), both at C speed and range-checking every token;
floats, strings, ``bytes`` and buffers of non-integers are refused. (Both
take each item through ``__index__``, so a ``bool`` token counts as 0 or
1.)

That is :func:`tokens_py`. With the compiled extension (see
:mod:`kvcm._native`), ``tokens`` is ``kvcm._kvcm_ext.tokens``: a list or
tuple of ints in int32 range is packed in C (about 5 ns a token) and a
writable int32 buffer is taken by address (its ``keep`` is a memoryview);
everything else, and every error, goes to :func:`tokens_py`, so the rules
and messages are the same.
"""

from __future__ import annotations

import array
import ctypes
import operator
import struct
import sys
from typing import Any

from .errors import InvalidArgumentError

__all__ = ["RANGES", "integer", "check", "set_field", "packer", "tokens", "tokens_py"]


def _describe(ct: Any) -> tuple[int, int, str]:
    bits = 8 * ctypes.sizeof(ct)
    if ct(-1).value == -1:
        return -(1 << (bits - 1)), (1 << (bits - 1)) - 1, f"int{bits}_t"
    return 0, (1 << bits) - 1, f"uint{bits}_t"


# Every ctypes integer type (size_t and the like are aliases of these):
# (lowest, highest, C name).
RANGES: dict[Any, tuple[int, int, str]] = {
    t: _describe(t)
    for t in (
        ctypes.c_byte, ctypes.c_ubyte, ctypes.c_short, ctypes.c_ushort, ctypes.c_int, ctypes.c_uint,
        ctypes.c_long, ctypes.c_ulong, ctypes.c_longlong, ctypes.c_ulonglong,
        ctypes.c_int8, ctypes.c_uint8, ctypes.c_int16, ctypes.c_uint16, ctypes.c_int32, ctypes.c_uint32,
        ctypes.c_int64, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_ssize_t,
    )
}


def integer(value: Any, lo: int, hi: int, ctname: str, name: str) -> int:
    """value as an int in [lo, hi], or raise naming ``name``."""
    if type(value) is not int:
        if isinstance(value, bool) or not hasattr(type(value), "__index__"):
            raise TypeError(f"{name}: expected an int, got {type(value).__name__}")
        value = operator.index(value)
    if lo <= value <= hi:
        return value
    raise InvalidArgumentError(f"{name}: {value} is out of range for {ctname} [{lo}, {hi}]")


def check(value: Any, ctype: Any, name: str) -> int:
    """value as an int that fits ctype, or raise naming ``name``."""
    lo, hi, ctname = RANGES[ctype]
    return integer(value, lo, hi, ctname, name)


_FIELDS: dict[type, dict[str, Any]] = {}


def set_field(struct: Any, field: str, value: Any, name: str | None = None) -> None:
    """``struct.field = value``, checked against the field's C type when it
    is an integer; ``name`` (default: the field's) names it in errors."""
    cls = type(struct)
    types = _FIELDS.get(cls)
    if types is None:
        types = _FIELDS[cls] = {f[0]: f[1] for f in cls._fields_}
    ct = types[field]
    r = RANGES.get(ct)
    if r is not None:
        value = integer(value, r[0], r[1], r[2], name or field)
    setattr(struct, field, value)


def packer(cls: Any, **codes: str) -> struct.Struct:
    """A struct.Struct whose pack(*values) gives the bytes of the ctypes
    structure cls with the fields named, in the order of their offsets,
    set to the values (packed by their struct codes, in native mode) and
    every other byte zero: a structure in one call (its bytes, or
    cls.from_buffer_copy of them) where setting ctypes fields one by one
    costs several times more. Raises TypeError when the fields are not in
    offset order or a code's size is not its field's."""
    fmt = "@"
    end = 0
    for name, code in codes.items():
        field = getattr(cls, name)
        if field.offset < end:
            raise TypeError(f"packer: field {name} of {cls.__name__} is out of offset order")
        fmt += f"{field.offset - end}x{code}"
        end = field.offset + field.size
        if struct.calcsize(fmt) != end:
            raise TypeError(f"packer: code {code!r} does not fit field {name} of {cls.__name__}")
    return struct.Struct(f"{fmt}{ctypes.sizeof(cls) - end}x")


_INT_FORMATS = frozenset("bBhHiIlLqQnN")
# A buffer's native integer format by (itemsize, signed).
_NATIVE = {(1, True): "b", (1, False): "B", (2, True): "h", (2, False): "H", (4, True): "i", (4, False): "I",
           (8, True): "q", (8, False): "Q"}
# struct-module prefixes of the native byte order.
_ORDER = ("", "@", "=", "<" if sys.byteorder == "little" else ">")
_REFUSED = (str, bytes, bytearray)
assert array.array("i").itemsize == 4


# struct.Struct(f"{n}i").pack by n: the fastest conversion of a list of ints
# to int32s (it range-checks each item); its bytes are passed as the address.
_PACKERS: dict[int, Any] = {}


def _packer(n: int) -> Any:
    if len(_PACKERS) >= 4096:
        _PACKERS.clear()
    pack = _PACKERS[n] = struct.Struct(f"{n}i").pack
    return pack


def _from_iterable(value: Any, name: str) -> array.array:
    try:
        return array.array("i", value)
    except (TypeError, OverflowError, ValueError):
        pass
    # The slow path only finds the culprit for the message.
    try:
        items = list(value)
    except TypeError:
        raise TypeError(f"{name}: expected a sequence of int token ids, got {type(value).__name__}") from None
    lo, hi, ctname = RANGES[ctypes.c_int32]
    for i, v in enumerate(items):
        integer(v, lo, hi, ctname, f"{name}[{i}]")
    raise TypeError(f"{name}: expected a sequence of int token ids")  # pragma: no cover


def _array(a: array.array) -> tuple[Any, int, Any]:
    n = len(a)
    return (a.buffer_info()[0] if n else None), n, a


def tokens_py(value: Any, name: str = "tokens") -> tuple[Any, int, Any]:
    """(address or None, count, keep) for an int32 token array argument:
    keep holds the memory (and a buffer export, so that its owner cannot
    resize it) until the C call has returned. See the module docstring.
    ``tokens`` is this function on the ctypes path."""
    if value is None:
        return None, 0, None
    t = type(value)
    if t is list or t is tuple:
        n = len(value)
        if not n:
            return None, 0, None
        pack = _PACKERS.get(n)
        if pack is None:
            pack = _packer(n)
        try:
            b = pack(*value)
        except struct.error:
            return _array(_from_iterable(value, name))  # raises, naming the token
        return b, n, b
    if t is array.array:
        if value.typecode == "i":
            n = len(value)
            if not n:
                return None, 0, None
            keep = memoryview(value)  # blocks resizing while the library reads it
            return value.buffer_info()[0], n, keep
        if value.typecode not in _INT_FORMATS:
            raise TypeError(f"{name}: expected int32 token ids, got an array of type {value.typecode!r}")
        return _array(_from_iterable(value, name))
    if isinstance(value, _REFUSED):
        raise TypeError(f"{name}: expected a sequence of int token ids, got {t.__name__}")
    try:
        mv = memoryview(value)
    except TypeError:
        return _array(_from_iterable(value, name))
    if mv.ndim != 1:
        raise TypeError(f"{name}: expected a one-dimensional buffer of token ids, got {mv.ndim} dimensions")
    fmt = mv.format
    code, prefix = fmt[-1:], fmt[:-1]
    if code not in _INT_FORMATS or prefix not in _ORDER:
        raise TypeError(
            f"{name}: expected a buffer of native-order integer token ids, got format {fmt!r} "
            "(convert it, for example with numpy's astype(numpy.int32))"
        )
    if not len(mv):
        return None, 0, None
    native = _NATIVE[(mv.itemsize, code.islower())]
    if native == "i":
        if mv.c_contiguous and not mv.readonly:
            keep = ctypes.c_char.from_buffer(mv)
            return ctypes.addressof(keep), len(mv), keep
        a = array.array("i")
        a.frombytes(mv.cast("B") if mv.c_contiguous else mv.tobytes())
        return _array(a)
    if native != fmt:
        mv = (mv if mv.c_contiguous else memoryview(mv.tobytes())).cast("B").cast(native)
    return _array(_from_iterable(mv, name))


#: The token conversion in use: tokens_py, or on the extension backend
#: kvcm._kvcm_ext.tokens (set by kvcm._native), which takes lists, tuples
#: and writable int32 buffers in C and hands everything else to tokens_py.
tokens = tokens_py
