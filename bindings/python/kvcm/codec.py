"""Cold-page codecs: native only, handed over by consumption.

A codec transforms a hot page (spread over the GPU pools of its pool group)
into one opaque cold blob and back. In Python a codec is always a *native*
codec object, a C vtable with its ``self`` pointer (``kvcm_cold_page_codec``),
made by :func:`create_default_kv_cache_cold_page_codec` or by a C/C++ factory
(:meth:`KVCacheColdPageCodec.from_factory`). Python implementations and
subclasses are not supported (a non-goal of the design): the codec runs with
the manager's lock held, on the migration path, from any thread.

The library's built-in codecs are :func:`Default`, :func:`Gather`, :func:`Fp8`
and :func:`Auto` (or :func:`create_builtin_kv_cache_cold_page_codec` by name;
``KVCacheManager(config, cold_page_codec="gather")`` takes the name too). The
gather, FP8 and auto codecs run on the manager's device: the manager makes
them when it opens the device. Gather and FP8 have CUDA kernels only: on the
emulated device the manager raises :class:`~kvcm.CodecRejectedError`.

Passing a codec to ``KVCacheManager(config, cold_page_codec=codec)`` consumes
it whether construction succeeds or fails; the wrapper is unusable from then
on and raises :class:`~kvcm.ConsumedError`. A codec never handed over is
destroyed by ``close()`` (or when garbage collected).
"""

from __future__ import annotations

import ctypes
from typing import Any

from . import _native
from ._managed import Managed, check_not_forked
from ._native import ffi

__all__ = [
    "KVCacheColdPageCodec", "create_default_kv_cache_cold_page_codec", "CODEC_FACTORY",
    "BuiltinCodec", "ElementType", "create_builtin_kv_cache_cold_page_codec", "Default", "Gather", "Fp8", "Auto",
]

BuiltinCodec = ffi.BuiltinCodec
ElementType = ffi.ElementType

#: The C signature of a codec factory: ``kvcm_status* factory(kvcm_cold_page_codec* out)``,
#: the same as ``kvcm_create_default_cold_page_codec``. Its restype is
#: ``c_void_p`` so that it can also wrap a Python function (ctypes callbacks
#: cannot return pointer types); the factory is called through
#: ``_FACTORY_CALL``, which gives back a ``kvcm_status*`` to check and free.
CODEC_FACTORY = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.POINTER(ffi.kvcm_cold_page_codec))
_FACTORY_CALL = ctypes.CFUNCTYPE(ctypes.POINTER(ffi.kvcm_status), ctypes.POINTER(ffi.kvcm_cold_page_codec))

_PRIVATE = object()

_SUBCLASS_REFUSED = (
    "Python implementations and subclasses of the cold-page codec are not supported: a codec "
    "must be native (C or C++). Use create_default_kv_cache_cold_page_codec(), or build a C/C++ "
    "codec and wrap its factory with KVCacheColdPageCodec.from_factory(address)."
)


