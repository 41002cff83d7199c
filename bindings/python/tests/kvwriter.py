"""The deterministic page-byte writer of tests/conformance/README.md.

The same function as Go's internal/testkit/fakeengine (ZeroLowBytes off) and the C++
runner's: the bytes of one token position of one (layer, role) buffer depend
on the seed, on every token up to that position, on the position and on the
buffer. Pure Python; fine for the small pages of the tests.
"""

from __future__ import annotations

import struct

M64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15


def mix64(z: int) -> int:
    z &= M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def chain_start(seed: int) -> int:
    return mix64(seed ^ 0x6B76636D2D66616B)


def chain_next(h: int, token: int) -> int:
    return mix64(h + GOLDEN + (token & 0xFFFFFFFF) * 0xD6E8FEB86659FD93)


def prefix_hashes(seed: int, tokens) -> list[int]:
    """prefix[p] = hash of tokens[0..p], token p included."""
    out = []
    h = chain_start(seed)
    for t in tokens:
        h = chain_next(h, t)
        out.append(h)
    return out


def fnv1a64(data: bytes, h: int = 0xCBF29CE484222325) -> int:
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & M64
    return h


def buffer_salt(layer: int, role: str) -> int:
    r = fnv1a64(role.encode())
    return mix64((((layer & 0xFFFFFFFF) << 32) ^ r ^ GOLDEN) & M64)


def token_bytes(prefix: int, pos: int, salt: int, n: int) -> bytes:
    """The n bytes of one position of one buffer."""
    x = mix64(prefix ^ mix64(pos + GOLDEN) ^ salt)
    words = []
    for _ in range((n + 7) // 8):
        x = (x + GOLDEN) & M64
        words.append(mix64(x))
    return struct.pack(f"<{len(words)}Q", *words)[:n]


class Digest:
    """FNV-1a 64, incrementally."""

    def __init__(self) -> None:
        self.h = 0xCBF29CE484222325

    def update(self, data: bytes) -> None:
        self.h = fnv1a64(data, self.h)

    def hexdigest(self) -> str:
        return f"{self.h:016x}"
