"""Multimodal digest tokens (KVCacheManagerV2's ``TokenIdExt = int | bytes |
MmItemContext``).

A token that is not a text token id is the 32-byte content digest of a
multimodal item, as ``bytes`` or as an :class:`MmItemContext` (the digest and
an optional uuid that never enters a key). A block's digests enter its key
(``core/blockhash`` specifies the bytes), so only a prompt with the same items
at the same positions reuses it. :func:`sequence_to_blockchain_keys` gives a
sequence's keys as the library computes them.
"""

from __future__ import annotations

import ctypes
import hashlib
import struct
from typing import Any, Iterator, Sequence

from . import _convert, _native
from ._native import bind, ffi

__all__ = ["DIGEST_SIZE", "MmItemContext", "gen_multimodal_cache_key_tokens", "sequence_to_blockchain_keys"]

DIGEST_SIZE = 32

_block_keys = bind("kvcm_block_keys")


class MmItemContext:
    """A multimodal item's token: its 32-byte content ``digest`` and an
    optional ``uuid``. Two contexts are equal when their digests are: the uuid
    is carried, never hashed."""

    __slots__ = ("_digest", "_uuid")

    def __init__(self, digest: bytes, uuid: str | None = None) -> None:
        self._digest = _digest_bytes(digest, "digest")
        if uuid is not None and not isinstance(uuid, str):
            raise TypeError(f"uuid: expected a str or None, got {type(uuid).__name__}")
        self._uuid = uuid

    @property
    def digest(self) -> bytes:
        return self._digest

    @property
    def uuid(self) -> str | None:
        return self._uuid

    def __eq__(self, other: object) -> bool:
        if isinstance(other, MmItemContext):
            return self._digest == other._digest
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._digest)

    def __repr__(self) -> str:
        return f"MmItemContext({self._digest.hex()}, uuid={self._uuid!r})"


def _digest_bytes(value: Any, name: str) -> bytes:
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise TypeError(f"{name}: expected {DIGEST_SIZE} bytes, got {type(value).__name__}")
    b = bytes(value)
    if len(b) != DIGEST_SIZE:
        raise ValueError(f"{name}: a multimodal digest is {DIGEST_SIZE} bytes, got {len(b)}")
    return b


def gen_multimodal_cache_key_tokens(id_offset: int, multi_modal_data_digest: bytes, num_tokens: int,
                                    token_offset: int = 0, uuid: str | None = None) -> list[Any]:
    """The key tokens of ``num_tokens`` tokens of a multimodal item, from
    item-local token ``token_offset`` on: item-local token 0 is the item's
    digest (an :class:`MmItemContext` with ``uuid``, or the digest bytes
    without one), token ``i > 0`` is ``id_offset + i`` (``id_offset`` is
    usually the vocabulary size, so that they never equal a text token)."""
    if type(num_tokens) is not int or num_tokens <= 0:
        raise ValueError(f"num_tokens: expected a positive int, got {num_tokens!r}")
    if type(token_offset) is not int or token_offset < 0:
        raise ValueError(f"token_offset: expected a non-negative int, got {token_offset!r}")
    digest = _digest_bytes(multi_modal_data_digest, "multi_modal_data_digest")
    first: Any = digest if uuid is None else MmItemContext(digest, uuid)
    return [first if token_offset + i == 0 else id_offset + token_offset + i for i in range(num_tokens)]


def is_digest(token: Any) -> bool:
    return isinstance(token, (bytes, bytearray, MmItemContext))


def split(tokens: Sequence[Any], name: str) -> tuple[Any, int, Any, Any, int, Any, int]:
    """A token sequence with digest tokens as the C ABI takes it: (tokens, n,
    positions, number of digests, digest bytes, their length, keep), the
    tokens' values at digest positions 0."""
    ids: list[int] = []
    positions: list[int] = []
    raw = bytearray()
    for i, t in enumerate(tokens):
        if isinstance(t, MmItemContext):
            positions.append(i)
            raw += t.digest
            ids.append(0)
        elif isinstance(t, (bytes, bytearray)):
            positions.append(i)
            raw += _digest_bytes(t, f"{name}[{i}]")
            ids.append(0)
        else:
            ids.append(t)
    toks, n, keep = _convert.tokens_py(ids, name)
    pos = (ctypes.c_size_t * max(len(positions), 1))(*positions)
    blob, blob_keep = _native.byte_buffer(bytes(raw))
    return toks, n, pos, len(positions), blob, len(raw), (keep, pos, blob_keep)


def _root(lora_id: int | None, salt: bytes | None) -> bytes:
    """The key chains of a scope start from (core/blockhash's scope hash)."""
    domain = b"kvcm-scope-v1" if lora_id is None else b"kvcm-scope-lora-v1"
    s = salt or b""
    return hashlib.sha256(domain + struct.pack("<qI", lora_id or 0, len(s)) + s).digest()[:8]


def sequence_to_blockchain_keys(tokens_per_block: int, reuse_scope: Any, tokens: Sequence[Any]
                                ) -> Iterator[tuple[list[Any], bytes]]:
    """Yield ``(token_block, key)`` pairs of a sequence: first the root
    (``[]``, the scope's key), then each block of ``tokens_per_block`` tokens
    (the last may be shorter) with its key, chained from the previous one.
    Keys are kvcm's 64-bit block keys as 8 little-endian bytes (the ``key``
    of the blocks' cache events, with the default SHA-256 block key)."""
    from .manager import KVCacheManager, _scope_fields

    tpb = _convert.check(tokens_per_block, ctypes.c_int32, "tokens_per_block")
    lora_id, salt = _scope_fields(reuse_scope, None, None)
    scope, has_lora, keep_scope = KVCacheManager._scope(lora_id, salt)
    seq = list(tokens)
    toks, n, pos, nd, blob, blen, keep = split(seq, "tokens")
    cap = -(-n // tpb) if tpb > 0 else 0
    keys = (ctypes.c_uint64 * max(cap, 1))()
    needed = ctypes.c_size_t()
    _block_keys(int(ffi.KVCM_BLOCK_KEY_SHA256), ctypes.byref(scope), has_lora, tpb, toks, n,
                pos if nd else None, nd, blob, blen, True, keys, cap, ctypes.byref(needed))
    del keep, keep_scope
    yield [], _root(lora_id, _salt_of(salt))
    for b in range(needed.value):
        yield seq[b * tpb:(b + 1) * tpb], int(keys[b]).to_bytes(8, "little")


def _salt_of(salt: Any) -> bytes | None:
    from .manager import _salt_bytes

    return _salt_bytes(salt)