class KVCacheColdPageCodec(Managed):
    """A native cold-page codec object (``kvcm_cold_page_codec``).

    Not constructible directly and not subclassable. Make one with
    :func:`create_default_kv_cache_cold_page_codec`,
    :meth:`from_factory` or :meth:`from_native`.
    """

    _what = "cold-page codec"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        raise TypeError(_SUBCLASS_REFUSED)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if len(args) != 2 or args[0] is not _PRIVATE:
            raise TypeError(
                "KVCacheColdPageCodec cannot be constructed directly; use "
                "create_default_kv_cache_cold_page_codec() or KVCacheColdPageCodec.from_factory(). "
                + _SUBCLASS_REFUSED
            )
        super().__init__()
        self._adopt(args[1])

    @classmethod
    def from_factory(cls, factory: Any) -> "KVCacheColdPageCodec":
        """Call a native codec factory and wrap the codec it makes.

        ``factory`` is the address of (or a ctypes function pointer to) a C
        function ``kvcm_status* factory(kvcm_cold_page_codec* out)``, the
        signature of ``kvcm_create_default_cold_page_codec``: for example
        ``ctypes.CDLL("libmycodec.so").my_codec_factory``. The new codec is
        owned by the returned wrapper until it is handed to a manager.
        """
        # A factory runs library code (the default one is Go): never in a
        # fork() child.
        check_not_forked()
        if isinstance(factory, int) and not isinstance(factory, bool):
            if factory == 0:
                raise ValueError("factory: NULL function address")
            fn = _FACTORY_CALL(factory)
        elif isinstance(factory, ctypes._CFuncPtr):  # type: ignore[attr-defined]
            if not ctypes.cast(factory, ctypes.c_void_p).value:
                raise ValueError("factory: NULL function pointer")
            # Keeps `factory` (and the callback it may wrap) alive for the call.
            fn = ctypes.cast(factory, _FACTORY_CALL)
        else:
            raise TypeError(
                "factory: expected the address (int) of a C function "
                "`kvcm_status* f(kvcm_cold_page_codec* out)` or a ctypes function pointer, "
                f"got {type(factory).__name__}"
            )
        out = ffi.kvcm_cold_page_codec()
        _native.release_deferred()
        st = fn(ctypes.byref(out))
        _native.check(st)  # a POINTER(kvcm_status): raised and freed
        return cls._wrap(out)

    @classmethod
    def from_native(cls, vtable: int, self_ptr: int | None) -> "KVCacheColdPageCodec":
        """Adopt a codec object already made in C: the address of its
        ``kvcm_cold_page_codec_vtable`` and its ``self`` pointer. Ownership
        moves to the wrapper (which destroys it through the vtable's destroy
        slot unless it hands it on)."""
        if not isinstance(vtable, int) or isinstance(vtable, bool) or vtable == 0:
            raise ValueError("vtable: expected a non-NULL address (int)")
        out = ffi.kvcm_cold_page_codec()
        out.vtable = ctypes.cast(ctypes.c_void_p(vtable), type(out.vtable))
        out.self = ctypes.c_void_p(self_ptr or 0)
        return cls._wrap(out)

    @classmethod
    def _wrap(cls, struct: Any) -> "KVCacheColdPageCodec":
        if not struct.vtable:
            raise ValueError("the codec object has a NULL vtable")
        return cls(_PRIVATE, struct)

    def _release(self, struct: Any) -> None:
        _native.check(_native.lib.kvcm_cold_page_codec_destroy(ctypes.byref(struct)))

    def __repr__(self) -> str:
        state = "consumed" if self._state == "consumed" else ("closed" if self.closed else "owned")
        return f"<KVCacheColdPageCodec {state}>"


def create_default_kv_cache_cold_page_codec() -> KVCacheColdPageCodec:
    """The default lossless concatenating codec, as a codec object.

    Not needed to select the default (``KVCacheManager(config)`` does); it is
    the reference for native codec authors and shows the ownership transfer::

        codec = create_default_kv_cache_cold_page_codec()
        manager = KVCacheManager(config, cold_page_codec=codec)  # codec consumed
    """
    out = ffi.kvcm_cold_page_codec()
    _native.call("kvcm_create_default_cold_page_codec", ctypes.byref(out))
    return KVCacheColdPageCodec._wrap(out)


_ELEMENT_NAMES = {"float16": ElementType.FLOAT16, "fp16": ElementType.FLOAT16, "half": ElementType.FLOAT16,
                  "bfloat16": ElementType.BFLOAT16, "bf16": ElementType.BFLOAT16}


def _builtin_kind(kind: "str | BuiltinCodec") -> BuiltinCodec:
    if isinstance(kind, BuiltinCodec):
        return kind
    if isinstance(kind, str):
        try:
            return BuiltinCodec[kind.upper()]
        except KeyError:
            pass
        raise ValueError(f"kind: expected one of 'default', 'gather', 'fp8', 'auto', got {kind!r}")
    raise TypeError(f"kind: expected a BuiltinCodec or its name, got {type(kind).__name__}")


def _element(element: Any) -> ElementType:
    if isinstance(element, ElementType):
        return element
    # A torch.float16 / numpy float16 names itself ("torch.float16", "float16").
    name = str(element).lower().rsplit(".", 1)[-1]
    if name in _ELEMENT_NAMES:
        return _ELEMENT_NAMES[name]
    raise ValueError(f"element: expected 'float16' or 'bfloat16' (or an ElementType), got {element!r}")


def create_builtin_kv_cache_cold_page_codec(
    kind: "str | BuiltinCodec",
    *,
    element: Any = ElementType.FLOAT16,
    block_elems: int = 0,
    crossover_bytes: int = 0,
) -> KVCacheColdPageCodec:
    """One of the library's built-in codecs (``kvcm_create_builtin_cold_page_codec``).

    ``kind`` is a :class:`BuiltinCodec` or its name: ``"default"``,
    ``"gather"`` (lossless, device indices, one CUDA kernel per call),
    ``"fp8"`` (FP8 e4m3 with one float32 scale per ``block_elems`` elements
    of the ``element`` type: ``"float16"`` or ``"bfloat16"``, or a torch or
    numpy dtype of that name; ``block_elems`` a power of two in [8, 256], 0
    for 128) or ``"auto"`` (lossless: per lifecycle the default codec or, on
    CUDA, the staged codec over the gather kernel, ``crossover_bytes`` per
    page and pool, 0 for the measured 1 MiB; the default codec on the
    emulated device). Bad options raise
    :class:`~kvcm.InvalidArgumentError` naming the field.
    """
    k = _builtin_kind(kind)
    o = ffi.kvcm_builtin_codec_options()
    o.struct_size = ctypes.sizeof(o)
    o.abi_version = ffi.KVCM_ABI_VERSION
    o.kind = int(k)
    o.element = int(_element(element))
    for name, v in (("block_elems", block_elems), ("crossover_bytes", crossover_bytes)):
        if not isinstance(v, int) or isinstance(v, bool):
            raise TypeError(f"{name}: expected an int, got {type(v).__name__}")
    if not -(1 << 31) <= block_elems < (1 << 31):
        raise ValueError(f"block_elems: {block_elems} is out of range")
    o.block_elems = block_elems
    o.crossover_bytes = crossover_bytes
    out = ffi.kvcm_cold_page_codec()
    _native.call("kvcm_create_builtin_cold_page_codec", ctypes.byref(o), ctypes.byref(out))
    return KVCacheColdPageCodec._wrap(out)


def Default() -> KVCacheColdPageCodec:
    """The default lossless codec (the one ``KVCacheManager(config)`` uses)."""
    return create_builtin_kv_cache_cold_page_codec(BuiltinCodec.DEFAULT)


def Gather() -> KVCacheColdPageCodec:
    """The lossless gather codec: the default codec's cold bytes, moved by one
    CUDA kernel per call with the page indices on the device. CUDA only."""
    return create_builtin_kv_cache_cold_page_codec(BuiltinCodec.GATHER)


def Fp8(element: Any = ElementType.FLOAT16, block_elems: int = 0) -> KVCacheColdPageCodec:
    """The lossy FP8 e4m3 codec for float16 or bfloat16 pages, one float32
    scale per ``block_elems`` elements (0: 128, 0.516 of the hot bytes).
    CUDA only; every pool's slot bytes must be a multiple of 2 * block_elems."""
    return create_builtin_kv_cache_cold_page_codec(BuiltinCodec.FP8, element=element, block_elems=block_elems)


def Auto(crossover_bytes: int = 0) -> KVCacheColdPageCodec:
    """The lossless auto codec: per lifecycle the default codec or, on CUDA,
    the staged codec (the gather kernel into device staging, then DMA; below
    ``crossover_bytes`` per page and pool, 0 for 1 MiB); the default codec on
    the emulated device."""
    return create_builtin_kv_cache_cold_page_codec(BuiltinCodec.AUTO, crossover_bytes=crossover_bytes)
